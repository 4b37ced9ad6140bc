//! Advanced indexing, as PyTorch indexes a tensor with tensors: [`Array::index_with`]
//! (`x[idx]`, `x[:, idx]`, `x[mask]`, `x[i, j]` with index arrays), [`Array::index_put_with_`]
//! (`x[idx] = v`, PyTorch's `index_put_` with `accumulate`), [`Array::nonzero`] and
//! [`Array::masked_select`].
//!
//! **Sizes known only from values.** The VM needs every output's shape when a call is
//! built, but `nonzero`, `masked_select` and indexing with a `bool` mask make as many
//! elements as the mask holds `true`s. So these count first: the count is read back to the
//! host (a sync point: the call waits for the mask's value, as PyTorch's CUDA `nonzero`
//! does), then the `nonzero` op fills the index array, and the gather (the `index` op) reads
//! through it. Assigning a number through a mask alone (`x[mask] = 0`) needs no count: it
//! is `masked_fill_` on the view, with no sync.
//!
//! **Rules.** Integers, slices, `None` and `...` index first, as views (`Array::index`);
//! each index array (`i64` or `i32`; a `bool` mask stands for as many index arrays as its
//! dimensions, those of its `nonzero`) then indexes one dimension of the view. The index
//! arrays broadcast together to one shape `B`; where they index consecutive dimensions, `B`
//! replaces those dimensions in the result, and otherwise it comes first, as in PyTorch.
//! A negative index counts from the end; one out of range fails the op when it runs
//! (`Error::Kernel` naming `index` or `index_put`, the dimension and the index).

use smallvec::SmallVec;

use super::index::TensorIndex;
use super::layout::broadcast_shapes;
use super::math::Rhs;
use super::select::{params, refuse};
use super::Array;
use crate::framework::{DType, Scalar};
use crate::vm::Result;

/// One index of [`Array::index_with`]: a basic index, or an index array.
#[derive(Debug, Clone)]
pub enum Indexer {
    /// An integer, a slice, `None` or `...` (basic indexing, a view).
    Basic(TensorIndex),
    /// An index array: `i64` or `i32` (the indices of one dimension, broadcast with the
    /// other index arrays), or `bool` (a mask over as many dimensions as it has).
    Array(Array),
}

impl From<TensorIndex> for Indexer {
    fn from(i: TensorIndex) -> Self {
        Indexer::Basic(i)
    }
}

impl From<&Array> for Indexer {
    fn from(a: &Array) -> Self {
        Indexer::Array(a.clone())
    }
}

/// The view and the index arrays an advanced index comes to: `view`'s dimensions
/// `d0..d0 + idx.len()` are indexed by `idx`.
struct Plan {
    view: Array,
    idx: Vec<Array>,
    d0: usize,
}

impl Array {
    /// The indices of the nonzero elements (`true`, any nonzero number, NaN), as an `i64`
    /// array `[n, ndim]` in row-major order (PyTorch's `nonzero()`). Reads the count first
    /// (a sync point: module docs).
    pub fn nonzero(&self) -> Result<Array> {
        let n = self.count_nonzero_now()?;
        let out = self.cx.empty(&[n, self.ndim()], DType::I64, self.device())?;
        self.call_into(self.cx.ops().nonzero, &[self], &out, Default::default())?;
        Ok(out)
    }

    /// The number of nonzero elements, read back (waits for this array's value).
    fn count_nonzero_now(&self) -> Result<usize> {
        let mask = if self.dtype() == DType::Bool { self.clone() } else { self.ne(Scalar::Int(0))? };
        Ok(mask.sum()?.item::<i64>()?.max(0) as usize)
    }

    /// The elements of this array where `mask` (`bool`, broadcast with this array) is
    /// true, as a 1-D array in row-major order (PyTorch's `masked_select`). Reads the
    /// mask's count first (a sync point: module docs).
    pub fn masked_select(&self, mask: &Array) -> Result<Array> {
        if mask.dtype() != DType::Bool {
            return Err(refuse(
                "masked_select",
                format!("the mask is {}: masked_select takes a bool mask", mask.dtype()),
            ));
        }
        let shape = broadcast_shapes("masked_select", self.shape(), mask.shape())?;
        let (mut x, mut m) = (self.broadcast_to(&shape)?, mask.broadcast_to(&shape)?);
        if shape.is_empty() {
            x = x.reshape(&[1])?;
            m = m.reshape(&[1])?;
        }
        x.index_with(&[Indexer::Array(m)])
    }

    /// Split `indices` into a view (the basic indices applied, index arrays as full
    /// slices) and the index arrays of its dimensions, adjacent from `d0` (module docs).
    fn advanced_plan(&self, op: &str, indices: &[Indexer]) -> Result<Plan> {
        // Masks become the index arrays of their nonzero elements (a read of the count);
        // a 0-d mask is a new dimension of size 1 indexed by [0] or by nothing.
        let mut items: Vec<Indexer> = Vec::with_capacity(indices.len());
        let mut d = 0usize; // the dimension of `self` the next consuming index takes
        let consuming: usize = indices
            .iter()
            .map(|i| match i {
                Indexer::Basic(TensorIndex::At(_) | TensorIndex::Slice { .. }) => 1,
                Indexer::Array(a) if a.dtype() == DType::Bool => a.ndim(),
                Indexer::Array(_) => 1,
                Indexer::Basic(_) => 0,
            })
            .sum();
        if consuming > self.ndim() {
            return Err(refuse(
                op,
                format!("too many indices for a tensor of {} dimensions: {consuming} given", self.ndim()),
            ));
        }
        for i in indices {
            match i {
                Indexer::Basic(TensorIndex::Ellipsis) => {
                    d += self.ndim() - consuming;
                    items.push(i.clone());
                }
                Indexer::Basic(TensorIndex::NewAxis) => items.push(i.clone()),
                Indexer::Basic(_) => {
                    d += 1;
                    items.push(i.clone());
                }
                Indexer::Array(m) if m.dtype() == DType::Bool && m.ndim() == 0 => {
                    return Err(refuse(
                        op,
                        "a 0-d bool index is not supported: use None (True) or an empty slice",
                    ));
                }
                Indexer::Array(m) if m.dtype() == DType::Bool => {
                    let covered = &self.shape()[d..d + m.ndim()];
                    if m.shape() != covered {
                        return Err(refuse(
                            op,
                            format!(
                                "the shape of the mask {:?} does not match the shape of the indexed dimensions {covered:?} (from dimension {d})",
                                m.shape()
                            ),
                        ));
                    }
                    let nz = m.nonzero()?;
                    for j in 0..m.ndim() {
                        items.push(Indexer::Array(nz.select(1, j as isize)?));
                    }
                    d += m.ndim();
                }
                Indexer::Array(a) => {
                    if !matches!(a.dtype(), DType::I64 | DType::I32) {
                        return Err(refuse(
                            op,
                            format!(
                                "tensors used as indices must be int64, int32 or bool, not {}",
                                a.dtype()
                            ),
                        ));
                    }
                    items.push(i.clone());
                    d += 1;
                }
            }
        }
        // The view: index arrays as full slices, each one's dimension in the view noted.
        let mut basic: Vec<TensorIndex> = Vec::with_capacity(items.len());
        let mut idx: Vec<Array> = Vec::new();
        let mut dims: SmallVec<[usize; 8]> = SmallVec::new();
        let consumed: usize = items
            .iter()
            .filter(|i| !matches!(i, Indexer::Basic(TensorIndex::NewAxis | TensorIndex::Ellipsis)))
            .count();
        // The dimension of the view the next index makes.
        let mut v = 0usize;
        for i in &items {
            match i {
                Indexer::Basic(b @ TensorIndex::At(_)) => basic.push(*b),
                Indexer::Basic(b @ (TensorIndex::Slice { .. } | TensorIndex::NewAxis)) => {
                    basic.push(*b);
                    v += 1;
                }
                Indexer::Basic(TensorIndex::Ellipsis) => {
                    basic.push(TensorIndex::Ellipsis);
                    v += self.ndim() - consumed;
                }
                Indexer::Array(a) => {
                    basic.push(TensorIndex::full());
                    idx.push(a.clone());
                    dims.push(v);
                    v += 1;
                }
            }
        }
        let mut view = self.index(&basic)?;
        if idx.is_empty() {
            return Err(refuse(op, "expected at least one index array"));
        }
        for a in &idx {
            if a.device() != self.device() {
                return Err(refuse(
                    op,
                    format!(
                        "an index array is on {} but the indexed array on {}: move it first",
                        a.device(),
                        self.device()
                    ),
                ));
            }
        }
        let adjacent = dims.windows(2).all(|w| w[1] == w[0] + 1);
        let d0 = if adjacent {
            dims[0]
        } else {
            // The indexed dimensions first, in order, then the others: PyTorch's layout of
            // the result for index arrays that are not adjacent.
            let mut order: Vec<isize> = dims.iter().map(|&d| d as isize).collect();
            order.extend((0..view.ndim()).filter(|d| !dims.contains(d)).map(|d| d as isize));
            view = view.permute(&order)?;
            0
        };
        Ok(Plan { view, idx, d0 })
    }

    /// `self[indices]` with index arrays (module docs): a new array (PyTorch's
    /// advanced indexing; NumPy's, except that integers index first, as PyTorch does).
    pub fn index_with(&self, indices: &[Indexer]) -> Result<Array> {
        if indices.iter().all(|i| matches!(i, Indexer::Basic(_))) {
            let basic: Vec<TensorIndex> =
                indices.iter().map(|i| if let Indexer::Basic(b) = i { *b } else { unreachable!() }).collect();
            return self.index(&basic);
        }
        let p = self.advanced_plan("index", indices)?;
        let mut inputs: Vec<&Array> = Vec::with_capacity(p.idx.len() + 1);
        inputs.push(&p.view);
        inputs.extend(p.idx.iter());
        p.view.call(self.cx.ops().index, &inputs, params("index", &[p.d0 as i64], &[])?)
    }

    /// `self[indices] = value` with index arrays (module docs), in this array's storage:
    /// `value` (an array, converted to this array's dtype and broadcast to the indexed
    /// shape, or a number) is written at the indices, or added there with `accumulate`
    /// (PyTorch's `index_put_(indices, values, accumulate)`). Where indices repeat, the
    /// last value in row-major order wins, or (with `accumulate`) the values add up in that
    /// order. A `bool` mask alone with a number is `masked_fill_` on the view: no read.
    pub fn index_put_with_<'a>(
        &self,
        indices: &[Indexer],
        value: impl Into<Rhs<'a>>,
        accumulate: bool,
    ) -> Result<()> {
        self.index_put_impl(indices, value.into(), accumulate, false)
    }

    /// [`index_put_with_`](Self::index_put_with_); with `strict`, a negative index is out
    /// of range (PyTorch's `index_copy`).
    pub(super) fn index_put_impl(
        &self,
        indices: &[Indexer],
        value: Rhs<'_>,
        accumulate: bool,
        strict: bool,
    ) -> Result<()> {
        if indices.iter().all(|i| matches!(i, Indexer::Basic(_))) && !accumulate {
            let basic: Vec<TensorIndex> =
                indices.iter().map(|i| if let Indexer::Basic(b) = i { *b } else { unreachable!() }).collect();
            return self.index_put_(&basic, value);
        }
        if let (Rhs::Scalar(s), false, false) = (value, accumulate, strict) {
            if let Some(done) = self.mask_fill(indices, s)? {
                return Ok(done);
            }
        }
        let p = self.advanced_plan("index_put_", indices)?;
        let mut b: SmallVec<[usize; 4]> = SmallVec::new();
        for a in &p.idx {
            b = broadcast_shapes("index_put_", &b, a.shape())?;
        }
        let k = p.idx.len();
        let vs = p.view.shape();
        let mut shape: Vec<usize> = vs[..p.d0].to_vec();
        shape.extend_from_slice(&b);
        shape.extend_from_slice(&vs[p.d0 + k..]);
        let values = match value {
            Rhs::Array(a) => a.to_dtype(self.dtype())?,
            Rhs::Scalar(s) => self.cx.full(&[], s, self.dtype(), self.device())?,
        };
        let values = values.broadcast_to(&shape).map_err(|e| match e {
            crate::vm::Error::InvalidOperands { detail, .. } => refuse("index_put_", detail),
            e => e,
        })?;
        let mut inputs: Vec<&Array> = Vec::with_capacity(k + 2);
        inputs.push(&p.view);
        inputs.push(&values);
        inputs.extend(p.idx.iter());
        let attrs = params("index_put", &[p.d0 as i64, i64::from(accumulate), i64::from(strict)], &[])?;
        p.view.call_into(self.cx.ops().index_put, &inputs, &p.view, attrs)
    }

    /// `self[basic..., mask] = s` as `masked_fill_` of the view, where the key is basic
    /// indices and one `bool` mask of at least one dimension; `None` for other keys.
    fn mask_fill(&self, indices: &[Indexer], s: Scalar) -> Result<Option<()>> {
        let masks: Vec<usize> =
            (0..indices.len()).filter(|&i| matches!(&indices[i], Indexer::Array(_))).collect();
        let [at] = masks[..] else { return Ok(None) };
        let Indexer::Array(m) = &indices[at] else { return Ok(None) };
        if m.dtype() != DType::Bool || m.ndim() == 0 {
            return Ok(None);
        }
        let basic: Vec<TensorIndex> = indices
            .iter()
            .map(|i| match i {
                Indexer::Basic(b) => *b,
                Indexer::Array(_) => TensorIndex::full(),
            })
            .collect();
        // The mask's first dimension in the view: the view dimensions the indices before
        // it make.
        let consuming: usize =
            basic.iter().filter(|b| matches!(b, TensorIndex::At(_) | TensorIndex::Slice { .. })).count()
                + m.ndim()
                - 1;
        if consuming > self.ndim() {
            return Ok(None);
        }
        let mut v = 0usize;
        for b in &basic[..at] {
            match b {
                TensorIndex::At(_) => {}
                TensorIndex::Ellipsis => v += self.ndim() - consuming,
                _ => v += 1,
            }
        }
        // The mask stands for `m.ndim()` dimensions: index those with full slices.
        let mut full = basic.clone();
        full.splice(at..=at, std::iter::repeat_n(TensorIndex::full(), m.ndim()));
        let mut view = self.index(&full)?;
        let covered = &view.shape()[v..v + m.ndim()];
        if m.shape() != covered {
            return Err(refuse(
                "index_put_",
                format!(
                    "the shape of the mask {:?} does not match the shape of the indexed dimensions {covered:?} (from dimension {v})",
                    m.shape()
                ),
            ));
        }
        // The mask with size-1 dimensions after it, so that it broadcasts over the rest.
        let mut mshape: Vec<isize> = m.shape().iter().map(|&d| d as isize).collect();
        mshape.extend(std::iter::repeat_n(1, view.ndim() - v - m.ndim()));
        let mask = m.reshape(&mshape)?;
        view.masked_fill_(&mask, s)?;
        Ok(Some(()))
    }
}
