//! The bound the VM is measured against: a bare three-thread pipeline.
//!
//! caller → forwarder → worker, each hand-off a batch (`Vec`) through a lock-free queue,
//! idle threads parked with the VM's own [`Notifier`] protocol and spin length. Each item is
//! as large as an instruction of the VM (64 bytes, one cache line; a test keeps the two
//! sizes equal), so the pipeline moves the same bytes per item as the VM moves per
//! instruction of up to three operands, and the worker calls a function through a pointer
//! for every item, as the VM calls a kernel. Like the VM, it keeps its emptied batches for reuse (a [`Pipeline`] keeps
//! them across runs) and holds its caller back above the same high-water mark of items in
//! flight until they fall to the low-water mark, so that its memory stays bounded and a run
//! never waits on the system for fresh pages. Nothing else: no checks, no dependence
//! tracking, no per-item completion. Whatever the VM does beyond this is its overhead.

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crossbeam_queue::SegQueue;

use crate::sync::notify::Notifier;

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

#[derive(Default)]
struct Stage {
    queue: SegQueue<Vec<Item>>,
    notify: Notifier,
}

/// A bare pipeline with the VM's batch size, spin length and water marks; its batches are
/// reused from one run to the next.
pub struct Pipeline {
    batch: usize,
    spin: u32,
    high_water: usize,
    low_water: usize,
    pool: SegQueue<Vec<Item>>,
}

impl Pipeline {
    /// A pipeline handing items over in batches of `batch`, spinning `spin` times before a
    /// thread sleeps, and holding the caller back above `high_water` items in flight until
    /// they fall to `low_water` (the VM's `Config` fields of the same names).
    pub fn new(batch: usize, spin: u32, high_water: usize, low_water: usize) -> Self {
        Pipeline { batch: batch.max(1), spin, high_water, low_water, pool: SegQueue::new() }
    }

    fn take(&self) -> Vec<Item> {
        self.pool.pop().unwrap_or_else(|| Vec::with_capacity(self.batch))
    }

    /// Push `n` no-op items through the pipeline; returns the time from the first push
    /// until the worker has run the last item.
    pub fn run(&self, n: usize) -> Duration {
        let fwd = Stage::default();
        let work = Stage::default();
        let done = AtomicUsize::new(0);
        // The caller sleeps here when too much is in flight, and when it waits for the end.
        let caller = Notifier::new();
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| loop {
                if let Some(b) = fwd.queue.pop() {
                    work.queue.push(b);
                    work.notify.notify();
                    continue;
                }
                if stop.load(Ordering::Acquire) {
                    break;
                }
                fwd.notify.wait(self.spin, || !fwd.queue.is_empty() || stop.load(Ordering::Acquire));
            });
            s.spawn(|| loop {
                if let Some(mut b) = work.queue.pop() {
                    for it in b.iter() {
                        (it.f)(it.arg);
                    }
                    let k = b.len();
                    b.clear();
                    self.pool.push(b);
                    done.fetch_add(k, Ordering::AcqRel);
                    caller.notify();
                    continue;
                }
                if stop.load(Ordering::Acquire) {
                    break;
                }
                work.notify.wait(self.spin, || !work.queue.is_empty() || stop.load(Ordering::Acquire));
            });
            let t0 = Instant::now();
            let mut b = self.take();
            let mut sent = 0;
            for i in 0..n {
                b.push(Item { f: noop, arg: i as u64 });
                if b.len() == self.batch {
                    sent += b.len();
                    fwd.queue.push(std::mem::replace(&mut b, self.take()));
                    fwd.notify.notify();
                    if sent - done.load(Ordering::Acquire) > self.high_water {
                        caller.wait(self.spin, || sent - done.load(Ordering::Acquire) <= self.low_water);
                    }
                }
            }
            if !b.is_empty() {
                fwd.queue.push(b);
                fwd.notify.notify();
            } else {
                self.pool.push(b);
            }
            caller.wait(self.spin, || done.load(Ordering::Acquire) == n);
            let t = t0.elapsed();
            stop.store(true, Ordering::Release);
            fwd.notify.notify();
            work.notify.notify();
            t
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_item_arrives_and_memory_stays_bounded() {
        let p = Pipeline::new(256, 16, 4096, 1024);
        for n in [0, 1, 255, 256, 257, 100_000] {
            let t = p.run(n);
            assert!(t.as_secs() < 10, "{n} items took {t:?}");
        }
        // At most high water in flight, plus the batch being filled and one in each stage.
        assert!(p.pool.len() <= 4096 / 256 + 4, "{} batches pooled", p.pool.len());
    }

    #[test]
    fn an_item_is_as_large_as_an_instruction() {
        use crate::vm::instruction::Instruction;
        assert_eq!(std::mem::size_of::<Item>(), std::mem::size_of::<Instruction>());
        assert_eq!(std::mem::align_of::<Item>(), std::mem::align_of::<Instruction>());
    }
}
