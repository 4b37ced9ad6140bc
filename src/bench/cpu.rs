//! CPU time per VM thread, for the benchmark's "where the time goes" columns.
//!
//! On Linux each thread's run time (nanoseconds on a CPU) is in
//! `/proc/self/task/<tid>/schedstat`, and its name in `comm`; the VM names its threads
//! (`eagervm-scheduler`, `eagervm-worker-<i>`), so a sample before and after a run gives
//! the CPU time each stage spent on it, whatever the machine's other load. The same file's
//! third field counts the thread's time slices: how many times it was put on a CPU, so
//! about how many times it woke. Where `/proc` is missing the sample is `None` and the
//! benchmark leaves these columns out.

use std::collections::HashMap;

/// One thread's name, CPU nanoseconds and time slices so far.
#[derive(Debug, Clone, Default)]
struct ThreadStat {
    name: String,
    ns: u64,
    slices: u64,
}

/// CPU nanoseconds and time slices per thread id, with the thread's name.
#[derive(Debug, Clone, Default)]
pub struct Sample {
    threads: HashMap<u64, ThreadStat>,
    /// The calling thread's id.
    me: u64,
}

/// CPU time per instruction of each stage of one run, in nanoseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct StageCpu {
    /// The thread that built and submitted the instructions.
    pub caller: f64,
    /// The scheduler thread (the floor's forwarder, in the floor's figures).
    pub scheduler: f64,
    /// All worker threads together.
    pub workers: f64,
}

/// CPU time this process has used so far, all its threads together (those that have
/// exited too), or `None` where the system does not tell.
pub fn process_cpu() -> Option<std::time::Duration> {
    #[cfg(unix)]
    {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: `ts` is a valid, writable timespec; the call only writes it.
        let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
        (rc == 0).then(|| std::time::Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
    }
    #[cfg(not(unix))]
    {
        None
    }
}

/// A thread's run time in nanoseconds and its number of time slices, from `schedstat`
/// (`run-ns wait-ns slices`).
fn schedstat(task: &std::path::Path) -> Option<(u64, u64)> {
    let text = std::fs::read_to_string(task.join("schedstat")).ok()?;
    let mut fields = text.split_whitespace();
    let ns = fields.next()?.parse().ok()?;
    let slices = fields.nth(1)?.parse().ok()?;
    Some((ns, slices))
}

/// Sample every thread of this process now, or `None` where `/proc` does not tell.
pub fn sample() -> Option<Sample> {
    let me: u64 = std::fs::read_link("/proc/thread-self").ok()?.file_name()?.to_str()?.parse().ok()?;
    let mut threads = HashMap::new();
    for entry in std::fs::read_dir("/proc/self/task").ok()? {
        let path = entry.ok()?.path();
        let Some(tid) = path.file_name().and_then(|n| n.to_str()).and_then(|n| n.parse().ok()) else {
            continue;
        };
        // A thread may exit between the listing and the reads: skip it.
        let (Ok(name), Some((ns, slices))) = (std::fs::read_to_string(path.join("comm")), schedstat(&path))
        else {
            continue;
        };
        threads.insert(tid, ThreadStat { name: name.trim().to_string(), ns, slices });
    }
    Some(Sample { threads, me })
}

/// CPU time (nanoseconds) and time slices of each kind of thread between two samples.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RoleCpu {
    /// CPU nanoseconds per kind of thread.
    pub ns: Roles,
    /// Time slices per kind of thread: about how many times its threads woke.
    pub slices: Roles,
}

/// One count per kind of thread of a VM process.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Roles {
    /// The thread that took the samples.
    pub caller: u64,
    /// `eagervm-sched*` threads.
    pub scheduler: u64,
    /// `eagervm-worker*` threads.
    pub workers: u64,
    /// `eagervm-watch*` threads (asynchronous streams' event watchers).
    pub watchers: u64,
    /// Every other thread of the process (device threads, the driver's own).
    pub other: u64,
}

impl Roles {
    /// The count of the calling thread (`caller`), or of the kind of thread its name says.
    fn of(&mut self, caller: bool, name: &str) -> &mut u64 {
        if caller {
            &mut self.caller
        } else if name.starts_with("eagervm-sched") {
            &mut self.scheduler
        } else if name.starts_with("eagervm-worker") {
            &mut self.workers
        } else if name.starts_with("eagervm-watch") {
            &mut self.watchers
        } else {
            &mut self.other
        }
    }
}

impl Sample {
    /// CPU time and time slices of each kind of thread between `self` and `later`.
    /// Threads that started in between count from zero; those that exited in between are
    /// not seen.
    pub fn roles_until(&self, later: &Sample) -> RoleCpu {
        let mut out = RoleCpu::default();
        for (tid, t) in &later.threads {
            let (ns0, slices0) = self.threads.get(tid).map_or((0, 0), |b| (b.ns, b.slices));
            *out.ns.of(*tid == later.me, &t.name) += t.ns.saturating_sub(ns0);
            *out.slices.of(*tid == later.me, &t.name) += t.slices.saturating_sub(slices0);
        }
        out
    }

    /// CPU time per instruction each stage spent between `self` and `later`, over `n`
    /// instructions. Threads that started in between count from zero.
    pub fn stages_until(&self, later: &Sample, n: usize) -> StageCpu {
        self.stages_named(later, n, "eagervm-sched", "eagervm-worker")
    }

    /// [`stages_until`](Self::stages_until) for a pipeline whose middle stage's threads are
    /// named `middle*` and whose workers' are named `workers*` (the benchmark's floor:
    /// `floor-fwd` and `floor-work`).
    pub fn stages_named(&self, later: &Sample, n: usize, middle: &str, workers: &str) -> StageCpu {
        let mut out = StageCpu::default();
        for (tid, t) in &later.threads {
            let before = self.threads.get(tid).map_or(0, |b| b.ns);
            let d = t.ns.saturating_sub(before) as f64 / n.max(1) as f64;
            if *tid == later.me {
                out.caller += d;
            } else if t.name.starts_with(middle) {
                out.scheduler += d;
            } else if t.name.starts_with(workers) {
                out.workers += d;
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This thread's CPU time so far.
    fn thread_cpu() -> std::time::Duration {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: `ts` is a valid, writable timespec; the call only writes it.
        let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        assert_eq!(rc, 0, "the thread's CPU clock is readable");
        std::time::Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
    }

    /// Burn `d` of this thread's CPU time. Measured on the thread's own CPU clock, not the
    /// wall clock: on a loaded machine a wall-clock spin may get a fraction of a core.
    fn spin_cpu(d: std::time::Duration) {
        let start = thread_cpu();
        let mut x = 0u64;
        while thread_cpu() - start < d {
            for _ in 0..1000 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
            }
        }
    }

    #[test]
    fn the_calling_threads_work_is_counted_as_the_callers() {
        let before = sample().expect("/proc/self/task is readable on Linux");
        spin_cpu(std::time::Duration::from_millis(20));
        let after = sample().expect("sampled once already");
        // Other tests of this process may run VMs meanwhile: only the caller's share is
        // this test's to check (the attribution by name is checked below).
        let s = before.stages_until(&after, 1);
        assert!(s.caller >= 15e6, "20 ms of CPU time counted as {} ns", s.caller);
    }

    #[test]
    fn process_cpu_time_counts_every_thread() {
        let before = process_cpu().expect("the process CPU clock is readable on Unix");
        let spin = || spin_cpu(std::time::Duration::from_millis(20));
        // Two threads that have exited by the second reading still count.
        std::thread::scope(|s| {
            s.spawn(spin);
            s.spawn(spin);
        });
        let used = process_cpu().expect("read once already") - before;
        assert!(
            used >= std::time::Duration::from_millis(40),
            "two spins of 20 ms of CPU time counted as {used:?}"
        );
    }

    #[test]
    fn stages_are_told_apart_by_thread_name() {
        let at = |me: u64, threads: &[(u64, &str, u64)]| Sample {
            threads: threads
                .iter()
                .map(|&(tid, name, ns)| (tid, ThreadStat { name: name.to_string(), ns, slices: ns / 10 }))
                .collect(),
            me,
        };
        let before = at(
            1,
            &[(1, "eagervm", 100), (2, "eagervm-schedul", 50), (3, "eagervm-worker-", 10), (4, "other", 7)],
        );
        let after = at(
            1,
            &[
                (1, "eagervm", 300),
                (2, "eagervm-schedul", 150),
                (3, "eagervm-worker-", 60),
                (4, "other", 99),
                // A worker started between the samples counts from zero.
                (5, "eagervm-worker-", 40),
            ],
        );
        let s = before.stages_until(&after, 10);
        assert_eq!((s.caller, s.scheduler, s.workers), (20.0, 10.0, 9.0));
        // Other names for the two stages: `other` is now the middle one.
        let s = before.stages_named(&after, 10, "oth", "eagervm-worker");
        assert_eq!((s.caller, s.scheduler, s.workers), (20.0, 9.2, 9.0));
    }

    #[test]
    fn roles_count_time_and_slices_by_thread_name() {
        let at = |me: u64, threads: &[(u64, &str, u64, u64)]| Sample {
            threads: threads
                .iter()
                .map(|&(tid, name, ns, slices)| (tid, ThreadStat { name: name.to_string(), ns, slices }))
                .collect(),
            me,
        };
        let before =
            at(7, &[(7, "main", 100, 1), (8, "eagervm-watch-3", 10, 2), (9, "cuda-EvtHandlr", 5, 5)]);
        let after = at(
            7,
            &[
                (7, "main", 150, 4),
                (8, "eagervm-watch-3", 30, 12),
                (9, "cuda-EvtHandlr", 9, 6),
                (10, "eagervm-schedul", 70, 3),
                (11, "eagervm-worker-", 80, 8),
            ],
        );
        let r = before.roles_until(&after);
        let ns = (r.ns.caller, r.ns.scheduler, r.ns.workers, r.ns.watchers, r.ns.other);
        assert_eq!(ns, (50, 70, 80, 20, 4));
        let slices =
            (r.slices.caller, r.slices.scheduler, r.slices.workers, r.slices.watchers, r.slices.other);
        assert_eq!(slices, (3, 3, 8, 10, 1));
    }
}
