//! The bound the VM is measured against: a bare three-thread pipeline.
//!
//! caller → forwarder → worker, each hand-off a batch (`Vec`) through a lock-free queue,
//! idle threads parked with the VM's own [`Notifier`] protocol and [`Backoff`]. Each item is
//! as large as an instruction of the VM (64 bytes, one cache line; a test keeps the two
//! sizes equal), so the pipeline moves the same bytes per item as the VM moves per
//! instruction of up to three operands, and the worker calls a function through a pointer
//! for every item, as the VM calls a kernel. Like the VM, it starts its threads once and
//! keeps them across runs (a run that started threads would pay for that, which the VM's
//! runs do not, and on short runs it dominates: `docs/performance.md`, "Why the hot paths
//! are shaped so", has the measurement), keeps its emptied batches for reuse, and holds its
//! caller back above the same high-water mark of items in flight until they fall to the
//! low-water mark, so that its memory stays bounded and a run never waits on the system
//! for fresh pages. Nothing else: no checks, no dependence tracking, no per-item
//! completion. Whatever the VM does beyond this is its overhead; the floor
//! (`src/bench/floor.rs`), built on the same machinery, measures how much of that any
//! dependency-tracking runtime has to do.

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_queue::SegQueue;

use crate::sync::notify::{Backoff, Notifier};

/// One pipeline item: a function and its argument, padded to an instruction's size and
/// alignment (one cache line).
#[derive(Clone, Copy)]
#[repr(align(64))]
struct Item {
    f: fn(u64),
    arg: u64,
}

fn noop(x: u64) {
    black_box(x);
}

/// One stage's inbox: batches, and the notifier its thread sleeps on.
struct Stage<T> {
    queue: SegQueue<Vec<T>>,
    notify: Notifier,
}

impl<T> Default for Stage<T> {
    fn default() -> Self {
        Stage { queue: SegQueue::new(), notify: Notifier::new() }
    }
}

/// What the caller and the pipeline's two threads share.
struct Shared<T> {
    backoff: Backoff,
    /// Emptied batches, for reuse.
    pool: SegQueue<Vec<T>>,
    fwd: Stage<T>,
    work: Stage<T>,
    /// Items the worker has run since the pipeline started (runs follow one another, so a
    /// run's own count is this less its value when the run began).
    done: AtomicUsize,
    /// The caller sleeps here when too much is in flight, and when it waits for the end.
    caller: Notifier,
    stop: AtomicBool,
}

/// The machinery of a three-stage pipeline of items `T`: the caller makes each item, a
/// forwarder thread sees each batch and hands it on, a worker thread runs each batch, all
/// with the VM's batch size, backoff and water marks. Threads start once and are kept, and
/// emptied batches are kept for reuse, from one run to the next; dropping it stops and
/// joins its threads. [`Pipeline`] passes items through untouched; the floor of
/// [`super::floor`] does a minimal runtime's work at each stage.
pub(crate) struct Stages<T: Send + 'static> {
    batch: usize,
    high_water: usize,
    low_water: usize,
    shared: Arc<Shared<T>>,
    threads: Vec<JoinHandle<()>>,
}

impl<T: Send + 'static> Stages<T> {
    /// Start the two threads, named `<name>-fwd` and `<name>-work`: the forwarder calls
    /// `forward` on each batch before handing it on, the worker calls `work` on it. The
    /// arguments after `backoff` are the VM's `Config` fields of the same names. Fails if
    /// a thread cannot be started.
    pub(crate) fn start(
        name: &str,
        batch: usize,
        backoff: Backoff,
        high_water: usize,
        low_water: usize,
        forward: impl FnMut(&[T]) + Send + 'static,
        work: impl FnMut(&[T]) + Send + 'static,
    ) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            backoff,
            pool: SegQueue::new(),
            fwd: Stage::default(),
            work: Stage::default(),
            done: AtomicUsize::new(0),
            caller: Notifier::new(),
            stop: AtomicBool::new(false),
        });
        let mut p = Stages { batch: batch.max(1), high_water, low_water, shared, threads: Vec::new() };
        let s = p.shared.clone();
        let t =
            std::thread::Builder::new().name(format!("{name}-fwd")).spawn(move || forwarder(&s, forward))?;
        p.threads.push(t);
        let s = p.shared.clone();
        let t = std::thread::Builder::new().name(format!("{name}-work")).spawn(move || worker(&s, work))?;
        p.threads.push(t);
        Ok(p)
    }

    fn take(&self) -> Vec<T> {
        self.shared.pool.pop().unwrap_or_else(|| Vec::with_capacity(self.batch))
    }

    /// Push `n` items, item `i` made by `make(i)`, through the pipeline; returns the time
    /// from the first push until the worker has run the last item.
    #[inline(always)]
    pub(crate) fn run(&mut self, n: usize, mut make: impl FnMut(usize) -> T) -> Duration {
        let sh = &*self.shared;
        let base = sh.done.load(Ordering::Acquire);
        let done = || sh.done.load(Ordering::Acquire) - base;
        let t0 = Instant::now();
        let mut b = self.take();
        let mut sent = 0;
        for i in 0..n {
            b.push(make(i));
            if b.len() == self.batch {
                sent += b.len();
                sh.fwd.queue.push(std::mem::replace(&mut b, self.take()));
                sh.fwd.notify.notify();
                if sent - done() > self.high_water {
                    sh.caller.wait(sh.backoff, || sent - done() <= self.low_water);
                }
            }
        }
        if !b.is_empty() {
            sh.fwd.queue.push(b);
            sh.fwd.notify.notify();
        } else {
            sh.pool.push(b);
        }
        sh.caller.wait(sh.backoff, || done() == n);
        t0.elapsed()
    }

    /// Items the worker has run since the pipeline started.
    #[cfg(test)]
    pub(crate) fn done(&self) -> usize {
        self.shared.done.load(Ordering::Acquire)
    }

    /// Emptied batches kept for reuse.
    #[cfg(test)]
    fn pooled(&self) -> usize {
        self.shared.pool.len()
    }
}

impl<T: Send + 'static> Drop for Stages<T> {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.fwd.notify.notify();
        self.shared.work.notify.notify();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// The forwarder: calls `forward` on each batch, then hands it on.
fn forwarder<T>(sh: &Shared<T>, mut forward: impl FnMut(&[T])) {
    loop {
        if let Some(b) = sh.fwd.queue.pop() {
            forward(&b);
            sh.work.queue.push(b);
            sh.work.notify.notify();
            continue;
        }
        if sh.stop.load(Ordering::Acquire) {
            break;
        }
        sh.fwd.notify.wait(sh.backoff, || !sh.fwd.queue.is_empty() || sh.stop.load(Ordering::Acquire));
    }
}

/// The worker: calls `work` on each batch, then counts the batch done.
fn worker<T>(sh: &Shared<T>, mut work: impl FnMut(&[T])) {
    loop {
        if let Some(mut b) = sh.work.queue.pop() {
            work(&b);
            let k = b.len();
            b.clear();
            sh.pool.push(b);
            sh.done.fetch_add(k, Ordering::AcqRel);
            sh.caller.notify();
            continue;
        }
        if sh.stop.load(Ordering::Acquire) {
            break;
        }
        sh.work.notify.wait(sh.backoff, || !sh.work.queue.is_empty() || sh.stop.load(Ordering::Acquire));
    }
}

/// A bare pipeline with the VM's batch size, backoff and water marks: the forwarder hands
/// each batch on untouched, the worker calls each item's function.
pub struct Pipeline {
    stages: Stages<Item>,
}

impl Pipeline {
    /// A pipeline handing items over in batches of `batch`, its idle threads waiting as
    /// `backoff` says before they sleep, and holding the caller back above `high_water`
    /// items in flight until they fall to `low_water` (the VM's `Config` fields of the same
    /// names). Fails if its threads cannot be started.
    pub fn new(batch: usize, backoff: Backoff, high_water: usize, low_water: usize) -> std::io::Result<Self> {
        let run = |b: &[Item]| {
            for it in b {
                (it.f)(it.arg);
            }
        };
        let stages = Stages::start("baseline", batch, backoff, high_water, low_water, |_: &[Item]| {}, run)?;
        Ok(Pipeline { stages })
    }

    /// Push `n` no-op items through the pipeline; returns the time from the first push
    /// until the worker has run the last item.
    pub fn run(&mut self, n: usize) -> Duration {
        self.stages.run(n, |i| Item { f: noop, arg: i as u64 })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_item_arrives_and_memory_stays_bounded() {
        let mut p = Pipeline::new(256, Backoff::DEFAULT, 4096, 1024).expect("threads start");
        let mut total = 0;
        for n in [0, 1, 255, 256, 257, 100_000] {
            let t = p.run(n);
            assert!(t.as_secs() < 10, "{n} items took {t:?}");
            total += n;
            assert_eq!(p.stages.done(), total, "every item ran");
        }
        // At most high water in flight, plus the batch being filled and one in each stage.
        let pooled = p.stages.pooled();
        assert!(pooled <= 4096 / 256 + 4, "{pooled} batches pooled");
    }

    #[test]
    fn an_item_is_as_large_as_an_instruction() {
        use crate::vm::instruction::INSTRUCTION_LAYOUT;
        assert_eq!((std::mem::size_of::<Item>(), std::mem::align_of::<Item>()), INSTRUCTION_LAYOUT);
    }
}
