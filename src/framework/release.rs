//! When a tensor's `Release` may be submitted.
//!
//! Instructions point to their tensors without a reference count (`vm::instruction`,
//! `TensorPtr`): the tensor's `Release`, ordered after every instruction that uses it, owns
//! the object. That order holds only if the `Release` enters the scheduler's inbox after
//! those instructions. A builder's batch is submitted every `batch_size` calls, so when the
//! last handle of a tensor drops, some builder (on this thread or another) may still hold
//! unsubmitted instructions that use it (an eager `Context` keeps one open between its
//! flushes). This module holds such a `Release` back until every batch
//! that was open when the tensor was released has been submitted.
//!
//! # Protocol
//!
//! A VM keeps a clock (an atomic counter), one *slot* per live builder and per live eager
//! context, a count of *busy* slots (open ones) and a list of *pending* releases.
//!
//! 1. **Builder, opening a batch** (before it checks the first call after a submission):
//!    count itself busy, tick the clock, store the tick in its slot (the batch's *start*),
//!    and issue a `SeqCst` fence; only then check the call's operands (whether each is
//!    released) and write its instructions. A batch is submitted only between calls, so
//!    every instruction of a call goes into the batch its checks were made in.
//! 2. **Builder, after submitting a batch** (pushed into the inbox): store *idle* in its
//!    slot, count itself not busy, then, if releases are pending, *drain* them.
//! 3. **Releaser** (the thread where the last handle dropped, or where `Array::release`
//!    marked the tensor released): issue a `SeqCst` fence; if no slot is busy, submit the
//!    `Release` at once. Otherwise tick the clock, giving the release its *tag*; add it to
//!    the pending list; then drain.
//! 4. **Drain**: the smallest start over all slots bounds what may go: every pending release
//!    whose tag is below it is taken out of the list and submitted.
//!
//! An eager context (`eager::context`) is a builder kept open between its flushes: its
//! batch is open from the checks of the first call built after a flush (step 1) until the
//! flush puts it in the inbox (step 2). (The protocol also admits a context that queues
//! calls it checked and builds them at its flush, as contexts once did; the loom model
//! keeps that case.)
//!
//! # Why the order holds
//!
//! *Last handle dropped.* Let builder B hold an unsubmitted use of tensor T when T's last
//! handle drops on thread X. B wrote that use while it had a handle of T, so: B's start
//! tick (step 1) happens before the use, which happens before B's handle of T dropped,
//! which happens before X's last drop (the reference count's release/acquire pair, as in
//! `Arc`), which happens before X ticks the clock. Ticks are read-modify-writes of one
//! atomic, and coherence orders them as happens-before does, so B's start is below X's
//! tag; and X sees B busy (the same chain carries B's busy count to X's acquire load). A
//! drain submits the release only after reading B's slot as idle or as a start above the
//! tag, with an acquire load of a value B stored with release ordering after pushing its
//! batch (step 2, or a later step 1): the batch is in the inbox before the `Release`. A
//! batch that starts after the tag cannot use T: no handle of it is left.
//!
//! *Explicit releases* (`Array::release`, MXNet's `DeleteVariable`): X marks T released
//! while other handles of it live on. A builder B on another thread may hold one and be
//! checking a call with T at that moment, and no handle's drop orders B before X. What
//! orders them is the check: B opens its batch (step 1), fences, and only then loads T's
//! `released` flag for each call it checks; X stores the flag, fences (step 3) and then
//! loads `busy`. In the single total order of the two fences one comes first. If X's does,
//! every load of the flag in B's batch sees it, and B refuses each call with T. If B's
//! does, X's load sees B's busy count (or a later value; a zero then comes from B's own
//! close, after its push, which the acquire load synchronises with), X's tick reads a clock
//! at or after B's start, so B's start is below the tag, and a drain after X's fence reads
//! B's slot as that start, as idle or as a later start: the release waits for B's batch.
//! Checking before opening, or closing a batch between a call's check and its
//! instructions, would lose this (a model in `tests/loom/release.rs` plants the first).
//!
//! *Contexts.* A context that queued checked calls, with its slot open from before their
//! checks until its flush's batch is in the inbox, could build them at the flush without
//! checking `released` again: a flag set since a call was accepted belongs to a release
//! that waits for the flush, by the argument above.
//!
//! # Why no release is forgotten
//!
//! A pending release waits for some builder's step 2. If that builder already passed its
//! check of the pending count before the release was added, the releaser's own drain (step
//! 3) finds the builder's slot idle or newer. This is the store-then-load pattern of
//! Dekker's algorithm, made safe by a `SeqCst` fence on each side, as in the notifier
//! (`crate::sync::notify`): the builder stores its slot, fences, and loads the pending
//! count; the releaser adds to the pending count, fences, and loads the slots. In the single
//! total order of the two fences, one comes first, and the load after the other fence sees
//! the store before it. `tests/loom/release.rs` checks both properties under loom, on every
//! interleaving, for builders and contexts, releases by a last handle and explicit ones.
//! (Loom models `SeqCst` fences but not `SeqCst` loads and stores, which it treats as
//! acquire/release: one more reason to state the protocol with fences.)
//!
//! # Memory ordering, field by field
//!
//! - `clock`: relaxed read-modify-writes; only their coherence order is used.
//! - `busy`: incremented before the use (sequenced before, so carried by the handle's
//!   release/acquire chain, and before the opener's fence), decremented with release
//!   ordering after the push; loaded with acquire ordering after the releaser's fence.
//! - slot `start`: stored with release ordering (after the push, for idle), loaded with
//!   acquire ordering after the releaser's fence.
//! - `pending_len`: changed under the pending lock, loaded by the builder after its fence.
//! - a tensor's `released` flag (`framework::tensor`): relaxed; ordered by the opener's
//!   fence and the releaser's fence.
//!
//! # Cost
//!
//! Nothing per instruction; per batch, three atomic operations and a fence to open and
//! three and a fence to close. A handle dropped while a slot is busy takes a fence, one
//! tick and two uncontended locks. The price of the rule: a release waits until each busy
//! builder submits its current batch (at most `batch_size` calls, or its `flush`, or the
//! end of its `run`; an eager context's, at most
//! `flush_every` calls, or its next read, wait, sync, `tensor`, `release` or drop). Memory
//! is held that long, never longer.

use std::collections::VecDeque;

use smallvec::SmallVec;

use crate::sync::{fence, Arc, AtomicU64, AtomicUsize, Mutex, Ordering};

/// Releases that may be submitted now (usually none or one: no allocation).
pub(crate) type Ready<T> = SmallVec<[T; 4]>;

/// A slot's value while its builder's batch is empty.
const IDLE: u64 = u64::MAX;

/// One builder's slot: the start tick of its open batch, or [`IDLE`].
#[derive(Debug)]
pub(crate) struct Slot {
    start: AtomicU64,
}

/// The release rule's shared state (one per VM), generic over what is released so that the
/// loom model can drive it with plain values.
#[derive(Debug)]
pub(crate) struct Releases<T> {
    clock: AtomicU64,
    /// Every slot ever handed out, and whether a builder holds it now.
    slots: Mutex<Vec<(Arc<Slot>, bool)>>,
    busy: AtomicUsize,
    /// Held-back releases with their tags, in increasing tag order, so that a drain takes a
    /// prefix and finds in one comparison that nothing may go (the common case while a
    /// batch is open: a drain per dropped handle must not scan them all).
    pending: Mutex<VecDeque<(u64, T)>>,
    pending_len: AtomicUsize,
}

impl<T> Default for Releases<T> {
    fn default() -> Self {
        Releases {
            clock: AtomicU64::new(0),
            slots: Mutex::new(Vec::new()),
            busy: AtomicUsize::new(0),
            pending: Mutex::new(VecDeque::new()),
            pending_len: AtomicUsize::new(0),
        }
    }
}

impl<T> Releases<T> {
    /// A slot for a new builder (an idle one).
    pub(crate) fn register(&self) -> Arc<Slot> {
        let mut slots = self.slots.lock();
        if let Some((s, used)) = slots.iter_mut().find(|(_, used)| !*used) {
            *used = true;
            return s.clone();
        }
        let s = Arc::new(Slot { start: AtomicU64::new(IDLE) });
        slots.push((s.clone(), true));
        s
    }

    /// Give back a builder's slot; its batch must be closed.
    pub(crate) fn unregister(&self, slot: &Arc<Slot>) {
        debug_assert_eq!(slot.start.load(Ordering::Relaxed), IDLE, "a builder left a batch open");
        let mut slots = self.slots.lock();
        if let Some(e) = slots.iter_mut().find(|(s, _)| Arc::ptr_eq(s, slot)) {
            e.1 = false;
        }
    }

    /// Step 1: the builder (or context) owning `slot` is about to check the first call of a
    /// batch (its operands' `released` flags) and write it.
    #[inline]
    pub(crate) fn open(&self, slot: &Slot) {
        self.busy.fetch_add(1, Ordering::Relaxed);
        let tick = self.clock.fetch_add(1, Ordering::Relaxed);
        slot.start.store(tick, Ordering::Release);
        // Explicit releases: the opening comes before the checks of `released` flags that
        // follow, for a releaser that set one and then looks at `busy` (module docs).
        fence(Ordering::SeqCst);
    }

    /// Step 2: the builder owning `slot` has pushed its batch into the inbox. Returns the
    /// releases that may go now (usually none), for the caller to submit.
    #[inline]
    pub(crate) fn close(&self, slot: &Slot) -> Ready<T> {
        slot.start.store(IDLE, Ordering::Release);
        self.busy.fetch_sub(1, Ordering::Release);
        fence(Ordering::SeqCst);
        if self.pending_len.load(Ordering::Relaxed) > 0 {
            self.drain()
        } else {
            Ready::new()
        }
    }

    /// Step 3: `t` is released (its `released` flag is set). Gives it back if it may be
    /// submitted now, with any other releases that may go; else keeps it for a later drain.
    pub(crate) fn release(&self, t: T) -> Ready<T> {
        // Explicit releases: the flag was set before this, and a builder that opened after
        // this fence sees it (module docs).
        fence(Ordering::SeqCst);
        if self.busy.load(Ordering::Acquire) == 0 {
            return SmallVec::from_iter([t]);
        }
        let tag = self.clock.fetch_add(1, Ordering::Relaxed);
        {
            let mut pending = self.pending.lock();
            // Tags come from one counter, so they arrive in order unless two threads
            // release at once.
            if pending.back().is_none_or(|&(last, _)| last < tag) {
                pending.push_back((tag, t));
            } else {
                let at = pending.partition_point(|&(other, _)| other < tag);
                pending.insert(at, (tag, t));
            }
            self.pending_len.store(pending.len(), Ordering::Relaxed);
        }
        fence(Ordering::SeqCst);
        self.drain()
    }

    /// Step 3 for several tensors whose last handles dropped on this thread (the releases
    /// a builder deferred, `framework::deferred`), with one fence and one tag for them all:
    /// each gets the tag it would have got had its release been made now, one by one, and a
    /// later tag only makes a release wait for more batches. Hands `now` each release that
    /// may be submitted at once.
    pub(crate) fn release_all(&self, ts: impl Iterator<Item = T>, mut now: impl FnMut(T)) {
        fence(Ordering::SeqCst);
        if self.busy.load(Ordering::Acquire) == 0 {
            ts.for_each(now);
            return;
        }
        let tag = self.clock.fetch_add(1, Ordering::Relaxed);
        {
            let mut pending = self.pending.lock();
            if pending.back().is_none_or(|&(last, _)| last < tag) {
                pending.extend(ts.map(|t| (tag, t)));
            } else {
                let first = pending.partition_point(|&(other, _)| other < tag);
                for (at, t) in (first..).zip(ts) {
                    pending.insert(at, (tag, t));
                }
            }
            self.pending_len.store(pending.len(), Ordering::Relaxed);
        }
        fence(Ordering::SeqCst);
        self.drain().into_iter().for_each(&mut now);
    }

    /// Step 4: take out every pending release older than every open batch.
    fn drain(&self) -> Ready<T> {
        let mut pending = self.pending.lock();
        if pending.is_empty() {
            return Ready::new();
        }
        let oldest_open = {
            let slots = self.slots.lock();
            slots.iter().map(|(s, _)| s.start.load(Ordering::Acquire)).min().unwrap_or(IDLE)
        };
        // The releases older than every open batch: a prefix, as tags are in order.
        let k = pending.partition_point(|&(tag, _)| tag < oldest_open);
        if k == 0 {
            return Ready::new();
        }
        let ready: Ready<T> = pending.drain(..k).map(|(_, t)| t).collect();
        self.pending_len.store(pending.len(), Ordering::Relaxed);
        ready
    }

    /// Take every pending release, whatever is open (the VM is shutting down and no
    /// builder is left).
    pub(crate) fn take_all(&self) -> Vec<T> {
        let mut pending = self.pending.lock();
        self.pending_len.store(0, Ordering::Relaxed);
        pending.drain(..).map(|(_, t)| t).collect()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_release_waits_for_the_batches_open_when_it_was_made() {
        let r: Releases<&str> = Releases::default();
        let (a, b) = (r.register(), r.register());
        assert_eq!(r.release("free").as_slice(), ["free"], "nothing open: at once");
        r.open(&a);
        assert!(r.release("t").is_empty(), "a's batch may use t");
        r.open(&b); // opened after t's release: cannot use t
        assert_eq!(r.close(&a).as_slice(), ["t"]);
        assert!(r.release("u").is_empty(), "b's batch may use u");
        r.open(&a);
        assert!(r.close(&a).is_empty(), "b is still open");
        assert_eq!(r.close(&b).as_slice(), ["u"]);
        assert!(r.take_all().is_empty(), "nothing is left waiting");
        r.unregister(&a);
        r.unregister(&b);
        let c = r.register();
        assert!(Arc::ptr_eq(&c, &a) || Arc::ptr_eq(&c, &b), "slots are reused");
    }
}
