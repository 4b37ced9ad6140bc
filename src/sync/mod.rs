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
    pub type MutexGuard<'a, T> = loom::sync::MutexGuard<'a, T>;

    impl<T> Mutex<T> {
        /// A new unlocked mutex.
        pub fn new(t: T) -> Self {
            Mutex(loom::sync::Mutex::new(t))
        }
        /// Lock it (loom never poisons in the models we run).
        pub fn lock(&self) -> MutexGuard<'_, T> {
            self.0.lock().unwrap()
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
            // loom's Condvar consumes the guard; swap it through a raw read/write pair.
            // SAFETY: `guard` is read out and immediately written back with the guard
            // that `wait` returns, so no guard is dropped twice or used while moved out.
            unsafe {
                let g = std::ptr::read(guard);
                let g = self.0.wait(g).unwrap();
                std::ptr::write(guard, g);
            }
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
}

pub use imp::*;
