//! Releases deferred by the building thread.
//!
//! In an eager loop the caller drops a tensor's last handle on nearly every call
//! (`x = b.call(add, &[&x, &y], ..)` drops the old `x`), while its builder is open. Made one
//! at a time, each such release takes the release rule's step 3 (`framework::release`): a
//! `SeqCst` fence, a tick of the shared clock, two locks and another fence, plus an upgrade
//! of the tensor's reference to its VM, all to learn that the release must wait for the
//! builder's batch anyway. A thread that holds an open builder of a VM therefore keeps the
//! released tensors of that VM in a thread-local list instead, and the builder makes their
//! releases when it submits its batch (`InstructionsBuilder::flush`), with one fence and
//! one tag for all of them (`Releases::release_all`). Making a release later is always
//! allowed: a later tag only makes it wait for more batches. It is made no later than the
//! builder's next submission (at most `batch_size` calls, its `flush`, or the end of its
//! `run`), which is when the rule would have let it go anyway, unless another thread's
//! batch was open as well.
//!
//! # Which thread, which builder
//!
//! The list belongs to the thread, and to the first builder made on it while it had none
//! (the *owner*; builders made while one owns the list, such as the one a host read makes
//! inside a `run`, do not take it). Only releases of the owner's VM are deferred, and only
//! while the owner is alive: it holds its VM alive, so a deferred release always has a VM
//! to go to. Every builder of that VM flushing on this thread makes the deferred releases,
//! and the owner makes them and gives the list up when it drops.
//!
//! A builder may be moved to another thread (it is `Send`, and a scoped thread may borrow
//! it) and dropped there, where it cannot reach its thread's list. It then clears a flag
//! the list shares with it (`live`); the list's thread, on its next release, next builder,
//! or exit, finds the flag clear and makes the releases the list still holds itself. A
//! release is therefore never lost, though in that case it may wait for that thread's next
//! such event.

use std::cell::RefCell;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::vm::tensor::{TensorInner, TensorOwner};
use crate::vm::{Engine, EngineRef};

use super::virtual_machine::release_owned;

/// The thread's list of deferred releases and who owns it.
struct Local {
    /// The owner's VM (`Engine::identity`); `None` while no builder owns the list.
    engine: Option<EngineRef>,
    /// Whether the owner is alive; shared with it, and kept to be used again.
    live: Option<Arc<AtomicBool>>,
    /// Tensors whose last handle dropped on this thread while the owner was alive, each with
    /// the reference its `Release` will hold.
    owners: Vec<TensorOwner>,
}

impl Drop for Local {
    /// At thread exit: make the releases still deferred (the owner was moved away).
    fn drop(&mut self) {
        release_stale(std::mem::take(&mut self.owners));
    }
}

thread_local! {
    static LOCAL: RefCell<Local> =
        const { RefCell::new(Local { engine: None, live: None, owners: Vec::new() }) };
}

/// A builder's claim on its thread's list (`None` if another builder owns it).
pub(crate) struct Ownership {
    live: Arc<AtomicBool>,
}

/// A builder of `engine` is made on this thread: it owns the thread's list if no live
/// builder does.
pub(crate) fn enter(engine: &Arc<Engine>) -> Option<Ownership> {
    let stale = LOCAL
        .try_with(|l| {
            let mut l = l.try_borrow_mut().ok()?;
            if l.live.as_ref().is_some_and(|f| f.load(Ordering::Acquire)) {
                return None;
            }
            // No owner, or an owner dropped on another thread (its list is made below).
            let live = match l.live.take() {
                Some(f) if Arc::strong_count(&f) == 1 => f,
                _ => Arc::new(AtomicBool::new(false)),
            };
            live.store(true, Ordering::Relaxed);
            l.live = Some(live.clone());
            l.engine = Some(engine.identity());
            Some((std::mem::take(&mut l.owners), Ownership { live }))
        })
        .ok()
        .flatten();
    let (left, ownership) = stale?;
    release_stale(left);
    Some(ownership)
}

/// Defer the release of `p`, whose last handle just dropped on this thread, if this
/// thread's list takes releases of its VM. Returns false, having done nothing, otherwise.
///
/// # Safety
/// As for `TensorOwner::adopt`: `p`'s last reference has just dropped on this thread, and the
/// object has not been freed.
#[inline]
pub(crate) unsafe fn defer(p: NonNull<TensorInner>) -> bool {
    // SAFETY: the object is alive (the contract).
    let vm = Some(unsafe { p.as_ref() }.vm);
    LOCAL
        .try_with(|l| {
            let Ok(mut l) = l.try_borrow_mut() else { return (false, Vec::new()) };
            if l.engine != vm {
                return (false, Vec::new());
            }
            if !l.live.as_ref().is_some_and(|f| f.load(Ordering::Relaxed)) {
                // The owner was dropped on another thread: make what it left here.
                l.engine = None;
                return (false, std::mem::take(&mut l.owners));
            }
            // SAFETY: the contract.
            l.owners.push(unsafe { TensorOwner::adopt(p) });
            (true, Vec::new())
        })
        .map(|(deferred, stale)| {
            if !stale.is_empty() {
                release_stale(stale);
            }
            deferred
        })
        .unwrap_or(false)
}

/// Move the releases this thread deferred for `engine` into `into` (emptied first), for the
/// caller to make.
pub(crate) fn take(engine: &Arc<Engine>, into: &mut Vec<TensorOwner>) {
    into.clear();
    let _ = LOCAL.try_with(|l| {
        if let Ok(mut l) = l.try_borrow_mut() {
            if l.engine == Some(engine.identity()) && !l.owners.is_empty() {
                std::mem::swap(&mut l.owners, into);
            }
        }
    });
}

impl Ownership {
    /// The owner drops: give the list up. On the thread it was made on, the caller has
    /// made the deferred releases; elsewhere the flag tells the list's thread to.
    pub(crate) fn leave(self) {
        self.live.store(false, Ordering::Release);
        let _ = LOCAL.try_with(|l| {
            if let Ok(mut l) = l.try_borrow_mut() {
                if l.live.as_ref().is_some_and(|f| Arc::ptr_eq(f, &self.live)) {
                    l.engine = None;
                }
            }
        });
    }
}

/// Make the releases left in a list whose owner is gone, each through its own VM.
#[cold]
fn release_stale(owners: Vec<TensorOwner>) {
    for t in owners {
        match t.vm.upgrade() {
            Some(vm) => release_owned(&vm, t),
            // The VM is gone and with it every instruction: dropping the owner frees it.
            None => drop(t),
        }
    }
}
