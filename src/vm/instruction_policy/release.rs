//! `Release`: the last use of a tensor frees its storage and clears its error.

use super::super::instruction::Operand;

/// Free the storage of each of `ops` (a `Release` has one) and clear its error.
// Inlined: every arm of `execute_other`'s match runs inside that one out-of-line function.
#[inline(always)]
pub(super) fn release(ops: &[Operand]) {
    for op in ops {
        // SAFETY: the Release is running, and owns its operand's tensor (alive); it holds
        // the write access to it: every earlier access has finished (or precedes it on
        // this stream's FIFO).
        let v = unsafe { op.tensor().value_mut() };
        v.storage = None;
        v.error = None;
    }
}
