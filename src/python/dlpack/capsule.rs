//! The capsule an export hands to the consumer: a DLPack managed tensor over the exported
//! memory, which owns what keeps that memory alive ([`Held`]), and its deleters.

use std::ffi::{c_void, CStr};
use std::ptr;

use pyo3::exceptions::PyTypeError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;

use super::ffi::{
    DlDataType, DlDevice, DlManagedTensor, DlManagedTensorVersioned, DlPackVersion, DlTensor, DLPACK_MAJOR,
    DLPACK_MINOR, DL_BFLOAT, DL_BOOL, DL_FLOAT, DL_INT, DL_UINT, FLAG_IS_COPIED, LEGACY, VERSIONED,
};
use crate::alloc::DeviceLoan;
use crate::framework::{DType, HostLoan, Tensor};

/// What an exported tensor's memory belongs to.
pub(super) enum Held {
    /// The VM's storage, lent.
    Loan(#[allow(dead_code)] HostLoan),
    /// The VM's device storage, lent (an array on `cuda:N`).
    Device(#[allow(dead_code)] DeviceLoan),
    /// A copy (`copy=True`): the bytes, in words so that every dtype is aligned.
    Copy(#[allow(dead_code)] Vec<u64>),
}

/// One export: the managed struct handed to the consumer first (so that a pointer to it is
/// a pointer to this), then what it points into.
#[repr(C)]
struct Exported<M> {
    managed: M,
    shape: Vec<i64>,
    strides: Vec<i64>,
    held: Held,
}

unsafe extern "C" fn delete_legacy(m: *mut DlManagedTensor) {
    if !m.is_null() {
        // SAFETY: every `DlManagedTensor` with this deleter is the first field of an
        // `Exported` leaked by `export`, and the consumer calls the deleter once.
        drop(unsafe { Box::from_raw(m.cast::<Exported<DlManagedTensor>>()) });
    }
}

unsafe extern "C" fn delete_versioned(m: *mut DlManagedTensorVersioned) {
    if !m.is_null() {
        // SAFETY: as in `delete_legacy`.
        drop(unsafe { Box::from_raw(m.cast::<Exported<DlManagedTensorVersioned>>()) });
    }
}

/// The destructor of a capsule made by `export`: if no consumer took it (it still has its
/// first name), the managed tensor is deleted with it.
unsafe extern "C" fn drop_legacy_capsule(capsule: *mut ffi::PyObject) {
    // SAFETY: Python calls this with the capsule, holding the GIL; `IsValid` sets no error.
    if unsafe { ffi::PyCapsule_IsValid(capsule, LEGACY.as_ptr()) } == 1 {
        // SAFETY: valid under this name, so its pointer is the managed tensor `export` made.
        let m = unsafe { ffi::PyCapsule_GetPointer(capsule, LEGACY.as_ptr()) }.cast::<DlManagedTensor>();
        // SAFETY: not consumed, so not deleted yet.
        unsafe { delete_legacy(m) };
    }
}

unsafe extern "C" fn drop_versioned_capsule(capsule: *mut ffi::PyObject) {
    // SAFETY: as in `drop_legacy_capsule`.
    if unsafe { ffi::PyCapsule_IsValid(capsule, VERSIONED.as_ptr()) } == 1 {
        // SAFETY: as in `drop_legacy_capsule`.
        let m = unsafe { ffi::PyCapsule_GetPointer(capsule, VERSIONED.as_ptr()) }
            .cast::<DlManagedTensorVersioned>();
        // SAFETY: as in `drop_legacy_capsule`.
        unsafe { delete_versioned(m) };
    }
}

/// The DLPack dtype of `d`.
pub(super) fn dl_dtype(d: DType) -> DlDataType {
    let (code, bits) = match d {
        DType::Bool => (DL_BOOL, 8),
        DType::U8 => (DL_UINT, 8),
        DType::I32 => (DL_INT, 32),
        DType::I64 => (DL_INT, 64),
        DType::F16 => (DL_FLOAT, 16),
        DType::BF16 => (DL_BFLOAT, 16),
        DType::F32 => (DL_FLOAT, 32),
        DType::F64 => (DL_FLOAT, 64),
    };
    DlDataType { code, bits, lanes: 1 }
}

/// The dtype of DLPack's `t`, if eagervm has it ([`dl_dtype`]'s inverse).
pub(super) fn from_dl(t: DlDataType) -> Option<DType> {
    DType::ALL.into_iter().find(|&d| {
        let e = dl_dtype(d);
        (e.code, e.bits, e.lanes) == (t.code, t.bits, t.lanes)
    })
}

/// `bytes` in a buffer aligned for every dtype (a copy's [`Held`]).
pub(super) fn aligned(bytes: &[u8]) -> Vec<u64> {
    let mut words = vec![0u64; bytes.len().div_ceil(8)];
    for (w, c) in words.iter_mut().zip(bytes.chunks(8)) {
        let mut b = [0u8; 8];
        b[..c.len()].copy_from_slice(c);
        *w = u64::from_ne_bytes(b);
    }
    words
}

/// Whether `max_version` asks for a versioned capsule: `(major, minor)` with `major >= 1`.
pub(super) fn wants_versioned(max_version: Option<&Bound<'_, PyAny>>) -> PyResult<bool> {
    match max_version {
        None => Ok(false),
        Some(v) if v.is_none() => Ok(false),
        Some(v) => {
            let (major, _minor): (u32, u32) = v.extract().map_err(|_| {
                PyTypeError::new_err(format!("max_version must be a (major, minor) tuple, not {v}"))
            })?;
            Ok(major >= 1)
        }
    }
}

/// Leak an `Exported` of `t`'s metadata over `data` and wrap it in a capsule: the
/// elements in row-major order, or at `strides` (in elements) where given.
#[allow(clippy::too_many_arguments)]
pub(super) fn make_capsule<'py>(
    py: Python<'py>,
    t: &Tensor,
    data: *mut c_void,
    device: DlDevice,
    held: Held,
    versioned: bool,
    copied: bool,
    strides: Option<Vec<i64>>,
) -> PyResult<Bound<'py, PyCapsule>> {
    let shape: Vec<i64> = t.shape().iter().map(|&d| d as i64).collect();
    let strides = strides.unwrap_or_else(|| {
        let mut s = vec![1i64; shape.len()];
        for d in (0..shape.len().saturating_sub(1)).rev() {
            s[d] = s[d + 1] * shape[d + 1].max(1);
        }
        s
    });
    let dl = |shape: *mut i64, strides: *mut i64| DlTensor {
        data,
        device,
        ndim: t.shape().len() as i32,
        dtype: dl_dtype(t.dtype()),
        shape,
        strides,
        byte_offset: 0,
    };
    // The shape and strides live in the `Exported`'s vectors, whose buffers stay put when
    // the struct moves into its box.
    let (ptr, name, destructor): (*mut c_void, &CStr, Option<ffi::PyCapsule_Destructor>) = if versioned {
        let mut e = Box::new(Exported {
            managed: DlManagedTensorVersioned {
                version: DlPackVersion { major: DLPACK_MAJOR, minor: DLPACK_MINOR },
                manager_ctx: ptr::null_mut(),
                deleter: Some(delete_versioned),
                flags: if copied { FLAG_IS_COPIED } else { 0 },
                dl_tensor: dl(ptr::null_mut(), ptr::null_mut()),
            },
            shape,
            strides,
            held,
        });
        e.managed.dl_tensor.shape = e.shape.as_mut_ptr();
        e.managed.dl_tensor.strides = e.strides.as_mut_ptr();
        let p = Box::into_raw(e);
        // SAFETY: `p` is the live box just leaked.
        unsafe { (*p).managed.manager_ctx = p.cast() };
        (p.cast(), VERSIONED, Some(drop_versioned_capsule))
    } else {
        let mut e = Box::new(Exported {
            managed: DlManagedTensor {
                dl_tensor: dl(ptr::null_mut(), ptr::null_mut()),
                manager_ctx: ptr::null_mut(),
                deleter: Some(delete_legacy),
            },
            shape,
            strides,
            held,
        });
        e.managed.dl_tensor.shape = e.shape.as_mut_ptr();
        e.managed.dl_tensor.strides = e.strides.as_mut_ptr();
        let p = Box::into_raw(e);
        // SAFETY: `p` is the live box just leaked.
        unsafe { (*p).managed.manager_ctx = p.cast() };
        (p.cast(), LEGACY, Some(drop_legacy_capsule))
    };
    // SAFETY: `ptr` is non-null, `name` is static, and the destructor matches the name.
    let capsule = unsafe { ffi::PyCapsule_New(ptr, name.as_ptr(), destructor) };
    if capsule.is_null() {
        // Not wrapped: free it here.
        // SAFETY: `ptr` is the box leaked above, handed to no one.
        unsafe {
            if versioned {
                delete_versioned(ptr.cast())
            } else {
                delete_legacy(ptr.cast())
            }
        }
    }
    // SAFETY: a new reference or null with the error set.
    let any = unsafe { Bound::from_owned_ptr_or_err(py, capsule) }?;
    Ok(any.downcast_into::<PyCapsule>()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dtype_has_its_dlpack_code_and_back() {
        // dlpack.h: kDLInt 0, kDLUInt 1, kDLFloat 2, kDLBfloat 4, kDLBool 6.
        let codes: Vec<(u8, u8)> = DType::ALL.iter().map(|&d| (dl_dtype(d).code, dl_dtype(d).bits)).collect();
        assert_eq!(codes, [(6, 8), (1, 8), (0, 32), (0, 64), (2, 16), (4, 16), (2, 32), (2, 64)]);
        for d in DType::ALL {
            assert_eq!(from_dl(dl_dtype(d)), Some(d));
        }
        assert_eq!(from_dl(DlDataType { code: 0, bits: 16, lanes: 1 }), None);
        assert_eq!(from_dl(DlDataType { code: 2, bits: 32, lanes: 4 }), None);
    }

    #[test]
    fn a_copy_keeps_its_bytes_in_aligned_words() {
        let bytes: Vec<u8> = (1..=11).collect();
        let words = aligned(&bytes);
        assert_eq!(words.len(), 2);
        // SAFETY: two words are 16 initialised bytes.
        let back = unsafe { std::slice::from_raw_parts(words.as_ptr().cast::<u8>(), 16) };
        assert_eq!(&back[..11], &bytes[..]);
        assert_eq!(&back[11..], &[0; 5]);
    }
}
