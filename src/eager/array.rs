//! [`Array`]: the user's eager tensor.

use std::fmt;

use super::context::{Binary, Unary};
use super::Context;
use crate::ep::{DeviceId, StreamType};
use crate::framework::{Attrs, DType, Element, Tensor};
use crate::vm::{Error, Result};

/// An eager tensor: a handle to a VM tensor plus the [`Context`] that runs its ops.
///
/// Every op returns a new array at once (the work runs asynchronously on the VM) or the
/// typed [`Error`] that refuses it. Ops run on the compute stream of the array's device;
/// all inputs of an op must live on one device (move them with [`Array::to`]). Cloning is
/// cheap and shares the tensor.
///
/// ```
/// use eagervm::eager::Context;
/// use eagervm::prelude::*;
///
/// let vm = VirtualMachine::new(Config::default())?;
/// let cx = Context::new(&vm);
/// let a = cx.from_slice(&[1.0f32, 2.0, 3.0], &[3], DeviceId::CPU)?;
/// let b = cx.from_slice(&[0.5f32, 0.5, 0.5], &[3], DeviceId::CPU)?;
/// let loss = a.sub(&b)?.mul(&a.sub(&b)?)?.sum()?; // 0.25 + 2.25 + 6.25
/// assert_eq!(loss.item::<f32>()?, 8.75);
/// # Ok::<(), eagervm::Error>(())
/// ```
#[derive(Clone)]
pub struct Array<'a> {
    t: Tensor,
    cx: &'a Context<'a>,
}

impl fmt::Debug for Array<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Array({:?})", self.t)
    }
}

impl<'a> Array<'a> {
    pub(super) fn new(t: Tensor, cx: &'a Context<'a>) -> Self {
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
    pub fn context(&self) -> &'a Context<'a> {
        self.cx
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

    pub(super) fn context_ptr(&self) -> *const () {
        self.cx as *const Context<'_> as *const ()
    }

    pub(super) fn flush_owner(&self) -> Result<()> {
        self.cx.flush()
    }

    fn binary(&self, op: Binary, other: &Array<'_>) -> Result<Array<'a>> {
        let device = self.device();
        let stream = (self.cx.vm().compute_stream(device)?, device);
        let mut out =
            self.cx.emit(self.cx.ops_binary(op), &[self, other], Attrs::default(), stream, device, &[])?;
        // Cannot fail: every op of `Binary` makes one output once its `infer` passed.
        Ok(out.pop().expect("one output"))
    }

    fn unary(&self, op: Unary, attrs: Attrs) -> Result<Array<'a>> {
        let device = self.device();
        let stream = (self.cx.vm().compute_stream(device)?, device);
        let mut out = self.cx.emit(self.cx.ops_unary(op), &[self], attrs, stream, device, &[])?;
        // Cannot fail: every op of `Unary` makes one output once its `infer` passed.
        Ok(out.pop().expect("one output"))
    }

    /// Matrix product `self @ other`: `[m, k] x [k, n] -> [m, n]`.
    pub fn matmul(&self, other: &Array<'_>) -> Result<Array<'a>> {
        self.binary(Binary::Matmul, other)
    }

    /// `selfᵀ @ other`: `[k, m] x [k, n] -> [m, n]` (a weight gradient, `xᵀ dy`).
    pub fn matmul_tn(&self, other: &Array<'_>) -> Result<Array<'a>> {
        self.binary(Binary::MatmulTn, other)
    }

    /// `self @ otherᵀ`: `[m, k] x [n, k] -> [m, n]` (an input gradient, `dy Wᵀ`).
    pub fn matmul_nt(&self, other: &Array<'_>) -> Result<Array<'a>> {
        self.binary(Binary::MatmulNt, other)
    }

    /// Elementwise `self + other` (same shape and dtype).
    pub fn add(&self, other: &Array<'_>) -> Result<Array<'a>> {
        self.binary(Binary::Add, other)
    }

    /// Elementwise `self - other` (same shape and dtype).
    pub fn sub(&self, other: &Array<'_>) -> Result<Array<'a>> {
        self.binary(Binary::Sub, other)
    }

    /// Elementwise `self * other` (same shape and dtype).
    pub fn mul(&self, other: &Array<'_>) -> Result<Array<'a>> {
        self.binary(Binary::Mul, other)
    }

    /// `self[i][j] + bias[j]`: a `[k]` bias added to every row of a `[n, k]` array.
    pub fn add_bias(&self, bias: &Array<'_>) -> Result<Array<'a>> {
        self.binary(Binary::AddBias, bias)
    }

    /// `self * factor` (for `i64`, the factor truncated toward zero).
    pub fn scale(&self, factor: f64) -> Result<Array<'a>> {
        self.unary(Unary::Scale, Attrs::scalar(factor))
    }

    /// `max(self, 0)` elementwise.
    pub fn relu(&self) -> Result<Array<'a>> {
        self.unary(Unary::Relu, Attrs::default())
    }

    /// The gradient of `relu` at `self` given the gradient `dy` of its output: `dy` where
    /// `self > 0`, 0 elsewhere.
    pub fn relu_grad(&self, dy: &Array<'_>) -> Result<Array<'a>> {
        // The kernel takes (dy, x); the result lives with `self`'s context.
        let device = self.device();
        let stream = (self.cx.vm().compute_stream(device)?, device);
        let op = self.cx.ops_binary(Binary::ReluGrad);
        let mut out = self.cx.emit(op, &[dy, self], Attrs::default(), stream, device, &[])?;
        // Cannot fail: `relu_grad` makes one output once its `infer` passed.
        Ok(out.pop().expect("one output"))
    }

    /// The sum of all elements, as a scalar array (shape `[]`).
    pub fn sum(&self) -> Result<Array<'a>> {
        self.unary(Unary::Sum, Attrs::default())
    }

    /// The sum over the rows of a `[n, k]` array: `[k]` column sums (a bias gradient).
    pub fn sum_rows(&self) -> Result<Array<'a>> {
        self.unary(Unary::SumRows, Attrs::default())
    }

    /// This array on `device`. The same array if it is there already; otherwise a copy on
    /// the destination's host-to-device stream (to a device) or the source's
    /// device-to-host stream (to the host), so that copies overlap compute.
    pub fn to(&self, device: DeviceId) -> Result<Array<'a>> {
        let src = self.device();
        if src == device {
            return Ok(self.clone());
        }
        let stream = if device.is_host() {
            (self.cx.vm().stream(src, StreamType::D2H)?, src)
        } else {
            (self.cx.vm().stream(device, StreamType::H2D)?, device)
        };
        let mut out =
            self.cx.emit(self.cx.ops_unary(Unary::Copy), &[self], Attrs::default(), stream, device, &[])?;
        // Cannot fail: `copy` makes one output once its `infer` passed.
        Ok(out.pop().expect("one output"))
    }

    /// The elements, in row-major order (flushes, then waits for the array's value).
    /// Returns the error the array carries if an instruction that produced it failed.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        if T::DTYPE != self.dtype() {
            return Err(Error::DType { expected: self.dtype(), found: T::DTYPE });
        }
        self.cx.flush()?;
        self.t.to_vec()
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
        self.cx.flush()?;
        self.t.wait()
    }

    /// Free the array's storage now, after every use already made of it, even while
    /// clones of it are alive (as MXNet's `DeleteVariable`). Later ops on it, or on any
    /// clone, are refused with [`Error::Released`]. Flushes the context first.
    pub fn release(&self) -> Result<()> {
        self.cx.flush()?;
        self.t.release_now()
    }
}
