//! The tensor object's reference count (`vm::tensor::TensorInner::refs`).
//!
//! It counts the user's handles and the `Release` instruction's owner, as `Arc`'s strong
//! count does, with one difference on the drop: a reference that finds the count at one
//! is the last one, and returns without writing the count ([`RefCount::drop_one`]). In an
//! eager loop nearly every drop is a last one (`x = f(x)` drops the old `x`, then its
//! `Release` drops the reference it was handed), and each is then a load instead of a
//! locked read-modify-write.
//!
//! # Memory ordering
//!
//! Why the load is enough: a count of one read by the holder of a reference means that no
//! other reference exists, and none can be made (only a holder of a reference can add one,
//! [`RefCount::add`]), so nothing can change the count any more. Every other reference was
//! dropped by a `Release` decrement, and the `Acquire` load that reads one synchronises
//! with the decrement it reads, and through the count's release sequence with every earlier
//! one, exactly as the acquire after `Arc`'s final decrement does: everything the other
//! holders did happens before what the last one does next (frees the object, or hands it to
//! a `Release`). A decrement that leaves one is a release, as in `Arc`.
//!
//! The count is left at one or zero when the last reference drops; whoever takes the object
//! over next sets it ([`RefCount::reset_to_one`]). `tests/loom/refcount.rs` checks this under
//! loom, with a planted bug (a relaxed load) that it finds.

use crate::sync::{AtomicUsize, Ordering};

/// A reference count that starts at one (module docs).
#[derive(Debug)]
pub(crate) struct RefCount(AtomicUsize);

impl RefCount {
    /// A count of one: the reference of whoever made the object.
    pub(crate) fn one() -> Self {
        RefCount(AtomicUsize::new(1))
    }

    /// Add a reference (relaxed: it is made from an existing one, which already orders
    /// every access the new one can make, as in `Arc::clone`).
    #[inline]
    pub(crate) fn add(&self) {
        if self.0.fetch_add(1, Ordering::Relaxed) > isize::MAX as usize {
            // 2^63 live references: only leaked handles get here. Going on would wrap the
            // count and free a live object.
            std::process::abort();
        }
    }

    /// Drop a reference the caller holds; returns whether it was the last one, in which
    /// case every other reference's accesses happen before the caller's next ones.
    #[inline]
    pub(crate) fn drop_one(&self) -> bool {
        if self.0.load(Ordering::Acquire) == 1 {
            // The only reference: nothing can add one any more (module docs).
            return true;
        }
        if self.0.fetch_sub(1, Ordering::Release) != 1 {
            return false;
        }
        // Synchronise with every earlier drop's release decrement (they all belong to the
        // count's release sequence). A load rather than a fence, as `Arc` does under
        // ThreadSanitizer, which does not model fences; on x86 both cost nothing.
        self.0.load(Ordering::Acquire);
        true
    }

    /// The last reference dropped ([`drop_one`](Self::drop_one) returned true): the object's
    /// new owner holds the one reference now (relaxed: no other thread can reach the
    /// object).
    #[inline]
    pub(crate) fn reset_to_one(&self) {
        self.0.store(1, Ordering::Relaxed);
    }

    /// [`drop_one`](Self::drop_one) with its shortcut's load relaxed: a bug, planted for
    /// the loom model to find (`tests/loom/refcount.rs`).
    #[cfg(loom)]
    #[allow(dead_code)]
    pub(crate) fn planted_relaxed_drop_one(&self) -> bool {
        if self.0.load(Ordering::Relaxed) == 1 {
            return true;
        }
        self.0.fetch_sub(1, Ordering::Release) == 1 && {
            self.0.load(Ordering::Acquire);
            true
        }
    }
}
