//! Basic indexing, as Python's `x[1:, ::2]`, `x[..., 0]` and `x[None]` index a PyTorch
//! tensor: integers select, slices slice, `None` adds a dimension of size 1 and `...`
//! stands for as many full slices as the other indices leave; the result is a view.
//! Assigning to an index (`x[1:3] = y`) writes through that view
//! ([`Array::index_put_`]).

use super::math::Rhs;
use super::Array;
use crate::vm::{Error, Result};

/// One index of [`Array::index`]: what Python writes between the brackets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorIndex {
    /// `i`: element `i` of the dimension (negative from the end); the dimension goes.
    At(isize),
    /// `start:end:step`: a slice of the dimension (ends clamped, negative from the end;
    /// `step` at least 1).
    Slice {
        /// First element (default 0).
        start: Option<isize>,
        /// One past the last (default: the end).
        end: Option<isize>,
        /// Step (default 1).
        step: isize,
    },
    /// `None`: a new dimension of size 1 here.
    NewAxis,
    /// `...`: full slices of as many dimensions as the other indices leave.
    Ellipsis,
}

impl TensorIndex {
    /// `i`.
    pub fn at(i: isize) -> TensorIndex {
        TensorIndex::At(i)
    }
    /// `:`: the whole dimension.
    pub fn full() -> TensorIndex {
        TensorIndex::Slice { start: None, end: None, step: 1 }
    }
    /// `start:end` (`None` for an open end).
    pub fn range(start: Option<isize>, end: Option<isize>) -> TensorIndex {
        TensorIndex::Slice { start, end, step: 1 }
    }
    /// `start:end:step`.
    pub fn slice(start: Option<isize>, end: Option<isize>, step: isize) -> TensorIndex {
        TensorIndex::Slice { start, end, step }
    }
}

impl Array {
    /// The view `self[indices]` (module docs). Refused with [`Error::InvalidOperands`] (op
    /// `index`) for more indices than dimensions, two ellipses, an index out of range or a
    /// step below 1.
    pub fn index(&self, indices: &[TensorIndex]) -> Result<Array> {
        let bad = |detail: String| Error::InvalidOperands { op: "index".into(), detail };
        let ellipses = indices.iter().filter(|i| **i == TensorIndex::Ellipsis).count();
        if ellipses > 1 {
            return Err(bad("an index can only have a single ellipsis ('...')".into()));
        }
        let consuming =
            indices.iter().filter(|i| matches!(i, TensorIndex::At(_) | TensorIndex::Slice { .. })).count();
        if consuming > self.ndim() {
            return Err(bad(format!(
                "too many indices for a tensor of {} dimensions: {consuming} given",
                self.ndim()
            )));
        }
        let mut out = self.clone();
        // The dimension of `out` the next index applies to.
        let mut d: isize = 0;
        for index in indices {
            match *index {
                TensorIndex::At(i) => out = out.select(d, i)?,
                TensorIndex::Slice { start, end, step } => {
                    out = out.slice(d, start, end, step)?;
                    d += 1;
                }
                TensorIndex::NewAxis => {
                    out = out.unsqueeze(d)?;
                    d += 1;
                }
                TensorIndex::Ellipsis => d += (self.ndim() - consuming) as isize,
            }
        }
        Ok(out)
    }

    /// `self[indices] = value`: the view [`index`](Self::index) gives, overwritten with
    /// `value` (an array broadcast to the view's shape and cast to its dtype, or a scalar),
    /// in this array's storage.
    pub fn index_put_<'a>(&self, indices: &[TensorIndex], value: impl Into<Rhs<'a>>) -> Result<()> {
        let mut view = self.index(indices)?;
        match value.into() {
            Rhs::Array(a) => view.copy_(a).map(|_| ()),
            Rhs::Scalar(s) => view.fill_(s).map(|_| ()),
        }
    }
}
