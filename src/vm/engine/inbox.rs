//! The inbox: where batches enter the engine, how many are in flight, and who takes them
//! out and numbers them.
//!
//! # Ends
//!
//! - **Producers**: any thread that holds the engine. [`Inbox::submit`] shows the batch to
//!   the submit observer, counts it in flight, queues it and rings the scheduler's bell;
//!   [`Inbox::throttle`] then blocks while too much is in flight (back-pressure,
//!   `vm::back_pressure`).
//! - **The scheduler's end** ([`SchedulerEnd`]: one per inbox, made with it and moved to the
//!   scheduler thread). [`Inbox::receive`] takes the oldest batch and numbers it; the
//!   scheduler retires what completes ([`Inbox::retire`]) and sleeps on the bell
//!   ([`Inbox::sleep`]) when nothing arrives. When the scheduler thread ends, its end
//!   leaves ([`Inbox::leave`]).
//! - **A waiter's claim** ([`Claim`]). A producer about to wait for its own batch may take
//!   the inbox over while nothing is in flight ([`Inbox::hand_off`]): it numbers its batch
//!   itself ([`Inbox::number`]), runs it on its own thread, adds the batches that follow it
//!   ([`Inbox::join_claim`]), and gives the inbox back ([`Inbox::end_claim`]).
//!
//! # Protocol
//!
//! 1. **Submit** (producer): if the inbox is dead or its consumer has left, hand the batch
//!    back (the caller buries it: nothing would run it). Otherwise, holding the observer's
//!    lock if one is attached (so that it sees batches in the order the scheduler receives
//!    them), show it the batch, add its length to the in-flight count
//!    (`BackPressure::admit`), push it, unlock, and ring the bell (`Notifier::notify`,
//!    which issues a `SeqCst` fence first). Then load `gone`: if the scheduler's end has
//!    left meanwhile, take whatever is queued and bury it.
//! 2. **Receive** (the scheduler's end): pop the oldest batch. If a claim is running
//!    (`BackPressure::inline_running`), hold it, sleeping on the bell, until the claim
//!    ends. Then number it: its first instruction gets the program number after the last
//!    one given out, and the counter moves past its last.
//! 3. **Claim** (a producer about to wait): holding the observer's lock, show the batch;
//!    if nothing is in flight and the inbox is alive, try to swap the in-flight word from
//!    exactly 0 to the claim bit (`BackPressure::try_claim_inline`). On failure, submit as
//!    in step 1. On success the claimant holds the program counter: it numbers its
//!    batches, runs them, and ends the claim (`BackPressure::end_inline`), ringing the bell
//!    if batches were admitted meanwhile (the scheduler holds them, step 2).
//! 4. **Die** ([`Inbox::kill`], whoever finds the engine unable to go on): set `dead`, ring
//!    the bell (the scheduler stops once idle) and wake the submitters blocked by
//!    back-pressure. Later submissions are handed back (step 1).
//! 5. **Leave** ([`Inbox::leave`], the scheduler thread as it ends): set `gone`, issue a
//!    `SeqCst` fence, then take whatever is queued and bury it.
//!
//! A batch is buried ([`Inbox::bury`]) by first letting go of what waiters wait for
//! ([`Submission::abandon`]: a host access's slot, which then answers `ShutDown`) and
//! keeping the rest until the inbox is dropped, after every engine thread has exited.
//!
//! # Why no batch is stranded
//!
//! A batch pushed after the scheduler's end left would never be received, and its waiter
//! would wait forever. The submitter pushes, fences (ringing the bell) and loads `gone`;
//! the leaving scheduler stores `gone`, fences and pops. In the total order of the two
//! `SeqCst` fences one comes first: if the submitter's does, the scheduler's pops, after
//! its own fence, find the batch; if the scheduler's does, the submitter's load sees
//! `gone` and it pops the batch itself (the store-then-load pattern of Dekker's algorithm,
//! as in the `Notifier`, whose documented fence in `notify` this relies on).
//!
//! # Memory ordering
//!
//! - The queue publishes a batch with release/acquire (`sync::queue`).
//! - The in-flight word and the claim: `vm::back_pressure`, whose module docs argue that
//!   whatever retired before a claim happens-before the claimant's work, and that the
//!   claimant's work happens-before whatever the scheduler receives after it.
//! - The program counter (`program`) is a plain cell handed between the scheduler's end
//!   and a claimant by those same orderings: the scheduler writes it only when it receives
//!   a batch, which it retires later with a `Release` read-modify-write of the word; a
//!   claim succeeds only on a word of 0, after every received batch has retired, reading
//!   from the release sequence of those retirements (`Acquire`). Inside the claim, the
//!   scheduler reads the counter only after an `Acquire` load found the claim bit clear,
//!   which synchronises with the claimant's `Release` clearing of it. So the two never
//!   touch the counter unordered; the loom model of the engine (`tests/loom/engine.rs`)
//!   checks it with loom's cell.
//! - `closing`: stored `Release` by [`Inbox::close`] after the closer's last submission;
//!   loaded `Acquire` by the scheduler, so that the in-flight count it reads after the load
//!   is no older than those submissions (`BackPressure::in_flight` says why a relaxed
//!   reading then suffices).
//! - `dead`: stored `SeqCst`, then the bell and the back-pressure lock are rung; every
//!   sleeper re-checks it after waking (the `Notifier`'s closure, or under the
//!   back-pressure lock), so none sleeps through it.
//! - `gone`: `SeqCst` fences on both sides (above).
//!
//! This file takes nothing from the crate but the `sync` facade and the back-pressure word,
//! so that the loom model compiles it as it is.

use std::sync::Arc;

use crate::sync::notify::{Backoff, Notifier};
use crate::sync::queue::Queue;
use crate::sync::{fence, AtomicBool, Mutex, MutexGuard, Ordering, UnsafeCell};
use crate::vm::back_pressure::BackPressure;

/// What the inbox carries: a batch of instructions.
pub(crate) trait Submission {
    /// How many instructions it holds: what it adds to the in-flight count.
    fn len(&self) -> usize;

    /// Let go of what a waiter waits for (host accesses answer that the engine is gone),
    /// keeping only what must outlive the engine's threads: the batch will never run.
    fn abandon(&mut self);
}

/// Sees every batch, in the order the scheduler receives them (`vm::observe`).
pub(crate) trait Observer<B>: Send {
    /// `batch` is about to be received.
    fn submitted(&mut self, batch: &B);
}

/// The scheduler's end of an inbox: whoever holds it receives the batches. One per inbox.
#[derive(Debug)]
pub(crate) struct SchedulerEnd(());

/// A waiter's hold on an inbox (protocol step 3): while it lives, the claimant, not the
/// scheduler, numbers batches, and the scheduler holds back what it receives. End it with
/// [`Inbox::end_claim`]; nothing else gives the inbox back.
#[must_use = "the scheduler receives nothing until the claim ends"]
#[derive(Debug)]
pub(crate) struct Claim(());

/// What [`Inbox::hand_off`] did with a batch.
pub(crate) enum Handed<B> {
    /// Queued for the scheduler.
    Submitted,
    /// The inbox is claimed for the caller, who runs the batch.
    Claimed(Claim, B),
    /// Nothing would run it: the caller buries it.
    Dead(B),
}

/// The inbox (module docs).
pub(crate) struct Inbox<B, O> {
    queue: Queue<B>,
    /// Instructions in flight, the submitters blocked on them, and the claim bit.
    bp: BackPressure,
    /// The last program number given out: the scheduler's end's, or a claimant's while it
    /// holds the claim (module docs, "Memory ordering").
    program: UnsafeCell<u64>,
    /// The scheduler's parking spot, which every producer rings.
    bell: Arc<Notifier>,
    /// Asked to finish what is in flight and stop (the engine handle's drop).
    closing: AtomicBool,
    /// The engine cannot go on (a thread it needs is missing, its scheduler panicked).
    dead: AtomicBool,
    /// The scheduler's end has left: nothing queued now will be received.
    gone: AtomicBool,
    /// Whether an observer is attached (read on every submission, without the lock).
    observing: AtomicBool,
    /// The attached observer; its lock also orders observation and queueing.
    observer: Mutex<Option<O>>,
    /// Batches that will never run, kept until the inbox drops (module docs).
    graveyard: Mutex<Vec<B>>,
}

// SAFETY: `program` is the only field that is not `Sync`; it is touched only by the holder
// of the scheduler's end or of a claim, which the protocol orders (module docs, "Memory
// ordering"). Everything else is `Sync` when `B` and `O` are `Send`.
unsafe impl<B: Send, O: Send> Sync for Inbox<B, O> {}
// SAFETY: as for `Sync`; the cell holds a plain number.
unsafe impl<B: Send, O: Send> Send for Inbox<B, O> {}

impl<B: Submission, O: Observer<B>> Inbox<B, O> {
    /// An empty inbox whose submitters block above `high_water` until `low_water`, ringing
    /// `bell` (the scheduler's), and its one scheduler's end.
    pub(crate) fn new(high_water: usize, low_water: usize, bell: Arc<Notifier>) -> (Self, SchedulerEnd) {
        let inbox = Inbox {
            queue: Queue::new(),
            bp: BackPressure::new(high_water, low_water),
            program: UnsafeCell::new(0),
            bell,
            closing: AtomicBool::new(false),
            dead: AtomicBool::new(false),
            gone: AtomicBool::new(false),
            observing: AtomicBool::new(false),
            observer: Mutex::new(None),
            graveyard: Mutex::new(Vec::new()),
        };
        (inbox, SchedulerEnd(()))
    }

    // ---- producers ----

    /// Hand `batch` to the scheduler (step 1); returns the instructions in flight after it,
    /// or the batch, which nothing would run, for the caller to [`bury`](Self::bury).
    #[inline]
    pub(crate) fn submit(&self, batch: B) -> Result<usize, B> {
        let seen = self.observe(&batch);
        self.push(batch, seen)
    }

    /// Block while too much is in flight: `admitted` is what [`submit`](Self::submit)
    /// returned (`BackPressure::throttle`). A dead inbox lets everyone go.
    #[inline]
    pub(crate) fn throttle(&self, admitted: usize) {
        self.bp.throttle(admitted, || self.is_dead());
    }

    /// Submit `batch` (`bounded`: and throttle), or, if nothing is in flight, claim the
    /// inbox for the caller to run it on its own thread (steps 1 and 3).
    pub(crate) fn hand_off(&self, batch: B, bounded: bool) -> Handed<B> {
        let seen = self.observe(&batch);
        // The load first: a busy engine's word is written by other cores, and a failing
        // compare-and-swap would take its cache line from them.
        if self.bp.in_flight() == 0 && !self.is_dead() && self.bp.try_claim_inline() {
            // The observer saw this batch before any a later submitter hands over: the
            // scheduler holds those back until the claim ends.
            drop(seen);
            return Handed::Claimed(Claim(()), batch);
        }
        match self.push(batch, seen) {
            Ok(now) => {
                if bounded {
                    self.throttle(now);
                }
                Handed::Submitted
            }
            Err(batch) => Handed::Dead(batch),
        }
    }

    /// Show `batch` to the observer and call `run` with its lock held: for a batch that
    /// runs on the caller's thread in synchronous mode, where there is no scheduler.
    pub(crate) fn observed<R>(&self, batch: B, run: impl FnOnce(B) -> R) -> R {
        let seen = self.observe(&batch);
        let r = run(batch);
        drop(seen);
        r
    }

    /// Step 1 once the observer has seen `batch` (`seen` holds its lock, if attached).
    #[inline]
    fn push(&self, batch: B, seen: Option<MutexGuard<'_, Option<O>>>) -> Result<usize, B> {
        if self.is_dead() {
            return Err(batch);
        }
        let now = self.bp.admit(batch.len());
        self.queue.push(batch);
        drop(seen);
        // The bell's `notify` issues a `SeqCst` fence before anything else: the
        // submitter's fence of "Why no batch is stranded" (module docs), so a submission
        // pays for one fence, not two.
        self.bell.notify();
        // A scheduler that left after the check above.
        if self.gone.load(Ordering::Relaxed) {
            self.bury_queued();
        }
        Ok(now)
    }

    /// Show `batch` to the attached observer; the guard returned keeps other submitters
    /// out until the batch is queued.
    #[inline]
    fn observe(&self, batch: &B) -> Option<MutexGuard<'_, Option<O>>> {
        if self.observing.load(Ordering::Relaxed) {
            self.observe_slow(batch)
        } else {
            None
        }
    }

    #[cold]
    fn observe_slow(&self, batch: &B) -> Option<MutexGuard<'_, Option<O>>> {
        let mut g = self.observer.lock();
        g.as_mut()?.submitted(batch);
        Some(g)
    }

    /// Attach (`Some`) or detach (`None`) the observer; returns the one detached.
    pub(crate) fn set_observer(&self, observer: Option<O>) -> Option<O> {
        let mut g = self.observer.lock();
        self.observing.store(observer.is_some(), Ordering::Relaxed);
        std::mem::replace(&mut *g, observer)
    }

    // ---- a waiter's claim ----

    /// The program number of the first of `n` instructions the claimant runs next; the
    /// counter moves past the last.
    #[inline]
    pub(crate) fn number(&self, _claim: &mut Claim, n: usize) -> u64 {
        // SAFETY: a claim exists only after the claim succeeded, and until it ends the
        // scheduler's end does not touch the counter (module docs, "Memory ordering"); the
        // `&mut Claim` makes this the only access on the claimant's side.
        self.program.with_mut(|p| unsafe { advance(p, n) })
    }

    /// `batch` joins the claimed run (it runs after the claimed batch, on the claimant's
    /// thread): the observer sees it.
    pub(crate) fn join_claim(&self, _claim: &Claim, batch: &B) {
        drop(self.observe(batch));
    }

    /// Give the inbox back to the scheduler (step 3's end).
    pub(crate) fn end_claim(&self, claim: Claim) {
        let Claim(()) = claim;
        if self.bp.end_inline() {
            self.bell.notify();
        }
    }

    // ---- the scheduler's end ----

    /// Take the oldest batch, and the program number of its first instruction (step 2):
    /// `None` if nothing is queued. While a claim runs, wait for it to end first.
    #[inline]
    pub(crate) fn receive(&self, _end: &mut SchedulerEnd, backoff: Backoff) -> Option<(B, u64)> {
        let batch = self.queue.pop()?;
        if self.bp.inline_running() {
            self.hold(backoff);
        }
        let n = batch.len();
        // SAFETY: the scheduler's end is unique and borrowed mutably here, and no claim
        // runs: it found the claim bit clear with an `Acquire` load after the batch was
        // admitted (module docs, "Memory ordering").
        let first = self.program.with_mut(|p| unsafe { advance(p, n) });
        Some((batch, first))
    }

    #[cold]
    fn hold(&self, backoff: Backoff) {
        self.bell.wait(backoff, || !self.bp.inline_running());
    }

    /// `n` instructions left flight (the scheduler thread: once per loop, and before it runs
    /// a barrier's callback, so that whoever the barrier wakes finds nothing in flight that
    /// finished before the barrier).
    #[inline]
    pub(crate) fn retire(&self, n: usize) {
        self.bp.retire(n);
    }

    /// Sleep on the bell until a batch is queued, `more()` is true (reports to handle), the
    /// inbox is [`drained`](Self::drained), or it is dead.
    pub(crate) fn sleep(&self, _end: &SchedulerEnd, backoff: Backoff, more: impl Fn() -> bool) {
        // Shutdown with work in flight is not a reason to wake: the completions of that work
        // are (the drain sleeps as any wait does).
        self.bell.wait(backoff, || more() || !self.queue.is_empty() || self.drained() || self.is_dead());
    }

    /// The scheduler's end leaves (step 5): what is queued now or later is buried.
    pub(crate) fn leave(&self, end: SchedulerEnd) {
        let SchedulerEnd(()) = end;
        self.gone.store(true, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        self.bury_queued();
    }

    // ---- the engine's life ----

    /// Ask the scheduler to finish what is in flight and stop: call after the last
    /// submission it must run.
    pub(crate) fn close(&self) {
        self.closing.store(true, Ordering::Release);
        self.bell.notify();
    }

    /// Whether [`close`](Self::close) was called and nothing is in flight.
    #[inline]
    pub(crate) fn drained(&self) -> bool {
        self.closing.load(Ordering::Acquire) && self.bp.in_flight() == 0
    }

    /// The engine cannot go on (step 4).
    pub(crate) fn kill(&self) {
        self.dead.store(true, Ordering::SeqCst);
        self.bell.notify();
        self.bp.wake_all();
    }

    /// Whether nothing will run what is submitted now: the engine died or its scheduler
    /// left.
    #[inline]
    pub(crate) fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire) || self.gone.load(Ordering::Acquire)
    }

    /// Whether the engine died (not merely stopped after a drain).
    #[inline]
    pub(crate) fn died(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }

    /// Keep a batch that will never run (module docs).
    pub(crate) fn bury(&self, mut batch: B) {
        batch.abandon();
        if batch.len() > 0 {
            self.graveyard.lock().push(batch);
        }
    }

    fn bury_queued(&self) {
        while let Some(batch) = self.queue.pop() {
            self.bury(batch);
        }
    }

    /// Instructions submitted and not yet retired (a reading that orders nothing).
    #[inline]
    pub(crate) fn in_flight(&self) -> usize {
        self.bp.in_flight()
    }
}

/// Give out `n` program numbers after `*p`: returns the first and moves `*p` to the last.
///
/// # Safety
/// `p` points to the inbox's counter, and the caller holds it (the scheduler's end outside
/// a claim, or the claim).
#[inline(always)]
unsafe fn advance(p: *mut u64, n: usize) -> u64 {
    // SAFETY: the caller holds the counter (the function's contract).
    let p = unsafe { &mut *p };
    let first = *p + 1;
    *p += n as u64;
    first
}
