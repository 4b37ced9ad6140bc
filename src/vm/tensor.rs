//! The engine's tensor object: metadata, value, dependence cell and reference count.
//!
//! A tensor has three kinds of state, each with one owner (DESIGN.md, "One owner"):
//!
//! | state | who touches it | how it is kept race-free |
//! | --- | --- | --- |
//! | [`TensorMeta`] | anyone | immutable after creation |
//! | value: storage and error | the instruction that the dependence rules let run | the scheduler orders every writer after all earlier accesses, and every reader after the last writer; same-stream order is kept by the stream's FIFO |
//! | dependence object | the scheduler thread alone | only the scheduler dereferences it |
//! | soft-sync state (`last_stream`, `released`) | the front end's caller thread building instructions; `released` also the thread of an explicit release (`Array::release`) | atomics (relaxed: program order is the caller's own; an explicit release is ordered with the builders' checks by the release rule's fences) |
//!
//! The object lives here, in the engine, because the scheduler and the workers reach a
//! tensor through it; the front end (`framework::tensor`) wraps it in the user's handle and
//! keeps its soft-sync and release state in the fields laid out for it. A tensor's storage
//! is allocated by the first instruction that writes it and freed by a `Release`
//! instruction that the last handle's drop has the front end emit after every earlier use.

use std::cell::UnsafeCell;
use std::collections::TryReserveError;
use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU32};
use std::sync::{Arc, OnceLock};

use smallvec::SmallVec;

use crate::alloc::objects::{Local, ObjectPool};
use crate::alloc::Storage;
use crate::ep::DeviceId;

use super::dependence::DepObject;
use super::error::Error;
use super::refcount::RefCount;
use super::EngineRef;

/// Element type of a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// 32-bit float.
    F32,
    /// 64-bit signed integer.
    I64,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::I64 => 8,
        }
    }
    /// Name used in messages and traces (`f32`, `i64`).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::I64 => "i64",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A tensor's shape: dimension sizes, outermost first. `[]` is a scalar.
pub type Shape = SmallVec<[usize; 4]>;

/// Shape, dtype and device of a tensor.
#[derive(Debug, Clone, Eq)]
pub struct TensorMeta {
    /// Dimension sizes.
    pub shape: Shape,
    /// Element type.
    pub dtype: DType,
    /// Where the storage lives.
    pub device: DeviceId,
}

impl PartialEq for TensorMeta {
    /// Field by field, dimensions in a plain loop: shapes are short, and metas are compared
    /// whenever the VM numbers one (`Engine::intern`) and on every call the builder
    /// checks in full.
    #[inline]
    fn eq(&self, other: &Self) -> bool {
        self.dtype == other.dtype
            && self.device == other.device
            && self.shape.len() == other.shape.len()
            && self.shape.iter().zip(&other.shape).all(|(a, b)| a == b)
    }
}

impl std::hash::Hash for TensorMeta {
    /// The same fields as `eq` compares.
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.shape[..].hash(state);
        self.dtype.hash(state);
        self.device.hash(state);
    }
}

impl TensorMeta {
    /// A new meta.
    pub fn new(shape: &[usize], dtype: DType, device: DeviceId) -> Self {
        TensorMeta { shape: shape.iter().copied().collect(), dtype, device }
    }
    /// Number of elements. Exact for the meta of every tensor, whose shape passed
    /// [`shape::check`](super::shape::check); a meta built by hand whose count overflows
    /// gives `usize::MAX` rather than a wrapped count.
    #[inline]
    pub fn numel(&self) -> usize {
        match self.shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d)) {
            Some(n) => n,
            None if self.shape.contains(&0) => 0,
            None => usize::MAX,
        }
    }
    /// Size of the storage in bytes (like [`numel`](Self::numel), `usize::MAX` for a meta
    /// built by hand whose size overflows).
    #[inline]
    pub fn bytes(&self) -> usize {
        self.numel().saturating_mul(self.dtype.size())
    }
    /// `f32[2, 3]` style description (no device).
    pub fn describe(&self) -> String {
        let dims: Vec<String> = self.shape.iter().map(|d| d.to_string()).collect();
        format!("{}[{}]", self.dtype, dims.join(", "))
    }
}

/// The value of a tensor: its bytes (once written) and the error it carries, if the last
/// instruction that wrote it failed.
#[derive(Debug, Default)]
pub(crate) struct TensorValue {
    pub(crate) storage: Option<Storage>,
    pub(crate) error: Option<Arc<Error>>,
}

/// A cache line of its own (64 bytes, aligned).
#[repr(C, align(64))]
struct Line<T>(T);

/// The object shared by the user's handles and the instructions that use a tensor.
///
/// Laid out by who touches what: the caller's state (reference count, soft-sync state,
/// what a call's check reads, metadata) fills the first two lines, with everything the
/// check of a call reads in the first; the value (the worker's) and the dependence object
/// (the scheduler's) each start a line of their own, so that the three threads that touch
/// every tensor do not move each other's lines between cores.
///
/// # Ownership
///
/// `refs` counts the user's handles ([`Tensor`]) plus, once the tensor's `Release` has
/// been emitted, the one [`TensorOwner`] that instruction holds. Instructions themselves
/// hold uncounted pointers (`TensorPtr`), which the `Release` (ordered after all of them)
/// outlives. When the last handle drops and no `Release` has been emitted yet, its count
/// passes to the new `Release` instead of freeing the object; the object is freed when the
/// count reaches zero otherwise.
#[repr(C)]
pub(crate) struct TensorInner {
    refs: RefCount,
    /// Index of the VM stream that last used this tensor, `NO_STREAM` if none (soft sync).
    pub(crate) last_stream: AtomicU32,
    /// The VM's number for `meta` (`MetaId::NONE` if it has none): the builder checks a
    /// call's signature by comparing these.
    pub(crate) meta_id: MetaId,
    /// Set when the tensor's `Release` has been emitted.
    pub(crate) released: AtomicBool,
    /// Whether the VM made this tensor to receive the copy that a host access of a device
    /// tensor reads (immutable; read only when that copy finds its input unwritten).
    pub(crate) fetch: Fetch,
    pub(crate) id: u64,
    pub(crate) vm: EngineRef,
    pub(crate) meta: TensorMeta,
    value: Line<UnsafeCell<TensorValue>>,
    dep: Line<UnsafeCell<DepObject>>,
}

/// A VM's number for a [`TensorMeta`] (see `Engine::intern`): two tensors of one VM have
/// the same meta exactly when they have the same number, unless it is [`MetaId::NONE`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct MetaId(pub(crate) u32);

impl MetaId {
    /// No number: the meta is compared in full.
    pub(crate) const NONE: MetaId = MetaId(u32::MAX);
}

/// What a tensor is for, if the VM made it as the host copy that `Tensor::wait` or
/// `Tensor::to_vec` of a device tensor reads: the copy then answers for an unwritten device
/// tensor as the access of an unwritten host tensor does
/// (`vm::instruction_policy::op_call`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Fetch {
    /// An ordinary tensor.
    No,
    /// The host copy of a `Tensor::wait`.
    Wait,
    /// The host copy of a `Tensor::to_vec`.
    Read,
}

/// `last_stream` value of a tensor no instruction has used yet.
pub(crate) const NO_STREAM: u32 = u32::MAX;

// SAFETY: `meta` and `id` are immutable and the atomics are Sync. The two cells are never
// touched concurrently: `dep` only by the scheduler thread (`dep_mut`'s contract), and
// `value` only by the instruction that the scheduler's dependence rules currently let
// access it, with happens-before edges between successive accessors established by the
// queues and completion reports they pass through (`value`/`value_mut`'s contract).
unsafe impl Sync for TensorInner {}
// SAFETY: all fields are Send (Storage owns its block; Arc<Error> is Send).
unsafe impl Send for TensorInner {}

impl TensorInner {
    #[inline(always)]
    pub(crate) fn new(id: u64, meta: TensorMeta, meta_id: MetaId, vm: EngineRef, fetch: Fetch) -> Self {
        TensorInner {
            refs: RefCount::one(),
            last_stream: AtomicU32::new(NO_STREAM),
            meta_id,
            released: AtomicBool::new(false),
            fetch,
            id,
            vm,
            meta,
            value: Line(UnsafeCell::new(TensorValue::default())),
            dep: Line(UnsafeCell::new(DepObject::default())),
        }
    }

    /// A tensor object that belongs to no VM, for unit tests of the engine's parts.
    #[cfg(test)]
    pub(crate) fn for_test(id: u64, meta: TensorMeta) -> Box<TensorInner> {
        Box::new(TensorInner::new(id, meta, MetaId::NONE, EngineRef::NONE, Fetch::No))
    }

    /// The tensor's value, for reading.
    ///
    /// # Safety
    /// The caller must be running an instruction that holds a read (or write) access to
    /// this tensor under the dependence rules, so that no writer runs concurrently.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn value(&self) -> &TensorValue {
        // SAFETY: no concurrent writer, by the caller's contract.
        unsafe { &*self.value.0.get() }
    }

    /// The tensor's value, for writing.
    ///
    /// # Safety
    /// The caller must be running an instruction that holds the write access to this
    /// tensor under the dependence rules, so that no other access runs concurrently, and
    /// must not hold another reference obtained from `value`/`value_mut` at the same time.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn value_mut(&self) -> &mut TensorValue {
        // SAFETY: exclusive access, by the caller's contract.
        unsafe { &mut *self.value.0.get() }
    }

    /// Whether this tensor was made by the VM named `vm` (`Engine::identity`): one
    /// comparison of words, nothing upgraded or counted. No other VM of the process is ever
    /// named so, even after this tensor's VM is gone.
    #[inline(always)]
    pub(crate) fn belongs_to(&self, vm: EngineRef) -> bool {
        self.vm == vm
    }

    /// The dependence object.
    ///
    /// # Safety
    /// Only the scheduler thread may call this, and it must not hold two references to the
    /// same tensor's dependence object at once.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn dep_mut(&self) -> &mut DepObject {
        // SAFETY: single-threaded access by the scheduler, by the caller's contract.
        unsafe { &mut *self.dep.0.get() }
    }
}

impl fmt::Debug for TensorInner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "tensor {} {} on {}", self.id, self.meta.describe(), self.meta.device)
    }
}

/// Add a reference to `t`, as `Arc::clone` does (`vm::refcount`).
#[inline]
pub(crate) fn add_ref(t: &TensorInner) {
    t.refs.add();
}

/// Drop a reference to `p`; returns whether it was the last one, in which case every
/// other reference's accesses happen before the caller's next ones (as in `Arc::drop`;
/// `vm::refcount`: the last drop may leave the count at one rather than zero).
///
/// # Safety
/// `p` must point to a live tensor object and the caller must own one of its references.
#[inline]
pub(crate) unsafe fn drop_ref(p: NonNull<TensorInner>) -> bool {
    // SAFETY: the caller's reference keeps the object alive for this access.
    unsafe { p.as_ref() }.refs.drop_one()
}

/// The reference a `Release` instruction holds on its tensor ([`TensorInner`]'s docs,
/// "Ownership"). Dropping the last one frees the object; it never emits
/// anything.
pub(crate) struct TensorOwner(NonNull<TensorInner>);

// SAFETY: as for Tensor.
unsafe impl Send for TensorOwner {}
// SAFETY: as for Tensor.
unsafe impl Sync for TensorOwner {}

impl TensorOwner {
    /// A new counted reference to `t`, for a `Release` emitted while handles are alive.
    pub(crate) fn counted(t: &TensorInner) -> Self {
        add_ref(t);
        TensorOwner(NonNull::from(t))
    }

    /// Take over the object whose last handle just dropped: the count is one again, this
    /// owner's.
    ///
    /// # Safety
    /// [`drop_ref`] of `p` has just returned true on this thread (the last reference
    /// dropped), so no other reference to it exists, and the object has not been freed.
    pub(crate) unsafe fn adopt(p: NonNull<TensorInner>) -> Self {
        // SAFETY: the object is alive and no other thread can reach it (the contract).
        unsafe { p.as_ref() }.refs.reset_to_one();
        TensorOwner(p)
    }
}

/// Blocks of freed tensor objects kept for new ones in batches (`alloc::objects`): up to
/// 32768 objects of 256 bytes (8 MiB, kept only once that many were freed at once), as many as a
/// chain of small calls has in flight under the default back-pressure bound (65536
/// instructions, a call and a `Release` per tensor), so that a caller running that far
/// ahead of the workers still finds its objects in the pool once they catch up.
const POOLED_OBJECTS: usize = 1 << 15;

/// The pool every tensor object comes from and goes back to, whichever VM it belongs to: an
/// object is made on the caller's thread and usually freed on a VM thread.
fn objects() -> &'static ObjectPool<TensorInner> {
    static POOL: OnceLock<ObjectPool<TensorInner>> = OnceLock::new();
    POOL.get_or_init(|| ObjectPool::new(POOLED_OBJECTS))
}

thread_local! {
    /// This thread's stack of free tensor-object blocks (`alloc::objects`).
    static LOCAL_OBJECTS: Local<TensorInner> = const { Local::new() };
}

/// A new tensor object with a count of one, the one `make` returns, made in a block from
/// the pool; freed by [`free`] (or by the last `TensorOwner`'s drop).
#[inline(always)]
pub(crate) fn alloc_object(make: impl FnOnce() -> TensorInner) -> NonNull<TensorInner> {
    let pool = objects();
    // A thread that is exiting has no stack any more: the global allocator serves it.
    let block = LOCAL_OBJECTS.try_with(|l| pool.take(l)).ok().flatten();
    pool.place(block, make)
}

/// Free a tensor object.
///
/// # Safety
/// `p` came from [`alloc_object`], its last reference has dropped, and nothing will
/// dereference it again: no instruction that names it can still be admitted or run.
pub(crate) unsafe fn free(p: NonNull<TensorInner>) {
    let pool = objects();
    // SAFETY: the contract (the closure runs at most once, and only then is `p` freed).
    if LOCAL_OBJECTS.try_with(|l| unsafe { pool.free(Some(l), p) }).is_err() {
        // SAFETY: the contract; the stack was gone, so `p` was not freed above.
        unsafe { pool.free(None, p) }
    }
}

impl std::ops::Deref for TensorOwner {
    type Target = TensorInner;
    #[inline]
    fn deref(&self) -> &TensorInner {
        // SAFETY: this counted reference keeps the object alive.
        unsafe { self.0.as_ref() }
    }
}

impl Drop for TensorOwner {
    fn drop(&mut self) {
        // SAFETY: this is a counted reference to a live object.
        if unsafe { drop_ref(self.0) } {
            // SAFETY: no reference is left, and the Release holding this owner was the last
            // instruction to point to the object, which came from `alloc_object`.
            unsafe { free(self.0) };
        }
    }
}

impl fmt::Debug for TensorOwner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        (**self).fmt(f)
    }
}

/// A Rust element type that maps to a [`DType`].
pub trait Element: Copy + Send + Sync + 'static + fmt::Debug {
    /// The matching dtype.
    const DTYPE: DType;
    /// Decode native-endian bytes.
    fn from_bytes(bytes: &[u8]) -> Vec<Self>;
    /// Encode to native-endian bytes.
    fn to_bytes(values: &[Self]) -> Vec<u8>;
    /// [`Element::from_bytes`], or the error of a refused allocation instead of the global
    /// allocator's abort: for buffers whose size a program chooses.
    fn try_from_bytes(bytes: &[u8]) -> Result<Vec<Self>, TryReserveError>;
    /// [`Element::to_bytes`], or the error of a refused allocation.
    fn try_to_bytes(values: &[Self]) -> Result<Vec<u8>, TryReserveError>;
}

/// A vector with room for exactly `n` elements, or the error of a refused allocation.
fn with_room<T>(n: usize) -> Result<Vec<T>, TryReserveError> {
    let mut v = Vec::new();
    v.try_reserve_exact(n)?;
    Ok(v)
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;
    fn from_bytes(bytes: &[u8]) -> Vec<Self> {
        bytes.chunks_exact(4).map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]])).collect()
    }
    fn to_bytes(values: &[Self]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_ne_bytes()).collect()
    }
    fn try_from_bytes(bytes: &[u8]) -> Result<Vec<Self>, TryReserveError> {
        let mut v = with_room(bytes.len() / 4)?;
        v.extend(bytes.chunks_exact(4).map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]])));
        Ok(v)
    }
    fn try_to_bytes(values: &[Self]) -> Result<Vec<u8>, TryReserveError> {
        let mut v = with_room(std::mem::size_of_val(values))?;
        v.extend(values.iter().flat_map(|x| x.to_ne_bytes()));
        Ok(v)
    }
}

impl Element for i64 {
    const DTYPE: DType = DType::I64;
    fn from_bytes(bytes: &[u8]) -> Vec<Self> {
        bytes
            .chunks_exact(8)
            .map(|c| i64::from_ne_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
            .collect()
    }
    fn to_bytes(values: &[Self]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_ne_bytes()).collect()
    }
    fn try_from_bytes(bytes: &[u8]) -> Result<Vec<Self>, TryReserveError> {
        let mut v = with_room(bytes.len() / 8)?;
        v.extend(
            bytes
                .chunks_exact(8)
                .map(|c| i64::from_ne_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]])),
        );
        Ok(v)
    }
    fn try_to_bytes(values: &[Self]) -> Result<Vec<u8>, TryReserveError> {
        let mut v = with_room(std::mem::size_of_val(values))?;
        v.extend(values.iter().flat_map(|x| x.to_ne_bytes()));
        Ok(v)
    }
}

#[cfg(test)]
mod layout_tests {
    use super::*;

    #[test]
    fn fallible_encodings_match_the_plain_ones() {
        let f = [1.5f32, -0.0, f32::MAX, 3.25];
        let fb = f32::to_bytes(&f);
        assert_eq!(f32::try_to_bytes(&f).unwrap(), fb);
        assert_eq!(f32::try_from_bytes(&fb).unwrap(), f32::from_bytes(&fb));
        let i = [i64::MIN, -1, 0, 7];
        let ib = i64::to_bytes(&i);
        assert_eq!(i64::try_to_bytes(&i).unwrap(), ib);
        assert_eq!(i64::try_from_bytes(&ib).unwrap(), i.to_vec());
        // A trailing partial element is ignored, as by `from_bytes`.
        assert_eq!(f32::try_from_bytes(&fb[..7]).unwrap(), vec![1.5]);
    }

    #[test]
    fn tensor_object_stays_small() {
        // Caller state and metadata on two lines, the value on one and the dependence
        // object on one (the type's docs). Each added line costs every instruction on a
        // program that cycles through more tensors than the cache holds.
        assert_eq!(std::mem::align_of::<TensorInner>(), 64);
        assert!(std::mem::size_of::<TensorInner>() <= 256, "{}", std::mem::size_of::<TensorInner>());
        assert!(std::mem::size_of::<TensorValue>() <= 64, "the worker reads one line per operand");
        assert!(std::mem::offset_of!(TensorInner, vm) < 128, "caller state beyond two lines");
        assert!(std::mem::offset_of!(TensorInner, released) < 64, "the call check reads one line");
        assert!(std::mem::offset_of!(TensorInner, meta_id) < 64, "the call check reads one line");
        assert!(std::mem::offset_of!(TensorInner, vm) < 64, "the call check reads one line");
        assert!(std::mem::size_of::<DepObject>() <= 64);
    }
}
