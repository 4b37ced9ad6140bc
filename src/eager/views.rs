//! Views and reshaping: [`Array`] methods that share the array's storage (no copy, no
//! kernel), with PyTorch's names and rules; and the few that copy where a view cannot be
//! had (`reshape`, `flatten`, `contiguous`, `copy`).

use smallvec::SmallVec;

use super::layout::{self, Layout};
use super::Array;
use crate::framework::Attrs;
use crate::vm::{Error, Result};

impl Array {
    /// A view of the same elements in `shape` (one size may be `-1`); refused with
    /// [`Error::InvalidOperands`] when the strides do not allow one, as PyTorch refuses it
    /// (use [`reshape`](Self::reshape)).
    pub fn view(&self, shape: &[isize]) -> Result<Array> {
        self.view_of(layout::view(&self.layout(), shape)?)
    }

    /// The elements in `shape` (one size may be `-1`): a view where the strides allow one,
    /// else a contiguous copy.
    pub fn reshape(&self, shape: &[isize]) -> Result<Array> {
        match layout::view(&self.layout(), shape) {
            Ok(l) => self.view_of(l),
            Err(_) => self.contiguous()?.view(shape),
        }
    }

    /// Dimensions `d0` and `d1` swapped (a view).
    pub fn transpose(&self, d0: isize, d1: isize) -> Result<Array> {
        self.view_of(layout::transpose(&self.layout(), d0, d1)?)
    }

    /// Dimension `i` of the result is dimension `dims[i]` of this array (a view).
    pub fn permute(&self, dims: &[isize]) -> Result<Array> {
        self.view_of(layout::permute(&self.layout(), dims)?)
    }

    /// The transpose of a matrix (a view); a 0-d or 1-d array is itself; more than two
    /// dimensions are refused, as PyTorch's `t()` refuses them.
    pub fn t(&self) -> Result<Array> {
        match self.ndim() {
            0 | 1 => Ok(self.clone()),
            2 => self.transpose(0, 1),
            n => Err(Error::InvalidOperands {
                op: "t".into(),
                detail: format!("expects a tensor of at most 2 dimensions, got {n}; use transpose() or mt()"),
            }),
        }
    }

    /// The last two dimensions swapped (PyTorch's `mT`; a view).
    pub fn mt(&self) -> Result<Array> {
        if self.ndim() < 2 {
            return Err(Error::InvalidOperands {
                op: "mT".into(),
                detail: format!("needs at least 2 dimensions, got {}", self.ndim()),
            });
        }
        self.transpose(-2, -1)
    }

    /// Every dimension in reverse order (PyTorch's `T`; a view).
    pub fn reversed_dims(&self) -> Result<Array> {
        let dims: SmallVec<[isize; 8]> = (0..self.ndim() as isize).rev().collect();
        self.permute(&dims)
    }

    /// Size-1 dimensions repeated to `sizes` and new leading dimensions added, without a
    /// copy (stride 0); `-1` keeps a size.
    pub fn expand(&self, sizes: &[isize]) -> Result<Array> {
        self.view_of(layout::expand(&self.layout(), sizes)?)
    }

    /// This array expanded to `shape` (`expand` with every size given).
    pub fn broadcast_to(&self, shape: &[usize]) -> Result<Array> {
        let sizes: SmallVec<[isize; 8]> = shape.iter().map(|&d| d as isize).collect();
        self.expand(&sizes)
    }

    /// This array expanded to `other`'s shape.
    pub fn expand_as(&self, other: &Array) -> Result<Array> {
        self.broadcast_to(other.shape())
    }

    /// Every dimension of size 1 removed (a view).
    pub fn squeeze(&self) -> Result<Array> {
        self.view_of(layout::squeeze(&self.layout(), None)?)
    }

    /// Dimensions `dims` removed where their size is 1 (a view; others are kept).
    pub fn squeeze_dims(&self, dims: &[isize]) -> Result<Array> {
        self.view_of(layout::squeeze(&self.layout(), Some(dims))?)
    }

    /// A dimension of size 1 inserted at `d` (a view).
    pub fn unsqueeze(&self, d: isize) -> Result<Array> {
        self.view_of(layout::unsqueeze(&self.layout(), d)?)
    }

    /// Dimensions `start..=end` merged into one (a view where the strides allow it, else a
    /// copy, as `reshape`); a 0-d array becomes one of one element.
    pub fn flatten(&self, start: isize, end: isize) -> Result<Array> {
        let n = self.ndim();
        if n == 0 {
            return self.reshape(&[1]);
        }
        let (s, e) = (layout::dim("flatten", start, n)?, layout::dim("flatten", end, n)?);
        if s > e {
            return Err(Error::InvalidOperands {
                op: "flatten".into(),
                detail: format!("start_dim {start} comes after end_dim {end}"),
            });
        }
        let shape = self.shape();
        let mut new: SmallVec<[isize; 8]> = shape[..s].iter().map(|&d| d as isize).collect();
        new.push(shape[s..=e].iter().product::<usize>() as isize);
        new.extend(shape[e + 1..].iter().map(|&d| d as isize));
        self.reshape(&new)
    }

    /// Dimension `d` split into `sizes` (one may be `-1`; a view).
    pub fn unflatten(&self, d: isize, sizes: &[isize]) -> Result<Array> {
        let n = self.ndim();
        if n == 0 {
            return Err(Error::InvalidOperands {
                op: "unflatten".into(),
                detail: "a 0-d tensor has no dimension".into(),
            });
        }
        let d = layout::dim("unflatten", d, n)?;
        let inner = layout::infer_size("unflatten", sizes, self.shape()[d])?;
        let mut new: SmallVec<[isize; 8]> = self.shape()[..d].iter().map(|&x| x as isize).collect();
        new.extend(inner.iter().map(|&x| x as isize));
        new.extend(self.shape()[d + 1..].iter().map(|&x| x as isize));
        self.view(&new)
    }

    /// Elements `start..start + length` of dimension `d` (a view; a negative start counts
    /// from the end).
    pub fn narrow(&self, d: isize, start: isize, length: usize) -> Result<Array> {
        self.view_of(layout::narrow(&self.layout(), d, start, length)?)
    }

    /// Element `index` of dimension `d`, the dimension removed (a view; negative from the
    /// end).
    pub fn select(&self, d: isize, index: isize) -> Result<Array> {
        self.view_of(layout::select(&self.layout(), d, index)?)
    }

    /// Dimension `d` sliced as Python slices a list (`start`/`end` clamped, negative from
    /// the end; `step` at least 1; a view).
    pub fn slice(&self, d: isize, start: Option<isize>, end: Option<isize>, step: isize) -> Result<Array> {
        self.view_of(layout::slice(&self.layout(), d, start, end, step)?)
    }

    /// Dimension `d` cut into views of `split_size` elements (the last shorter).
    pub fn split(&self, split_size: usize, d: isize) -> Result<Vec<Array>> {
        let n = self.ndim();
        let di = layout::dim("split", d, n)?;
        if n == 0 {
            return Err(Error::InvalidOperands {
                op: "split".into(),
                detail: "a 0-d tensor has no dimension".into(),
            });
        }
        self.split_with_sizes(&layout::split_lengths(self.shape()[di], split_size)?, d)
    }

    /// Dimension `d` cut into views of the given `sizes`, which must add up to its size.
    pub fn split_with_sizes(&self, sizes: &[usize], d: isize) -> Result<Vec<Array>> {
        let n = self.ndim();
        if n == 0 {
            return Err(Error::InvalidOperands {
                op: "split".into(),
                detail: "a 0-d tensor has no dimension".into(),
            });
        }
        let di = layout::dim("split", d, n)?;
        let total: usize = sizes.iter().sum();
        if total != self.shape()[di] {
            return Err(Error::InvalidOperands {
                op: "split".into(),
                detail: format!(
                    "sizes {sizes:?} add up to {total}, but dimension {d} has size {} (shape {:?})",
                    self.shape()[di],
                    self.shape()
                ),
            });
        }
        let mut start = 0;
        let mut out = Vec::with_capacity(sizes.len());
        for &len in sizes {
            out.push(self.narrow(d, start as isize, len)?);
            start += len;
        }
        Ok(out)
    }

    /// Dimension `d` cut into at most `chunks` views of equal size (the last shorter).
    pub fn chunk(&self, chunks: usize, d: isize) -> Result<Vec<Array>> {
        let n = self.ndim();
        if n == 0 {
            return Err(Error::InvalidOperands {
                op: "chunk".into(),
                detail: "a 0-d tensor has no dimension".into(),
            });
        }
        let di = layout::dim("chunk", d, n)?;
        self.split_with_sizes(&layout::chunk_lengths(self.shape()[di], chunks)?, d)
    }

    /// Every element of dimension `d` as a view, the dimension removed.
    pub fn unbind(&self, d: isize) -> Result<Vec<Array>> {
        let n = self.ndim();
        if n == 0 {
            return Err(Error::InvalidOperands {
                op: "unbind".into(),
                detail: "a 0-d tensor has no dimension".into(),
            });
        }
        let di = layout::dim("unbind", d, n)?;
        (0..self.shape()[di] as isize).map(|i| self.select(d, i)).collect()
    }

    /// The diagonal of dimensions `d1` and `d2` shifted by `offset` (above the main one for
    /// a positive offset), as a last dimension (a view).
    pub fn diagonal(&self, offset: isize, d1: isize, d2: isize) -> Result<Array> {
        self.view_of(layout::diagonal(&self.layout(), offset, d1, d2)?)
    }

    /// A view of this array's storage: the elements `shape` and `strides` name from
    /// element `offset` of the storage (PyTorch's `as_strided`).
    pub fn as_strided(&self, shape: &[usize], strides: &[isize], offset: usize) -> Result<Array> {
        self.view_of(Layout { shape: shape.into(), strides: strides.into(), offset })
    }

    /// This array if it is contiguous, else a contiguous copy.
    pub fn contiguous(&self) -> Result<Array> {
        if self.is_contiguous() {
            return Ok(self.clone());
        }
        self.copy()
    }

    /// A new array with this array's values, contiguous (PyTorch's `clone()`; `Clone` on an
    /// `Array` copies the handle). Nothing is shared with this array afterwards.
    pub fn copy(&self) -> Result<Array> {
        self.call(self.cx.ops().copy, &[self], Attrs::default())
    }
}
