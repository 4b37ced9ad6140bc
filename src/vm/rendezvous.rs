//! A one-shot rendezvous: one thread waits for a value that an instruction hands over once,
//! or for the news that it never will (the host accesses' slot, `vm::instruction`).
//!
//! # Protocol
//!
//! 1. **Fulfil** (the instruction, on whichever thread runs it): under the lock, store the
//!    value, set `done`, and wake the waiter.
//! 2. **Abandon** (the instruction dropped without having run: a dead engine buries it, or
//!    it is dropped with its batch): under the lock, if nothing was stored, store that
//!    nothing will be, set `done`, and wake the waiter. So a waiter is always answered:
//!    every instruction that holds the sending side either runs or is dropped, and a dead
//!    engine lets go of the instructions it keeps (`Inbox::bury`).
//! 3. **Wait** (the caller): re-check `done` a short while as an idle VM thread does
//!    (spinning, then yielding its core: the VM's [`Backoff`]), since a small read usually
//!    arrives within a few microseconds, sooner than a sleep and the wake-up through the
//!    kernel would take; then take the lock and, while nothing is stored, wait on the
//!    condition variable. Take the answer under the lock.
//!
//! The waiter's check and sleep happen under the lock that steps 1 and 2 take to store and
//! wake, so a wake-up cannot fall between them. `done` is only a hint for the re-checks:
//! the answer is handed over under the lock either way.
//!
//! # Memory ordering
//!
//! `done` is stored `Release` after the value and loaded `Acquire`, but the value is read
//! under the lock, whose release and acquisition order it after the store; the flag only
//! decides when the waiter takes the lock.
//!
//! This file takes nothing from the crate but the `sync` facade, so that the loom model of
//! the engine compiles it as it is.

use crate::sync::notify::Backoff;
use crate::sync::{spin_hint, yield_now, AtomicBool, Condvar, Mutex, Ordering};

/// What a rendezvous holds.
#[derive(Debug)]
enum State<T> {
    /// Nothing yet.
    Waiting,
    /// The value, not yet taken.
    Ready(T),
    /// Nothing will come (step 2), or the value was taken.
    Over,
}

/// A one-shot rendezvous (module docs).
#[derive(Debug)]
pub(crate) struct Rendezvous<T> {
    state: Mutex<State<T>>,
    cv: Condvar,
    /// Set once `state` has left `Waiting` (a hint for the re-checks).
    done: AtomicBool,
}

impl<T> Default for Rendezvous<T> {
    fn default() -> Self {
        Rendezvous { state: Mutex::new(State::Waiting), cv: Condvar::new(), done: AtomicBool::new(false) }
    }
}

impl<T> Rendezvous<T> {
    /// Hand `value` to the waiter (step 1). Only the first answer counts.
    pub(crate) fn fulfil(&self, value: T) {
        let mut g = self.state.lock();
        if matches!(*g, State::Waiting) {
            *g = State::Ready(value);
        }
        self.done.store(true, Ordering::Release);
        self.cv.notify_all();
    }

    /// Tell the waiter that no value will come, unless one did (step 2).
    pub(crate) fn abandon(&self) {
        let mut g = self.state.lock();
        if matches!(*g, State::Waiting) {
            *g = State::Over;
            self.done.store(true, Ordering::Release);
            self.cv.notify_all();
        }
    }

    /// Whether an answer is in (a hint: read it with [`wait`](Self::wait)).
    pub(crate) fn is_done(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }

    /// Block until answered (step 3): the value, or `None` if none will come (or it was
    /// taken already). Re-checks as `backoff` says before it sleeps.
    pub(crate) fn wait(&self, backoff: Backoff) -> Option<T> {
        'poll: {
            for _ in 0..backoff.spins {
                if self.is_done() {
                    break 'poll;
                }
                spin_hint();
            }
            for _ in 0..backoff.yields {
                if self.is_done() {
                    break 'poll;
                }
                yield_now();
            }
        }
        let mut g = self.state.lock();
        loop {
            match std::mem::replace(&mut *g, State::Over) {
                State::Ready(v) => return Some(v),
                State::Over => return None,
                State::Waiting => {
                    *g = State::Waiting;
                    self.cv.wait(&mut g);
                }
            }
        }
    }
}
