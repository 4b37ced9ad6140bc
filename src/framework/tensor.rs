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
/// the handle's reference passes to a new `Release`; otherwise the object is freed.
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
    if !t.released.load(Ordering::Relaxed) && t.last_stream.load(Ordering::Relaxed) != NO_STREAM {
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
    // SAFETY: no reference is left (the last dropped), and nothing will dereference the object
    // again: it was never used; or its Release (which outlives every instruction that
    // used it) has dropped; or its VM is gone, which means that every VM thread has exited
    // after each device stream ran what was launched on it (`scheduler_main`), and that
    // the instructions it never ran are only dropped, which reads no tensor.
    unsafe { free(p) };
}

impl Tensor {
    /// A new tensor object with one handle, for the use `fetch` says; `meta_id` is `vm`'s
    /// number for `meta`.
    #[inline]
    pub(crate) fn made_for(id: u64, meta: TensorMeta, meta_id: MetaId, vm: EngineRef, fetch: Fetch) -> Self {
        Tensor(alloc_object(|| TensorInner::new(id, meta, meta_id, vm, fetch)))
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
