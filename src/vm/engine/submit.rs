//! Submission: the paths by which a caller's batch reaches an executor, on the caller's
//! thread.
//!
//! | path | when | who runs the batch |
//! | --- | --- | --- |
//! | [`submit`] | a builder's batch | the scheduler and the workers; the caller then waits while too much is in flight (back-pressure) |
//! | [`submit_unbounded`] | `Release`s | as `submit`, without the wait; on an idle engine, this thread ([`hand_off`]) |
//! | [`hand_off`] | a batch whose end the caller waits for next (a host access, a barrier) | on an idle engine, this thread, through a claim of the inbox; otherwise as `submit` |
//! | any of them, in synchronous mode | `Config::synchronous` | this thread, at once, under each stream's policy |
//!
//! A batch that nothing would run (the engine died, or its scheduler left) is buried
//! (`Inbox::bury`): its host accesses answer `ShutDown`.
//!
//! # A waiter runs its own work
//!
//! A caller that hands over a batch and then waits for its last instruction pays for two
//! threads' wake-ups (the scheduler's, then a worker's) before its result comes back; one
//! that runs it pays for neither. So when nothing is in flight, [`hand_off`] claims the
//! inbox for the caller (`engine/inbox.rs`, step 3) and returns a [`Handoff`] holding the
//! claim: the caller is then the inbox's consumer. [`Handoff::finish`] numbers the claimed
//! batches through the claim, runs each instruction under its stream's policy as
//! synchronous mode does, and ends the claim, after which the scheduler receives what
//! others submitted meanwhile. The claim is taken only when nothing is in flight, so the
//! batch cannot overtake earlier work, and only for batches a thread waits for next or that
//! only free memory, so the engine's asynchrony is kept for everything else
//! (`docs/architecture.md`, "A waiter runs its own work").
//!
//! Which batches may run on a waiter: calls, releases, host accesses and barriers, on the
//! streams the stream table marks (`StreamTable::runs_inline`: synchronous, not
//! collective, not where the flight recorder keeps every stream's instructions), and
//! nothing while a profiling session is open, so that the timeline shows everything.
//!
//! The hand-off holds the engine's parts as its caller does ([`PartsHold`]): borrowed, or
//! through a counted handle, so that an owned builder's hand-off outlives nothing it
//! borrows.

use std::sync::Arc;

use smallvec::SmallVec;

use super::super::instruction::{Batch, Body};
use super::super::stream_policy::kind::StreamPolicy;
use super::super::stream_policy::run_inline;
use super::inbox::{Claim, Handed};
use super::parts::Parts;

/// Hand `batch` to the scheduler (or run it, in synchronous mode); block while too much is
/// in flight.
#[inline]
pub(crate) fn submit(parts: &Parts, batch: Batch) {
    if let Some(now) = enqueue(parts, batch) {
        parts.inbox.throttle(now);
    }
}

/// Hand `batch` over without waiting for back-pressure: for `Release`s, which only free
/// memory, so that the thread that drops a handle does not block on other threads' work.
/// On an idle engine they run on this thread at once instead ([`hand_off`]): a handle
/// dropped between round trips would otherwise keep the engine busy just long enough that
/// the next waiter finds it so.
pub(crate) fn submit_unbounded(parts: &Parts, batch: Batch) {
    if batch.is_empty() {
        parts.recycle(batch);
    } else if parts.inbox.in_flight() == 0 {
        hand_off(PartsHold::Borrowed(parts), batch, false).finish();
    } else {
        enqueue(parts, batch);
    }
}

/// Submit `batch`, whose end the caller waits for next, or claim the inbox to run it on
/// this thread when the hand-off finishes (module docs); `bounded`: wait for back-pressure
/// when it is handed over.
pub(crate) fn hand_off(parts: PartsHold<'_>, batch: Batch, bounded: bool) -> Handoff<'_> {
    let p: &Parts = &parts;
    if p.config.synchronous || batch.is_empty() || !may_run_inline(p, &batch) {
        if let (Some(now), true) = (enqueue(p, batch), bounded) {
            p.inbox.throttle(now);
        }
        return Handoff { parts, claim: None, absorbing: false, batches: SmallVec::new() };
    }
    let (claim, batches) = match p.inbox.hand_off(batch, bounded) {
        Handed::Claimed(claim, batch) => (Some(claim), SmallVec::from_iter([batch])),
        Handed::Submitted => (None, SmallVec::new()),
        Handed::Dead(batch) => {
            p.inbox.bury(batch);
            (None, SmallVec::new())
        }
    };
    Handoff { absorbing: claim.is_some(), parts, claim, batches }
}

/// Queue `batch` for the scheduler, or run it now in synchronous mode; returns how many
/// instructions are in flight after it, if it was queued.
fn enqueue(parts: &Parts, batch: Batch) -> Option<usize> {
    if parts.config.synchronous {
        run_synchronously(parts, batch);
        return None;
    }
    match parts.inbox.submit(batch) {
        Ok(now) => Some(now),
        Err(batch) => {
            parts.inbox.bury(batch);
            None
        }
    }
}

/// Synchronous mode: run each instruction of `batch` on this thread, in order, under its
/// stream's policy, numbered from the engine's count of them.
#[cold]
fn run_synchronously(parts: &Parts, batch: Batch) {
    parts.inbox.observed(batch, |mut batch| {
        batch.drain_each(|ins, ops, _| run_inline(parts, ins, ops, parts.next_synchronous()));
        parts.recycle(batch);
    });
}

/// Whether every instruction of `batch` may run on a waiter's thread (module docs).
fn may_run_inline(parts: &Parts, batch: &Batch) -> bool {
    !parts.timeline.is_on()
        && batch.ins.iter().all(|ins| match ins.body {
            Body::Barrier { .. } => true,
            Body::OpCall { .. } | Body::Release { .. } | Body::Read(_) | Body::Write(_) | Body::Wait(_) => {
                parts.streams.runs_inline(ins.stream.index())
            }
            Body::RecordEvent { .. } | Body::StreamWaitEvent { .. } | Body::WaitEvent { .. } => false,
        })
}

/// The engine's parts as a hand-off or a builder holds them: borrowed for a lifetime, or
/// through a counted handle of its own (a builder that owns its handle:
/// `framework::builder`).
pub(crate) enum PartsHold<'e> {
    /// Borrowed for `'e`.
    Borrowed(&'e Parts),
    /// A counted handle, kept as long as the holder lives.
    Owned(Arc<Parts>),
}

impl std::ops::Deref for PartsHold<'_> {
    type Target = Parts;
    #[inline(always)]
    fn deref(&self) -> &Parts {
        match self {
            PartsHold::Borrowed(p) => p,
            PartsHold::Owned(p) => p,
        }
    }
}

/// What [`hand_off`] did with a batch: handed it to the scheduler, or claimed the inbox to
/// run it on this thread (module docs). Finish it with [`finish`](Self::finish).
#[must_use = "a claimed batch runs when the hand-off is finished"]
pub(crate) struct Handoff<'e> {
    parts: PartsHold<'e>,
    /// The claim of the inbox, while this thread holds it.
    claim: Option<Claim>,
    /// Whether [`follow`](Self::follow) may still add batches to the claimed run: once one
    /// went to the scheduler, later ones must too, to keep program order.
    absorbing: bool,
    /// The claimed batches, in program order.
    batches: SmallVec<[Batch; 2]>,
}

impl Handoff<'_> {
    /// Submit `batch` (`Release`s that follow the handed-off batch, without waiting for
    /// back-pressure): into the claimed run when it may run there, else to the scheduler.
    pub(crate) fn follow(&mut self, batch: Batch) {
        let p: &Parts = &self.parts;
        match &self.claim {
            Some(claim) if self.absorbing && !batch.is_empty() && may_run_inline(p, &batch) => {
                p.inbox.join_claim(claim, &batch);
                self.batches.push(batch);
            }
            _ => {
                self.absorbing = false;
                submit_unbounded(p, batch);
            }
        }
    }

    /// Whether this thread holds the claim: the batch runs here, in
    /// [`finish`](Self::finish). (The Python binding's waits ask.)
    #[cfg_attr(not(feature = "python"), allow(dead_code))]
    pub(crate) fn is_claimed(&self) -> bool {
        self.claim.is_some()
    }

    /// Run the claimed batches, if any, and give the inbox back to the scheduler.
    pub(crate) fn finish(mut self) {
        self.run();
    }

    /// [`finish`](Self::finish)'s work.
    fn run(&mut self) {
        let Some(mut claim) = self.claim.take() else { return };
        let p: &Parts = &self.parts;
        for mut batch in self.batches.drain(..) {
            let first = p.inbox.number(&mut claim, batch.len());
            batch.number_from(first);
            batch.drain_each(|ins, ops, program| {
                if !StreamPolicy::on_scheduler(&ins.body) {
                    p.flight.ran_inline(ins.stream.index(), 1);
                }
                run_inline(p, ins, ops, program);
            });
            p.recycle(batch);
        }
        p.inbox.end_claim(claim);
    }
}

impl Drop for Handoff<'_> {
    /// A hand-off dropped unfinished (a panic unwinding through its caller) still runs what
    /// it claimed: the batches were accepted, and what others submitted meanwhile must run
    /// after them.
    fn drop(&mut self) {
        self.run();
    }
}
