//! Indexing and joining of [`Array`]s, with PyTorch's names: [`cat`], [`stack`],
//! [`index_select`](Array::index_select), [`gather`](Array::gather),
//! [`scatter`](Array::scatter) (and `scatter_add`, the reductions, the in-place forms),
//! [`index_add`](Array::index_add) and [`embedding`].
//!
//! Index arrays are `i64` (or `i32`); an index out of range fails the op when it runs, as
//! `Error::Kernel` naming the op, the dimension and the index (reported by the array's
//! next read or wait; the VM runs on). As in PyTorch, these ops do not wrap a negative index
//! (advanced indexing does: `eager::advanced`). Dimensions may be negative (counted from
//! the end). `docs/ops.md`, "Indexing and joining", has the kernels' rules.

use smallvec::SmallVec;

use super::math::Rhs;
use super::Array;
use crate::framework::{promote_types, Attrs, Scalar, MAX_INPUTS};
use crate::vm::{Error, Result};

/// The attributes of a call of `op` with this parameter list.
pub(super) fn params(op: &str, ints: &[i64], scalars: &[Scalar]) -> Result<Attrs> {
    Attrs::default()
        .with_params(ints, scalars)
        .map_err(|e| Error::InvalidOperands { op: op.into(), detail: e.to_string() })
}

/// The error of a call of `op` refused before any op is built.
pub(super) fn refuse(op: &str, detail: impl Into<String>) -> Error {
    Error::InvalidOperands { op: op.into(), detail: detail.into() }
}

/// How [`Array::scatter_reduce_with`] combines a source value with the element it lands on
/// (PyTorch's `reduce=` of `scatter`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScatterReduce {
    /// `reduce="add"`: the values are added (`scatter_add`).
    Add,
    /// `reduce="multiply"`: the element is multiplied by the values.
    Multiply,
}

impl ScatterReduce {
    /// The reduction PyTorch names `name` (`"add"`, `"multiply"`).
    pub fn from_name(name: &str) -> Option<ScatterReduce> {
        match name {
            "add" | "sum" => Some(ScatterReduce::Add),
            "multiply" | "prod" => Some(ScatterReduce::Multiply),
            _ => None,
        }
    }

    fn code(r: Option<ScatterReduce>) -> i64 {
        match r {
            None => 0,
            Some(ScatterReduce::Add) => 1,
            Some(ScatterReduce::Multiply) => 2,
        }
    }
}

/// Whether `a` is a 1-D empty array, which [`cat`] skips as PyTorch does.
fn skipped(a: &Array) -> bool {
    a.shape() == [0]
}

/// The arrays joined along dimension `dim` (PyTorch's `torch.cat`): equal in every other
/// dimension; the result's dtype is the promotion of all their dtypes (each converted
/// first where it differs). 1-D empty arrays are skipped whatever the others' rank, as
/// PyTorch skips them. A call of more arrays than one instruction takes
/// ([`MAX_INPUTS`]) writes the result in parts, one call per group of inputs, each into a
/// view of the result.
///
/// ```
/// use eagervm::eager::{cat, Context};
/// use eagervm::prelude::*;
///
/// let vm = VirtualMachine::new(Config::default())?;
/// let cx = Context::new(&vm);
/// let a = cx.from_slice(&[1i64, 2, 3, 4], &[2, 2], DeviceId::CPU)?;
/// let b = cx.from_slice(&[0.5f32, 0.25], &[2, 1], DeviceId::CPU)?;
/// let c = cat(&[&a, &b], -1)?; // i64 and f32 give f32
/// assert_eq!(c.shape(), &[2, 3]);
/// assert_eq!(c.to_vec::<f32>()?, vec![1.0, 2.0, 0.5, 3.0, 4.0, 0.25]);
/// # Ok::<(), eagervm::Error>(())
/// ```
pub fn cat(tensors: &[&Array], dim: isize) -> Result<Array> {
    let first = *tensors.first().ok_or_else(|| refuse("cat", "expected a non-empty list of arrays"))?;
    let dtype = tensors.iter().skip(1).fold(first.dtype(), |d, a| promote_types(d, a.dtype()));
    let kept: Vec<Array> =
        tensors.iter().filter(|a| !skipped(a)).map(|a| a.to_dtype(dtype)).collect::<Result<_>>()?;
    if kept.is_empty() {
        // Every input is 1-D and empty: so is the result.
        return first.to_dtype(dtype)?.copy();
    }
    let rank = kept[0].ndim();
    if rank == 0 {
        return Err(refuse("cat", "zero-dimensional arrays cannot be concatenated"));
    }
    let d = super::layout::dim("cat", dim, rank)?;
    let attrs = params("cat", &[d as i64], &[])?;
    let op = first.cx.ops().cat;
    if kept.len() <= MAX_INPUTS {
        let refs: SmallVec<[&Array; 8]> = kept.iter().collect();
        return kept[0].call(op, &refs, attrs);
    }
    // More inputs than an instruction takes: one call per group, each writing its part.
    let mut shape: SmallVec<[usize; 8]> = kept[0].shape().into();
    shape[d] = 0;
    for a in &kept {
        if a.ndim() != rank {
            return Err(refuse(
                "cat",
                format!(
                    "arrays must have the same number of dimensions: {:?} and {:?}",
                    kept[0].shape(),
                    a.shape()
                ),
            ));
        }
        shape[d] += a.shape()[d];
    }
    let out = first.cx.empty(&shape, dtype, first.device())?;
    let mut start = 0usize;
    for group in kept.chunks(MAX_INPUTS) {
        let len: usize = group.iter().map(|a| a.shape()[d]).sum();
        let part = out.narrow(d as isize, start as isize, len)?;
        let refs: SmallVec<[&Array; 8]> = group.iter().collect();
        group[0].call_into(op, &refs, &part, attrs)?;
        start += len;
    }
    Ok(out)
}

/// The arrays, all of one shape, joined along a new dimension `dim` (PyTorch's
/// `torch.stack`): each gets a dimension of size 1 there (a view), then [`cat`] joins them.
pub fn stack(tensors: &[&Array], dim: isize) -> Result<Array> {
    let first = *tensors.first().ok_or_else(|| refuse("stack", "expected a non-empty list of arrays"))?;
    for (i, a) in tensors.iter().enumerate() {
        if a.shape() != first.shape() {
            return Err(refuse(
                "stack",
                format!(
                    "stack expects each array to be equal size, but got {:?} at entry 0 and {:?} at entry {i}",
                    first.shape(),
                    a.shape()
                ),
            ));
        }
    }
    let d = super::layout::dim("stack", dim, first.ndim() + 1)? as isize;
    let parts: Vec<Array> = tensors.iter().map(|a| a.unsqueeze(d)).collect::<Result<_>>()?;
    let refs: Vec<&Array> = parts.iter().collect();
    cat(&refs, d)
}

/// Look up rows of `weight` (`[num_embeddings, embedding_dim]`) by the indices of `input`
/// (`i64` or `i32`, any shape): `[*input.shape, embedding_dim]` (PyTorch's
/// `torch.nn.functional.embedding`). `padding_idx` (negative from the end) must be a row of
/// `weight`; it matters to training only (its row gets no gradient), so the lookup is the
/// same. Computed as `index_select` of `weight` along dimension 0 with the flattened
/// indices, reshaped: an index out of range fails the op when it runs.
pub fn embedding(input: &Array, weight: &Array, padding_idx: Option<i64>) -> Result<Array> {
    if weight.ndim() != 2 {
        return Err(refuse("embedding", format!("weight must be 2-D, not {:?}", weight.shape())));
    }
    let n = weight.shape()[0] as i64;
    if let Some(p) = padding_idx {
        if p >= n || p < -n {
            return Err(refuse("embedding", format!("padding_idx {p} must be within num_embeddings ({n})")));
        }
    }
    let flat = input.reshape(&[-1])?;
    let rows = weight.index_select(0, &flat)?;
    let mut shape: SmallVec<[isize; 8]> = input.shape().iter().map(|&s| s as isize).collect();
    shape.push(weight.shape()[1] as isize);
    rows.view(&shape)
}

impl Array {
    /// The slices of this array at `index` (`i64` or `i32`, 0-d or 1-D) along dimension
    /// `dim`, in order: the result has `index`'s length there (PyTorch's `index_select`).
    /// A negative index is out of range.
    pub fn index_select(&self, dim: isize, index: &Array) -> Result<Array> {
        let d = super::layout::dim("index_select", dim, self.ndim())?;
        self.call(self.cx.ops().index_select, &[self, index], params("index_select", &[d as i64], &[])?)
    }

    /// The elements of this array picked along dimension `dim` by `index` (`i64` or `i32`,
    /// of this array's rank, no larger in any other dimension): `out[i] = self[i with
    /// coordinate dim replaced by index[i]]`, of `index`'s shape (PyTorch's `gather`,
    /// NumPy's `take_along_axis`).
    pub fn gather(&self, dim: isize, index: &Array) -> Result<Array> {
        let d = super::layout::dim("gather", dim, self.ndim())?;
        self.call(self.cx.ops().gather, &[self, index], params("gather", &[d as i64], &[])?)
    }

    /// The scatter's source: an array of this array's dtype, or a number (converted to
    /// this array's dtype, expanded to `index`'s shape).
    fn scatter_src(&self, index: &Array, src: Rhs<'_>) -> Result<Array> {
        match src {
            Rhs::Array(a) => Ok(a.clone()),
            Rhs::Scalar(s) => self.cx.full(&[], s, self.dtype(), self.device())?.broadcast_to(index.shape()),
        }
    }

    /// A copy of this array with `src`'s values written along dimension `dim` at `index`:
    /// `out[i with coordinate dim replaced by index[i]] = src[i]` for each position `i` of
    /// `index` (PyTorch's `scatter`; `src` an array of this array's dtype, or a number).
    /// Where `index` repeats a position, the last write in row-major order of `index` wins.
    pub fn scatter<'a>(&self, dim: isize, index: &Array, src: impl Into<Rhs<'a>>) -> Result<Array> {
        self.scatter_reduce_with(dim, index, src, None)
    }

    /// [`scatter`](Self::scatter) in place.
    pub fn scatter_<'a>(&mut self, dim: isize, index: &Array, src: impl Into<Rhs<'a>>) -> Result<&mut Self> {
        self.scatter_reduce_with_(dim, index, src, None)
    }

    /// [`scatter`](Self::scatter) with PyTorch's `reduce=`: the source values are added to
    /// (or multiply) the elements they land on, in row-major order of `index`, so that
    /// repeated indices give the same result on every run.
    pub fn scatter_reduce_with<'a>(
        &self,
        dim: isize,
        index: &Array,
        src: impl Into<Rhs<'a>>,
        reduce: Option<ScatterReduce>,
    ) -> Result<Array> {
        let d = super::layout::dim("scatter", dim, self.ndim())?;
        let src = self.scatter_src(index, src.into())?;
        let attrs = params("scatter", &[d as i64, ScatterReduce::code(reduce)], &[])?;
        self.call(self.cx.ops().scatter, &[self, index, &src], attrs)
    }

    /// [`scatter_reduce_with`](Self::scatter_reduce_with) in place.
    pub fn scatter_reduce_with_<'a>(
        &mut self,
        dim: isize,
        index: &Array,
        src: impl Into<Rhs<'a>>,
        reduce: Option<ScatterReduce>,
    ) -> Result<&mut Self> {
        let d = super::layout::dim("scatter_", dim, self.ndim())?;
        let src = self.scatter_src(index, src.into())?;
        let attrs = params("scatter_", &[d as i64, ScatterReduce::code(reduce)], &[])?;
        self.call_into(self.cx.ops().scatter, &[self, index, &src], self, attrs)?;
        Ok(self)
    }

    /// A copy of this array with `src`'s values added along dimension `dim` at `index`
    /// (PyTorch's `scatter_add`; NumPy's `add.at` along an axis): repeated indices add up, in
    /// row-major order of `index`.
    pub fn scatter_add(&self, dim: isize, index: &Array, src: &Array) -> Result<Array> {
        self.scatter_reduce_with(dim, index, src, Some(ScatterReduce::Add))
    }

    /// [`scatter_add`](Self::scatter_add) in place.
    pub fn scatter_add_(&mut self, dim: isize, index: &Array, src: &Array) -> Result<&mut Self> {
        self.scatter_reduce_with_(dim, index, src, Some(ScatterReduce::Add))
    }

    /// A copy of this array with `alpha * source`'s slices along dimension `dim` added to
    /// the slices `index` names (`i64` or `i32`, 0-d or 1-D; `source` of this array's
    /// dtype and shape but `index`'s length along `dim`): PyTorch's `index_add`. Repeated
    /// indices add up, in increasing order of the source's slices.
    pub fn index_add(
        &self,
        dim: isize,
        index: &Array,
        source: &Array,
        alpha: impl Into<Scalar>,
    ) -> Result<Array> {
        let d = super::layout::dim("index_add", dim, self.ndim())?;
        let attrs = params("index_add", &[d as i64], &[alpha.into()])?;
        self.call(self.cx.ops().index_add, &[self, index, source], attrs)
    }

    /// [`index_add`](Self::index_add) in place.
    pub fn index_add_(
        &mut self,
        dim: isize,
        index: &Array,
        source: &Array,
        alpha: impl Into<Scalar>,
    ) -> Result<&mut Self> {
        let d = super::layout::dim("index_add_", dim, self.ndim())?;
        let attrs = params("index_add_", &[d as i64], &[alpha.into()])?;
        self.call_into(self.cx.ops().index_add, &[self, index, source], self, attrs)?;
        Ok(self)
    }
}

impl Array {
    /// The index list `[:, ..., :, index]` (`index` as 1-D) that names the slices of
    /// dimension `d` that `index` picks.
    fn along(&self, d: usize, index: &Array) -> Result<Vec<super::Indexer>> {
        let mut key = vec![super::Indexer::Basic(super::TensorIndex::full()); d];
        key.push(super::Indexer::Array(index.reshape(&[-1])?));
        Ok(key)
    }

    /// [`index_copy`](Self::index_copy) in place.
    pub fn index_copy_(&mut self, dim: isize, index: &Array, source: &Array) -> Result<&mut Self> {
        let d = super::layout::dim("index_copy_", dim, self.ndim())?;
        if self.ndim() == 0 {
            return Err(refuse("index_copy_", "a 0-d array has no slices to copy into"));
        }
        let mut want: SmallVec<[usize; 8]> = self.shape().into();
        want[d] = index.numel();
        if source.shape() != want.as_slice() {
            return Err(refuse(
                "index_copy_",
                format!(
                    "source is {:?} but the array is {:?} and the index has {} elements: source must be {:?}",
                    source.shape(),
                    self.shape(),
                    index.numel(),
                    want.as_slice()
                ),
            ));
        }
        if source.dtype() != self.dtype() {
            return Err(refuse(
                "index_copy_",
                format!(
                    "source is {} but the array is {}: source must have the array's dtype",
                    source.dtype(),
                    self.dtype()
                ),
            ));
        }
        self.index_put_impl(&self.along(d, index)?, Rhs::Array(source), false, true)?;
        Ok(self)
    }

    /// A copy of this array with `source`'s slices along dimension `dim` written to the
    /// slices `index` (`i64` or `i32`, 1-D) names (PyTorch's `index_copy`; `source` has this
    /// array's dtype and shape but `index`'s length along `dim`). A negative index is out of
    /// range; where `index` repeats, the last slice wins. Advanced indexing's `index_put`
    /// on the view `[:, ..., :, index]`.
    pub fn index_copy(&self, dim: isize, index: &Array, source: &Array) -> Result<Array> {
        let mut out = self.copy()?;
        out.index_copy_(dim, index, source)?;
        Ok(out)
    }

    /// [`index_fill`](Self::index_fill) in place.
    pub fn index_fill_(&mut self, dim: isize, index: &Array, value: impl Into<Scalar>) -> Result<&mut Self> {
        let d = super::layout::dim("index_fill_", dim, self.ndim())?;
        if self.ndim() == 0 {
            let view = self.unsqueeze(0)?;
            view.index_put_impl(&view.along(0, index)?, Rhs::Scalar(value.into()), false, false)?;
            return Ok(self);
        }
        self.index_put_impl(&self.along(d, index)?, Rhs::Scalar(value.into()), false, false)?;
        Ok(self)
    }

    /// A copy of this array with the slices of dimension `dim` that `index` (`i64` or `i32`,
    /// 0-d or 1-D; negative from the end) names set to `value` (PyTorch's `index_fill`).
    pub fn index_fill(&self, dim: isize, index: &Array, value: impl Into<Scalar>) -> Result<Array> {
        let mut out = self.copy()?;
        out.index_fill_(dim, index, value)?;
        Ok(out)
    }

    /// The elements of this array, taken as 1-D in row-major order, at `index` (`i64` or
    /// `i32`, any shape; negative from the end): an array of `index`'s shape (PyTorch's
    /// `take`, NumPy's `take` without an axis).
    pub fn take(&self, index: &Array) -> Result<Array> {
        self.reshape(&[-1])?.index_with(&[super::Indexer::Array(index.clone())])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eager::Context;
    use crate::ep::mock::MockConfig;
    use crate::ep::DeviceId;
    use crate::prelude::{Config, VirtualMachine};

    fn vm() -> VirtualMachine {
        VirtualMachine::new(Config::default().with_mock_devices(1, MockConfig::default())).unwrap()
    }

    const DEVICES: [DeviceId; 2] = [DeviceId::CPU, DeviceId::mock(0)];

    #[test]
    fn cat_of_more_inputs_than_a_call_takes_writes_parts() {
        let vm = vm();
        let cx = Context::new(&vm);
        for dev in DEVICES {
            let n = MAX_INPUTS * 2 + 7;
            let parts: Vec<Array> =
                (0..n).map(|i| cx.from_slice(&[i as i32, -(i as i32)], &[2, 1], dev).unwrap()).collect();
            let mut refs: Vec<&Array> = parts.iter().collect();
            let empty = cx.from_slice::<f32>(&[], &[0], dev).unwrap();
            refs.insert(3, &empty); // skipped, but promotes to f32 as PyTorch does
            let c = cat(&refs, 1).unwrap();
            assert_eq!(c.shape(), &[2, n]);
            let v = c.to_dtype(crate::framework::DType::I64).unwrap().to_vec::<i64>().unwrap();
            let want: Vec<i64> = (0..n as i64).chain((0..n as i64).map(|i| -i)).collect();
            assert_eq!(v, want);
            assert_eq!(c.dtype(), crate::framework::DType::F32);
            let s = stack(&[&parts[1], &parts[2]], -1).unwrap();
            assert_eq!(s.shape(), &[2, 1, 2]);
            assert_eq!(s.to_vec::<i32>().unwrap(), vec![1, 2, -1, -2]);
            assert!(stack(&[&parts[1], &empty], 0).is_err());
        }
    }

    #[test]
    fn index_copy_index_fill_and_take() {
        let vm = vm();
        let cx = Context::new(&vm);
        for dev in DEVICES {
            let x = cx.from_slice(&[1i64, 2, 3, 4, 5, 6], &[2, 3], dev).unwrap();
            let idx = cx.from_slice(&[2i64, 0], &[2], dev).unwrap();
            let src = cx.from_slice(&[10i64, 20, 30, 40], &[2, 2], dev).unwrap();
            assert_eq!(
                x.index_copy(1, &idx, &src).unwrap().to_vec::<i64>().unwrap(),
                vec![20, 2, 10, 40, 5, 30]
            );
            let neg = cx.from_slice(&[-1i64, 0], &[2], dev).unwrap();
            match x.index_copy(1, &neg, &src).unwrap().to_vec::<i64>().unwrap_err() {
                Error::Kernel { message, .. } => {
                    assert!(message.contains("index -1 is out of range"), "{message}")
                }
                e => panic!("{e}"),
            }
            assert!(x.index_copy(1, &idx, &x).is_err());
            assert_eq!(
                x.index_fill(1, &neg, -7).unwrap().to_vec::<i64>().unwrap(),
                vec![-7, 2, -7, -7, 5, -7]
            );
            let mut y = x.copy().unwrap();
            y.index_fill_(0, &cx.from_slice(&[1i64], &[], dev).unwrap(), 0).unwrap();
            assert_eq!(y.to_vec::<i64>().unwrap(), vec![1, 2, 3, 0, 0, 0]);
            let t = x.t().unwrap().take(&cx.from_slice(&[0i64, -1, 1, 4], &[2, 2], dev).unwrap()).unwrap();
            assert_eq!(t.shape(), &[2, 2]);
            assert_eq!(t.to_vec::<i64>().unwrap(), vec![1, 6, 4, 3]);
            assert_eq!(x.to_vec::<i64>().unwrap(), vec![1, 2, 3, 4, 5, 6]);
        }
    }

    #[test]
    fn an_index_out_of_range_fails_the_op_and_the_vm_runs_on() {
        let vm = vm();
        let cx = Context::new(&vm);
        for dev in DEVICES {
            let x = cx.from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3], dev).unwrap();
            let bad = cx.from_slice(&[0i64, 3], &[2], dev).unwrap();
            let y = x.index_select(1, &bad).unwrap();
            match y.to_vec::<f32>().unwrap_err() {
                Error::Kernel { op, message, .. } => {
                    assert_eq!(op, "index_select");
                    assert_eq!(message, "index_select: index 3 is out of range for dimension 1 of size 3");
                }
                e => panic!("{e}"),
            }
            let good = cx.from_slice(&[2i64, 0], &[2], dev).unwrap();
            let y = x.index_select(-1, &good).unwrap();
            assert_eq!(y.to_vec::<f32>().unwrap(), vec![3.0, 1.0, 6.0, 4.0]);
            let g = x.gather(0, &cx.from_slice(&[1i64, 0, 1], &[1, 3], dev).unwrap()).unwrap();
            assert_eq!(g.to_vec::<f32>().unwrap(), vec![4.0, 2.0, 6.0]);
            let mut z = x.copy().unwrap();
            let idx = cx.from_slice(&[1i64, 1, 1], &[1, 3], dev).unwrap();
            z.scatter_(0, &idx, 0.5).unwrap();
            assert_eq!(z.to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0, 0.5, 0.5, 0.5]);
            let src = cx.from_slice(&[1.0f32, 1.0, 1.0], &[1, 3], dev).unwrap();
            z.scatter_add_(0, &idx, &src).unwrap();
            assert_eq!(z.to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0, 1.5, 1.5, 1.5]);
            let ones = cx.from_slice(&[1.0f32, 1.0], &[2, 1], dev).unwrap();
            let at0 = cx.from_slice(&[0i64], &[1], dev).unwrap();
            let r = x.index_add(1, &at0, &ones, 2.0).unwrap();
            assert_eq!(r.to_vec::<f32>().unwrap(), vec![3.0, 2.0, 3.0, 6.0, 5.0, 6.0]);
            let w = cx.from_slice(&[0.0f32, 0.1, 1.0, 1.1, 2.0, 2.1], &[3, 2], dev).unwrap();
            let ids = cx.from_slice(&[2i64, 0, 1, 2], &[2, 2], dev).unwrap();
            let e = embedding(&ids, &w, Some(0)).unwrap();
            assert_eq!(e.shape(), &[2, 2, 2]);
            assert_eq!(e.to_vec::<f32>().unwrap(), vec![2.0, 2.1, 0.0, 0.1, 1.0, 1.1, 2.0, 2.1]);
            assert!(embedding(&ids, &w, Some(3)).is_err());
        }
    }
}
