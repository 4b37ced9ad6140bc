//! A worker's queue: one producer hands work to one thread that sleeps while there is none.
//!
//! Each `ThreadCtx` worker has one, fed by the scheduler with dispatched batches
//! (`vm::thread_ctx`), and so has each asynchronous stream's watcher, fed by the worker that
//! launches on the stream with events to watch (`vm::stream_policy::event`).
//!
//! # Protocol
//!
//! 1. **Push** (the producer): queue the item, then ring the consumer's [`Notifier`], which
//!    makes a system call only if the consumer sleeps.
//! 2. **Serve** ([`WorkerQueue::serve`], the consumer's loop): take the oldest item and
//!    handle it; with none, if the stop flag is set, handle what is left and return, else
//!    sleep on the notifier until an item or the flag arrives.
//! 3. **Stop** ([`WorkerQueue::stop`], the producer, once nothing more will be pushed): set
//!    the flag, then ring. The consumer returns once it has handled every item pushed
//!    before the flag.
//!
//! # Memory ordering
//!
//! The queue publishes each item (release/acquire, `sync::queue`). The stop flag is stored
//! `Release` and loaded `Acquire`: a consumer that sees it sees every push made before it,
//! so its pop after that load finds them all. No stop is missed by a sleeper: the
//! notifier's fences order the flag's store before the sleeper's re-check or its wake-up
//! (`sync::notify`); `Release`/`Acquire` alone would not order that store before that load.
//! The loop checks the flag only after a pop found the queue empty, and once it sees the
//! flag it pops until the queue is empty before it returns: an item pushed between that
//! pop and the flag (the scheduler of a dead engine flushes, then stops its workers) is
//! still handled. An item pushed after the flag would be left: the producers stop a queue
//! only once nothing more is coming (the scheduler once its loop has ended, a worker once
//! every launch was reported).
//!
//! This file takes nothing from the crate but the `sync` facade, so that the loom model of
//! the engine compiles it as it is.

use crate::sync::notify::{Backoff, Notifier};
use crate::sync::queue::Queue;
use crate::sync::{AtomicBool, Ordering};

/// The queue of one consumer thread (module docs).
#[derive(Debug, Default)]
pub(crate) struct WorkerQueue<T> {
    queue: Queue<T>,
    bell: Notifier,
    stop: AtomicBool,
}

impl<T> WorkerQueue<T> {
    /// An empty queue.
    pub(crate) fn new() -> Self {
        WorkerQueue { queue: Queue::new(), bell: Notifier::new(), stop: AtomicBool::new(false) }
    }

    /// Hand `item` to the consumer (step 1).
    #[inline]
    pub(crate) fn push(&self, item: T) {
        self.queue.push(item);
        self.bell.notify();
    }

    /// Ask the consumer to return once it has handled everything pushed so far (step 3).
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.bell.notify();
    }

    /// Whether nothing is queued (a reading: an item may arrive right after).
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// The consumer's loop (step 2): handle each item with `f`, in order, until stopped.
    /// Idle, it re-checks as `backoff` says before it sleeps.
    #[inline]
    pub(crate) fn serve(&self, backoff: Backoff, mut f: impl FnMut(T)) {
        loop {
            if let Some(item) = self.queue.pop() {
                f(item);
                continue;
            }
            if self.stop.load(Ordering::Acquire) {
                // Pushed between the pop above and the flag: the pops after the `Acquire`
                // load find every item pushed before the flag.
                while let Some(item) = self.queue.pop() {
                    f(item);
                }
                return;
            }
            self.bell.wait(backoff, || !self.queue.is_empty() || self.stop.load(Ordering::Acquire));
        }
    }
}
