//! The count of an owner's live views, and the handshake between a new view and an
//! explicit release of the owner.
//!
//! An explicit release (`Array::release`, MXNet's `DeleteVariable`) frees an owner's storage
//! after every use already made of it, unless views of that storage are alive: then the
//! storage stays for them, and is freed once its last reference (the last view's among them)
//! drops. A view may be made on one thread while the owner is released on another, and no
//! handle's drop orders the two. What orders them is this handshake, Dekker's pattern:
//!
//! 1. **A new view** counts itself ([`ViewCount::enter`]), issues a `SeqCst` fence, then
//!    loads the owner's `released` flag; if it is set, it uncounts itself and is refused.
//! 2. **An explicit release** sets the flag ([`ViewCount::release`]), issues a `SeqCst`
//!    fence, then loads the count; if it is not zero, the release waits for the views.
//!
//! In the single total order of the two fences one comes first, and the load after the
//! other sees the store before it: the new view sees the flag (and is refused), or the
//! release sees the count (and waits). A release can never free a storage a view that was
//! made is still using. `tests/loom` checks this on every interleaving, with a model that
//! plants relaxed fences and must fail.
//!
//! # Memory ordering
//!
//! The count and the flag are otherwise relaxed: the fences order the two stores before the
//! two loads. A view's uncount when it is done ([`ViewCount::leave`]) needs no ordering of
//! its own: whoever frees the storage learns that the view is done through the owner's
//! reference count (release/acquire, as `Arc`), not through this count.

use crate::sync::{fence, AtomicBool, AtomicU32, Ordering};

/// The live views of an owner's storage.
#[derive(Debug, Default)]
pub(crate) struct ViewCount(AtomicU32);

/// What an explicit release found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Release {
    /// The tensor was released already.
    Again,
    /// No view is alive: the storage may go after every use made of it.
    Now,
    /// Views are alive: the storage stays until its last reference drops.
    AfterViews,
}

impl ViewCount {
    /// Count a new view of the owner whose `released` flag is given (step 1); `false` (and
    /// nothing counted) if the owner is released.
    pub(crate) fn enter(&self, released: &AtomicBool) -> bool {
        self.0.fetch_add(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        if released.load(Ordering::Relaxed) {
            self.0.fetch_sub(1, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// A view is done with the storage.
    pub(crate) fn leave(&self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }

    /// Release the owner whose `released` flag is given (step 2).
    pub(crate) fn release(&self, released: &AtomicBool) -> Release {
        if released.swap(true, Ordering::Relaxed) {
            return Release::Again;
        }
        fence(Ordering::SeqCst);
        if self.0.load(Ordering::Relaxed) > 0 {
            Release::AfterViews
        } else {
            Release::Now
        }
    }

    /// [`enter`](Self::enter) with its fence made relaxed: the planted bug of the loom model.
    #[cfg(loom)]
    #[allow(dead_code)] // called by the model (tests/loom/views.rs), not by the library
    pub(crate) fn enter_unfenced(&self, released: &AtomicBool) -> bool {
        self.0.fetch_add(1, Ordering::Relaxed);
        if released.load(Ordering::Relaxed) {
            self.0.fetch_sub(1, Ordering::Relaxed);
            return false;
        }
        true
    }
}
