//! The completion channel: reports from the workers and watchers to the scheduler.
//!
//! # Ends
//!
//! - **Producers**: the workers (a synchronous stream's "done through p" once per batch, an
//!   asynchronous stream's "launched") and the watchers (an asynchronous stream's "done
//!   through p" per event). Each fills a list taken from the channel's pool
//!   ([`Completions::take`]) and hands it over whole ([`Completions::report`]), which
//!   rings the scheduler's bell.
//! - **The consumer**: the scheduler thread, which takes every list handed over so far
//!   ([`Completions::drain`]) and gives the emptied lists back to the pool, so that a
//!   report costs no allocation once the pool is warm.
//!
//! Reports of one producer arrive in the order it handed them over (one queue, FIFO); those
//! of different producers in any order. The scheduler's sleep counts a non-empty channel
//! as a reason to wake (`Inbox::sleep`'s `more`), and a producer pushes before it rings,
//! so no report is left unread (the `Notifier`'s protocol).
//!
//! # Memory ordering
//!
//! A list is published by the queue (release on push, acquire on pop, `sync::queue`): the
//! scheduler sees everything a worker did before reporting, which is how a kernel's writes
//! happen-before whatever the scheduler lets run after it.
//!
//! This file takes nothing from the crate but the `sync` facade, so that the loom model of
//! the engine compiles it as it is.

use std::sync::Arc;

use crate::sync::notify::Notifier;
use crate::sync::queue::Queue;

/// The completion channel (module docs), carrying reports of type `C`.
pub(crate) struct Completions<C> {
    queue: Queue<Vec<C>>,
    /// Emptied lists, for producers to fill again.
    pool: Queue<Vec<C>>,
    /// The scheduler's parking spot.
    bell: Arc<Notifier>,
    /// The capacity of a new list.
    capacity: usize,
}

impl<C> Completions<C> {
    /// An empty channel whose new lists hold `capacity` reports, ringing `bell` (the
    /// scheduler's).
    pub(crate) fn new(capacity: usize, bell: Arc<Notifier>) -> Self {
        Completions { queue: Queue::new(), pool: Queue::new(), bell, capacity }
    }

    /// An empty list to fill with reports (producers).
    #[inline]
    pub(crate) fn take(&self) -> Vec<C> {
        self.pool.pop().unwrap_or_else(|| Vec::with_capacity(self.capacity))
    }

    /// Hand `reports` to the scheduler (producers).
    #[inline]
    pub(crate) fn report(&self, reports: Vec<C>) {
        self.queue.push(reports);
        self.bell.notify();
    }

    /// Call `f` on every report handed over so far, in order per producer; returns how many
    /// there were (the scheduler).
    #[inline]
    pub(crate) fn drain(&self, mut f: impl FnMut(C)) -> usize {
        let mut n = 0;
        while let Some(mut list) = self.queue.pop() {
            n += list.len();
            for c in list.drain(..) {
                f(c);
            }
            self.pool.push(list);
        }
        n
    }

    /// Whether no report waits (a reading: one may arrive right after).
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }
}
