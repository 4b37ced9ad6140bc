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

/// The attributes of an op call, by name: what an op takes besides its operands.
///
/// Each op reads the fields it needs and ignores the others: `fill`'s value and `scale`'s
/// factor are [`scalar`](Self::scalar); `matmul` reads the transpose flags. Every field's
/// default is the op's plain form (0, not transposed). `Attrs` is `Copy` and 16 bytes, so
/// that an instruction carries it inline (its body stays three words) and a call allocates
/// nothing for it; the inference cache compares its bits ([`Attrs::flag_bits`]).
///
/// ```
/// use eagervm::prelude::*;
///
/// let fill = Attrs::scalar(0.5);
/// let grad = Attrs::transposed(true, false); // aᵀ b, a weight gradient
/// assert_eq!((fill.scalar, fill.transpose_a), (0.5, false));
/// assert_eq!(Attrs::default().with_transpose_b(true), Attrs::transposed(false, true));
/// assert_eq!(grad, Attrs { transpose_a: true, ..Attrs::default() });
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Attrs {
    /// The scalar argument, if the op takes one (`fill`'s value, `scale`'s factor, `fail`'s
    /// code); 0 otherwise.
    pub scalar: f64,
    /// `matmul`: use `aᵀ` for the first operand (`a` is `[k, m]`).
    pub transpose_a: bool,
    /// `matmul`: use `bᵀ` for the second operand (`b` is `[n, k]`).
    pub transpose_b: bool,
}

impl Attrs {
    /// Attributes with the given scalar.
    pub fn scalar(v: f64) -> Self {
        Attrs { scalar: v, ..Attrs::default() }
    }

    /// Attributes with the given transpose flags (`matmul`).
    pub fn transposed(a: bool, b: bool) -> Self {
        Attrs { transpose_a: a, transpose_b: b, ..Attrs::default() }
    }

    /// These attributes with `scalar` set to `v`.
    pub fn with_scalar(self, v: f64) -> Self {
        Attrs { scalar: v, ..self }
    }

    /// These attributes with `transpose_a` set to `t`.
    pub fn with_transpose_a(self, t: bool) -> Self {
        Attrs { transpose_a: t, ..self }
    }

    /// These attributes with `transpose_b` set to `t`.
    pub fn with_transpose_b(self, t: bool) -> Self {
        Attrs { transpose_b: t, ..self }
    }

    /// Every field but `scalar`, as bits (bit 0: `transpose_a`, bit 1: `transpose_b`; at
    /// most 16 bits): with `scalar`'s bits, two attributes are equal exactly when both are
    /// (up to NaN payloads, which compare by bits), so caches key calls by them.
    #[inline(always)]
    pub fn flag_bits(&self) -> u16 {
        self.transpose_a as u16 | (self.transpose_b as u16) << 1
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

    /// Whether inputs may live on another device than the stream's (copies).
    fn cross_device(&self) -> bool {
        false
    }

    /// Compute the outputs from the inputs. Runs on the stream's execution context; outputs
    /// are allocated (zeroed on first use) before the call.
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

/// A read-only view of an input.
#[derive(Debug)]
pub struct TensorView<'a> {
    /// Shape, dtype and device.
    pub meta: &'a TensorMeta,
    /// The bytes.
    pub data: &'a Storage,
}

/// A writable view of an output.
#[derive(Debug)]
pub struct TensorViewMut<'a> {
    /// Shape, dtype and device.
    pub meta: &'a TensorMeta,
    /// The bytes.
    pub data: &'a mut Storage,
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
