//! `Barrier` in synchronous mode.
//!
//! Otherwise a barrier never reaches [`execute`]: it takes the scheduler-thread stream
//! policy, and the scheduler runs its callback once every stream is done through the
//! position it noted (`stream_policy::scheduler`). In synchronous mode the caller runs
//! every instruction as it submits it, so everything before the barrier is done: its
//! callback is taken out and called at once.
//!
//! [`execute`]: super::execute

/// Take the barrier's callback out and call it.
// Inlined: every arm of `execute_other`'s match runs inside that one out-of-line function.
#[inline(always)]
pub(super) fn run(callback: &mut Box<dyn FnOnce() + Send>) {
    std::mem::replace(callback, Box::new(|| {}))()
}
