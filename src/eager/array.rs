//! [`Array`]: the user's eager tensor, an owned handle.

use std::fmt;

use super::Context;
use crate::ep::{DeviceId, StreamType};
use crate::framework::{Attrs, DType, Element, Op, Tensor};
use crate::vm::{Error, Result};

/// An eager tensor: a counted handle to a VM tensor plus the [`Context`] that runs its ops.
///
/// An array owns what it needs: it is `Clone` (cheap: two counters), `Send` and `Sync`,
/// and keeps its context and VM running while it lives (`eager::context`, "Ownership"), so
/// it can sit in a struct beside its [`VirtualMachine`](crate::VirtualMachine). Every op
/// returns a new array at once (the work runs asynchronously on the VM) or the typed
/// [`Error`] that refuses it. Ops run on the compute stream of the array's device; all
/// inputs of an op must live on one device (move them with [`Array::to`]).
///
/// Each op has three forms: `a.add(&b)` makes a new array; `a.add_into(&b, &mut out)`
/// writes an existing array `out` (PyTorch's `out=`: no new storage); `a.add_(&b)` updates
/// `a` in place, seen by every handle of it.
///
/// ```
/// use eagervm::eager::{Array, Context};
/// use eagervm::prelude::*;
///
/// struct Model {
///     vm: VirtualMachine,
///     w: Array,
/// }
///
/// let vm = VirtualMachine::new(Config::default())?;
/// let cx = Context::new(&vm);
/// let w = cx.from_slice(&[0.5f32, 0.5, 0.5], &[3], DeviceId::CPU)?;
/// let mut m = Model { vm, w };
/// let a = cx.from_slice(&[1.0f32, 2.0, 3.0], &[3], DeviceId::CPU)?;
/// let loss = a.sub(&m.w)?.mul(&a.sub(&m.w)?)?.sum()?; // 0.25 + 2.25 + 6.25
/// assert_eq!(loss.item::<f32>()?, 8.75);
/// m.w.add_(&a)?; // in place: every handle of `w` sees [1.5, 2.5, 3.5]
/// assert_eq!(m.w.to_vec::<f32>()?, vec![1.5, 2.5, 3.5]);
/// m.vm.sync()?;
/// # Ok::<(), eagervm::Error>(())
/// ```
#[derive(Clone)]
pub struct Array {
    t: Tensor,
    cx: Context,
}

impl fmt::Debug for Array {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Array({:?})", self.t)
    }
}

/// The three forms of an elementwise or product op: `op`, `op_into`, `op_`.
macro_rules! forms {
    ($(#[$doc:meta])* $name:ident, $into:ident, $inplace:ident, $op:ident, $attrs:expr) => {
        $(#[$doc])*
        pub fn $name(&self, other: &Array) -> Result<Array> {
            self.binary(self.cx.ops().$op, other, $attrs)
        }

        #[doc = concat!("[`", stringify!($name), "`](Self::", stringify!($name), ") written into `out`, which must have the result's shape and")]
        /// dtype and live on this array's device (`Error::OutputMismatch`, `WrongDevice`
        /// otherwise); `out`'s earlier value is overwritten once every earlier use of it
        /// is done. `out` may not be one of the inputs (`Error::Aliased`): use the
        /// in-place form for that.
        pub fn $into(&self, other: &Array, out: &mut Array) -> Result<()> {
            self.binary_into(self.cx.ops().$op, other, $attrs, out)
        }

        #[doc = concat!("[`", stringify!($name), "`](Self::", stringify!($name), ") in place: this array (and every handle of it) holds the result.")]
        /// The result is computed into a new array, then copied into this one on the same
        /// stream (a kernel never reads and writes one buffer), so it costs one copy and
        /// holds a second buffer for the time between the two.
        pub fn $inplace(&mut self, other: &Array) -> Result<&mut Self> {
            let r = self.$name(other)?;
            self.assign(&r)?;
            Ok(self)
        }
    };
}

/// The three forms of a one-input op.
macro_rules! unary_forms {
    ($(#[$doc:meta])* $name:ident, $into:ident, $inplace:ident, $op:ident, $attrs:expr $(, $arg:ident: $ty:ty)?) => {
        $(#[$doc])*
        pub fn $name(&self $(, $arg: $ty)?) -> Result<Array> {
            self.unary(self.cx.ops().$op, $attrs)
        }

        #[doc = concat!("[`", stringify!($name), "`](Self::", stringify!($name), ") written into `out` (as [`add_into`](Self::add_into) writes it).")]
        pub fn $into(&self $(, $arg: $ty)?, out: &mut Array) -> Result<()> {
            let stream = self.cx.vm().compute_stream(self.device())?;
            self.cx.call_into(self.cx.ops().$op, &[self], &[&out.t], $attrs, stream)
        }

        #[doc = concat!("[`", stringify!($name), "`](Self::", stringify!($name), ") in place (as [`add_`](Self::add_) does it).")]
        pub fn $inplace(&mut self $(, $arg: $ty)?) -> Result<&mut Self> {
            let r = self.$name($($arg)?)?;
            self.assign(&r)?;
            Ok(self)
        }
    };
}

impl Array {
    pub(super) fn new(t: Tensor, cx: Context) -> Self {
        Array { t, cx }
    }

    /// The id of the underlying tensor (errors name tensors by it).
    pub fn id(&self) -> u64 {
        self.t.id()
    }
    /// Dimension sizes.
    pub fn shape(&self) -> &[usize] {
        self.t.shape()
    }
    /// Element type.
    pub fn dtype(&self) -> DType {
        self.t.dtype()
    }
    /// Where the array lives.
    pub fn device(&self) -> DeviceId {
        self.t.device()
    }
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.t.numel()
    }
    /// The context that runs this array's ops.
    pub fn context(&self) -> &Context {
        &self.cx
    }

    /// The low-level tensor, for use with [`VirtualMachine::run`](crate::VirtualMachine::run).
    /// Flushes the context first, so that what the VM is given next is ordered after this
    /// array's pending writes.
    pub fn tensor(&self) -> Result<&Tensor> {
        self.cx.flush()?;
        Ok(&self.t)
    }

    pub(super) fn tensor_unflushed(&self) -> &Tensor {
        &self.t
    }

    fn binary(&self, op: Op, other: &Array, attrs: Attrs) -> Result<Array> {
        let stream = self.cx.vm().compute_stream(self.device())?;
        self.cx.call1(op, [self, other], attrs, stream)
    }

    fn binary_into(&self, op: Op, other: &Array, attrs: Attrs, out: &mut Array) -> Result<()> {
        let stream = self.cx.vm().compute_stream(self.device())?;
        self.cx.call_into(op, &[self, other], &[&out.t], attrs, stream)
    }

    fn unary(&self, op: Op, attrs: Attrs) -> Result<Array> {
        let stream = self.cx.vm().compute_stream(self.device())?;
        self.cx.call1(op, [self], attrs, stream)
    }

    /// Overwrite this array with `value` (same shape, dtype and device), on the compute
    /// stream of its device, after every earlier use of it.
    pub fn assign(&mut self, value: &Array) -> Result<()> {
        let stream = self.cx.vm().compute_stream(self.device())?;
        self.cx.call_into(self.cx.ops().copy, &[value], &[&self.t], Attrs::default(), stream)
    }

    forms!(
        /// Matrix product `self @ other`: `[m, k] x [k, n] -> [m, n]`.
        matmul, matmul_into, matmul_, matmul, Attrs::default()
    );

    forms!(
        /// `selfᵀ @ other`: `[k, m] x [k, n] -> [m, n]` (a weight gradient, `xᵀ dy`): `matmul`
        /// with `transpose_a`.
        matmul_tn, matmul_tn_into, matmul_tn_, matmul, Attrs::transposed(true, false)
    );

    forms!(
        /// `self @ otherᵀ`: `[m, k] x [n, k] -> [m, n]` (an input gradient, `dy Wᵀ`): `matmul`
        /// with `transpose_b`.
        matmul_nt, matmul_nt_into, matmul_nt_, matmul, Attrs::transposed(false, true)
    );

    forms!(
        /// Elementwise `self + other` (same shape and dtype).
        add, add_into, add_, add, Attrs::default()
    );

    forms!(
        /// Elementwise `self - other` (same shape and dtype).
        sub, sub_into, sub_, sub, Attrs::default()
    );

    forms!(
        /// Elementwise `self * other` (same shape and dtype).
        mul, mul_into, mul_, mul, Attrs::default()
    );

    forms!(
        /// `self[i][j] + bias[j]`: a `[k]` bias added to every row of a `[n, k]` array.
        add_bias, add_bias_into, add_bias_, add_bias, Attrs::default()
    );

    unary_forms!(
        /// `self * factor` (for `i64`, the factor truncated toward zero).
        scale, scale_into, scale_, scale, Attrs::scalar(factor), factor: f64
    );

    unary_forms!(
        /// `max(self, 0)` elementwise.
        relu, relu_into, relu_, relu, Attrs::default()
    );

    /// `self @ other` with the transpose flags given: `aᵀ b` with `transpose_a`, `a bᵀ` with
    /// `transpose_b` (not both: `Error::InvalidOperands`).
    pub fn matmul_t(&self, other: &Array, transpose_a: bool, transpose_b: bool) -> Result<Array> {
        self.binary(self.cx.ops().matmul, other, Attrs::transposed(transpose_a, transpose_b))
    }

    /// The gradient of `relu` at `self` given the gradient `dy` of its output: `dy` where
    /// `self > 0`, 0 elsewhere.
    pub fn relu_grad(&self, dy: &Array) -> Result<Array> {
        // The kernel takes (dy, x).
        let stream = self.cx.vm().compute_stream(self.device())?;
        self.cx.call1(self.cx.ops().relu_grad, [dy, self], Attrs::default(), stream)
    }

    /// The sum of all elements, as a scalar array (shape `[]`).
    pub fn sum(&self) -> Result<Array> {
        self.unary(self.cx.ops().sum, Attrs::default())
    }

    /// The sum over the rows of a `[n, k]` array: `[k]` column sums (a bias gradient).
    pub fn sum_rows(&self) -> Result<Array> {
        self.unary(self.cx.ops().sum_rows, Attrs::default())
    }

    /// This array on `device`. The same array if it is there already; otherwise a copy on
    /// the destination's host-to-device stream (to a device) or the source's
    /// device-to-host stream (to the host), so that copies overlap compute.
    pub fn to(&self, device: DeviceId) -> Result<Array> {
        let src = self.device();
        if src == device {
            return Ok(self.clone());
        }
        let vm = self.cx.vm();
        let stream = if device.is_host() {
            vm.stream(src, StreamType::D2H)?
        } else {
            vm.stream(device, StreamType::H2D)?
        };
        let out = vm.empty_at(self.shape(), self.dtype(), device, || format!("a copy to {device}"))?;
        self.cx.call_into(self.cx.ops().copy, &[self], &[&out], Attrs::default(), stream)?;
        Ok(self.cx.array(out))
    }

    /// The elements, in row-major order (flushes, then waits for the array's value).
    /// Returns the error the array carries if an instruction that produced it failed.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        if T::DTYPE != self.dtype() {
            return Err(Error::DType { expected: self.dtype(), found: T::DTYPE });
        }
        let bytes = self.cx.host_access(&self.t, false)?;
        self.t.values_of(&bytes)
    }

    /// The one element of a one-element array (a scalar such as a loss).
    pub fn item<T: Element>(&self) -> Result<T> {
        if self.numel() != 1 {
            return Err(Error::Access {
                tensor: self.id(),
                detail: format!("has {} elements; item reads a one-element array", self.numel()),
            });
        }
        let values = self.to_vec::<T>()?;
        values.first().copied().ok_or_else(|| Error::Access {
            tensor: self.id(),
            detail: format!("read {} elements; item reads a one-element array", values.len()),
        })
    }

    /// Wait until the array's value is computed (flushes first). Returns the error it
    /// carries, if any.
    pub fn wait(&self) -> Result<()> {
        self.cx.host_access(&self.t, true).map(|_| ())
    }

    /// Free the array's storage now, after every use already made of it, even while
    /// clones of it are alive (as MXNet's `DeleteVariable`). Later ops on it, or on any
    /// clone, are refused with [`Error::Released`]. Flushes the context first.
    pub fn release(&self) -> Result<()> {
        self.cx.flush()?;
        self.t.release_now()
    }
}
