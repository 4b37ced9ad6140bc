//! `Array.__dlpack__`: the array's own host storage, lent ([`Tensor::lend_host`]) (a view
//! as it lies in its storage, with its strides), or a copy; an array on `cuda:N` goes to
//! [`device_export`](super::device_export).
//!
//! [`Tensor::lend_host`]: crate::framework::Tensor::lend_host

use std::ffi::c_void;

use pyo3::exceptions::PyBufferError;
use pyo3::prelude::*;

use super::capsule::{aligned, make_capsule, wants_versioned, Held};
use super::device_export::export_cuda;
use super::ffi::{DlDevice, DL_CPU, DL_CUDA};
use crate::eager::Array;
use crate::ep::DeviceType;
use crate::python::errors::IntoPy;
use crate::python::issue::{lend, read};

/// `Array.__dlpack__` of `a` (module docs).
pub(crate) fn export<'py>(
    py: Python<'py>,
    a: &Array,
    stream: Option<&Bound<'py, PyAny>>,
    max_version: Option<&Bound<'py, PyAny>>,
    dl_device: Option<(i32, i32)>,
    copy: Option<bool>,
) -> PyResult<Bound<'py, PyAny>> {
    let t = a.tensor_unflushed();
    let cuda = (t.device().ty == DeviceType::Cuda).then_some(t.device().index);
    let own = match cuda {
        Some(n) => (DL_CUDA, i32::from(n)),
        None => (DL_CPU, 0),
    };
    let to_host = match dl_device {
        None => false,
        Some(d) if d == own => false,
        Some(d) if d == (DL_CPU, 0) => true,
        Some(d) if cuda.is_some() => {
            return Err(PyBufferError::new_err(format!(
            "the array on {} can be exported to DLPack device {own:?} or to the host (1, 0), not to {d:?}",
            t.device()
        )))
        }
        Some(d) => {
            return Err(PyBufferError::new_err(format!(
                "the array on {} is exported as host memory (DLPack device (1, 0)), not to {d:?}",
                t.device()
            )))
        }
    };
    if let (Some(_), false, false) = (cuda, to_host, copy == Some(true)) {
        return export_cuda(py, a, stream, max_version);
    }
    // A host export: the consumer reads host memory, complete when this returns.
    if stream.is_some_and(|s| !s.is_none()) && cuda.is_none() {
        return Err(PyBufferError::new_err("a stream applies to device memory; eagervm exports host memory"));
    }
    let host = t.device().is_host();
    if copy == Some(false) && !host {
        return Err(PyBufferError::new_err(format!(
            "the array is on {}; its host memory is a copy, so copy=False cannot be met (copy it with .to(\"cpu\"))",
            t.device()
        )));
    }
    let versioned = wants_versioned(max_version)?;
    // A view of part of a host storage is exported as it lies: the owner's storage, lent,
    // from the view's first element, with its strides.
    let view = (host && copy != Some(true) && !t.is_whole()).then(|| t.meta().clone());
    let held = if copy == Some(true) {
        Held::Copy(aligned(&read(py, a)?))
    } else {
        let lent = if view.is_some() { t.storage_owner().py_err()? } else { t.clone() };
        Held::Loan(lend(py, a.context(), &lent)?.py_err()?)
    };
    let copied = !matches!(held, Held::Loan(_)) || !host;
    let data = match &held {
        Held::Loan(l) => l.as_ptr().cast::<c_void>(),
        Held::Device(_) => unreachable!("a host export"),
        Held::Copy(v) => v.as_ptr().cast_mut().cast(),
    };
    let (data, strides) = match &view {
        // Within the loan: the view's layout was checked against its storage.
        Some(m) => (
            data.cast::<u8>().wrapping_add(m.offset * m.dtype.size()).cast(),
            Some(m.strides.iter().map(|&s| s as i64).collect()),
        ),
        None => (data, None),
    };
    let device = DlDevice { device_type: DL_CPU, device_id: 0 };
    Ok(make_capsule(py, t, data, device, held, versioned, copied, strides)?.into_any())
}
