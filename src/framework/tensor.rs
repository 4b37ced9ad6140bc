//! The user's tensor handle.
//!
//! A [`Tensor`] is a counted reference to the engine's tensor object
//! (`vm::tensor::TensorInner`): cloning adds to the object's count, and dropping
//! the last handle of a tensor that some instruction used has its `Release` emitted under
//! the release rule (`framework::release`), ordered after every instruction that used it,
//! so dropping a handle never waits. Waiting for and reading a tensor (`wait`, `to_vec`)
//! go through a host access built by the front end.

use std::collections::TryReserveError;
use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::ep::DeviceId;
use crate::vm::tensor::{
    add_ref, alloc_object, drop_ref, free, Fetch, MetaId, TensorInner, TensorOwner, NO_STREAM,
};
use crate::vm::{DType, Element, Engine, EngineRef, Error, Result, TensorMeta};

/// The user's handle to a tensor. Cloning is cheap (one counter on the tensor's first
/// cache line); when the last clone drops, the tensor's storage is released by a `Release`
/// instruction ordered after every instruction that used it, so dropping a handle never
/// waits.
pub struct Tensor(NonNull<TensorInner>);

// SAFETY: a Tensor is a counted shared reference to a TensorInner, which is Send and Sync
// (its own SAFETY comments); the count is atomic.
unsafe impl Send for Tensor {}
// SAFETY: as for Send.
unsafe impl Sync for Tensor {}

impl Clone for Tensor {
    #[inline]
    fn clone(&self) -> Self {
        add_ref(self.inner());
        Tensor(self.0)
    }
}

impl Drop for Tensor {
    #[inline]
    fn drop(&mut self) {
        // SAFETY: this handle is a reference to a live object.
        if unsafe { drop_ref(self.0) } {
            // SAFETY: the last reference dropped: this thread holds the only access.
            unsafe { last_reference_dropped(self.0) }
        }
    }
}

/// The last handle of a tensor dropped. If the tensor was used and has no `Release` yet,
/// the handle's reference passes to a new `Release`; otherwise the object is freed (and a
/// view's reference to its owner is dropped after it).
///
/// # Safety
/// The last reference to `p` has just dropped (`drop_ref`), so no other exists.
#[cold]
unsafe fn last_reference_dropped(p: NonNull<TensorInner>) {
    // SAFETY: the object is alive until freed below, and no other thread can reach it.
    let t = unsafe { p.as_ref() };
    // A load and a store, not a swap: with no handle left, no other thread can set the flag
    // now (an explicit release needs a handle), and one that did earlier is ordered before
    // this by the count's release/acquire pair.
    let releasing = !t.released.load(Ordering::Relaxed) || t.release_deferred.load(Ordering::Relaxed);
    if releasing && t.last_stream.load(Ordering::Relaxed) != NO_STREAM {
        t.released.store(true, Ordering::Relaxed);
        // SAFETY: the last reference dropped on this thread (the contract), and the object is
        // alive.
        if unsafe { super::deferred::defer(p) } {
            return;
        }
        if let Some(vm) = t.vm.upgrade() {
            // SAFETY: the last reference dropped on this thread (the contract), and the object
            // is alive.
            super::virtual_machine::release_owned(&vm, unsafe { TensorOwner::adopt(p) });
            return;
        }
    }
    // A view done with: its reference to its owner goes once the view object is freed (no
    // instruction names the view any more).
    let base = hand_off_base(t);
    // SAFETY: no reference is left (the last dropped), and nothing will dereference the object
    // again: it was never used; or its Release (which outlives every instruction that
    // used it) has dropped; or its VM is gone, which means that every VM thread has exited
    // after each device stream ran what was launched on it (`scheduler_main`), and that
    // the instructions it never ran are only dropped, which reads no tensor.
    unsafe { free(p) };
    drop(base);
}

/// The handle of its owner that the view `t` held, handed back (once; `None` for an owner,
/// or if already handed back): the caller drops it once no instruction that names the view
/// can be submitted before the owner's `Release` (after the view's own `Release` is in the
/// inbox, or when the view is freed without one).
pub(crate) fn hand_off_base(t: &TensorInner) -> Option<Tensor> {
    let base = t.base_ptr()?;
    if t.base_handed.swap(true, Ordering::AcqRel) {
        return None;
    }
    // SAFETY: the view's counted reference to its owner keeps the owner alive; it passes to
    // the handle made here (the flag above makes that happen once).
    let owner = unsafe { base.as_ref() };
    owner.views.leave();
    Some(Tensor(base))
}

thread_local! {
    /// Owners' handles that views handed back while their `Release`s were being put in
    /// batches not yet submitted by this thread (`push_release`): dropped by
    /// [`drop_handed_bases`] after this thread's next submission.
    static HANDED: std::cell::RefCell<Vec<Tensor>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Keep `base`, an owner's handle a view handed back as its `Release` went into a batch,
/// until this thread has submitted that batch ([`drop_handed_bases`]): the owner's own
/// `Release`, which dropping the handle may emit, must come after the view's.
pub(crate) fn hand_back_later(base: Tensor) {
    if let Err(std::thread::AccessError { .. }) = HANDED.try_with(|h| h.borrow_mut().push(base)) {
        // The thread is exiting: every batch it built is submitted by now.
    }
}

/// Drop the owners' handles views handed back on this thread ([`hand_back_later`]): called
/// after this thread submits its batches, so that every `Release` of a view put in a batch
/// by this thread is in the inbox before its owner's. Returns whether it dropped any.
pub(crate) fn drop_handed_bases() -> bool {
    let handed = HANDED.try_with(|h| std::mem::take(&mut *h.borrow_mut())).unwrap_or_default();
    let any = !handed.is_empty();
    drop(handed);
    any
}

impl Tensor {
    /// A new tensor object with one handle, for the use `fetch` says; `meta_id` is `vm`'s
    /// number for `meta`.
    #[inline]
    pub(crate) fn made_for(id: u64, meta: TensorMeta, meta_id: MetaId, vm: EngineRef, fetch: Fetch) -> Self {
        Tensor(alloc_object(|| TensorInner::new(id, meta, meta_id, vm, fetch)))
    }

    /// [`made_for`](Self::made_for), for a tensor that owns its storage but lays it out in
    /// another order than row-major (`meta`'s strides: a pointwise op's output laid out like
    /// its inputs, `VirtualMachine::empty_strided`): its elements are its whole storage,
    /// but not in row-major order, so it is not [`is_whole`](Self::is_whole).
    pub(crate) fn made_strided(id: u64, meta: TensorMeta, meta_id: MetaId, vm: EngineRef) -> Self {
        Tensor(alloc_object(|| {
            let mut t = TensorInner::new(id, meta, meta_id, vm, Fetch::No);
            t.whole = false;
            t
        }))
    }

    /// The tensor's id, unique within its VM; errors and traces name tensors by it.
    pub fn id(&self) -> u64 {
        self.inner().id
    }
    /// Shape, dtype and device.
    pub fn meta(&self) -> &TensorMeta {
        &self.inner().meta
    }
    /// Dimension sizes.
    pub fn shape(&self) -> &[usize] {
        &self.inner().meta.shape
    }
    /// Element type.
    pub fn dtype(&self) -> DType {
        self.inner().meta.dtype
    }
    /// Where the storage lives.
    pub fn device(&self) -> DeviceId {
        self.inner().meta.device
    }
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.inner().meta.numel()
    }

    pub(crate) fn vm(&self) -> Result<Arc<Engine>> {
        self.inner().vm.upgrade().ok_or(Error::ShutDown)
    }

    #[inline]
    pub(crate) fn inner(&self) -> &TensorInner {
        // SAFETY: a handle is a counted reference: the object lives at least as long.
        unsafe { self.0.as_ref() }
    }

    pub(crate) fn check_live(&self) -> Result<()> {
        if self.inner().released.load(Ordering::Relaxed) {
            return Err(Error::Released { tensor: self.id() });
        }
        Ok(())
    }

    /// The tensor's bytes, once every instruction issued so far that writes it has finished.
    pub(crate) fn read_bytes(&self) -> Result<Vec<u8>> {
        super::virtual_machine::read_bytes(&self.vm()?, self)
    }

    /// A view of this tensor's storage: the elements `shape` and `strides` name from
    /// element `offset` of the storage (strides and offset in elements of the storage, as
    /// PyTorch's `as_strided`). No copy is made and nothing runs: the view reads and writes
    /// the storage itself, ordered with every other use of it by the storage's one dependence
    /// object. Refused with [`Error::InvalidOperands`] (op `as_strided`) if the layout
    /// reaches outside the storage, and with [`Error::Released`] for a released tensor.
    ///
    /// ```
    /// use eagervm::prelude::*;
    ///
    /// let vm = VirtualMachine::new(Config::default())?;
    /// let x = vm.from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3], DeviceId::CPU)?;
    /// let col = x.view_layout(&[2], &[3], 1)?; // x[:, 1]
    /// assert_eq!(col.shape(), &[2]);
    /// assert!(x.view_layout(&[2], &[3], 4).is_err()); // element 7 of 6
    /// # Ok::<(), eagervm::Error>(())
    /// ```
    pub fn view_layout(&self, shape: &[usize], strides: &[isize], offset: usize) -> Result<Tensor> {
        self.view_in(&self.vm()?, shape, strides, offset)
    }

    /// [`view_layout`](Self::view_layout) for a caller that holds this tensor's engine (an
    /// eager context: no lookup of the engine by its number).
    pub(crate) fn view_in(
        &self,
        engine: &Arc<Engine>,
        shape: &[usize],
        strides: &[isize],
        offset: usize,
    ) -> Result<Tensor> {
        self.check_live()?;
        if !self.inner().belongs_to(engine.identity()) {
            return Err(Error::ForeignTensor { op: "as_strided".into(), tensor: self.id() });
        }
        let owner = self.inner().owner();
        let meta = self.meta().with_layout(shape, strides, offset);
        let bad = |detail: String| Error::InvalidOperands { op: "as_strided".into(), detail };
        // The view's element count must be a number; its bytes are its storage's.
        crate::vm::shape::check(shape, meta.dtype, u64::MAX, || "`as_strided`".into())?;
        meta.check_layout(owner.meta.numel()).map_err(bad)?;
        let meta_id = engine.intern(&meta);
        let id = engine.next_tensor_id();
        // The handshake with an explicit release of the owner (`vm::views`): counted, then
        // the flag read again.
        if !owner.views.enter(&self.inner().released) {
            return Err(Error::Released { tensor: self.id() });
        }
        add_ref(owner);
        let owner_ptr = NonNull::from(owner);
        let split = engine.config().fault.split_view_dependences;
        // SAFETY: `owner` is an owner (`TensorInner::owner`), alive while `self` is, and the
        // reference counted above is the view's, handed back by `hand_off_base`.
        Ok(Tensor(alloc_object(|| unsafe { TensorInner::new_view(id, meta, meta_id, owner_ptr, split) })))
    }

    /// Whether this tensor is a view of another's storage ([`view_layout`](Self::view_layout)).
    pub fn is_view(&self) -> bool {
        self.inner().is_view()
    }

    /// Whether this tensor and `other` lie in the same storage (`false` if either is
    /// released: a released view may have let its storage go).
    pub fn shares_storage(&self, other: &Tensor) -> bool {
        self.check_live().is_ok()
            && other.check_live().is_ok()
            && std::ptr::eq(self.inner().owner(), other.inner().owner())
    }

    /// The owner of this tensor's storage: the tensor itself, or the one it views.
    /// [`Error::Released`] for a released tensor.
    pub fn storage_owner(&self) -> Result<Tensor> {
        self.check_live()?;
        let owner = self.inner().owner();
        add_ref(owner);
        Ok(Tensor(NonNull::from(owner)))
    }

    /// Whether this tensor's elements are its whole storage, each once, in row-major order
    /// from the start (every tensor the VM makes; a view that is all of its storage).
    pub fn is_whole(&self) -> bool {
        self.inner().whole
    }

    /// Release the tensor while handles of it may still be alive (`Array::release`).
    pub(crate) fn release_now(&self) -> Result<()> {
        super::virtual_machine::release_tensor(&*self.vm()?, self);
        Ok(())
    }

    /// Wait until every instruction issued so far that writes this tensor has finished.
    /// Returns the error the tensor carries, if the instruction that last wrote it failed
    /// (or read a failed tensor). Every call returns it again; a later successful write
    /// clears it.
    pub fn wait(&self) -> Result<()> {
        super::virtual_machine::wait_tensor(&self.vm()?, self)
    }

    /// Lend the tensor's host bytes, once every instruction issued so far that writes it
    /// has finished (a zero-copy export: DLPack, `docs/python.md`). The loan keeps the bytes
    /// allocated until it drops, even after this tensor's `Release`, its last handle or its
    /// VM; it points at the tensor's own storage, or for a tensor on a device at a host
    /// copy made through the device's device-to-host stream. Returns the error the tensor
    /// carries, or [`Error::Uninitialized`] if nothing has written it.
    ///
    /// The loan grants no access: an instruction issued later that writes this tensor
    /// writes the lent bytes in place, so a reader through the pointer waits for the VM's
    /// writes ([`wait`](Self::wait)) before it reads, and a writer through it waits until
    /// no instruction uses the tensor.
    pub fn lend_host(&self) -> Result<crate::alloc::HostLoan> {
        super::virtual_machine::lend_host(&self.vm()?, self)
    }

    /// Copy the tensor's elements to a `Vec` (waiting for pending writes first). Tensors on
    /// a device are copied to the host through the device's device-to-host stream.
    ///
    /// The buffers are allocated fallibly: if the host read cannot get its copy of the bytes
    /// it returns [`Error::Alloc`]; if the `Vec` returned cannot be allocated,
    /// [`Error::Access`] (out of memory). The tensor is untouched either way.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        if T::DTYPE != self.dtype() {
            return Err(Error::DType { expected: self.dtype(), found: T::DTYPE });
        }
        let bytes = self.read_bytes()?;
        self.values_of(&bytes)
    }

    /// `bytes` read from this tensor as values of type `T` (checked against the dtype by
    /// the caller).
    pub(crate) fn values_of<T: Element>(&self, bytes: &[u8]) -> Result<Vec<T>> {
        T::try_from_bytes(bytes).map_err(|e| out_of_host_memory(self.id(), bytes.len(), "the values read", e))
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner().fmt(f)
    }
}

/// The error of a caller-side buffer (`to_vec`'s values, `write`'s copy of the data) that
/// could not be allocated: nothing ran, or what ran is untouched.
#[cold]
pub(crate) fn out_of_host_memory(tensor: u64, bytes: usize, what: &str, e: TryReserveError) -> Error {
    Error::Access { tensor, detail: format!("out of memory allocating {bytes} bytes for {what} ({e})") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_caller_buffer_that_cannot_be_allocated_is_a_typed_error() {
        // The one refusal that can be produced without real memory pressure.
        let refused = Vec::<u64>::new().try_reserve_exact(usize::MAX).unwrap_err();
        match out_of_host_memory(9, usize::MAX, "the values read", refused) {
            Error::Access { tensor: 9, detail } => {
                assert!(detail.starts_with(&format!(
                    "out of memory allocating {} bytes for the values read",
                    usize::MAX
                )))
            }
            other => panic!("{other:?}"),
        }
    }
}
