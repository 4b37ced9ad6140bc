//! Back-pressure: the count of instructions in flight, and the wait of a submitter that
//! put too many there.
//!
//! A submitter adds each batch to the count before it hands the batch to the scheduler; the
//! scheduler subtracts what retires. A submitter that finds the count above `high_water`
//! after adding its batch blocks until the count falls to `low_water` or below, or until the
//! VM dies. There may be many such submitters at once, and they wait for a count to fall,
//! not for work to arrive, so they wait on a lock and condition variable of their own rather
//! than on a [`Notifier`](crate::sync::notify::Notifier).
//!
//! # Protocol
//!
//! One atomic word, `state`, holds two counts: the instructions in flight in its low
//! [`COUNT_BITS`] bits, and the submitters registered as waiting in the bits above.
//!
//! 1. **Admit** ([`BackPressure::admit`], submitter): add the batch's length to the word,
//!    in one read-modify-write. The count after it is what `admit` returns. The caller then
//!    puts the batch where the scheduler will receive it.
//! 2. **Throttle** ([`BackPressure::throttle`], submitter): if that count is above
//!    `high_water`, register (add one waiter to the word), take the lock, and, while the
//!    count read from the word is above `low_water` and the VM is not dead, wait on the
//!    condition variable, which releases the lock while the thread sleeps. Then release the
//!    lock and deregister (take the waiter back out of the word).
//! 3. **Retire** ([`BackPressure::retire`], scheduler): subtract what retired from the word,
//!    in one read-modify-write. The word it returns (the value before) gives both the count
//!    after the subtraction and whether anyone is registered; only if the count is at or
//!    below `low_water` and someone is registered, take the lock and wake every waiter.
//! 4. **Die** ([`BackPressure::wake_all`], whoever finds the VM dead): set the VM's dead
//!    flag (the caller's, read by the `dead` closure of step 2), then take the lock and
//!    wake every waiter.
//!
//! 5. **Claim** ([`BackPressure::try_claim_inline`], a caller about to wait for its own
//!    batch): compare-and-swap the word from exactly 0 (nothing in flight, nobody waiting) to
//!    [`INLINE`]. On success the caller runs its batch on its own thread instead of handing
//!    it over (`vm::engine`, "Running a waiter's work on its thread"); on failure it hands
//!    the batch over as usual.
//! 6. **End the claim** ([`BackPressure::end_inline`], the claimant): clear [`INLINE`] in one
//!    read-modify-write; if the count it returns is not 0, batches were admitted meanwhile,
//!    and the claimant wakes the scheduler.
//! 7. **Hold** ([`BackPressure::inline_running`], the scheduler, after taking a batch from
//!    the inbox): while [`INLINE`] is set, receive nothing; sleep until the claimant wakes it.
//!    Other submitters never wait for a claim: they admit and hand over as usual.
//!
//! So admitting costs one atomic read-modify-write, and retiring one read-modify-write
//! and, while nobody waits, nothing else: no lock and no load.
//!
//! # Memory ordering
//!
//! Steps 1–4 access `state` with `Relaxed` (retiring with `Release`, for step 5, which
//! costs nothing more on x86-64 or AArch64's read-modify-writes). Nothing is published through the word: a batch
//! reaches the scheduler through the inbox, a queue with its own release/acquire pairs,
//! and a waiter reads nothing the scheduler wrote but the count. What the argument below
//! needs is coherence (the accesses to one atomic have one modification order, a
//! read-modify-write reads the last value before its own in that order, and a thread never
//! reads a value older than one it has read or written itself), which every ordering gives,
//! and the lock, whose release and acquisition order the critical sections. Access by
//! access:
//!
//! - `admit`'s `fetch_add` (step 1): `Relaxed`. The count it returns, the one compared with
//!   `high_water`, is the word's latest value whatever the ordering.
//! - The registration's `fetch_add` (step 2): `Relaxed`. What matters is which of it and a
//!   retirement comes first in the word's modification order (below).
//! - The waiter's load of the count, under the lock (step 2): `Relaxed`. It follows the
//!   registration in program order, so it reads the registration's value or a later one;
//!   and it follows, through the lock, any waker's critical section before it.
//! - `retire`'s `fetch_sub` (step 3): `Relaxed`, for the registration's reason. Its old
//!   value tells whether anyone waits, with no second access.
//! - The deregistration's `fetch_sub` (step 2): `Relaxed`. A retirement that reads the
//!   word from before it takes the lock and wakes nobody: a cost, not a loss.
//! - [`BackPressure::in_flight`]: `Relaxed`, a reading. The scheduler's end-of-run check
//!   (nothing in flight once `shutdown` is set) needs no more: the thread that set
//!   `shutdown` admitted everything it submitted before its `Release` store of the flag,
//!   which the scheduler's `Acquire` load synchronises with, so the count it reads after that
//!   load is no older than those admissions.
//! - The VM's dead flag (not in this type; read by the `dead` closure): any ordering. It is
//!   read under the lock and set before [`BackPressure::wake_all`] takes the lock (below).
//!
//! *Why no wake-up is lost.* The scenario to prevent, step by step:
//!
//! 1. a submitter, above `high_water`, takes the lock and reads a count above `low_water`;
//! 2. the scheduler retires, the count falls to `low_water`, and it finds nobody
//!    registered, so it takes no lock and wakes nobody;
//! 3. the submitter waits on the condition variable; if nothing else retires (the
//!    scheduler has nothing left), it sleeps forever.
//!
//! The registration and the retirement are read-modify-writes of the same word, so one
//! comes first in its modification order, and the other reads a value that includes it:
//!
//! - *Registration first.* The retirement's read includes the registration (the
//!   deregistration comes only after the wait), so step 2 finds someone registered, takes
//!   the lock and wakes every waiter. The submitter holds the lock only between taking it
//!   and sleeping, and the condition variable releases it and sleeps in one step; so the
//!   scheduler's wake-up either finds it asleep and wakes it, or comes before it took the
//!   lock, and then the submitter's read of the count comes after the scheduler released
//!   the lock (the lock's release/acquire pair), hence after the retirement: it reads the
//!   fallen count or a later one, and does not sleep on the old one.
//! - *Retirement first.* The registration reads the word after the retirement, and the
//!   submitter's read of the count, later in its own program order, reads that word or a
//!   later one: step 1 cannot read the count from before the retirement.
//!
//! "A later one" may be above `low_water` again, if other submitters have admitted since;
//! the submitter then sleeps until a later retirement brings the count down, and the same
//! argument holds for that one.
//!
//! The dead flag needs no registration: the waiter reads it (through `dead`) under the
//! lock, and [`BackPressure::wake_all`] always takes the lock, after the flag is set. So
//! either the waiter reads the flag after `wake_all` released the lock, and sees it set,
//! or it read the flag before `wake_all` took the lock, and then it is asleep when the
//! wake-up comes.
//!
//! *The inline claim.* Three orderings, each a release/acquire pair through the word:
//!
//! - *What retired before the claim happens-before the claimant's work.* A worker's writes
//!   reach the scheduler through its completion queue (release/acquire), and the scheduler
//!   retires them with a `Release` read-modify-write. The claim is an `Acquire`
//!   compare-and-swap that reads the word at 0, the value the last retirement wrote or a
//!   later one written by read-modify-writes (every write to the word is one), so it reads
//!   from the release sequence of every retirement before it and synchronises with each.
//! - *The claim excludes the scheduler.* The count is 0 when the claim succeeds, so every
//!   batch admitted before it has retired, which the scheduler does only after receiving it;
//!   a batch admitted after it has its count added to a word with [`INLINE`] set.
//! - *The claimant's work happens-before what the scheduler receives after it.* The
//!   scheduler takes a batch from the inbox, which orders the batch's admission before it,
//!   and then loads the word with `Acquire`. Its load reads the admission's value or a later
//!   one. If [`INLINE`] is set there, it holds until a later `Acquire` load finds it clear; a
//!   value with it clear that follows the claim in the word's modification order is the
//!   `Release` clearing's, or one a later read-modify-write wrote, in that clearing's release
//!   sequence. Either way the load synchronises with the clearing.
//!
//! The wake-up after a hold goes through the scheduler's `Notifier`, whose protocol
//! (`sync::notify`) loses none: the claimant clears the bit (publishes) and then notifies.
//!
//! *Why one word.* With the two counts in two atomics, the same argument is the
//! store-then-load pattern of Dekker's algorithm (register, then read the count; retire,
//! then read the registrations), which needs the four accesses `SeqCst`, or a `SeqCst`
//! fence on each side as `Notifier` has. loom regards `SeqCst` accesses as `AcqRel`, and
//! reports that protocol as losing the wake-up that the C++ model forbids; the fence would
//! add a barrier instruction to every retirement. In one word, coherence alone closes the window,
//! loom checks it as it is, and a retirement learns whether anyone waits from the value its
//! read-modify-write returns, without a second access.
//!
//! The word's width bounds both counts: 2^40 instructions in flight (each holds at least
//! its own allocation, so memory runs out long before) and 2^23 waiting submitters (one per
//! thread), below the claim's bit. Debug builds check both.
//!
//! `tests/loom/back_pressure.rs` checks the protocol under loom: this file takes nothing
//! from the crate but [`crate::sync`], so that the model can compile it alone.

use crate::sync::{AtomicU64, Condvar, Mutex, Ordering};

/// The bits of `state` that count instructions in flight; the bits above count waiters.
pub(crate) const COUNT_BITS: u32 = 40;

/// One waiter, as added to `state`.
const WAITER: u64 = 1 << COUNT_BITS;

/// The count's bits of `state`.
const COUNT_MASK: u64 = WAITER - 1;

/// The top bit of `state`: a caller is running work on its own thread (the inline claim).
pub(crate) const INLINE: u64 = 1 << 63;

/// The waiters' bits of `state`.
const WAITERS_MASK: u64 = !COUNT_MASK & !INLINE;

/// The in-flight count and the wait of submitters above high water (see the module docs).
#[derive(Debug)]
pub(crate) struct BackPressure {
    /// Instructions in flight (low [`COUNT_BITS`] bits) and registered waiters (the rest).
    state: AtomicU64,
    /// Held by a waiter from its check of the count to its sleep, and by a waker while it
    /// wakes: the check and the sleep are one step for a waker.
    lock: Mutex<()>,
    cv: Condvar,
    high_water: usize,
    low_water: usize,
}

impl BackPressure {
    /// Nothing in flight; a submitter that takes the count above `high_water` waits until it
    /// falls to `low_water` or below (`low_water < high_water`).
    pub(crate) fn new(high_water: usize, low_water: usize) -> Self {
        debug_assert!(low_water < high_water, "low_water {low_water} is not below high_water {high_water}");
        debug_assert!((high_water as u64) < COUNT_MASK, "high_water {high_water} does not fit the count");
        BackPressure {
            state: AtomicU64::new(0),
            lock: Mutex::new(()),
            cv: Condvar::new(),
            high_water,
            low_water,
        }
    }

    /// Count `n` more instructions in flight (step 1); returns the count after adding them.
    /// Call before the instructions can reach the scheduler, so that it never retires
    /// instructions not yet counted.
    #[inline]
    pub(crate) fn admit(&self, n: usize) -> usize {
        let old = self.state.fetch_add(n as u64, Ordering::Relaxed);
        let now = (old & COUNT_MASK) + n as u64;
        debug_assert!(now < COUNT_MASK, "{now} instructions in flight overflow the count");
        now as usize
    }

    /// Block while too much is in flight (step 2): if `admitted` (what [`admit`](Self::admit)
    /// returned) is above `high_water`, wait until the count is at or below `low_water` or
    /// `dead()` is true. Whoever makes `dead()` true must call [`wake_all`](Self::wake_all)
    /// after.
    #[inline]
    pub(crate) fn throttle(&self, admitted: usize, dead: impl Fn() -> bool) {
        if admitted > self.high_water {
            self.wait_for_low_water(dead);
        }
    }

    #[cold]
    fn wait_for_low_water(&self, dead: impl Fn() -> bool) {
        let _span = tracing::debug_span!(
            "back_pressure",
            in_flight = self.in_flight(),
            high_water = self.high_water,
            low_water = self.low_water,
        )
        .entered();
        let old = self.state.fetch_add(WAITER, Ordering::Relaxed);
        debug_assert!(old & WAITERS_MASK != WAITERS_MASK, "too many waiters");
        let mut g = self.lock.lock();
        // Re-read under the lock: the check and the sleep must be one step for a waker.
        while self.in_flight() > self.low_water && !dead() {
            self.cv.wait(&mut g);
        }
        drop(g);
        // A retirement that reads the word from before this takes the lock for nothing.
        self.state.fetch_sub(WAITER, Ordering::Relaxed);
    }

    /// `n` instructions left flight (step 3; the scheduler, once per loop).
    #[inline]
    pub(crate) fn retire(&self, n: usize) {
        let old = self.state.fetch_sub(n as u64, Ordering::Release);
        debug_assert!(old & COUNT_MASK >= n as u64, "retired {n} of {} in flight", old & COUNT_MASK);
        if old & WAITERS_MASK != 0 && (old & COUNT_MASK) - n as u64 <= self.low_water as u64 {
            self.wake_all();
        }
    }

    /// Wake every waiter, to re-check its condition (step 4: after the VM's dead flag is set).
    pub(crate) fn wake_all(&self) {
        let _g = self.lock.lock();
        self.cv.notify_all();
    }

    /// Claim the right to run work on the calling thread (step 5): only when nothing is in
    /// flight and nobody waits, and only one claim at a time. On success everything retired
    /// before happens-before the caller's next accesses, and until
    /// [`end_inline`](Self::end_inline) the scheduler holds back whatever it receives.
    #[inline]
    pub(crate) fn try_claim_inline(&self) -> bool {
        self.state.compare_exchange(0, INLINE, Ordering::Acquire, Ordering::Relaxed).is_ok()
    }

    /// Give the claim back (step 6); what the claimant did happens-before whatever the
    /// scheduler does with the batches it held back. Returns whether any were admitted
    /// meanwhile, so that the caller knows to wake the scheduler.
    #[inline]
    pub(crate) fn end_inline(&self) -> bool {
        let old = self.state.fetch_and(!INLINE, Ordering::Release);
        debug_assert!(old & INLINE != 0, "no inline claim to end");
        old & COUNT_MASK != 0
    }

    /// Whether a claimant runs work on its own thread now (the scheduler, after taking a
    /// batch from the inbox). `false` orders the claimant's work before the caller's next
    /// accesses (step 7).
    #[inline]
    pub(crate) fn inline_running(&self) -> bool {
        self.state.load(Ordering::Acquire) & INLINE != 0
    }

    /// Instructions admitted and not yet retired. A reading that orders nothing: for
    /// reports, and for a thread that knows by other means that nothing more is admitted.
    #[inline]
    pub(crate) fn in_flight(&self) -> usize {
        (self.state.load(Ordering::Relaxed) & COUNT_MASK) as usize
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool as StdBool;
    use std::sync::mpsc;
    use std::sync::Arc;
    use std::thread;
    use std::time::Duration;

    /// Long enough that a run that should have finished but did not is a failure, not a
    /// slow machine. The threads are not scoped, so that a failing test fails rather than
    /// waits for a thread that hangs.
    const HANG: Duration = Duration::from_secs(20);

    fn waiters(bp: &BackPressure) -> u64 {
        bp.state.load(Ordering::Relaxed) >> COUNT_BITS
    }

    /// Sleep until `k` waiters are registered.
    fn until_waiting(bp: &BackPressure, k: u64) {
        while waiters(bp) < k {
            thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn a_waiter_above_high_water_wakes_at_low_water() {
        let bp = Arc::new(BackPressure::new(4, 2));
        let admitted = bp.admit(5);
        assert_eq!(admitted, 5);
        let (tx, rx) = mpsc::channel();
        let b = bp.clone();
        thread::spawn(move || {
            b.throttle(admitted, || false);
            tx.send(b.in_flight()).unwrap();
        });
        until_waiting(&bp, 1);
        bp.retire(2);
        // 3 in flight, above low water: the waiter must stay.
        assert!(rx.recv_timeout(Duration::from_millis(50)).is_err(), "woke above low water");
        bp.retire(1);
        let seen = rx.recv_timeout(HANG).expect("the waiter was not woken at low water");
        assert_eq!(seen, 2);
        while waiters(&bp) > 0 {
            thread::yield_now(); // it deregisters after it sent
        }
    }

    #[test]
    fn every_waiter_wakes() {
        let bp = Arc::new(BackPressure::new(4, 2));
        let admitted = bp.admit(5);
        let (tx, rx) = mpsc::channel();
        for _ in 0..2 {
            let (tx, bp) = (tx.clone(), bp.clone());
            thread::spawn(move || {
                bp.throttle(admitted, || false);
                tx.send(()).unwrap();
            });
        }
        until_waiting(&bp, 2);
        bp.retire(3);
        for _ in 0..2 {
            rx.recv_timeout(HANG).expect("a waiter was not woken");
        }
        assert_eq!(bp.in_flight(), 2);
    }

    #[test]
    fn a_dead_vm_wakes_the_waiter() {
        let bp = Arc::new(BackPressure::new(4, 2));
        let dead = Arc::new(StdBool::new(false));
        let admitted = bp.admit(10);
        let (tx, rx) = mpsc::channel();
        let (b, d) = (bp.clone(), dead.clone());
        thread::spawn(move || {
            b.throttle(admitted, || d.load(Ordering::Relaxed));
            tx.send(()).unwrap();
        });
        until_waiting(&bp, 1);
        dead.store(true, Ordering::Relaxed);
        bp.wake_all();
        rx.recv_timeout(HANG).expect("the waiter of a dead VM was not woken");
        assert_eq!(bp.in_flight(), 10, "nothing retired");
    }

    #[test]
    fn no_wait_at_or_below_high_water() {
        let bp = Arc::new(BackPressure::new(4, 2));
        assert_eq!(bp.admit(3), 3);
        let admitted = bp.admit(1);
        assert_eq!(admitted, 4);
        let (tx, rx) = mpsc::channel();
        let b = bp.clone();
        // Above low water, at high water: returns without waiting.
        thread::spawn(move || {
            b.throttle(admitted, || false);
            tx.send(()).unwrap();
        });
        rx.recv_timeout(HANG).expect("waited at high water");
        assert_eq!(waiters(&bp), 0, "never registered");
        assert_eq!(bp.in_flight(), 4);
    }

    #[test]
    fn a_retirement_with_nobody_waiting_takes_no_lock() {
        let bp = Arc::new(BackPressure::new(4, 2));
        bp.admit(5);
        let _held = bp.lock.lock();
        let (tx, rx) = mpsc::channel();
        let b = bp.clone();
        thread::spawn(move || {
            // To low water and below, with the lock held here: blocks if it takes the lock.
            b.retire(3);
            b.retire(2);
            tx.send(()).unwrap();
        });
        rx.recv_timeout(HANG).expect("a retirement took the lock with nobody waiting");
        assert_eq!(bp.in_flight(), 0);
    }
}
