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
//! 2. Consumer, finding nothing to do: re-check a short while, spinning and then yielding
//!    its core between checks ([`Backoff`]; [`Notifier::wait`] takes the check as a
//!    closure), then take the lock, set `sleeping`, issue a `SeqCst` fence and check once
//!    more. Only if the check still finds nothing does it wait on the condition variable,
//!    which releases the lock atomically.
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
//! model-checked under loom by `tests/loom/notify.rs`, including the shutdown variant
//! (a stop flag set by one thread, then `notify`).
//!
//! # Memory ordering
//!
//! `sleeping` is only written under the lock; its load in `notify` is `Relaxed` after a
//! `SeqCst` fence, which is the store-load ordering the argument above needs. The work
//! itself is published by the queue (crossbeam's queues use release/acquire), so the
//! consumer sees the item's contents once it sees the item.

use super::{fence, AtomicBool, Condvar, Mutex, Ordering};

/// How many times an idle consumer re-checks with a spin hint before it starts yielding
/// ([`Backoff::spins`]). Short, yet the next batch of a busy producer often arrives within
/// it (`docs/tuning.md`, `spin`, has what a spin costs).
pub const DEFAULT_SPIN: u32 = 32;

/// How many times an idle consumer then re-checks after yielding its core to the operating
/// system ([`Backoff::yields`]), on a machine with few cores ([`FEW_CORES`]; elsewhere the
/// default is none: see [`default_yields`]). A yield is one short system call when no
/// other thread wants the core, so this phase stays short on an idle machine
/// (`docs/tuning.md`, `yields`, has what a yield costs).
pub const DEFAULT_YIELDS: u32 = 16;

/// At most this many CPUs available to the process count as few: eagervm's busy threads
/// (the caller, the scheduler, a worker, and on a device its watcher) may then outnumber
/// the cores, and an idle thread's yield hands its core to one of them.
pub const FEW_CORES: usize = 4;

/// The default number of yields before an idle thread sleeps on this machine:
/// [`DEFAULT_YIELDS`] where the process may run on at most [`FEW_CORES`] CPUs
/// (`std::thread::available_parallelism`, which follows the affinity mask and cgroup
/// quotas), and 0 where it may run on more. With cores to spare a yield finds nobody to hand
/// the core to and returns at once, so the yield phase is a spin made of system calls that
/// costs each idle scheduler and watcher CPU time and gains nothing, while on two cores the
/// yields make every workload faster end to end (`docs/tuning.md`, `yields`, has both
/// measurements). Read once per process.
pub fn default_yields() -> u32 {
    static YIELDS: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *YIELDS.get_or_init(|| match std::thread::available_parallelism() {
        Ok(n) if n.get() > FEW_CORES => 0,
        _ => DEFAULT_YIELDS,
    })
}

/// How an idle consumer waits before it sleeps: first `spins` re-checks separated by a
/// spin-loop hint, then `yields` re-checks separated by a yield of the thread, then sleep.
///
/// The yield phase is what makes the wait cheap on a machine with fewer cores than busy
/// threads (eagervm's caller, scheduler and worker on two cores): a thread that spins holds
/// a core that the thread it waits for may need, while a thread that yields hands it over
/// at once when someone else is runnable, and costs a system call per re-check when nobody
/// is. Sleeping instead costs a futex round trip on both sides (the producer's wake-up and
/// the consumer's return), and the consumer's latency to come back. This is the shape of
/// `crossbeam_utils::Backoff` (spin, then yield, then park), with both phases counted in
/// re-checks so that they can be tuned (`Config::spin`, `Config::yields`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// Re-checks separated by a spin-loop hint (`pause` on x86).
    pub spins: u32,
    /// Re-checks separated by a yield of the thread.
    pub yields: u32,
}

impl Backoff {
    /// [`DEFAULT_SPIN`] spins, then [`DEFAULT_YIELDS`] yields: the wait on a machine with
    /// few cores.
    pub const DEFAULT: Backoff = Backoff { spins: DEFAULT_SPIN, yields: DEFAULT_YIELDS };

    /// Sleep at the first empty check.
    pub const NONE: Backoff = Backoff { spins: 0, yields: 0 };

    /// [`DEFAULT_SPIN`] spins, then [`default_yields`] yields: [`Backoff::DEFAULT`] on a
    /// machine with few cores, no yield phase on one with more.
    pub fn for_this_machine() -> Backoff {
        Backoff { spins: DEFAULT_SPIN, yields: default_yields() }
    }
}

impl Default for Backoff {
    /// [`Backoff::for_this_machine`].
    fn default() -> Self {
        Backoff::for_this_machine()
    }
}

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
    /// [`notify`](Self::notify). Re-checks as `backoff` says (spinning, then yielding), then
    /// sleeps.
    pub fn wait(&self, backoff: Backoff, mut ready: impl FnMut() -> bool) {
        for _ in 0..backoff.spins {
            if ready() {
                return;
            }
            super::spin_hint();
        }
        for _ in 0..backoff.yields {
            if ready() {
                return;
            }
            super::yield_now();
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

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool as StdBool;

    /// Waits on `n` with `backoff` until the `k`-th check, and returns, for each check,
    /// whether the consumer had announced that it sleeps. A thread notifies after a while so
    /// that a wait that slept too early returns rather than hangs (and the test then fails
    /// on what it recorded, not on time).
    fn checks_until(backoff: Backoff, k: usize) -> Vec<bool> {
        let n = Notifier::new();
        let done = StdBool::new(false);
        let mut seen = Vec::new();
        std::thread::scope(|s| {
            s.spawn(|| {
                while !done.load(Ordering::Acquire) {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                    n.notify();
                }
            });
            n.wait(backoff, || {
                seen.push(n.sleeping.load(Ordering::Relaxed));
                seen.len() >= k
            });
            done.store(true, Ordering::Release);
        });
        seen
    }

    #[test]
    fn work_found_while_spinning_or_yielding_needs_no_sleep() {
        // One spin, then four yields: the third check is the second of the yield phase.
        assert_eq!(checks_until(Backoff { spins: 1, yields: 4 }, 3), [false; 3]);
        // Only yields.
        assert_eq!(checks_until(Backoff { spins: 0, yields: 2 }, 2), [false; 2]);
    }

    #[test]
    fn after_its_spins_and_yields_the_consumer_announces_its_sleep() {
        // Two spins and two yields find nothing; the fifth check is made after `sleeping`
        // is set (the re-check that closes the lost wake-up window).
        assert_eq!(checks_until(Backoff { spins: 2, yields: 2 }, 5), [false, false, false, false, true]);
        assert_eq!(checks_until(Backoff::NONE, 1), [true]);
    }

    #[test]
    fn yields_are_the_default_only_on_few_cores() {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let expected = if cores <= FEW_CORES { DEFAULT_YIELDS } else { 0 };
        assert_eq!(default_yields(), expected, "{cores} CPUs");
        assert_eq!(Backoff::default(), Backoff { spins: DEFAULT_SPIN, yields: expected });
    }
}
