//! Padding and rearranging, with PyTorch's names: [`Array::pad`] (`F.pad`, constant,
//! reflect, replicate and circular modes), [`Array::flip`], [`Array::roll`],
//! [`Array::repeat`] and [`Array::tile`].
//!
//! Each is a composition of views and existing ops, as PyTorch composes several of them:
//! `flip` is a copy of a view with negated strides; `roll` joins two slices per dimension
//! (`cat`); `repeat` and `tile` copy an expanded view (stride 0) into a new array and reshape
//! it; `pad` in constant mode fills a new array and copies the (cropped, for negative pads)
//! input into a view of it, and in the other modes gathers each padded dimension with
//! `index_select` through indices computed on the host. Every result is a new array.

use smallvec::SmallVec;

use super::layout::dim;
use super::select::{cat, refuse};
use super::Array;
use crate::framework::Scalar;
use crate::vm::Result;

/// How [`Array::pad`] fills the new elements (PyTorch's `mode=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PadMode {
    /// `"constant"`: the value given.
    Constant,
    /// `"reflect"`: the input mirrored at its edges, the edge not repeated (each pad
    /// smaller than the dimension).
    Reflect,
    /// `"replicate"`: the edge element repeated.
    Replicate,
    /// `"circular"`: the input wrapped around (each pad at most the dimension).
    Circular,
}

impl PadMode {
    /// The mode PyTorch names `name`.
    pub fn from_name(name: &str) -> Option<PadMode> {
        match name {
            "constant" => Some(PadMode::Constant),
            "reflect" => Some(PadMode::Reflect),
            "replicate" => Some(PadMode::Replicate),
            "circular" => Some(PadMode::Circular),
            _ => None,
        }
    }
}

impl Array {
    /// This array with its elements reversed along each of `dims` (PyTorch's `flip`): a new
    /// array, copied from a view with those strides negated.
    pub fn flip(&self, dims: &[isize]) -> Result<Array> {
        let n = self.ndim();
        let mut strides: SmallVec<[isize; 8]> = self.strides().into();
        let mut offset = self.storage_offset() as isize;
        let mut seen: SmallVec<[bool; 8]> = SmallVec::from_elem(false, n.max(1));
        for &d in dims {
            let d = dim("flip", d, n)?;
            if seen[d] {
                return Err(refuse("flip", format!("dim {d} appears multiple times in the list of dims")));
            }
            seen[d] = true;
            if n > 0 && self.shape()[d] > 1 {
                offset += (self.shape()[d] as isize - 1) * strides[d];
                strides[d] = -strides[d];
            }
        }
        if self.numel() == 0 {
            return self.copy();
        }
        self.as_strided(self.shape(), &strides, offset as usize)?.copy()
    }

    /// This array with its elements shifted by `shifts[i]` along `dims[i]`, those pushed
    /// past the end coming back at the start (PyTorch's `roll`); with no `dims`, the
    /// flattened array is rolled by the one shift and given this array's shape back.
    pub fn roll(&self, shifts: &[i64], dims: &[isize]) -> Result<Array> {
        if dims.is_empty() {
            let [s] = shifts[..] else {
                return Err(refuse("roll", format!("{} shifts without dims: give one shift", shifts.len())));
            };
            let shape: SmallVec<[isize; 8]> = self.shape().iter().map(|&d| d as isize).collect();
            return self.reshape(&[-1])?.roll(&[s], &[0])?.view(&shape);
        }
        if shifts.len() != dims.len() {
            return Err(refuse(
                "roll",
                format!("shifts and dims must have the same length, got {} and {}", shifts.len(), dims.len()),
            ));
        }
        let mut out = self.clone();
        for (&s, &d) in shifts.iter().zip(dims) {
            let d = dim("roll", d, self.ndim())?;
            let size = self.shape().get(d).copied().unwrap_or(1) as i64;
            if size == 0 {
                continue;
            }
            let s = s.rem_euclid(size);
            if s == 0 {
                continue;
            }
            let tail = out.narrow(d as isize, (size - s) as isize, s as usize)?;
            let head = out.narrow(d as isize, 0, (size - s) as usize)?;
            out = cat(&[&tail, &head], d as isize)?;
        }
        if out.shares_storage(self) {
            out = out.copy()?;
        }
        Ok(out)
    }

    /// This array repeated `sizes[i]` times along each dimension `i` (PyTorch's `repeat`;
    /// NumPy's `tile` with as many sizes): `sizes` has at least as many entries as this
    /// array has dimensions, extra leading ones adding dimensions. A copy of an expanded
    /// view.
    pub fn repeat(&self, sizes: &[usize]) -> Result<Array> {
        let n = sizes.len();
        if n < self.ndim() {
            return Err(refuse(
                "repeat",
                format!(
                    "number of dimensions of repeat dims ({n}) can not be smaller than number of dimensions of \
                     the array ({})",
                    self.ndim()
                ),
            ));
        }
        // [1, .., s0, s1, ..] with a dimension of 1 before each, expanded to [r0, s0, r1, s1, ..].
        let mut lead: SmallVec<[isize; 8]> = SmallVec::from_elem(1, n - self.ndim());
        lead.extend(self.shape().iter().map(|&d| d as isize));
        let mut x = self.reshape(&lead)?;
        let mut expanded: SmallVec<[isize; 16]> = SmallVec::new();
        let mut out: SmallVec<[isize; 8]> = SmallVec::new();
        for (i, (&r, &s)) in sizes.iter().zip(&lead).enumerate() {
            x = x.unsqueeze(2 * i as isize)?;
            expanded.push(r as isize);
            expanded.push(s);
            out.push(r as isize * s);
        }
        x.expand(&expanded)?.copy()?.view(&out)
    }

    /// PyTorch's `tile`: [`repeat`](Self::repeat) with `dims` padded with leading ones to
    /// this array's rank.
    pub fn tile(&self, dims: &[usize]) -> Result<Array> {
        let mut sizes: SmallVec<[usize; 8]> = SmallVec::from_elem(1, self.ndim().saturating_sub(dims.len()));
        sizes.extend_from_slice(dims);
        self.repeat(&sizes)
    }

    /// This array padded (PyTorch's `torch.nn.functional.pad`): `pad` holds pairs
    /// `(before, after)` from the last dimension backwards (`[left, right, top, bottom]` pads
    /// the last two dimensions); a negative pad crops. `mode` says what the new elements
    /// hold ([`PadMode`]); `value` is the constant's (converted to this array's dtype).
    pub fn pad(&self, pad: &[i64], mode: PadMode, value: impl Into<Scalar>) -> Result<Array> {
        if pad.len() % 2 != 0 || pad.len() / 2 > self.ndim() {
            return Err(refuse(
                "pad",
                format!(
                    "padding length must be even and at most twice the number of dimensions ({}), not {}",
                    self.ndim(),
                    pad.len()
                ),
            ));
        }
        let n = self.ndim();
        // (dimension, before, after) for each padded dimension.
        let pads: SmallVec<[(usize, i64, i64); 4]> =
            pad.chunks(2).enumerate().map(|(i, p)| (n - 1 - i, p[0], p[1])).collect();
        let mut shape: SmallVec<[usize; 8]> = self.shape().into();
        for &(d, b, a) in &pads {
            let s = shape[d] as i64 + b + a;
            if s < 0 {
                return Err(refuse(
                    "pad",
                    format!(
                        "the padded size of dimension {d} is negative ({s}): input {:?}, pad {pad:?}",
                        self.shape()
                    ),
                ));
            }
            shape[d] = s as usize;
        }
        if mode == PadMode::Constant {
            let out = self.cx.full(&shape, value.into(), self.dtype(), self.device())?;
            // The part of the input that stays (cropped by negative pads) and where it goes.
            let mut src = self.clone();
            let mut dst = out.clone();
            for &(d, b, a) in &pads {
                let size = self.shape()[d] as i64;
                let keep = (size - (-b).max(0) - (-a).max(0)).max(0);
                src = src.narrow(d as isize, (-b).max(0).min(size) as isize, keep as usize)?;
                dst = dst.narrow(d as isize, b.max(0) as isize, keep as usize)?;
            }
            if dst.numel() > 0 {
                dst.copy_(&src)?;
            }
            return Ok(out);
        }
        let mut out = self.clone();
        for &(d, b, a) in &pads {
            let size = self.shape()[d] as i64;
            let fits = match mode {
                PadMode::Reflect => b < size && a < size,
                PadMode::Circular => b <= size && a <= size,
                _ => size > 0,
            };
            if !fits || size == 0 {
                return Err(refuse(
                    "pad",
                    format!(
                        "{mode:?} padding of {b} and {a} does not fit dimension {d} of size {size} (reflect: each pad \
                         below the size; circular: at most the size; replicate: a size above 0)"
                    ),
                ));
            }
            let picks: Vec<i64> = (-b..size + a)
                .map(|i| match mode {
                    PadMode::Reflect => {
                        let i = i.abs();
                        if i >= size {
                            2 * (size - 1) - i
                        } else {
                            i
                        }
                    }
                    PadMode::Replicate => i.clamp(0, size - 1),
                    _ => i.rem_euclid(size),
                })
                .collect();
            let index = self.cx.from_slice(&picks, &[picks.len()], self.device())?;
            out = out.index_select(d as isize, &index)?;
        }
        if out.shares_storage(self) {
            out = out.copy()?;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eager::Context;
    use crate::ep::mock::MockConfig;
    use crate::ep::DeviceId;
    use crate::prelude::{Config, VirtualMachine};

    #[test]
    fn flip_roll_repeat_tile_pad() {
        let vm = VirtualMachine::new(Config::default().with_mock_devices(1, MockConfig::default())).unwrap();
        let cx = Context::new(&vm);
        for dev in [DeviceId::CPU, DeviceId::mock(0)] {
            let x = cx.from_slice(&[1i32, 2, 3, 4, 5, 6], &[2, 3], dev).unwrap();
            assert_eq!(x.flip(&[-1]).unwrap().to_vec::<i32>().unwrap(), vec![3, 2, 1, 6, 5, 4]);
            assert_eq!(x.flip(&[0, 1]).unwrap().to_vec::<i32>().unwrap(), vec![6, 5, 4, 3, 2, 1]);
            assert_eq!(x.t().unwrap().flip(&[0]).unwrap().to_vec::<i32>().unwrap(), vec![3, 6, 2, 5, 1, 4]);
            assert!(x.flip(&[0, -2]).is_err());
            assert_eq!(x.roll(&[1], &[1]).unwrap().to_vec::<i32>().unwrap(), vec![3, 1, 2, 6, 4, 5]);
            assert_eq!(x.roll(&[-1, 4], &[0, 1]).unwrap().to_vec::<i32>().unwrap(), vec![6, 4, 5, 3, 1, 2]);
            assert_eq!(x.roll(&[2], &[]).unwrap().to_vec::<i32>().unwrap(), vec![5, 6, 1, 2, 3, 4]);
            let r = x.repeat(&[2, 1, 2]).unwrap();
            assert_eq!(r.shape(), &[2, 2, 6]);
            assert_eq!(&r.to_vec::<i32>().unwrap()[..12], &[1, 2, 3, 1, 2, 3, 4, 5, 6, 4, 5, 6]);
            assert_eq!(x.tile(&[2]).unwrap().shape(), &[2, 6]);
            assert!(x.repeat(&[2]).is_err());
            let p = x.pad(&[1, -1, 0, 1], PadMode::Constant, 9).unwrap();
            assert_eq!(p.shape(), &[3, 3]);
            assert_eq!(p.to_vec::<i32>().unwrap(), vec![9, 1, 2, 9, 4, 5, 9, 9, 9]);
            let p = x.pad(&[2, 1], PadMode::Reflect, 0).unwrap();
            assert_eq!(p.to_vec::<i32>().unwrap(), vec![3, 2, 1, 2, 3, 2, 6, 5, 4, 5, 6, 5]);
            let p = x.pad(&[1, 2], PadMode::Replicate, 0).unwrap();
            assert_eq!(p.to_vec::<i32>().unwrap(), vec![1, 1, 2, 3, 3, 3, 4, 4, 5, 6, 6, 6]);
            let p = x.pad(&[0, 0, 1, 0], PadMode::Circular, 0).unwrap();
            assert_eq!(p.to_vec::<i32>().unwrap(), vec![4, 5, 6, 1, 2, 3, 4, 5, 6]);
            assert!(x.pad(&[3, 0], PadMode::Reflect, 0).is_err());
            assert!(x.pad(&[1], PadMode::Constant, 0).is_err());
        }
    }
}
