//! `Release`: the last use of a tensor frees its storage and clears its error; the last use
//! of a view frees nothing but the view (its `Release` owns the view object, freed when the
//! instruction drops), since the storage is its owner's.

use super::super::instruction::Operand;

/// Free the storage of each of `ops` (a `Release` has one) and clear its error.
// Inlined: every arm of `execute_other`'s match runs inside that one out-of-line function.
#[inline(always)]
pub(super) fn release(ops: &[Operand]) {
    for op in ops {
        // SAFETY: the Release is running, and owns its operand's tensor (alive); it holds
        // the write access to it: every earlier access has finished (or precedes it on
        // this stream's FIFO).
        let t = unsafe { op.tensor() };
        if t.is_view() {
            continue;
        }
        // SAFETY: as above; an owner's value is its own.
        let v = unsafe { t.value_mut() };
        v.storage = None;
        v.error = None;
    }
}
