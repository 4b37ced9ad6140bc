//! [`Array`]: the user's eager tensor, an owned handle.

use std::fmt;

use super::layout::Layout;
use super::Context;
use crate::ep::{DeviceId, StreamType};
use crate::framework::{Attrs, DType, Element, Op, Tensor};
use crate::vm::{Error, Result};

/// An eager tensor: a counted handle to a VM tensor plus the [`Context`] that runs its ops.
///
/// An array owns what it needs: it is `Clone` (cheap: two counters; a copy of the values is
/// [`copy`](Self::copy), PyTorch's `clone`), `Send` and `Sync`, and keeps its context and VM
/// running while it lives (`eager::context`, "Ownership"), so it can sit in a struct beside
/// its [`VirtualMachine`](crate::VirtualMachine). Every op returns a new array at once (the
/// work runs asynchronously on the VM) or the typed [`Error`] that refuses it. Ops run on
/// the compute stream of the array's device; all inputs of an op must live on one device
/// (move them with [`Array::to`]).
///
/// Names, arguments and results follow PyTorch's, in Rust's idiom: views share their
/// storage (`view`, `transpose`, `t`, `narrow`, `select`, `index`, ...: no copy, no kernel),
/// elementwise ops broadcast and promote dtypes as PyTorch does (`a.add(&b)`, `a.add(2.0)`),
/// comparisons give `bool` arrays, and the in-place forms (`add_`, `copy_`, `fill_`,
/// `masked_fill_`, [`index_put_`](Self::index_put_)) write through views into the storage
/// they share.
///
/// ```
/// use eagervm::eager::{Array, Context, TensorIndex as I};
/// use eagervm::prelude::*;
///
/// let vm = VirtualMachine::new(Config::default())?;
/// let cx = Context::new(&vm);
/// let x = cx.from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3], DeviceId::CPU)?;
/// let col = x.index(&[I::full(), I::at(1)])?; // x[:, 1], a view
/// assert_eq!(col.to_vec::<f32>()?, vec![2.0, 5.0]);
/// let b = cx.from_slice(&[10.0f32, 20.0, 30.0], &[3], DeviceId::CPU)?;
/// let y = x.add(&b)?.mul(0.5)?; // [2, 3] + [3] broadcasts
/// assert_eq!(y.to_vec::<f32>()?, vec![5.5, 11.0, 16.5, 7.0, 12.5, 18.0]);
/// let mut w = x.t()?; // [3, 2], a view of x's storage
/// w.index(&[I::at(0)])?.fill_(0.0)?; // writes x[:, 0]
/// assert_eq!(x.to_vec::<f32>()?, vec![0.0, 2.0, 3.0, 0.0, 5.0, 6.0]);
/// assert_eq!(x.gt(2.5)?.to_vec::<bool>()?, vec![false, false, true, false, true, true]);
/// w.mul_(2.0)?;
/// assert_eq!(x.sum()?.item::<f32>()?, 32.0);
/// # Ok::<(), eagervm::Error>(())
/// ```
#[derive(Clone)]
pub struct Array {
    pub(super) t: Tensor,
    pub(super) cx: Context,
}

impl fmt::Debug for Array {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Array({:?})", self.t)
    }
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
    /// Number of dimensions (PyTorch's `dim()`).
    pub fn ndim(&self) -> usize {
        self.t.shape().len()
    }
    /// The size of dimension `d` (negative counts from the end).
    pub fn size(&self, d: isize) -> Result<usize> {
        if self.ndim() == 0 {
            return Err(Error::InvalidOperands {
                op: "size".into(),
                detail: "a 0-d tensor has no dimensions".into(),
            });
        }
        Ok(self.shape()[super::layout::dim("size", d, self.ndim())?])
    }
    /// Elements of the storage between neighbours along each dimension.
    pub fn strides(&self) -> &[isize] {
        &self.t.meta().strides
    }
    /// The storage element of index `[0, 0, ...]` (PyTorch's `storage_offset()`).
    pub fn storage_offset(&self) -> usize {
        self.t.meta().offset
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
    /// Whether the elements lie in row-major order one after another.
    pub fn is_contiguous(&self) -> bool {
        self.t.meta().is_contiguous()
    }
    /// Whether this array is a view of another's storage.
    pub fn is_view(&self) -> bool {
        self.t.is_view()
    }
    /// Whether this array and `other` lie in the same storage.
    pub fn shares_storage(&self, other: &Array) -> bool {
        self.t.shares_storage(&other.t)
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

    pub(crate) fn tensor_unflushed(&self) -> &Tensor {
        &self.t
    }

    /// The layout of this array in its storage.
    pub(super) fn layout(&self) -> Layout {
        let m = self.t.meta();
        Layout { shape: m.shape.clone(), strides: m.strides.clone(), offset: m.offset }
    }

    /// A view of this array's storage with layout `l` (checked against the storage).
    pub(super) fn view_of(&self, l: Layout) -> Result<Array> {
        let t = self.t.view_in(self.cx.vm().engine(), &l.shape, &l.strides, l.offset)?;
        Ok(Array::new(t, self.cx.clone()))
    }

    /// The compute stream of this array's device.
    pub(super) fn compute(&self) -> Result<crate::vm::StreamId> {
        self.cx.vm().compute_stream(self.device())
    }

    /// Call single-output `op` on this array's compute stream.
    pub(super) fn call(&self, op: Op, inputs: &[&Array], attrs: Attrs) -> Result<Array> {
        let stream = self.compute()?;
        match inputs {
            [a] => self.cx.call1(op, [*a], attrs, stream),
            [a, b] => self.cx.call1(op, [*a, *b], attrs, stream),
            _ => Ok(self.cx.call_multi(op, inputs, attrs, stream)?.remove(0)),
        }
    }

    /// Call `op` on this array's compute stream, writing `out`.
    pub(super) fn call_into(&self, op: Op, inputs: &[&Array], out: &Array, attrs: Attrs) -> Result<()> {
        let stream = self.compute()?;
        self.cx.call_into(op, inputs, &[&out.t], attrs, stream)
    }

    /// This array on `device`. The same array if it is there already; otherwise a copy on
    /// the destination's host-to-device stream (to a device) or the source's
    /// device-to-host stream (to the host), so that copies overlap compute. A view that is
    /// not contiguous is made contiguous on its own device first.
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
        let from = self.contiguous()?;
        let out = vm.empty_at(self.shape(), self.dtype(), device, || format!("a copy to {device}"))?;
        self.cx.call_into(self.cx.ops().copy, &[&from], &[&out], Attrs::default(), stream)?;
        Ok(self.cx.array(out))
    }

    /// This array with its elements converted to `dtype` (PyTorch's `to(dtype)`): the same
    /// array if it has that dtype already, else a new one (the `cast` op: floats round to
    /// nearest even, a float to an integer truncates toward zero and saturates, NaN to 0;
    /// `docs/ops.md`).
    pub fn to_dtype(&self, dtype: DType) -> Result<Array> {
        if self.dtype() == dtype {
            return Ok(self.clone());
        }
        self.call(self.cx.ops().cast, &[self], Attrs::default().with_dtype(dtype))
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
        if T::DTYPE != self.dtype() {
            return Err(Error::DType { expected: self.dtype(), found: T::DTYPE });
        }
        // The one element from the bytes read, without a vector of values.
        let bytes = self.cx.host_access(&self.t, false)?;
        T::first_of(&bytes).ok_or_else(|| Error::Access {
            tensor: self.id(),
            detail: format!("read {} bytes; item reads a one-element array", bytes.len()),
        })
    }

    /// Wait until the array's value is computed (flushes first). Returns the error it
    /// carries, if any.
    pub fn wait(&self) -> Result<()> {
        self.cx.host_access(&self.t, true).map(|_| ())
    }

    /// Free the array's storage now, after every use already made of it, even while
    /// clones of it are alive (as MXNet's `DeleteVariable`). Later ops on it, or on any
    /// clone, are refused with [`Error::Released`]. A storage that views of other arrays
    /// still use is freed once the last of them goes. Flushes the context first.
    pub fn release(&self) -> Result<()> {
        self.cx.flush()?;
        self.t.release_now()
    }
}
