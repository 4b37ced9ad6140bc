//! Host-side gathers and scatters: the elements of a host tensor of any layout to or from a
//! contiguous buffer (the pinned staging buffer of a copy between host and device).
//!
//! A layout is walked in row-major order of its index as runs along its innermost
//! dimension (after merging the dimensions that are contiguous together,
//! [`Layout::plan`]); a run of stride 1 is one `memcpy`.

use super::layout::Layout;
use crate::vm::TensorMeta;

/// Call `run(first, offset, len, step)` for each run of `m`'s elements in row-major order:
/// `first` is the run's first element number, `offset` the storage element (from the
/// storage's start) of that element, and the run has `len` elements `step` apart.
fn walk(m: &TensorMeta, mut run: impl FnMut(usize, isize, usize, isize)) {
    let n = m.numel();
    if n == 0 {
        return;
    }
    let (sizes, strides): (Vec<usize>, Vec<isize>) = match Layout::plan(&m.shape, &[&m.strides]) {
        Ok(l) => (0..l.ndim as usize).map(|d| (l.size[d] as usize, l.stride[0][d] as isize)).unzip(),
        // More dimensions than a kernel takes: walk them as they are.
        Err(_) => (m.shape.to_vec(), m.strides.to_vec()),
    };
    let (len, step) = match (sizes.last(), strides.last()) {
        (Some(&len), Some(&step)) => (len, step),
        _ => (1, 1),
    };
    let outer = &sizes[..sizes.len().saturating_sub(1)];
    let mut index = vec![0usize; outer.len()];
    let mut first = 0;
    while first < n {
        let offset =
            m.offset as isize + index.iter().zip(&strides).map(|(&i, &s)| i as isize * s).sum::<isize>();
        run(first, offset, len, step);
        first += len;
        for d in (0..outer.len()).rev() {
            index[d] += 1;
            if index[d] < outer[d] {
                break;
            }
            index[d] = 0;
        }
    }
}

/// Copy the elements `m` names in the storage at `base` into `out`, contiguous, in
/// row-major order of their index.
///
/// # Safety
/// `m`'s layout lies inside the storage at `base` (`TensorMeta::check_layout`), which is
/// readable; `out` is writable for `m.bytes()` bytes and overlaps none of those elements.
pub unsafe fn gather(m: &TensorMeta, base: *const u8, out: *mut u8) {
    let size = m.dtype.size();
    walk(m, |first, offset, len, step| {
        // SAFETY: the caller's contract: elements `offset + j·step` (`j < len`) are in the
        // storage, and `first + len <= numel` elements fit in `out`.
        unsafe {
            let to = out.add(first * size);
            if step == 1 {
                std::ptr::copy_nonoverlapping(base.offset(offset * size as isize), to, len * size);
            } else {
                for j in 0..len {
                    let from = base.offset((offset + j as isize * step) * size as isize);
                    std::ptr::copy_nonoverlapping(from, to.add(j * size), size);
                }
            }
        }
    });
}

/// Copy `m.numel()` contiguous elements from `from` into the elements `m` names in the
/// storage at `base`, in row-major order of their index.
///
/// # Safety
/// `m`'s layout lies inside the storage at `base`, which the caller may write (its
/// instruction holds the write access, and no reference to those bytes is alive); `from` is
/// readable for `m.bytes()` bytes and overlaps none of those elements.
pub unsafe fn scatter(m: &TensorMeta, from: *const u8, base: *mut u8) {
    let size = m.dtype.size();
    walk(m, |first, offset, len, step| {
        // SAFETY: as in `gather`, with the roles of the two sides exchanged.
        unsafe {
            let src = from.add(first * size);
            if step == 1 {
                std::ptr::copy_nonoverlapping(src, base.offset(offset * size as isize), len * size);
            } else {
                for j in 0..len {
                    let to = base.offset((offset + j as isize * step) * size as isize);
                    std::ptr::copy_nonoverlapping(src.add(j * size), to, size);
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ep::DeviceId;
    use crate::vm::DType;

    fn view(shape: &[usize], strides: &[isize], offset: usize) -> TensorMeta {
        TensorMeta::new(shape, DType::I32, DeviceId::CPU).with_layout(shape, strides, offset)
    }

    fn gathered(m: &TensorMeta, storage: &[i32]) -> Vec<i32> {
        m.check_layout(storage.len()).unwrap();
        let mut out = vec![0i32; m.numel()];
        // SAFETY: the layout was checked against `storage`; `out` holds numel elements.
        unsafe { gather(m, storage.as_ptr().cast(), out.as_mut_ptr().cast()) };
        out
    }

    #[test]
    fn gathers_follow_the_layout() {
        let storage: Vec<i32> = (0..24).collect();
        // Transposed [3, 4] -> [4, 3], from offset 1.
        assert_eq!(gathered(&view(&[4, 3], &[1, 4], 1), &storage), [1, 5, 9, 2, 6, 10, 3, 7, 11, 4, 8, 12]);
        // Every other element, reversed.
        assert_eq!(gathered(&view(&[4], &[-2], 9), &storage), [9, 7, 5, 3]);
        // Broadcast rows.
        assert_eq!(gathered(&view(&[2, 3], &[0, 1], 4), &storage), [4, 5, 6, 4, 5, 6]);
        // Contiguous, 0-d and empty.
        assert_eq!(gathered(&view(&[2, 2], &[2, 1], 20), &storage), [20, 21, 22, 23]);
        assert_eq!(gathered(&view(&[], &[], 7), &storage), [7]);
        assert!(gathered(&view(&[0, 3], &[3, 1], 0), &storage).is_empty());
        // Nine dimensions that do not merge (neighbours swapped pairwise): walked as they are.
        let shape = [2usize; 9];
        let strides: Vec<isize> = (0..9)
            .map(|d| match d {
                8 => 1,
                d if d % 2 == 0 => 1 << (7 - d),
                d => 1 << (9 - d),
            })
            .collect();
        assert!(Layout::plan(&shape, &[&strides]).is_err());
        let big: Vec<i32> = (0..512).collect();
        let m = view(&shape, &strides, 0);
        let want: Vec<i32> = (0..512u32)
            .map(|i| (0..9).map(|d| ((i >> (8 - d)) & 1) as i32 * strides[d] as i32).sum())
            .collect();
        assert_eq!(gathered(&m, &big), want);
    }

    #[test]
    fn scatters_invert_gathers() {
        let m = view(&[3, 2], &[1, 3], 2);
        let mut storage = vec![-1i32; 8];
        let values = [10, 11, 12, 13, 14, 15];
        // SAFETY: the layout reaches element 2 + 2 + 3 = 7 of 8; `values` holds 6 elements.
        unsafe { scatter(&m, values.as_ptr().cast(), storage.as_mut_ptr().cast()) };
        assert_eq!(storage, [-1, -1, 10, 12, 14, 11, 13, 15]);
        assert_eq!(gathered(&m, &storage), values);
    }
}
