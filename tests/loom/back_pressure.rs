//! Model checks of the back-pressure handshake (`src/vm/back_pressure.rs`) under loom.
//!
//! The handshake is compiled here by path, over the loom facade, so its atomic word, lock
//! and condition variable are loom's. Submitters admit batches and throttle; a scheduler
//! thread retires what was admitted. Every model checks that each submitter returns from
//! its wait: a lost wake-up leaves it asleep with nothing left to wake it, which loom
//! reports as a deadlock. The models with one submitter also check that it returns only
//! once the count is at or below low water, or once the VM is dead.
//!
//! Two models run the first model over a copy of the handshake with a bug planted in it (the
//! scheduler reads the waiters in an access of its own before it retires; the submitter
//! checks the count before it takes the lock), and check that loom finds the lost wake-up.
//!
//! The inline claim (steps 5–7 of the handshake's docs) has a model of its own: a claimant
//! that runs work on its own thread, a submitter that hands a batch over meanwhile, and a
//! scheduler that retires earlier work and then receives the batch. Each writes the same
//! unsynchronised cell, so loom fails the model if any two of them are not ordered. Two
//! planted copies (a retirement that does not release; an end of the claim that does not
//! release) check that loom finds the race.

#[path = "../../src/vm/back_pressure.rs"]
#[allow(dead_code)]
mod handshake;

// `std`'s `Arc`, not loom's: the planted models end in a deadlock, and a loom `Arc` dropped
// while the model unwinds from it aborts the process.
use std::sync::Arc;

use loom::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use loom::sync::{Condvar, Mutex};
use loom::thread;

use crate::common::{check, failure_of};
use handshake::{BackPressure, COUNT_BITS, INLINE};

/// The marks of every model: a batch of 3 is above high water, and the count must fall
/// to 1 before its submitter goes on.
const HIGH: usize = 2;
const LOW: usize = 1;

/// What the models drive: the handshake itself, or a copy with a planted bug.
trait Gate: Send + Sync + 'static {
    fn admit(&self, n: usize) -> usize;
    fn throttle(&self, admitted: usize, dead: impl Fn() -> bool);
    fn retire(&self, n: usize);
    fn wake_all(&self);
    fn in_flight(&self) -> usize;
}

impl Gate for BackPressure {
    fn admit(&self, n: usize) -> usize {
        BackPressure::admit(self, n)
    }
    fn throttle(&self, admitted: usize, dead: impl Fn() -> bool) {
        BackPressure::throttle(self, admitted, dead)
    }
    fn retire(&self, n: usize) {
        BackPressure::retire(self, n)
    }
    fn wake_all(&self) {
        BackPressure::wake_all(self)
    }
    fn in_flight(&self) -> usize {
        BackPressure::in_flight(self)
    }
}

fn handshake() -> BackPressure {
    BackPressure::new(HIGH, LOW)
}

/// A scheduler: retire, once per loop, whatever arrived in `inbox` (a count of
/// instructions handed over) since the last loop, until `total` have retired.
fn scheduler<G: Gate>(bp: Arc<G>, inbox: Arc<AtomicUsize>, total: usize) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        let mut retired = 0;
        while retired < total {
            let arrived = inbox.load(Ordering::Acquire);
            if arrived > retired {
                bp.retire(arrived - retired);
                retired = arrived;
            } else {
                thread::yield_now();
            }
        }
    })
}

/// A submitter's batch: admit, hand over, throttle. Returns the count it admitted to and
/// the count after its wait.
fn submit<G: Gate>(bp: &G, inbox: &AtomicUsize, n: usize) -> (usize, usize) {
    let admitted = bp.admit(n);
    inbox.fetch_add(n, Ordering::Release);
    bp.throttle(admitted, || false);
    (admitted, bp.in_flight())
}

/// One submitter hands over a batch of 1, then one of 2: 3 in flight, above high water,
/// unless the scheduler retired the first already. The scheduler retires them as they
/// arrive, both at once or one after the other.
fn submitter_and_scheduler<G: Gate>(make: fn() -> G) {
    check(move || {
        let bp = Arc::new(make());
        let inbox = Arc::new(AtomicUsize::new(0));
        let s = scheduler(bp.clone(), inbox.clone(), 3);
        for n in [1, 2] {
            let (admitted, now) = submit(&*bp, &inbox, n);
            // Only this thread adds to the count: it cannot have risen since the wait.
            assert!(admitted <= HIGH || now <= LOW, "the submitter went on with {now} in flight");
        }
        s.join().unwrap();
        assert_eq!(bp.in_flight(), 0);
    });
}

#[test]
fn a_submitter_above_high_water_is_woken_at_low_water() {
    submitter_and_scheduler(handshake);
}

/// Two submitters have each handed over a batch of 3, taking the count to 6: both wait,
/// while the scheduler retires one batch per loop, and the retirement that brings the
/// count to low water may have to wake both. (The admissions are made before the threads
/// start, which keeps the model small; the first model explores admissions racing
/// retirements.)
#[test]
fn every_waiting_submitter_is_woken() {
    check(|| {
        let bp = Arc::new(handshake());
        let first = bp.admit(3);
        let second = bp.admit(3);
        let s = {
            let bp = bp.clone();
            thread::spawn(move || {
                bp.retire(3);
                bp.retire(3);
            })
        };
        let other = {
            let bp = bp.clone();
            thread::spawn(move || bp.throttle(second, || false))
        };
        bp.throttle(first, || false);
        other.join().unwrap();
        s.join().unwrap();
        assert_eq!(bp.in_flight(), 0);
    });
}

/// The scheduler retires part of a batch above high water and dies (sets the dead flag,
/// then wakes every waiter), leaving the count above low water: the submitter returns.
/// The flag is relaxed on both sides: the handshake's lock is what orders it.
#[test]
fn a_dead_vm_wakes_a_waiting_submitter() {
    check(|| {
        let bp = Arc::new(handshake());
        let dead = Arc::new(AtomicBool::new(false));
        // Counted before the scheduler, started next, can retire any of it.
        let admitted = bp.admit(3);
        let s = {
            let (bp, dead) = (bp.clone(), dead.clone());
            thread::spawn(move || {
                bp.retire(1);
                dead.store(true, Ordering::Relaxed);
                bp.wake_all();
            })
        };
        bp.throttle(admitted, || dead.load(Ordering::Relaxed));
        let now = bp.in_flight();
        assert!(now <= LOW || dead.load(Ordering::Relaxed), "the submitter went on with {now} in flight");
        s.join().unwrap();
        assert_eq!(bp.in_flight(), 2);
    });
}

/// Where the planted copy of the handshake goes wrong.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Bug {
    /// The scheduler learns whether anyone waits from a load before its subtraction, not
    /// from the subtraction itself: a submitter can register and read the old count in
    /// between, and sleep through a retirement that wakes nobody.
    WaitersReadBeforeRetiring,
    /// The submitter reads the count before it takes the lock: the scheduler's wake-up can
    /// come between the read and the wait, and find nobody asleep.
    CountReadOutsideTheLock,
}

/// The handshake's protocol, copied, with one bug.
struct Planted {
    state: AtomicU64,
    lock: Mutex<()>,
    cv: Condvar,
    bug: Bug,
}

const WAITER: u64 = 1 << COUNT_BITS;

impl Planted {
    fn new(bug: Bug) -> Planted {
        Planted { state: AtomicU64::new(0), lock: Mutex::new(()), cv: Condvar::new(), bug }
    }
}

impl Gate for Planted {
    fn admit(&self, n: usize) -> usize {
        ((self.state.fetch_add(n as u64, Ordering::Relaxed) % WAITER) as usize) + n
    }

    fn throttle(&self, admitted: usize, dead: impl Fn() -> bool) {
        if admitted <= HIGH {
            return;
        }
        self.state.fetch_add(WAITER, Ordering::Relaxed);
        if self.bug == Bug::CountReadOutsideTheLock {
            while self.in_flight() > LOW && !dead() {
                let g = self.lock.lock().unwrap();
                drop(self.cv.wait(g).unwrap());
            }
        } else {
            let mut g = self.lock.lock().unwrap();
            while self.in_flight() > LOW && !dead() {
                g = self.cv.wait(g).unwrap();
            }
            drop(g);
        }
        self.state.fetch_sub(WAITER, Ordering::Relaxed);
    }

    fn retire(&self, n: usize) {
        let early = (self.bug == Bug::WaitersReadBeforeRetiring).then(|| self.state.load(Ordering::Relaxed));
        let old = self.state.fetch_sub(n as u64, Ordering::Relaxed);
        let seen = early.unwrap_or(old);
        if seen >= WAITER && (old % WAITER) as usize - n <= LOW {
            self.wake_all();
        }
    }

    fn wake_all(&self) {
        let _g = self.lock.lock().unwrap();
        self.cv.notify_all();
    }

    fn in_flight(&self) -> usize {
        (self.state.load(Ordering::Relaxed) % WAITER) as usize
    }
}

#[test]
fn planted_waiters_read_before_retiring_is_caught() {
    let message = failure_of(|| submitter_and_scheduler(|| Planted::new(Bug::WaitersReadBeforeRetiring)));
    assert!(message.contains("deadlock"), "the model failed, but not by a lost wake-up: {message}");
}

#[test]
fn planted_count_read_outside_the_lock_is_caught() {
    let message = failure_of(|| submitter_and_scheduler(|| Planted::new(Bug::CountReadOutsideTheLock)));
    assert!(message.contains("deadlock"), "the model failed, but not by a lost wake-up: {message}");
}

/// What the claim model drives: the handshake itself, or a copy with a planted bug.
trait Claim: Send + Sync + 'static {
    fn admit(&self, n: usize) -> usize;
    fn retire(&self, n: usize);
    fn try_claim_inline(&self) -> bool;
    fn end_inline(&self) -> bool;
    fn inline_running(&self) -> bool;
}

impl Claim for BackPressure {
    fn admit(&self, n: usize) -> usize {
        BackPressure::admit(self, n)
    }
    fn retire(&self, n: usize) {
        BackPressure::retire(self, n)
    }
    fn try_claim_inline(&self) -> bool {
        BackPressure::try_claim_inline(self)
    }
    fn end_inline(&self) -> bool {
        BackPressure::end_inline(self)
    }
    fn inline_running(&self) -> bool {
        BackPressure::inline_running(self)
    }
}

/// Add `k` to the cell; loom fails the model if another thread's access is not ordered
/// with this one.
fn touch(cell: &loom::cell::UnsafeCell<u32>, k: u32) {
    // SAFETY: the model's claim is that every access to the cell is ordered with every
    // other; loom checks exactly that and fails the model where it is not.
    cell.with_mut(|p| unsafe { *p += k });
}

/// One instruction is in flight: its worker's write is the scheduler's (the completion
/// queue orders the two in the VM). The scheduler retires it, then receives a batch if one
/// arrived, holding it while a claim runs. A submitter admits and hands over a batch. This
/// thread claims and, if it gets the claim, runs its own work and ends the claim.
fn claim_model<C: Claim>(make: fn() -> C) {
    check(move || {
        let bp = Arc::new(make());
        let cell = Arc::new(loom::cell::UnsafeCell::new(0u32));
        let inbox = Arc::new(AtomicBool::new(false));
        bp.admit(1);
        let scheduler = {
            let (bp, cell, inbox) = (bp.clone(), cell.clone(), inbox.clone());
            thread::spawn(move || {
                touch(&cell, 1);
                bp.retire(1);
                if inbox.load(Ordering::Acquire) {
                    while bp.inline_running() {
                        thread::yield_now();
                    }
                    touch(&cell, 100);
                }
            })
        };
        let submitter = {
            let (bp, inbox) = (bp.clone(), inbox.clone());
            thread::spawn(move || {
                bp.admit(1);
                inbox.store(true, Ordering::Release);
            })
        };
        if bp.try_claim_inline() {
            touch(&cell, 10);
            bp.end_inline();
        }
        scheduler.join().unwrap();
        submitter.join().unwrap();
    });
}

#[test]
fn an_inline_claim_is_ordered_with_the_scheduler_both_ways() {
    claim_model(handshake);
}

/// Where the planted copy of the claim goes wrong.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum ClaimBug {
    /// The retirement is `Relaxed`: the claimant may run before the retired work's writes
    /// reach it.
    RetireRelaxed,
    /// The end of the claim is `Relaxed`: the scheduler may run the held batch before the
    /// claimant's writes reach it.
    EndRelaxed,
}

/// The claim's protocol, copied, with one bug.
struct PlantedClaim {
    state: AtomicU64,
    bug: ClaimBug,
}

impl Claim for PlantedClaim {
    fn admit(&self, n: usize) -> usize {
        ((self.state.fetch_add(n as u64, Ordering::Relaxed) % WAITER) as usize) + n
    }
    fn retire(&self, n: usize) {
        let order = if self.bug == ClaimBug::RetireRelaxed { Ordering::Relaxed } else { Ordering::Release };
        self.state.fetch_sub(n as u64, order);
    }
    fn try_claim_inline(&self) -> bool {
        self.state.compare_exchange(0, INLINE, Ordering::Acquire, Ordering::Relaxed).is_ok()
    }
    fn end_inline(&self) -> bool {
        let order = if self.bug == ClaimBug::EndRelaxed { Ordering::Relaxed } else { Ordering::Release };
        self.state.fetch_and(!INLINE, order) % WAITER != 0
    }
    fn inline_running(&self) -> bool {
        self.state.load(Ordering::Acquire) & INLINE != 0
    }
}

#[test]
fn planted_relaxed_retirement_is_caught() {
    let message = failure_of(|| {
        claim_model(|| PlantedClaim { state: AtomicU64::new(0), bug: ClaimBug::RetireRelaxed })
    });
    assert!(message.contains("Causality"), "the model failed, but not by a race: {message}");
}

#[test]
fn planted_relaxed_end_of_claim_is_caught() {
    let message =
        failure_of(|| claim_model(|| PlantedClaim { state: AtomicU64::new(0), bug: ClaimBug::EndRelaxed }));
    assert!(message.contains("Causality"), "the model failed, but not by a race: {message}");
}
