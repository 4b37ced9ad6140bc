//! The synchronisation facade.
//!
//! Every runtime type that sleeps, wakes or shares state between threads imports its
//! primitives from here, never from `std` or `parking_lot` directly. Under `--cfg loom`
//! the same names resolve to [loom]'s model-checked types, so the sleep/wake and shutdown
//! protocols ([`notify`]) are explored exhaustively by `tests/loom_*.rs`; in normal builds
//! they are `std` atomics and `parking_lot` locks.
//!
//! The wrappers give one API for both worlds (`lock()` returns a guard, `Condvar::wait`
//! takes `&mut guard`), which is `parking_lot`'s shape.
//!
//! [loom]: https://docs.rs/loom

pub mod notify;

#[cfg(not(loom))]
mod imp {
    pub use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
    pub use std::sync::Arc;
    pub use std::thread;

    /// A mutual-exclusion lock (`parking_lot::Mutex`).
    pub type Mutex<T> = parking_lot::Mutex<T>;
    /// The guard of [`Mutex`].
    pub type MutexGuard<'a, T> = parking_lot::MutexGuard<'a, T>;
    /// A condition variable (`parking_lot::Condvar`).
    pub type Condvar = parking_lot::Condvar;

    /// Hint to the processor inside a short spin.
    #[inline]
    pub fn spin_hint() {
        std::hint::spin_loop();
    }

    /// Offer the thread's core to another runnable thread (`sched_yield`).
    #[inline]
    pub fn yield_now() {
        std::thread::yield_now();
    }
}

#[cfg(loom)]
mod imp {
    pub use loom::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
    pub use loom::sync::Arc;
    pub use loom::thread;

    /// loom's mutex behind `parking_lot`'s API.
    #[derive(Debug, Default)]
    pub struct Mutex<T>(loom::sync::Mutex<T>);

    /// The guard of [`Mutex`].
    ///
    /// loom's `Condvar::wait` consumes its guard and hands back a new one, while
    /// `parking_lot`'s borrows it; the guard is kept in an `Option` so that [`Condvar::wait`]
    /// can move it out and back without `unsafe`. It is `None` only inside `wait`, and if
    /// `wait` unwinds (loom reports a deadlock by panicking) the empty guard drops nothing.
    #[derive(Debug)]
    pub struct MutexGuard<'a, T>(Option<loom::sync::MutexGuard<'a, T>>);

    impl<T> std::ops::Deref for MutexGuard<'_, T> {
        type Target = T;
        fn deref(&self) -> &T {
            self.0.as_ref().expect("guard is held outside Condvar::wait")
        }
    }

    impl<T> std::ops::DerefMut for MutexGuard<'_, T> {
        fn deref_mut(&mut self) -> &mut T {
            self.0.as_mut().expect("guard is held outside Condvar::wait")
        }
    }

    impl<T> Mutex<T> {
        /// A new unlocked mutex.
        pub fn new(t: T) -> Self {
            Mutex(loom::sync::Mutex::new(t))
        }
        /// Lock it (loom never poisons in the models we run).
        pub fn lock(&self) -> MutexGuard<'_, T> {
            MutexGuard(Some(self.0.lock().unwrap()))
        }
    }

    /// loom's condition variable behind `parking_lot`'s API.
    #[derive(Debug, Default)]
    pub struct Condvar(loom::sync::Condvar);

    impl Condvar {
        /// A new condition variable.
        pub fn new() -> Self {
            Condvar(loom::sync::Condvar::new())
        }
        /// Release the guard's lock, sleep until notified, lock again.
        pub fn wait<T>(&self, guard: &mut MutexGuard<'_, T>) {
            let g = guard.0.take().expect("guard is held outside Condvar::wait");
            guard.0 = Some(self.0.wait(g).unwrap());
        }
        /// Wake one sleeper.
        pub fn notify_one(&self) -> bool {
            self.0.notify_one();
            true
        }
        /// Wake every sleeper.
        pub fn notify_all(&self) -> usize {
            self.0.notify_all();
            0
        }
    }

    /// Under loom a spin is a yield, so that the model can schedule the other thread.
    pub fn spin_hint() {
        loom::thread::yield_now();
    }

    /// loom's yield: the model schedules another thread.
    pub fn yield_now() {
        loom::thread::yield_now();
    }
}

pub use imp::*;
