//! The kernel ABI: the op-kernel trait, the arguments a kernel sees, and the one-word
//! reference an instruction holds.
//!
//! A kernel is shape inference plus a computation. The front end asks the kernel to
//! [`infer`](OpKernel::infer) its outputs' shapes and dtypes before emitting an
//! instruction, so that bad calls are refused before anything runs; the stream policy later
//! calls [`compute`](OpKernel::compute) on the stream's worker (CPU), on the device's own
//! thread (mock), or on the stream's worker with the device's CUDA stream current (CUDA: the
//! kernel enqueues its work there and returns, and an event recorded behind it tells when
//! it is done). The built-in kernels (`kernels`) implement this trait; the op registry that
//! names them is the front end's (`framework::op`).

use std::fmt;

use smallvec::SmallVec;

use crate::alloc::Storage;

use super::tensor::{DType, Shape, TensorMeta};

pub use super::dtype::Scalar;
pub use super::params::{Params, ParamsFull};

/// Scalar kinds as [`Attrs`] packs them.
const FLOAT: u8 = 0;
const INT: u8 = 1;
const BOOL: u8 = 2;

/// The attributes of an op call, by name: what an op takes besides its operands.
///
/// Each op reads the fields it needs and ignores the others: `fill`'s value and `scale`'s
/// factor are the [`scalar`](Self::value); `matmul` reads the transpose flags; `sum`'s
/// dims and `conv2d`'s stride are in the [parameter list](Self::params). Every field's
/// default is the op's plain form (0.0, not transposed, no parameters). `Attrs` is `Copy`
/// and 16 bytes (the scalar packed as its bits and a kind, the parameter list as the number
/// `vm::params` interns it under), so that an instruction carries it inline (its body stays
/// three words) and a call allocates nothing for it; the inference cache compares its bits
/// ([`Attrs::scalar_bits`], [`Attrs::flag_bits`], [`Attrs::params_id`]).
///
/// ```
/// use eagervm::prelude::*;
/// use eagervm::framework::Scalar;
///
/// let fill = Attrs::scalar(0.5);
/// let grad = Attrs::transposed(true, false); // aᵀ b, a weight gradient
/// assert_eq!((fill.value(), fill.transpose_a), (Scalar::Float(0.5), false));
/// assert_eq!(Attrs::integer(1 << 60).value().as_i64(), 1 << 60); // exact
/// assert_eq!(Attrs::default().with_transpose_b(true), Attrs::transposed(false, true));
/// assert_eq!(grad, Attrs::default().with_transpose_a(true));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Attrs {
    /// The scalar's bits: an `f64`'s, an `i64`'s, or 0/1.
    bits: u64,
    /// Which of the three the bits are.
    kind: u8,
    /// `matmul`: use `aᵀ` for the first operand (`a` is `[k, m]`).
    pub transpose_a: bool,
    /// `matmul`: use `bᵀ` for the second operand (`b` is `[n, k]`).
    pub transpose_b: bool,
    /// A dtype argument (`cast`'s target), as `DType as u8 + 1`; 0 for none.
    dtype: u8,
    /// The number of the call's parameter list (`vm::params`); 0 for none.
    params: u32,
}

impl Attrs {
    /// Attributes with the given float scalar.
    pub fn scalar(v: f64) -> Self {
        Attrs::default().with_scalar(v)
    }

    /// Attributes with the given integer scalar (exact: integer kernels use it as it is).
    pub fn integer(v: i64) -> Self {
        Attrs::default().with_value(Scalar::Int(v))
    }

    /// Attributes with the given scalar of any kind.
    pub fn of(v: impl Into<Scalar>) -> Self {
        Attrs::default().with_value(v.into())
    }

    /// Attributes with the given transpose flags (`matmul`).
    pub fn transposed(a: bool, b: bool) -> Self {
        Attrs { transpose_a: a, transpose_b: b, ..Attrs::default() }
    }

    /// These attributes with the float scalar `v`.
    pub fn with_scalar(self, v: f64) -> Self {
        self.with_value(Scalar::Float(v))
    }

    /// These attributes with the scalar `v`.
    pub fn with_value(self, v: Scalar) -> Self {
        let (bits, kind) = match v {
            Scalar::Float(f) => (f.to_bits(), FLOAT),
            Scalar::Int(i) => (i as u64, INT),
            Scalar::Bool(b) => (u64::from(b), BOOL),
        };
        Attrs { bits, kind, ..self }
    }

    /// These attributes with the dtype argument `d` (`cast`'s target).
    pub fn with_dtype(self, d: DType) -> Self {
        Attrs { dtype: d as u8 + 1, ..self }
    }

    /// The dtype argument, if one was given.
    #[inline]
    pub fn dtype(&self) -> Option<DType> {
        self.dtype.checked_sub(1).and_then(|i| DType::ALL.get(i as usize).copied())
    }

    /// These attributes with the parameter list `ints`, `scalars` (dims, sizes, bounds: what
    /// each op reads is in `docs/ops.md`). Lists are interned: equal lists make equal
    /// attributes. Refused only when the process already holds
    /// [`MAX_PARAMS`](super::params::MAX_PARAMS) distinct lists.
    pub fn with_params(self, ints: &[i64], scalars: &[Scalar]) -> Result<Self, ParamsFull> {
        self.with_param_list(&Params::new(ints, scalars))
    }

    /// These attributes with the parameter list `p` (as [`with_params`](Self::with_params)).
    pub fn with_param_list(self, p: &Params) -> Result<Self, ParamsFull> {
        Ok(Attrs { params: p.intern()?, ..self })
    }

    /// The parameter list (empty unless one was given).
    #[inline]
    pub fn params(&self) -> &'static Params {
        Params::get(self.params)
    }

    /// The parameter list's number, for caches: equal numbers are equal lists.
    #[inline(always)]
    pub fn params_id(&self) -> u32 {
        self.params
    }

    /// These attributes with `transpose_a` set to `t`.
    pub fn with_transpose_a(self, t: bool) -> Self {
        Attrs { transpose_a: t, ..self }
    }

    /// These attributes with `transpose_b` set to `t`.
    pub fn with_transpose_b(self, t: bool) -> Self {
        Attrs { transpose_b: t, ..self }
    }

    /// The scalar argument (0.0 unless one was given).
    #[inline]
    pub fn value(&self) -> Scalar {
        match self.kind {
            INT => Scalar::Int(self.bits as i64),
            BOOL => Scalar::Bool(self.bits != 0),
            _ => Scalar::Float(f64::from_bits(self.bits)),
        }
    }

    /// The scalar as an `f64` ([`Scalar::as_f64`]).
    #[inline]
    pub fn float(&self) -> f64 {
        self.value().as_f64()
    }

    /// The scalar as an `i64` ([`Scalar::as_i64`]).
    #[inline]
    pub fn int(&self) -> i64 {
        self.value().as_i64()
    }

    /// The scalar's bits, for caches: with [`flag_bits`](Self::flag_bits), two attributes
    /// are equal exactly when both are (up to NaN payloads, which compare by bits).
    #[inline(always)]
    pub fn scalar_bits(&self) -> u64 {
        self.bits
    }

    /// Every field but the scalar's bits, as bits (bit 0: `transpose_a`, bit 1:
    /// `transpose_b`, bits 2-3: the scalar's kind, bits 4-7: the dtype argument; at most 16
    /// bits).
    #[inline(always)]
    pub fn flag_bits(&self) -> u16 {
        self.transpose_a as u16
            | (self.transpose_b as u16) << 1
            | (self.kind as u16) << 2
            | (self.dtype as u16) << 4
    }
}

/// The shape and dtype of one output, as inferred by a kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutSpec {
    /// Dimension sizes.
    pub shape: Shape,
    /// Element type.
    pub dtype: DType,
}

/// Output specs; two inline.
pub type OutSpecs = SmallVec<[OutSpec; 2]>;

/// A kernel: shape inference plus the computation.
///
/// Kernels are registered once and live for the whole process (`&'static`), so an
/// instruction carries a plain reference and no reference count.
pub trait OpKernel: Send + Sync + 'static {
    /// The op's name.
    fn name(&self) -> &'static str;

    /// Check the inputs (count, shapes, dtypes) and push one [`OutSpec`] per output. The
    /// error message names the operand at fault; the builder wraps it in
    /// [`Error::InvalidOperands`](super::Error::InvalidOperands).
    ///
    /// `outputs` holds the specs of the outputs the caller gave, if it gave any (for ops
    /// like `fill` whose output shape is the caller's choice); it is empty otherwise.
    fn infer(
        &self,
        inputs: &[&TensorMeta],
        given: &[&TensorMeta],
        attrs: &Attrs,
        outputs: &mut OutSpecs,
    ) -> Result<(), String>;

    /// The dtypes the kernel computes on: those of its data inputs (index and mask operands
    /// aside), or of its output for an op without inputs (`fill`). `docs/ops.md`'s table of
    /// ops, dtypes and devices is generated from it, and a test checks that `infer` accepts
    /// exactly these. Empty (the default): not declared, as a framework's own kernel may
    /// leave it.
    fn dtypes(&self) -> &'static [DType] {
        &[]
    }

    /// Whether inputs may live on another device than the stream's (copies).
    fn cross_device(&self) -> bool {
        false
    }

    /// Whether the kernel takes operands of any layout (strides, offset, broadcast strides of
    /// 0): then it gets every operand as it is. A kernel that does not (the default, for
    /// kernels written over contiguous slices) gets a contiguous copy of each input that is
    /// not contiguous, and writes an output that is not contiguous through a contiguous
    /// temporary copied into it afterwards: the builder inserts those copies, on the call's
    /// stream (`InstructionsBuilder`, "Layouts").
    fn strided(&self) -> bool {
        false
    }

    /// Whether an output may share its storage with an input, as `x.add_(y)` writes `x`
    /// and reads it: exactly the same elements (the same storage, offset, shape and
    /// strides), each read before it is written. The builder refuses such a call for a
    /// kernel that does not say so (the default), and refuses any other overlap of an
    /// output with an input for every kernel (`Error::Overlap`).
    fn in_place(&self) -> bool {
        false
    }

    /// Whether each output element is computed from the input elements at its own index
    /// (after broadcasting), and every output has the inputs' broadcast shape: an
    /// elementwise op. Then, for a kernel that is also [`strided`](Self::strided), the
    /// outputs a call makes are laid out like its inputs, as PyTorch lays them out (the
    /// output of `exp` of a transposed tensor is transposed too, and both are walked in
    /// memory order), instead of row-major (`framework::layout`, `pointwise_strides`). A
    /// kernel's answer must not depend on the device: a CUDA kernel answers as its CPU
    /// kernel does.
    fn pointwise(&self) -> bool {
        false
    }

    /// Whether a call that succeeds has written every element of every output it was given,
    /// for all operands that pass [`infer`](Self::infer): then an output that is its whole
    /// storage and is written for the first time gets a block that is not zeroed, holding
    /// whatever its earlier storage left (`alloc::request`, "Unzeroed blocks"). A kernel
    /// that writes part of an output, leaves an element untouched for some inputs, or reads
    /// an output before writing it (accumulates into it) must not say so: it keeps the
    /// default, zeroed outputs. What a failing call left in its outputs is never read.
    fn writes_outputs(&self) -> bool {
        false
    }

    /// Whether a launch of this call on an asynchronous device must be checked for bad data
    /// that the kernel finds only when it runs (an index out of range): such a kernel
    /// reports it in its stream's fault record (`ep::fault`) instead of returning an
    /// error, and the stream policy waits for the launch, reads the record, and fails the
    /// call as a returned error would (`vm::stream_policy`, "Checked launches"). A kernel
    /// that cannot meet bad data (the default) needs no check, and costs no wait.
    fn checks_data(&self, attrs: &Attrs) -> bool {
        let _ = attrs;
        false
    }

    /// Compute the outputs from the inputs. Runs on the stream's execution context; outputs
    /// are allocated before the call, where written for the first time: zeroed, unless the
    /// kernel [writes them whole](Self::writes_outputs) and the output is its whole storage.
    fn compute(&self, ctx: &mut KernelCtx<'_, '_>) -> Result<(), String>;

    /// Told, in place of [`compute`](Self::compute), that an instruction of this kernel
    /// will not run: an input carries an error, an input was never written, or its outputs
    /// could not be allocated. Its outputs carry the error. Kernels that keep state across
    /// calls in step with other processes (collectives, which every rank must issue in the
    /// same order) use it to leave that state consistent; the others ignore it.
    fn skipped(&self, why: &dyn fmt::Display) {
        let _ = why;
    }

    /// [`skipped`](Self::skipped), with the call's attributes: what the VM calls. A kernel
    /// that must tell which call did not run (one waited for by a caller that a scalar
    /// attribute names: the DLPack export of device memory) overrides this one.
    fn skipped_call(&self, attrs: &Attrs, why: &dyn fmt::Display) {
        let _ = attrs;
        self.skipped(why)
    }
}

impl fmt::Debug for dyn OpKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OpKernel({})", self.name())
    }
}

/// An input as a kernel sees it: its layout and the storage it lies in.
///
/// The tensor's elements are those of `data` that `meta` names (`meta.offset`,
/// `meta.strides`: a view may be any part of its storage, in any order, and an input may
/// share its storage with an output of the same call, when the kernel allows it:
/// [`OpKernel::in_place`]). Read it through [`Storage::as_ptr`], element by element as the
/// layout says, or as a slice where the layout is contiguous and no output shares the
/// storage.
#[derive(Debug)]
pub struct TensorView<'a> {
    /// Shape, strides, offset, dtype and device.
    pub meta: &'a TensorMeta,
    /// The storage (all of it).
    pub data: &'a Storage,
}

/// An output as a kernel sees it: its layout and the storage it lies in, written through
/// [`Storage::as_mut_ptr`] (the instruction holds the write access to the storage).
#[derive(Debug)]
pub struct TensorViewMut<'a> {
    /// Shape, strides, offset, dtype and device.
    pub meta: &'a TensorMeta,
    /// The storage (all of it).
    pub data: &'a Storage,
}

/// What a kernel sees: its attributes, inputs and outputs (`'a`: the lists, `'t`: the
/// tensors' bytes).
#[derive(Debug)]
pub struct KernelCtx<'a, 't> {
    /// The call's attributes.
    pub attrs: Attrs,
    /// Inputs, in call order.
    pub inputs: &'a [TensorView<'t>],
    /// Outputs, in call order, allocated.
    pub outputs: &'a mut [TensorViewMut<'t>],
}

/// A kernel in one word: a reference to a `&'static dyn OpKernel` that lives for the rest of
/// the process (an entry of a static kernel table, or one leaked box per registration of a
/// kernel built at run time). An instruction holds one, so that its body fits in three words.
#[derive(Clone, Copy)]
pub(crate) struct KernelRef(&'static &'static dyn OpKernel);

impl KernelRef {
    /// A reference to `kernel`.
    pub(crate) const fn new(kernel: &'static &'static dyn OpKernel) -> Self {
        KernelRef(kernel)
    }

    /// The kernel.
    #[inline]
    pub(crate) fn get(self) -> &'static dyn OpKernel {
        *self.0
    }

    /// The address that identifies this reference (compared, never dereferenced, by caches).
    #[inline]
    pub(crate) fn addr(self) -> usize {
        self.0 as *const &'static dyn OpKernel as usize
    }
}

impl std::ops::Deref for KernelRef {
    type Target = dyn OpKernel;
    #[inline]
    fn deref(&self) -> &(dyn OpKernel + 'static) {
        *self.0
    }
}

impl fmt::Debug for KernelRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OpKernel({})", self.name())
    }
}
