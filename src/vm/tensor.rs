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
use std::fmt;
use std::num::NonZeroUsize;
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
use super::views::ViewCount;
use super::EngineRef;

pub use super::dtype::{DType, Element};

/// A tensor's shape: dimension sizes, outermost first. `[]` is a scalar.
pub type Shape = SmallVec<[usize; 4]>;

/// A tensor's strides: for each dimension, how many elements of its storage one step along
/// it moves.
pub type Strides = SmallVec<[isize; 4]>;

/// Shape, strides, offset, dtype and device of a tensor: which elements of its storage it
/// is, and where the storage lives.
///
/// Element `[i0, i1, ...]` of the tensor is element `offset + i0 * strides[0] + i1 *
/// strides[1] + ...` of the storage, as in PyTorch. A tensor made by the VM (a call's
/// output, `empty`) is contiguous: row-major strides, offset 0, the whole storage; a view
/// (`framework::Tensor::view`) shares another tensor's storage with a layout of its own.
/// Shapes and strides of up to four dimensions are kept inline.
#[derive(Debug, Clone, Eq)]
pub struct TensorMeta {
    /// Dimension sizes.
    pub shape: Shape,
    /// Elements of the storage between neighbours along each dimension.
    pub strides: Strides,
    /// The storage element of index `[0, 0, ...]`.
    pub offset: usize,
    /// Element type.
    pub dtype: DType,
    /// Where the storage lives.
    pub device: DeviceId,
}

impl PartialEq for TensorMeta {
    /// Field by field, dimensions in a plain loop: shapes are short, and metas are compared
    /// whenever the builder checks a call in full.
    #[inline]
    fn eq(&self, other: &Self) -> bool {
        self.same_signature(other)
            && self.offset == other.offset
            && self.strides.len() == other.strides.len()
            && self.strides.iter().zip(&other.strides).all(|(a, b)| a == b)
    }
}

impl std::hash::Hash for TensorMeta {
    /// The same fields as `eq` compares.
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.shape[..].hash(state);
        self.strides[..].hash(state);
        self.offset.hash(state);
        self.dtype.hash(state);
        self.device.hash(state);
    }
}

/// Row-major strides of `shape`: the last dimension's is 1.
pub fn contiguous_strides(shape: &[usize]) -> Strides {
    let mut strides: Strides = SmallVec::from_elem(1, shape.len());
    let mut step = 1usize;
    for (s, &d) in strides.iter_mut().zip(shape).rev() {
        *s = step as isize;
        step = step.wrapping_mul(d.max(1));
    }
    strides
}

impl TensorMeta {
    /// A contiguous meta: row-major strides, offset 0.
    #[inline]
    pub fn new(shape: &[usize], dtype: DType, device: DeviceId) -> Self {
        let n = shape.len();
        if n <= 4 {
            // Every call's output is made here: the inline buffers are filled in one loop,
            // without `SmallVec`'s per-element capacity checks of `collect`.
            let (mut dims, mut strides, mut step) = ([0usize; 4], [0isize; 4], 1usize);
            for i in (0..n).rev() {
                dims[i] = shape[i];
                strides[i] = step as isize;
                step = step.wrapping_mul(shape[i].max(1));
            }
            return TensorMeta {
                shape: SmallVec::from_buf_and_len(dims, n),
                strides: SmallVec::from_buf_and_len(strides, n),
                offset: 0,
                dtype,
                device,
            };
        }
        TensorMeta {
            shape: shape.iter().copied().collect(),
            strides: contiguous_strides(shape),
            offset: 0,
            dtype,
            device,
        }
    }

    /// A view's meta: `shape` and `strides` (one per dimension) from `offset`, of this
    /// meta's dtype and device.
    pub fn with_layout(&self, shape: &[usize], strides: &[isize], offset: usize) -> Self {
        TensorMeta {
            shape: shape.iter().copied().collect(),
            strides: strides.iter().copied().collect(),
            offset,
            dtype: self.dtype,
            device: self.device,
        }
    }

    /// Whether `other` has the same shape, dtype and device (whatever its layout): what
    /// kernels infer from, and what a VM numbers (`Engine::intern`).
    #[inline]
    pub fn same_signature(&self, other: &Self) -> bool {
        self.dtype == other.dtype
            && self.device == other.device
            && self.shape.len() == other.shape.len()
            && self.shape.iter().zip(&other.shape).all(|(a, b)| a == b)
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
    /// Size of the tensor's elements in bytes (like [`numel`](Self::numel), `usize::MAX` for
    /// a meta built by hand whose size overflows). For a contiguous tensor made by the VM,
    /// the size of its storage.
    #[inline]
    pub fn bytes(&self) -> usize {
        self.numel().saturating_mul(self.dtype.size())
    }

    /// Whether the elements lie in row-major order one after another (dimensions of size 1
    /// may have any stride; an empty tensor is contiguous), as PyTorch's `is_contiguous`.
    pub fn is_contiguous(&self) -> bool {
        if self.numel() == 0 {
            return true;
        }
        let mut expected = 1isize;
        for (&d, &s) in self.shape.iter().zip(&self.strides).rev() {
            if d != 1 {
                if s != expected {
                    return false;
                }
                expected = expected.wrapping_mul(d as isize);
            }
        }
        true
    }

    /// The storage elements the tensor may touch, as `lo..hi` (element indices, `lo`
    /// included), or `None` for an empty tensor. A negative index (a layout that reaches
    /// before the storage) gives `None` too: [`check_layout`](Self::check_layout) refuses it.
    pub fn span(&self) -> Option<std::ops::Range<usize>> {
        if self.numel() == 0 {
            return None;
        }
        let (mut lo, mut hi) = (self.offset as i128, self.offset as i128);
        for (&d, &s) in self.shape.iter().zip(&self.strides) {
            let reach = (d as i128 - 1) * s as i128;
            if reach < 0 {
                lo += reach;
            } else {
                hi += reach;
            }
        }
        (lo >= 0 && hi < usize::MAX as i128).then(|| lo as usize..hi as usize + 1)
    }

    /// Check that this layout stays within a storage of `storage_elems` elements: one
    /// stride per dimension, and every element it names inside (a layout of no elements
    /// names none, whatever its offset). Returns why not.
    pub fn check_layout(&self, storage_elems: usize) -> Result<(), String> {
        if self.strides.len() != self.shape.len() {
            return Err(format!("{} strides for {} dimensions", self.strides.len(), self.shape.len()));
        }
        if self.numel() == 0 {
            // It names no element, so any offset will do (PyTorch's rule: `x[1]` of a
            // `[2, 0]` tensor has offset 1 in a storage of none).
            return Ok(());
        }
        match self.span() {
            Some(r) if r.end <= storage_elems => Ok(()),
            _ => Err(format!(
                "shape {:?} with strides {:?} from offset {} reaches outside a storage of {storage_elems} elements",
                &self.shape[..],
                &self.strides[..],
                self.offset
            )),
        }
    }

    /// `f32[2, 3]` style description (no device); a view that is not contiguous from offset
    /// 0 adds its layout: `f32[3, 2] (strides [1, 3])`, `f32[2] (offset 4)`.
    pub fn describe(&self) -> String {
        let dims: Vec<String> = self.shape.iter().map(|d| d.to_string()).collect();
        let mut s = format!("{}[{}]", self.dtype, dims.join(", "));
        if !self.is_contiguous() {
            let st: Vec<String> = self.strides.iter().map(|d| d.to_string()).collect();
            s.push_str(&format!(" (strides [{}]", st.join(", ")));
            if self.offset != 0 {
                s.push_str(&format!(", offset {}", self.offset));
            }
            s.push(')');
        } else if self.offset != 0 {
            s.push_str(&format!(" (offset {})", self.offset));
        }
        s
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
/// what a call's check reads, metadata) comes first, with everything the check of a call
/// reads in the first line; the value (the worker's) and the dependence object (the
/// scheduler's) each take a line of their own, so that the three threads that touch every
/// tensor do not move each other's lines between cores.
///
/// # Storages and views
///
/// A tensor made by the VM owns its storage: the value and the dependence object in its
/// own lines are the storage's. A *view* (`framework::Tensor::view`) is a tensor object
/// with a layout of its own (`meta`: shape, strides, offset) over another tensor's storage:
/// its `base` names the owner, and its value and dependence object are the owner's
/// ([`value`](Self::value) and the scheduler's `vm::instruction::Operand::dep` go there). So
/// every read and write through any view of a storage is ordered by the one dependence object
/// of that storage (the read/write rule applies to storages), and the storage's error and
/// bytes are shared.
/// A view of a view names the owner, never another view.
///
/// # Ownership
///
/// `refs` counts the user's handles ([`Tensor`]), plus one per live view of this tensor's
/// storage (the view's reference to its `base`, handed back to the front end when the view
/// is done: `framework::tensor`), plus, once the tensor's `Release` has been emitted, the
/// one [`TensorOwner`] that instruction holds. Instructions themselves hold uncounted
/// pointers (`TensorPtr`), which the `Release` (ordered after all of them) outlives. When the
/// last handle drops and no `Release` has been emitted yet, its count passes to the new
/// `Release` instead of freeing the object; the object is freed when the count reaches zero
/// otherwise. A view's `Release` frees the view object alone (it is ordered after every use
/// of the storage before it, that view's among them); the owner's frees the storage, and
/// comes after every view's, since a view holds a reference to its owner until its own
/// `Release` is submitted.
#[repr(C)]
pub(crate) struct TensorInner {
    refs: RefCount,
    /// Index of the VM stream that last used this tensor, `NO_STREAM` if none. An owner's
    /// is its storage's, whichever of its views used it (soft sync); a view's is where the
    /// view itself was last used (its `Release` goes there).
    pub(crate) last_stream: AtomicU32,
    /// The VM's number for `meta`'s signature (shape, dtype, device; `MetaId::NONE` if it
    /// has none): the builder checks a call's signature by comparing these.
    pub(crate) meta_id: MetaId,
    /// Set when the tensor's `Release` has been emitted, or it was released explicitly (a
    /// facade atomic: the view handshake of `vm::views` is model-checked with it).
    pub(crate) released: crate::sync::AtomicBool,
    /// Whether the VM made this tensor to receive the copy that a host access of a device
    /// tensor reads (immutable; read only when that copy finds its input unwritten).
    pub(crate) fetch: Fetch,
    /// Whether this tensor's elements are its whole storage, each once, in row-major order
    /// from the start (an owner; a view that is all of its storage): a write through it
    /// replaces the storage's whole value, error included (immutable).
    pub(crate) whole: bool,
    /// Whether the view's reference to its `base` has been handed back (views only; set
    /// once, by the front end: `framework::tensor`).
    pub(crate) base_handed: AtomicBool,
    /// Live views of this tensor's storage (owners only): an explicit release of the owner
    /// waits for them (`vm::views`).
    pub(crate) views: ViewCount,
    /// Set by an explicit release of an owner that views still used: its `Release` is
    /// emitted when its last reference drops, as if it had not been released.
    pub(crate) release_deferred: AtomicBool,
    /// The owner of the storage this tensor views; `None` for an owner (immutable). The
    /// address's lowest bit (objects are 64-byte aligned) is set for a view that keeps a
    /// dependence object of its own, the planted fault `split_view_dependences` alone.
    base: Option<NonNull<TensorInner>>,
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

/// What a tensor is for, if the VM made it as the host copy that `Tensor::to_vec` (or a
/// loan) of a device tensor or a view reads: the copy then answers for an unwritten tensor as
/// the access of an unwritten host tensor does (`vm::instruction_policy::op_call`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Fetch {
    /// An ordinary tensor.
    No,
    /// The host copy of a `Tensor::to_vec`.
    Read,
}

/// The tag bit of [`TensorInner`]'s `base` that the planted fault `split_view_dependences`
/// sets.
const SPLIT: usize = 1;

/// `last_stream` value of a tensor no instruction has used yet.
pub(crate) const NO_STREAM: u32 = u32::MAX;

// SAFETY: `meta` and `id` are immutable and the atomics are Sync. The two cells are never
// touched concurrently: `dep` only by the scheduler thread (`own_dep_mut`'s contract), and
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
            released: crate::sync::AtomicBool::new(false),
            fetch,
            whole: true,
            base_handed: AtomicBool::new(false),
            views: ViewCount::default(),
            release_deferred: AtomicBool::new(false),
            base: None,
            id,
            vm,
            meta,
            value: Line(UnsafeCell::new(TensorValue::default())),
            dep: Line(UnsafeCell::new(DepObject::default())),
        }
    }

    /// A view of `base`'s storage with the layout `meta` (checked by the caller against the
    /// storage's size), holding a reference to the owner of that storage: the caller has
    /// counted it (`add_ref`) and counted the view in the owner's `views`.
    ///
    /// # Safety
    /// `owner` is a live owner (not a view), and the reference counted for this view keeps
    /// it alive until the front end hands it back (`framework::tensor`).
    pub(crate) unsafe fn new_view(
        id: u64,
        meta: TensorMeta,
        meta_id: MetaId,
        owner: NonNull<TensorInner>,
        split_dependence: bool,
    ) -> Self {
        // SAFETY: `owner` is alive (the contract).
        let o = unsafe { owner.as_ref() };
        debug_assert!(o.base.is_none(), "a view's base is an owner");
        let whole = meta.offset == 0 && meta.is_contiguous() && meta.numel() == o.meta.numel();
        let mut t = TensorInner::new(id, meta, meta_id, o.vm, Fetch::No);
        t.whole = whole;
        t.base = Some(owner.map_addr(|a| a | usize::from(split_dependence)));
        t
    }

    /// A tensor object that belongs to no VM, for unit tests of the engine's parts.
    #[cfg(test)]
    pub(crate) fn for_test(id: u64, meta: TensorMeta) -> Box<TensorInner> {
        Box::new(TensorInner::new(id, meta, MetaId::NONE, EngineRef::NONE, Fetch::No))
    }

    /// The owner of this tensor's storage: itself, or the tensor it views.
    #[inline(always)]
    pub(crate) fn owner(&self) -> &TensorInner {
        match self.base {
            // SAFETY: a view keeps its owner alive (the type's docs, "Ownership"); clearing the
            // fault's tag bit gives back its aligned address.
            Some(b) => unsafe { b.map_addr(|a| NonZeroUsize::new_unchecked(a.get() & !SPLIT)).as_ref() },
            None => self,
        }
    }

    /// Whether this tensor is a view of another's storage.
    #[inline(always)]
    pub(crate) fn is_view(&self) -> bool {
        self.base.is_some()
    }

    /// Whether this tensor's dependence object is another's (its owner's): a view, unless
    /// it carries the planted fault `split_view_dependences`.
    #[inline(always)]
    pub(crate) fn shares_dependence(&self) -> bool {
        matches!(self.base, Some(b) if b.addr().get() & SPLIT == 0)
    }

    /// The owner this view's reference is to, if this is a view.
    #[inline]
    pub(crate) fn base_ptr(&self) -> Option<NonNull<TensorInner>> {
        self.is_view().then(|| NonNull::from(self.owner()))
    }

    /// The value of the tensor's storage, for reading.
    ///
    /// # Safety
    /// The caller must be running an instruction that holds a read (or write) access to
    /// this tensor's storage under the dependence rules, so that no writer runs concurrently.
    #[allow(clippy::mut_from_ref)]
    #[inline(always)]
    pub(crate) unsafe fn value(&self) -> &TensorValue {
        // SAFETY: no concurrent writer, by the caller's contract.
        unsafe { &*self.owner().value.0.get() }
    }

    /// The value of the tensor's storage, for writing.
    ///
    /// # Safety
    /// The caller must be running an instruction that holds the write access to this
    /// tensor's storage under the dependence rules, so that no other access runs
    /// concurrently, and must not hold another reference obtained from `value`/`value_mut`
    /// (of this tensor or of another view of its storage) at the same time.
    #[allow(clippy::mut_from_ref)]
    #[inline(always)]
    pub(crate) unsafe fn value_mut(&self) -> &mut TensorValue {
        // SAFETY: exclusive access, by the caller's contract.
        unsafe { &mut *self.owner().value.0.get() }
    }

    /// The value of the tensor's storage as a raw pointer, for an instruction that reads
    /// and writes it through several operands (an output that is also an input): fields are
    /// reached through it one at a time, never as a reference to the whole value.
    #[inline(always)]
    pub(crate) fn value_ptr(&self) -> *mut TensorValue {
        self.owner().value.0.get()
    }

    /// Whether this tensor was made by the VM named `vm` (`Engine::identity`): one
    /// comparison of words, nothing upgraded or counted. No other VM of the process is ever
    /// named so, even after this tensor's VM is gone.
    #[inline(always)]
    pub(crate) fn belongs_to(&self, vm: EngineRef) -> bool {
        self.vm == vm
    }

    /// This tensor object's own dependence object: its storage's, unless it is a view that
    /// shares its owner's ([`shares_dependence`](Self::shares_dependence)), whose own
    /// object is unused. The scheduler knows which from the operand
    /// (`vm::instruction::Operand::dep`), without a look at `base`.
    ///
    /// # Safety
    /// Only the scheduler thread may call this, and it must not hold two references to the
    /// same storage's dependence object at once (two views of one storage share it);
    /// `self.shares_dependence()` is false.
    #[allow(clippy::mut_from_ref)]
    #[inline(always)]
    pub(crate) unsafe fn own_dep_mut(&self) -> &mut DepObject {
        debug_assert!(!self.shares_dependence());
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
/// 32768 objects of 320 bytes (10 MiB, kept only once that many were freed at once), as many as a
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

#[cfg(test)]
mod layout_tests {
    use super::*;

    #[test]
    fn tensor_object_stays_small() {
        // Caller state and metadata (shape and strides inline up to four dimensions) on
        // three lines, the value on one and the dependence object on one (the type's docs).
        // Each added line costs every instruction on a program that cycles through more
        // tensors than the cache holds.
        assert_eq!(std::mem::align_of::<TensorInner>(), 64);
        assert!(std::mem::size_of::<TensorInner>() <= 320, "{}", std::mem::size_of::<TensorInner>());
        assert!(std::mem::size_of::<TensorValue>() <= 64, "the worker reads one line per operand");
        assert!(std::mem::offset_of!(TensorInner, meta) < 128, "caller state beyond two lines");
        assert!(std::mem::offset_of!(TensorInner, released) < 64, "the call check reads one line");
        assert!(std::mem::offset_of!(TensorInner, meta_id) < 64, "the call check reads one line");
        assert!(std::mem::offset_of!(TensorInner, vm) < 64, "the call check reads one line");
        assert!(std::mem::offset_of!(TensorInner, base) < 64, "the call check reads one line");
        assert!(std::mem::offset_of!(TensorInner, last_stream) < 64, "the call check reads one line");
        assert!(std::mem::size_of::<DepObject>() <= 64);
    }
}
