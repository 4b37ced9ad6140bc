//! `VM.from_dlpack`: the producer's capsule is renamed `used_…` (it is ours from then on)
//! and its memory becomes a VM tensor's storage, host memory
//! ([`VirtualMachine::from_host_memory`](crate::VirtualMachine::from_host_memory)) or CUDA
//! memory ([`VirtualMachine::from_device_memory`](crate::VirtualMachine::from_device_memory));
//! or a copy of it, where the VM cannot use it as it is. The producer's deleter runs with
//! the GIL, after the VM frees the storage ([`deleters`](crate::python::deleters)).

use std::ptr::NonNull;

use pyo3::exceptions::{PyBufferError, PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyDict};

use super::capsule::from_dl;
use super::ffi::{
    DlDataType, DlDevice, DlManagedTensor, DlManagedTensorVersioned, DlTensor, DLPACK_MAJOR, DLPACK_MINOR,
    DL_CPU, DL_CUDA, DL_CUDA_HOST, FLAG_READ_ONLY, LEGACY, LEGACY_USED, VERSIONED, VERSIONED_USED,
};
use crate::eager::{Array, Context};
use crate::ep::DeviceId;
use crate::framework::virtual_machine::HostAccess;
use crate::framework::{bf16, f16, Attrs, DType};
use crate::python::deleters::{self, collect};
use crate::python::errors::IntoPy;
use crate::python::issue::{access, issued};

/// A producer's managed tensor that this binding owns (its capsule is renamed `used_…`):
/// it must be deleted once, with the GIL.
enum Managed {
    Legacy(NonNull<DlManagedTensor>),
    Versioned(NonNull<DlManagedTensorVersioned>),
}

impl Managed {
    /// Call the producer's deleter.
    ///
    /// # Safety
    /// Once per managed tensor, with the GIL held (the producer may need it).
    unsafe fn delete(self) {
        match self {
            // SAFETY: the producer's struct is valid until its deleter runs (the contract:
            // once).
            Managed::Legacy(m) => unsafe {
                if let Some(d) = m.as_ref().deleter {
                    d(m.as_ptr())
                }
            },
            // SAFETY: as above.
            Managed::Versioned(m) => unsafe {
                if let Some(d) = m.as_ref().deleter {
                    d(m.as_ptr())
                }
            },
        }
    }

    fn tensor(&self) -> &DlTensor {
        // SAFETY: valid until deleted, which consumes `self`.
        unsafe {
            match self {
                Managed::Legacy(m) => &m.as_ref().dl_tensor,
                Managed::Versioned(m) => &m.as_ref().dl_tensor,
            }
        }
    }

    fn flags(&self) -> u64 {
        match self {
            Managed::Legacy(_) => 0,
            // SAFETY: as in `tensor`.
            Managed::Versioned(m) => unsafe { m.as_ref().flags },
        }
    }
}

/// A producer's managed tensor owned by a VM tensor's storage (or by an import in
/// progress). Dropping it, on any thread, defers its deletion to the binding's next call
/// with the GIL ([`deleters`]).
struct Owner(Option<Managed>);

// SAFETY: the managed tensor is only read on the importing thread, before the owner goes
// to the VM; after that it is only moved to the deleters' list and deleted there with the
// GIL, as the producer allows from any thread (DLPack: the deleter may be called from any
// thread).
unsafe impl Send for Owner {}

impl Owner {
    /// Call the producer's deleter now (`_py`: with the GIL).
    fn delete(mut self, _py: Python<'_>) {
        if let Some(m) = self.0.take() {
            // SAFETY: taken out of its owner, so deleted once; the GIL is held (`_py`).
            unsafe { m.delete() };
        }
    }
}

impl Drop for Owner {
    fn drop(&mut self) {
        if let Some(m) = self.0.take() {
            let owner = Owner(Some(m));
            deleters::defer(Box::new(move |py| owner.delete(py)));
        }
    }
}

/// Call `x.__dlpack__(max_version=(1, 0))` (or `x.__dlpack__()` for a producer that does
/// not take the keyword), with `stream=` the consumer's stream for device memory, and take
/// the managed tensor out of the capsule.
fn take_capsule(x: &Bound<'_, PyAny>, stream: Option<u64>) -> PyResult<Owner> {
    let py = x.py();
    let kw = PyDict::new(py);
    if let Some(s) = stream {
        kw.set_item("stream", s)?;
    }
    kw.set_item("max_version", (DLPACK_MAJOR, DLPACK_MINOR))?;
    let capsule = match x.call_method("__dlpack__", (), Some(&kw)) {
        Ok(c) => c,
        Err(e) if e.is_instance_of::<PyTypeError>(py) => {
            // A producer of DLPack before 1.0, which does not take `max_version`.
            kw.del_item("max_version")?;
            x.call_method("__dlpack__", (), Some(&kw))?
        }
        Err(e) => return Err(e),
    };
    let capsule = capsule
        .downcast_into::<PyCapsule>()
        .map_err(|_| PyTypeError::new_err("__dlpack__ did not return a PyCapsule"))?;
    let cap = capsule.as_ptr();
    for (name, used, versioned) in [(VERSIONED, VERSIONED_USED, true), (LEGACY, LEGACY_USED, false)] {
        // SAFETY: `cap` is a live capsule; `IsValid` sets no error.
        if unsafe { ffi::PyCapsule_IsValid(cap, name.as_ptr()) } != 1 {
            continue;
        }
        // SAFETY: valid under `name`.
        let p = unsafe { ffi::PyCapsule_GetPointer(cap, name.as_ptr()) };
        let Some(p) = NonNull::new(p) else { return Err(PyErr::fetch(py)) };
        // The capsule is consumed: its destructor now leaves the tensor to us.
        // SAFETY: a live capsule and a static name.
        if unsafe { ffi::PyCapsule_SetName(cap, used.as_ptr()) } != 0 {
            return Err(PyErr::fetch(py));
        }
        return Ok(Owner(Some(if versioned {
            Managed::Versioned(p.cast())
        } else {
            Managed::Legacy(p.cast())
        })));
    }
    Err(PyBufferError::new_err(
        "__dlpack__ returned a capsule that is neither a fresh \"dltensor\" nor a \"dltensor_versioned\"",
    ))
}

/// What an import found in the producer's tensor.
struct Layout {
    dtype: DType,
    shape: Vec<usize>,
    /// Element strides, row-major compact if `None`.
    strides: Option<Vec<isize>>,
    /// The first element (`data + byte_offset`).
    data: *mut u8,
    read_only: bool,
}

/// Read and check the producer's tensor: its device is one `accepts` (`expected` names it
/// for the message), its dtype is one the VM has, and its shape is a shape.
fn layout(m: &Managed, accepts: impl Fn(DlDevice) -> bool, expected: &str) -> PyResult<Layout> {
    if let Managed::Versioned(v) = m {
        // SAFETY: valid until deleted.
        let version = unsafe { &v.as_ref().version };
        if version.major != DLPACK_MAJOR {
            return Err(PyBufferError::new_err(format!(
                "the producer's DLPack version {}.{} is not 1.x",
                version.major, version.minor
            )));
        }
    }
    let dl = m.tensor();
    let dev = dl.device;
    if !accepts(dev) {
        return Err(PyBufferError::new_err(format!(
            "eagervm imports host and CUDA memory through DLPack, and this import expected {}, not memory of DLPack device ({}, {})",
            expected, dev.device_type, dev.device_id
        )));
    }
    let dtype = from_dl(dl.dtype).ok_or_else(|| {
        let DlDataType { code, bits, lanes } = dl.dtype;
        PyTypeError::new_err(format!(
            "eagervm has no dtype for the DLPack dtype (code {code}, {bits} bits, {lanes} lanes): its dtypes are bool, uint8, int32, int64, float16, bfloat16, float32 and float64"
        ))
    })?;
    if dl.ndim < 0 {
        return Err(PyValueError::new_err(format!("a DLPack tensor with {} dimensions", dl.ndim)));
    }
    let ndim = dl.ndim as usize;
    let dims: &[i64] = if ndim == 0 {
        &[]
    } else {
        // SAFETY: DLPack: `shape` holds `ndim` sizes, valid until the deleter runs.
        unsafe { std::slice::from_raw_parts(dl.shape, ndim) }
    };
    let shape = dims
        .iter()
        .map(|&d| {
            usize::try_from(d).map_err(|_| PyValueError::new_err(format!("a negative size in {dims:?}")))
        })
        .collect::<PyResult<Vec<usize>>>()?;
    let numel: usize = shape.iter().product();
    let strides = if dl.strides.is_null() || ndim == 0 {
        None
    } else {
        // SAFETY: DLPack: non-null `strides` holds `ndim` strides, in elements.
        let s = unsafe { std::slice::from_raw_parts(dl.strides, ndim) };
        let s: Vec<isize> = s.iter().map(|&x| x as isize).collect();
        let mut expected = 1isize;
        let mut compact = true;
        for d in (0..ndim).rev() {
            if shape[d] != 1 && s[d] != expected {
                compact = false;
            }
            expected = expected.saturating_mul(shape[d] as isize);
        }
        (!compact && numel > 0).then_some(s)
    };
    if dl.data.is_null() && numel > 0 {
        return Err(PyBufferError::new_err(format!("a DLPack tensor of shape {shape:?} with no data")));
    }
    let data = (dl.data as *mut u8).wrapping_add(dl.byte_offset as usize);
    Ok(Layout { dtype, shape, strides, data, read_only: m.flags() & FLAG_READ_ONLY != 0 })
}

/// The producer's elements in row-major order (a strided or misaligned tensor's copy).
fn gather<T: Copy>(l: &Layout) -> Vec<T> {
    let numel: usize = l.shape.iter().product();
    let mut out = Vec::with_capacity(numel);
    if numel == 0 {
        return out;
    }
    let strides: Vec<isize> = match &l.strides {
        Some(s) => s.clone(),
        None => {
            let mut s = vec![1isize; l.shape.len()];
            for d in (0..l.shape.len().saturating_sub(1)).rev() {
                s[d] = s[d + 1] * l.shape[d + 1] as isize;
            }
            s
        }
    };
    let mut index = vec![0usize; l.shape.len()];
    for _ in 0..numel {
        let offset: isize = index.iter().zip(&strides).map(|(&i, &s)| i as isize * s).sum();
        // SAFETY: DLPack: every element the shape and strides name lies in the producer's
        // memory, valid until its deleter runs (after this); the read is unaligned-safe.
        out.push(unsafe { l.data.cast::<T>().wrapping_offset(offset).read_unaligned() });
        for d in (0..index.len()).rev() {
            index[d] += 1;
            if index[d] < l.shape[d] {
                break;
            }
            index[d] = 0;
        }
    }
    out
}

/// `VM.from_dlpack(x, device, copy)` (module docs; `docs/python.md`, "DLPack"): an array
/// of `cx` over the producer's memory, or over a copy of it.
pub(crate) fn import(
    py: Python<'_>,
    cx: &Context,
    x: &Bound<'_, PyAny>,
    asked: Option<DeviceId>,
    copy: Option<bool>,
) -> PyResult<Array> {
    let device = asked.unwrap_or(DeviceId::CPU);
    if !x.hasattr("__dlpack__")? {
        return Err(PyTypeError::new_err(format!(
            "expected a DLPack producer (an object with __dlpack__), got {}",
            x.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "?".into())
        )));
    }
    if x.hasattr("__dlpack_device__")? {
        let (ty, id): (i32, i32) = x.call_method0("__dlpack_device__")?.extract()?;
        if ty == DL_CUDA {
            let r = import_cuda(py, cx, x, id, asked, copy);
            collect(py);
            return r;
        }
        if ty != DL_CPU && ty != DL_CUDA_HOST {
            return Err(PyBufferError::new_err(format!(
                "eagervm imports host and CUDA memory through DLPack, not memory of DLPack device ({ty}, {id}): copy it to the host first (for PyTorch, x.cpu())"
            )));
        }
    }
    let owner = take_capsule(x, None)?;
    let r = import_owned(py, cx, owner, device, copy);
    // The deleter of a copied (or refused) import runs now.
    collect(py);
    r
}

/// A new host array of `cx` holding the producer's elements (`l`), gathered in row-major
/// order.
fn copy_in(py: Python<'_>, cx: &Context, l: &Layout) -> PyResult<Array> {
    macro_rules! from {
        ($t:ty) => {
            issued(py, cx, cx.from_slice(&gather::<$t>(l), &l.shape, DeviceId::CPU))
        };
    }
    match l.dtype {
        // Read as bytes: a producer's bool need not be 0 or 1.
        DType::Bool => {
            let v: Vec<bool> = gather::<u8>(l).into_iter().map(|b| b != 0).collect();
            issued(py, cx, cx.from_slice(&v, &l.shape, DeviceId::CPU))
        }
        DType::U8 => from!(u8),
        DType::I32 => from!(i32),
        DType::I64 => from!(i64),
        DType::F16 => from!(f16),
        DType::BF16 => from!(bf16),
        DType::F32 => from!(f32),
        DType::F64 => from!(f64),
    }
}

fn import_owned(
    py: Python<'_>,
    cx: &Context,
    owner: Owner,
    device: DeviceId,
    copy: Option<bool>,
) -> PyResult<Array> {
    let host = |d: DlDevice| d.device_type == DL_CPU || d.device_type == DL_CUDA_HOST;
    let l = layout(owner.0.as_ref().expect("a fresh owner"), host, "host memory")?;
    let numel: usize = l.shape.iter().product();
    let aligned = numel == 0 || l.data as usize % crate::alloc::lend::FOREIGN_ALIGN == 0;
    let why_copy = if l.strides.is_some() {
        Some("its elements are not contiguous in row-major order")
    } else if !aligned {
        Some("its data is not aligned to 8 bytes")
    } else if l.read_only {
        Some("the producer marked it read-only")
    } else {
        None
    };
    if copy == Some(false) {
        if let Some(why) = why_copy {
            return Err(PyBufferError::new_err(format!("copy=False cannot be met: {why}")));
        }
        if !device.is_host() {
            return Err(PyBufferError::new_err(format!(
                "copy=False cannot be met: the memory is on the host, not on {device}"
            )));
        }
    }
    let host = if why_copy.is_some() || copy == Some(true) {
        let host = copy_in(py, cx, &l)?;
        drop(owner);
        host
    } else {
        // Null only for an empty tensor (`layout` refuses it otherwise), whose address
        // nothing reads.
        let data = NonNull::new(l.data).unwrap_or(NonNull::<u64>::dangling().cast());
        // SAFETY: DLPack: the producer's memory (`numel` elements of the dtype from `data`,
        // compact, checked above, and 8-aligned) stays valid until its deleter runs, which
        // `owner`'s drop leads to; it is writable (not marked read-only). That nothing else
        // races with the VM's accesses is the exchange's rule (docs/python.md, "DLPack"):
        // the user orders other accesses with the VM.
        let t = unsafe { cx.vm().from_host_memory(data, &l.shape, l.dtype, Box::new(owner)) }.py_err()?;
        cx.wrap(t)
    };
    if device.is_host() {
        return Ok(host);
    }
    // One copy, through the device's host-to-device stream (`Array::to`): the producer may
    // change its memory once this returns, as after a copy at the call.
    let copied = host.to(device);
    copy_and_wait(py, cx, copied)
}

/// `copied`, a copy made for an import, once it is made: the exchange's producer may
/// change its memory once this returns. The source's `Release` follows the copy when the
/// caller drops it.
fn copy_and_wait(py: Python<'_>, cx: &Context, copied: crate::Result<Array>) -> PyResult<Array> {
    let copied = issued(py, cx, copied)?;
    access(py, &copied, HostAccess::Wait)?.py_err()?;
    Ok(copied)
}

/// The raw handle of VM stream `id` (a CUDA stream), for a producer's `__dlpack__(stream=)`.
fn stream_handle(cx: &Context, id: crate::vm::StreamId) -> Option<u64> {
    let engine = cx.vm().engine();
    let s = engine.stream(id).ok()?;
    crate::ep::cuda::raw_stream(&*s.ep)
}

/// The import of CUDA memory on DLPack device `(kDLCUDA, id)` (`docs/python.md`, "DLPack"):
/// the producer orders its pending work before the VM's compute stream of `cuda:id`
/// (`__dlpack__(stream=<that stream>)`), and its memory becomes the storage of a VM array
/// on `cuda:id`, written there by a `noop` on that stream, so that the VM's other streams
/// read it after that point too. Compact, 8-aligned memory only; `copy=True` copies it on
/// the device and waits for the copy.
fn import_cuda(
    py: Python<'_>,
    cx: &Context,
    x: &Bound<'_, PyAny>,
    id: i32,
    device: Option<DeviceId>,
    copy: Option<bool>,
) -> PyResult<Array> {
    let index = u16::try_from(id).map_err(|_| {
        PyBufferError::new_err(format!("DLPack device (2, {id}) is not a CUDA device ordinal"))
    })?;
    let dev = DeviceId::cuda(index);
    if let Some(d) = device.filter(|&d| d != dev) {
        return Err(PyBufferError::new_err(format!(
            "the producer's memory is on {dev}; eagervm imports it there, not to {d}: import it with device=None, then copy it with .to(\"{d}\")"
        )));
    }
    let vm = cx.vm();
    // A VM without the device refuses here, with the DeviceError that names it.
    let compute = vm.compute_stream(dev).py_err()?;
    let handle = stream_handle(cx, compute).ok_or_else(|| {
        PyBufferError::new_err(format!("the VM's compute stream of {dev} is not a CUDA stream"))
    })?;
    let owner = take_capsule(x, Some(handle))?;
    let expected = format!("CUDA memory of device {id}");
    let on_dev = |d: DlDevice| d.device_type == DL_CUDA && d.device_id == id;
    let l = layout(owner.0.as_ref().expect("a fresh owner"), on_dev, &expected)?;
    let numel: usize = l.shape.iter().product();
    let why_not = if l.strides.is_some() {
        Some("its elements are not contiguous in row-major order (for PyTorch, pass x.contiguous())")
    } else if numel > 0 && l.data as usize % crate::alloc::lend::FOREIGN_ALIGN != 0 {
        Some("its data is not aligned to 8 bytes")
    } else if l.read_only && copy != Some(true) {
        Some("the producer marked it read-only (copy=True copies it)")
    } else {
        None
    };
    if let Some(why) = why_not {
        return Err(PyBufferError::new_err(format!("CUDA memory cannot be imported without a copy: {why}")));
    }
    let addr = if numel == 0 { 0 } else { l.data as usize as u64 };
    // SAFETY: DLPack: the producer's memory (`numel` compact elements of the dtype from
    // `addr`, 8-aligned, checked above) stays valid until its deleter runs, which `owner`'s
    // drop leads to; it is writable unless flagged read-only (then only the copy below
    // reads it). The producer ordered its pending work before the VM's compute stream
    // (`stream=` above), the first stream that touches it (the `noop` below); that nothing
    // else races with the VM's accesses later is the exchange's rule (docs/python.md).
    let t = unsafe { vm.from_device_memory(addr, &l.shape, l.dtype, dev, Box::new(owner)) }.py_err()?;
    let noop = vm.op("noop").py_err()?;
    let written = cx.build(&[], |b| b.call_into(noop, &[], &[&t], Attrs::default(), compute));
    issued(py, cx, written)?;
    let t = cx.wrap(t);
    if copy != Some(true) {
        return Ok(t);
    }
    // A copy on the device, on the compute stream.
    copy_and_wait(py, cx, t.copy())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_strided_tensor_is_gathered_in_row_major_order() {
        // A 2 x 3 view of the transpose of [[0, 1], [2, 3], [4, 5]].
        let mem = [0.0f32, 1.0, 2.0, 3.0, 4.0, 5.0];
        let l = Layout {
            dtype: DType::F32,
            shape: vec![2, 3],
            strides: Some(vec![1, 2]),
            data: mem.as_ptr().cast_mut().cast(),
            read_only: false,
        };
        assert_eq!(gather::<f32>(&l), [0.0, 2.0, 4.0, 1.0, 3.0, 5.0]);
        // Negative strides: the rows reversed.
        let l = Layout { strides: Some(vec![-3, 1]), data: mem[3..].as_ptr().cast_mut().cast(), ..l };
        assert_eq!(gather::<f32>(&l), [3.0, 4.0, 5.0, 0.0, 1.0, 2.0]);
    }
}
