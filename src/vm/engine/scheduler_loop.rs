//! The scheduler thread's loop: what it takes from the completion channel and the inbox,
//! in which order, and when it sleeps and stops. What it does with each report and batch
//! is the scheduler's dependence logic (`vm::scheduler`), behind [`Dispatch`].
//!
//! # One loop
//!
//! 1. Every completion report handed over so far ([`Completions::drain`]): each retires
//!    what it reports and may release edges; then the instructions those releases freed are
//!    dispatched and the barriers whose streams are done run ([`Dispatch::completed`]).
//! 2. Up to [`INTAKE_PER_LOOP`] batches from the inbox, each numbered on receipt
//!    ([`Inbox::receive`], which holds a batch while a waiter's claim runs), so that
//!    completions, which free memory, interleave with intake.
//! 3. The loop's outgoing batches go to the workers, and what retired in it leaves the
//!    in-flight count ([`Dispatch::flush`], [`Inbox::retire`]).
//! 4. If the loop found anything, loop again. Otherwise stop if the inbox is closed and
//!    nothing is in flight (a drain: everything submitted before the close has run), or if
//!    the engine is dead; else sleep on the scheduler's bell until a report or a batch
//!    arrives, the drain completes or the engine dies ([`Inbox::sleep`]).
//!
//! Every producer pushes before it rings the bell, and the sleep re-checks every one of
//! those conditions under the `Notifier`'s protocol, so none is slept through.
//!
//! This file takes nothing from the crate but the `sync` facade and the engine's channels,
//! so that the loom model of the engine runs this loop as it is.

use crate::sync::notify::Backoff;

use super::completions::Completions;
use super::inbox::{Inbox, Observer, SchedulerEnd, Submission};

/// Batches taken from the inbox per loop, at most.
pub(crate) const INTAKE_PER_LOOP: usize = 4;

/// What the scheduler does with what its loop takes (module docs).
pub(crate) trait Dispatch<B, C> {
    /// A loop begins.
    fn begin(&mut self) {}
    /// One completion report.
    fn complete(&mut self, report: C);
    /// The loop's `n` reports (`n > 0`) are in: dispatch what they freed, run the barriers
    /// that are due.
    fn completed(&mut self, n: usize);
    /// One batch from the inbox, its first instruction numbered `first`.
    fn receive(&mut self, batch: B, first: u64);
    /// The loop took `n` instructions (`n > 0`) from the inbox.
    fn received(&mut self, _n: usize) {}
    /// Hand the loop's outgoing batches to the workers; returns how many instructions
    /// retired in the loop.
    fn flush(&mut self) -> usize;
    /// The loop ends; `busy`: it found something to do.
    fn end(&mut self, _busy: bool) {}
}

/// Run the scheduler's loop until the inbox is drained after its close, or the engine dies.
pub(crate) fn run<B, C, O, D>(
    inbox: &Inbox<B, O>,
    end: &mut SchedulerEnd,
    completions: &Completions<C>,
    backoff: Backoff,
    d: &mut D,
) where
    B: Submission,
    O: Observer<B>,
    D: Dispatch<B, C>,
{
    loop {
        d.begin();
        let n = completions.drain(|c| d.complete(c));
        if n > 0 {
            d.completed(n);
        }
        let mut busy = n > 0;
        let mut taken = 0;
        for _ in 0..INTAKE_PER_LOOP {
            let Some((batch, first)) = inbox.receive(end, backoff) else { break };
            taken += batch.len();
            d.receive(batch, first);
            busy = true;
        }
        if taken > 0 {
            d.received(taken);
        }
        let retired = d.flush();
        if retired > 0 {
            inbox.retire(retired);
        }
        d.end(busy);
        if busy {
            continue;
        }
        if inbox.drained() || inbox.died() {
            return;
        }
        inbox.sleep(end, backoff, || !completions.is_empty());
    }
}
