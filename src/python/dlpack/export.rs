//! `Array.__dlpack__`: the array's own host storage, lent ([`Tensor::lend_host`]), or a
//! copy; an array on `cuda:N` goes to [`device_export`](super::device_export).

use std::ffi::c_void;
use std::sync::Arc;

use pyo3::exceptions::PyBufferError;
use pyo3::prelude::*;

use super::capsule::{make_capsule, wants_versioned, Held};
use super::device_export::export_cuda;
use super::ffi::{DlDevice, DL_CPU, DL_CUDA};
use crate::ep::DeviceType;
use crate::framework::{DType, Tensor};
use crate::python::errors::IntoPy;
use crate::python::shared::Shared;
use crate::python::wait::wait;
use crate::Result;

/// `Array.__dlpack__` (module docs).
pub(crate) fn export<'py>(
    py: Python<'py>,
    shared: &Arc<Shared>,
    t: &Tensor,
    stream: Option<&Bound<'py, PyAny>>,
    max_version: Option<&Bound<'py, PyAny>>,
    dl_device: Option<(i32, i32)>,
    copy: Option<bool>,
) -> PyResult<Bound<'py, PyAny>> {
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
        return export_cuda(py, shared, t, stream, max_version);
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
    shared.flush(py);
    let held = {
        let t = t.clone();
        if copy == Some(true) {
            wait(py, move || -> Result<Held> {
                Ok(match t.dtype() {
                    DType::F32 => Held::F32(t.to_vec()?),
                    DType::I64 => Held::I64(t.to_vec()?),
                    other => return Err(crate::Error::DType { expected: DType::F32, found: other }),
                })
            })?
            .py_err()?
        } else {
            Held::Loan(wait(py, move || t.lend_host())?.py_err()?)
        }
    };
    let copied = !matches!(held, Held::Loan(_)) || !host;
    let data = match &held {
        Held::Loan(l) => l.as_ptr().cast::<c_void>(),
        Held::Device(_) => unreachable!("a host export"),
        Held::F32(v) => v.as_ptr().cast_mut().cast(),
        Held::I64(v) => v.as_ptr().cast_mut().cast(),
    };
    let device = DlDevice { device_type: DL_CPU, device_id: 0 };
    Ok(make_capsule(py, t, data, device, held, versioned, copied)?.into_any())
}
