//! The synchronisation facade.
//!
//! In normal builds these are `std` atomics and `parking_lot` locks; under `--cfg loom` the
//! same names resolve to [loom]'s model-checked types.
//!
//! What goes through it: the sleep/wake protocol itself ([`notify`]: the scheduler's, the
//! workers', the watchers' and the mock device threads' idle waits), the engine's channels
//! ([`queue`]: the inbox, the completion channel, the workers' and watchers' queues), the
//! inbox's program counter ([`UnsafeCell`]), its closing and death flags and the inline
//! claim (`vm::engine`), the host accesses' rendezvous (`vm::rendezvous`), the release rule
//! (`framework::release`, and the builder's and the eager context's slots in it), the VM's
//! in-flight count and back-pressure wait (`vm::back_pressure`), and the mock device's
//! events and counters (`ep::mock`).
//!
//! What is model-checked: the crate is never built under loom. One test binary,
//! `tests/loom`, compiles this module by path, and with it, by path, the modules it
//! checks, which take nothing from the crate but this facade and each other:
//! `src/framework/release.rs`, `src/vm/back_pressure.rs`, and the engine's parts
//! (`src/vm/engine/{inbox,completions,worker_queue,scheduler_loop}.rs`,
//! `src/vm/rendezvous.rs`). loom explores their interleavings up to a preemption bound
//! (`tests/loom/common.rs`): the [`notify`] protocol with its stop-flag shutdown, the release
//! rule, the back-pressure handshake, and the engine assembled from its parts (a scheduler,
//! a worker, a waiter that may run its own batch, a release, shutdown and death).
//!
//! What does not go through it (`std`, `parking_lot` or crossbeam directly): the mock
//! streams' queues, the event pools and the profiler's sink (crossbeam's `SegQueue`); `Arc`
//! in most of `vm`, `ep` and `framework`; the tensors' atomics (reference count, last
//! stream, released flag: `vm::tensor`); the failure log (`vm::instruction_policy`); the
//! profiler's session word (`vm::observe::timeline`); the allocators (`alloc::host` says
//! why); the CUDA backend; the trace recorder's channel; and the spawning of every thread
//! (`std::thread`).
//!
//! The wrappers give one API for both worlds (`lock()` returns a guard, `Condvar::wait`
//! takes `&mut guard`), which is `parking_lot`'s shape.
//!
//! [loom]: https://docs.rs/loom

pub mod notify;
pub mod queue;

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

    /// A cell whose owner is handed from thread to thread by a protocol, not a lock: loom's
    /// `UnsafeCell` API (`with`, `with_mut`), over the standard one. Under loom, an access
    /// the protocol does not order after the previous one fails the model.
    #[derive(Debug, Default)]
    pub struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

    impl<T> UnsafeCell<T> {
        /// A cell holding `t`.
        pub const fn new(t: T) -> Self {
            UnsafeCell(std::cell::UnsafeCell::new(t))
        }

        /// Read through the pointer `f` is given.
        #[inline(always)]
        pub fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
            f(self.0.get())
        }

        /// Write through the pointer `f` is given.
        #[inline(always)]
        pub fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
            f(self.0.get())
        }
    }
}

#[cfg(loom)]
mod imp {
    pub use loom::cell::UnsafeCell;
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
