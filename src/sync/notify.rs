//! The sleep/wake protocol shared by every idle loop in eagervm (the scheduler, the
//! `ThreadCtx` workers, the event watchers and the mock device's stream threads). Callers
//! blocked by back-pressure wait on a lock and condition variable of their own instead:
//! there may be many of them, and they wait for a count to fall, not for work to arrive.
//!
//! # Protocol
//!
//! One consumer thread owns a [`Notifier`]; any number of producers hand it work through a
//! lock-free queue that lives beside it. The consumer never sleeps on a non-empty queue and
//! a producer never makes a system call unless the consumer sleeps:
//!
//! 1. Producer: publish the work (push to the queue), then call [`Notifier::notify`].
//!    `notify` issues a `SeqCst` fence and loads `sleeping`; only if it is set does it take
//!    the lock, clear the flag and signal the condition variable.
//! 2. Consumer, finding nothing to do: spin a short while re-checking ([`Notifier::wait`]
//!    takes the check as a closure), then take the lock, set `sleeping`, issue a `SeqCst`
//!    fence and check once more. Only if the check still finds nothing does it wait on the
//!    condition variable, which releases the lock atomically.
//!
//! # Why no wake-up is lost
//!
//! The lost-wake-up scenario is: the consumer checks (empty), a producer pushes and sees
//! `sleeping == false` (so does not signal), then the consumer goes to sleep forever. The
//! two `SeqCst` fences forbid it: in the single total order of `SeqCst` operations either
//! the consumer's fence comes first, and then the producer's load after its own fence sees
//! `sleeping == true` and signals; or the producer's fence comes first, and then the
//! consumer's re-check after its fence sees the pushed work and does not sleep. The signal
//! itself cannot slip in between the consumer's re-check and its wait, because the consumer
//! holds the lock over both and the producer takes the lock before signalling.
//!
//! This is the protocol of rayon-core's `sleep` module reduced to one sleeper. It is
//! model-checked under loom by `tests/loom_notify.rs`, including the shutdown variant
//! (a stop flag set by one thread, then `notify`).
//!
//! # Memory ordering
//!
//! `sleeping` is only written under the lock; its load in `notify` is `Relaxed` after a
//! `SeqCst` fence, which is the store-load ordering the argument above needs. The work
//! itself is published by the queue (crossbeam's queues use release/acquire), so the
//! consumer sees the item's contents once it sees the item.

use super::{fence, AtomicBool, Condvar, Mutex, Ordering};

/// How long an idle consumer re-checks before it sleeps (iterations of a spin hint).
///
/// A few microseconds: long enough to catch the next batch of a busy producer without a
/// futex round trip, short enough not to starve the producer on a 2-core machine.
pub const DEFAULT_SPIN: u32 = 128;

/// A one-sleeper parking spot (see the module docs for the protocol).
#[derive(Debug, Default)]
pub struct Notifier {
    sleeping: AtomicBool,
    lock: Mutex<()>,
    cv: Condvar,
}

impl Notifier {
    /// A notifier with nobody asleep.
    pub fn new() -> Self {
        Notifier { sleeping: AtomicBool::new(false), lock: Mutex::new(()), cv: Condvar::new() }
    }

    /// Wake the consumer if it sleeps. Call after publishing work; costs a fence and a load
    /// when the consumer is awake.
    #[inline]
    pub fn notify(&self) {
        fence(Ordering::SeqCst);
        if self.sleeping.load(Ordering::Relaxed) {
            self.wake_slow();
        }
    }

    #[cold]
    fn wake_slow(&self) {
        let _g = self.lock.lock();
        if self.sleeping.load(Ordering::Relaxed) {
            self.sleeping.store(false, Ordering::Relaxed);
            self.cv.notify_one();
        }
    }

    /// Block the calling (consumer) thread until `ready()` returns true.
    ///
    /// `ready` must become true only through state that producers publish before they call
    /// [`notify`](Self::notify). Spins `spin` times first, then sleeps.
    pub fn wait(&self, spin: u32, mut ready: impl FnMut() -> bool) {
        for _ in 0..spin {
            if ready() {
                return;
            }
            super::spin_hint();
        }
        let mut g = self.lock.lock();
        loop {
            self.sleeping.store(true, Ordering::Relaxed);
            fence(Ordering::SeqCst);
            if ready() {
                self.sleeping.store(false, Ordering::Relaxed);
                return;
            }
            // Spurious wake-ups land here too; the loop re-arms and re-checks.
            self.cv.wait(&mut g);
        }
    }
}
