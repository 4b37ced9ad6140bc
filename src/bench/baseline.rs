//! The bound the VM is measured against: a bare three-thread pipeline.
//!
//! caller → forwarder → worker, each hand-off a batch (`Vec`) through a lock-free queue,
//! batches recycled through a pool, idle threads parked with the VM's own
//! [`Notifier`] protocol and spin length. Each item is as large as a small instruction
//! (64 bytes) and the worker calls a function through a pointer for every item, as the VM
//! calls a kernel. Nothing else: no dependence tracking, no per-item completion. Whatever
//! the VM does beyond this is its overhead.

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crossbeam_queue::SegQueue;

use crate::sync::notify::Notifier;

/// One pipeline item: a function and its argument, padded to 64 bytes.
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

/// Push `n` no-op items through the pipeline in batches of `batch`; returns the time from
/// the first push until the worker has run the last item.
pub fn run(n: usize, batch: usize, spin: u32) -> Duration {
    let batch = batch.max(1);
    let fwd = Stage::default();
    let work = Stage::default();
    let pool: SegQueue<Vec<Item>> = SegQueue::new();
    let done = AtomicUsize::new(0);
    let finished = Notifier::new();
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
            fwd.notify.wait(spin, || !fwd.queue.is_empty() || stop.load(Ordering::Acquire));
        });
        s.spawn(|| loop {
            if let Some(mut b) = work.queue.pop() {
                for it in b.iter() {
                    (it.f)(it.arg);
                }
                let k = b.len();
                b.clear();
                pool.push(b);
                if done.fetch_add(k, Ordering::AcqRel) + k == n {
                    finished.notify();
                }
                continue;
            }
            if stop.load(Ordering::Acquire) {
                break;
            }
            work.notify.wait(spin, || !work.queue.is_empty() || stop.load(Ordering::Acquire));
        });
        let t0 = Instant::now();
        let mut b = pool.pop().unwrap_or_else(|| Vec::with_capacity(batch));
        for i in 0..n {
            b.push(Item { f: noop, arg: i as u64 });
            if b.len() == batch {
                fwd.queue
                    .push(std::mem::replace(&mut b, pool.pop().unwrap_or_else(|| Vec::with_capacity(batch))));
                fwd.notify.notify();
            }
        }
        if !b.is_empty() {
            fwd.queue.push(b);
            fwd.notify.notify();
        }
        finished.wait(spin, || done.load(Ordering::Acquire) == n);
        let t = t0.elapsed();
        stop.store(true, Ordering::Release);
        fwd.notify.notify();
        work.notify.notify();
        t
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_item_arrives() {
        for n in [0, 1, 255, 256, 257, 10_000] {
            let t = super::run(n, 256, 16);
            assert!(t.as_secs() < 10, "{n} items took {t:?}");
        }
    }
}
