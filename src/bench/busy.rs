//! Competition for the CPU: `eagervm bench --busy K` measures its workloads beside `K` busy
//! loops, and every report says how many ran and the machine's 1-minute load average at the
//! start and the end (`docs/performance.md`, "Under contention").
//!
//! Each competitor is a child process running a POSIX shell's `while :; do :; done`
//! ([`BUSY_LOOP`]): it never sleeps and makes no system call in its loop, so it wants a whole
//! core for as long as it runs. Processes, not threads of this one, because:
//!
//! - the question is how the VM fares beside *other programs* that want the CPU: another
//!   process shares no allocator, address space or cache lines with the VM, and the
//!   scheduler weighs it as it weighs any program started from the same shell (with
//!   autogroup scheduling, the competitors share the bench's group, as programs started
//!   beside it from the same session would);
//! - the bench's own accounting stays its own: `cpu::process_cpu` (the whole process's CPU
//!   time, used by `bench --cuda`) would count competitor threads, and a thread listing of
//!   `/proc/self/task` would hold them;
//! - the peer harness (`benches/peers/compare.py`) starts the very same command around
//!   PyTorch's harness, so both sides of a ratio run beside the same competition.
//!
//! [`Competitors`] is a guard: dropping it kills and reaps every competitor, so they stop
//! whatever way the measurement ends (an error, an early return, a panic that unwinds). On
//! Linux each competitor is also told to die with the thread that started it, so that a
//! bench killed outright leaves no busy loop behind.

use std::io;
use std::process::{Child, Command, Stdio};

/// The program each competitor runs: a shell's empty loop. `:` is a builtin, so the loop
/// runs in user space without a system call, never sleeping.
pub const BUSY_LOOP: [&str; 3] = ["sh", "-c", "while :; do :; done"];

/// `K` running busy loops; dropping the guard stops them all.
///
/// Start it and drop it on the same thread: on Linux the competitors die when the thread
/// that started them exits (`PR_SET_PDEATHSIG`), which would end them early if that thread
/// ended before the guard did.
#[derive(Debug)]
pub struct Competitors {
    children: Vec<Child>,
}

impl Competitors {
    /// Start `k` busy loops (none for `k = 0`). If one cannot be started, those already
    /// started are stopped before the error is returned.
    pub fn start(k: usize) -> io::Result<Competitors> {
        // Built up in the guard itself, so that an error part-way drops (stops) the others.
        let mut guard = Competitors { children: Vec::with_capacity(k) };
        for _ in 0..k {
            guard.children.push(spawn()?);
        }
        Ok(guard)
    }

    /// How many competitors run.
    pub fn len(&self) -> usize {
        self.children.len()
    }

    /// Whether none runs (`--busy 0`).
    pub fn is_empty(&self) -> bool {
        self.children.is_empty()
    }

    /// The competitors' process ids.
    pub fn pids(&self) -> Vec<u32> {
        self.children.iter().map(Child::id).collect()
    }
}

impl Drop for Competitors {
    fn drop(&mut self) {
        // Every kill first, then every wait: the competitors stop together rather than one
        // after another's reaping, and each is reaped so that none is left as a zombie.
        for c in &mut self.children {
            let _ = c.kill();
        }
        for c in &mut self.children {
            let _ = c.wait();
        }
    }
}

/// Start one busy loop, its standard streams closed so that it can neither read the bench's
/// input nor write into its report.
fn spawn() -> io::Result<Child> {
    let mut cmd = Command::new(BUSY_LOOP[0]);
    cmd.args(&BUSY_LOOP[1..]).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt as _;
        // SAFETY: the closure runs in the child between fork and exec and calls only
        // `prctl`, `getppid` and `raise`, which are async-signal-safe; it allocates nothing.
        let parent = std::process::id() as libc::pid_t;
        unsafe {
            cmd.pre_exec(move || {
                // Die with the starting thread, even if the bench is killed without unwinding.
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(io::Error::last_os_error());
                }
                // The parent may have died before the call above: then nobody would stop us.
                if libc::getppid() != parent {
                    libc::raise(libc::SIGKILL);
                }
                Ok(())
            });
        }
    }
    cmd.spawn()
}

/// The 1-minute load average from `/proc/loadavg`, or `None` where it cannot be read (not
/// Linux, no `/proc`). Being an average over the last minute, a reading at the start of a
/// run says what the machine was doing before it.
pub fn load_average() -> Option<f64> {
    parse_load_average(&std::fs::read_to_string("/proc/loadavg").ok()?)
}

/// The first field of `/proc/loadavg`'s text (`1.64 1.39 1.56 3/99 801`).
fn parse_load_average(text: &str) -> Option<f64> {
    text.split_whitespace().next()?.parse().ok().filter(|x: &f64| x.is_finite() && *x >= 0.0)
}

/// The conditions a figure was measured under, carried by every line of `eagervm bench
/// --json`.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Conditions {
    /// How many busy loops ran beside the measurement (`--busy`).
    pub busy: usize,
    /// The 1-minute load average when the measurement began; absent where it cannot be read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub load_1m_start: Option<f64>,
    /// The 1-minute load average when it ended; absent where it cannot be read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub load_1m_end: Option<f64>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    /// A process's user and system CPU time in clock ticks, or `None` once it is gone
    /// (reaped). A zombie still has a `stat` file, so a competitor killed but not reaped is
    /// seen here, as state `Z`.
    fn stat(pid: u32) -> Option<(char, u64)> {
        let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // `pid (comm) state ...`: the fields after the command's closing parenthesis.
        let fields: Vec<&str> = text[text.rfind(')')? + 1..].split_whitespace().collect();
        let state = fields.first()?.chars().next()?;
        let (utime, stime): (u64, u64) = (fields.get(11)?.parse().ok()?, fields.get(12)?.parse().ok()?);
        Some((state, utime + stime))
    }

    /// Whether `pid` is a process started by this one (a reused id would belong to another
    /// parent).
    fn ours(pid: u32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).ok().is_some_and(|text| {
            let fields: Vec<&str> = text[text.rfind(')').unwrap_or(0) + 1..].split_whitespace().collect();
            fields.get(1).and_then(|p| p.parse::<u32>().ok()) == Some(std::process::id())
        })
    }

    #[test]
    fn two_competitors_burn_cpu_and_none_outlives_the_guard() {
        let guard = Competitors::start(2).expect("sh starts");
        assert_eq!(guard.len(), 2);
        let pids = guard.pids();
        // Each must burn CPU time, not merely exist: 5 ticks (50 ms at the usual 100 Hz) each.
        // On a loaded machine a competitor gets a share of a core, hence the generous wait.
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let ticks: Vec<u64> =
                pids.iter().map(|&p| stat(p).expect("a competitor runs while the guard lives").1).collect();
            if ticks.iter().all(|&t| t >= 5) {
                break;
            }
            assert!(Instant::now() < deadline, "competitors {pids:?} used only {ticks:?} ticks in 20 s");
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(pids.iter().all(|&p| ours(p)), "the competitors are this process's children");
        drop(guard);
        for p in pids {
            assert!(!ours(p), "competitor {p} outlived its guard: {:?}", stat(p));
        }
    }

    #[test]
    fn the_guard_stops_its_competitors_when_the_measurement_panics() {
        let (tx, rx) = std::sync::mpsc::channel();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
            let guard = Competitors::start(2).expect("sh starts");
            tx.send(guard.pids()).unwrap();
            panic!("a measurement failed (this test's panic, on purpose)");
        }));
        assert!(r.is_err());
        let pids = rx.recv().unwrap();
        assert_eq!(pids.len(), 2);
        for p in pids {
            assert!(!ours(p), "competitor {p} outlived a panic: {:?}", stat(p));
        }
    }

    #[test]
    fn zero_competitors_start_nothing() {
        let guard = Competitors::start(0).unwrap();
        assert!(guard.is_empty() && guard.pids().is_empty());
    }

    #[test]
    fn the_load_average_is_the_first_field() {
        assert_eq!(parse_load_average("1.64 1.39 1.56 3/99 801\n"), Some(1.64));
        assert_eq!(parse_load_average(""), None);
        assert_eq!(parse_load_average("x 1 2"), None);
        assert_eq!(parse_load_average("-1 0 0"), None);
        if std::path::Path::new("/proc/loadavg").exists() {
            assert!(load_average().is_some(), "/proc/loadavg exists but was not read");
        }
    }

    #[test]
    fn conditions_leave_out_an_unread_load() {
        let c = Conditions { busy: 2, load_1m_start: Some(1.5), load_1m_end: None };
        let v = serde_json::to_value(c).unwrap();
        assert_eq!(v, serde_json::json!({"busy": 2, "load_1m_start": 1.5}));
    }
}
