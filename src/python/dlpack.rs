//! DLPack exchange without copies (`docs/python.md`, "DLPack").
//!
//! - **Export** (`Array.__dlpack__`): the array's own host storage, lent
//!   ([`Tensor::lend_host`]), as a `DLManagedTensorVersioned` (capsule `dltensor_versioned`)
//!   when the consumer asks for DLPack 1.x, else as a `DLManagedTensor` (`dltensor`). The
//!   manager context owns the loan; the deleter, called by the consumer on any thread,
//!   drops it and frees the struct. It never touches Python.
//! - **Import** (`VM.from_dlpack`): the producer's capsule is renamed `used_…` (it is ours
//!   from then on) and its memory becomes a VM tensor's storage
//!   ([`VirtualMachine::from_host_memory`](crate::VirtualMachine::from_host_memory)). The
//!   VM frees that storage on one of its threads; the producer's deleter may need the GIL
//!   (NumPy's takes it with `PyGILState_Ensure`), and a VM thread that waited for the GIL
//!   could deadlock with a Python thread that holds it while it waits for the VM (a VM's
//!   drop joins its threads; back-pressure inside a call keeps the GIL). So a freed
//!   producer's tensor goes on a list that the binding empties, calling the deleters, the
//!   next time it runs with the GIL ([`collect`]: every call and flush).
//!
//! The structs are DLPack's C ABI (`dlpack.h`, v1.x), written out here: they are frozen, and
//! the Rust crates that carry them bring their own PyO3.

use std::ffi::{c_void, CStr};
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use pyo3::exceptions::{PyBufferError, PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyDict};

use super::array::{parse_device, PyArr};
use super::errors::IntoPy;
use super::shared::Shared;
use super::wait::wait;
use crate::ep::{DeviceId, StreamType};
use crate::framework::{Attrs, DType, HostLoan, Tensor};
use crate::Result;

/// `DLDeviceType::kDLCPU`.
const DL_CPU: i32 = 1;
/// `kDLCUDAHost`: page-locked host memory, which the CPU reads as any other.
const DL_CUDA_HOST: i32 = 3;
/// `DLDataTypeCode::kDLInt`.
const DL_INT: u8 = 0;
/// `kDLFloat`.
const DL_FLOAT: u8 = 2;
/// `DLPACK_FLAG_BITMASK_READ_ONLY`.
const FLAG_READ_ONLY: u64 = 1 << 0;
/// `DLPACK_FLAG_BITMASK_IS_COPIED`.
const FLAG_IS_COPIED: u64 = 1 << 1;
/// The DLPack version of the versioned structs made and taken here.
const DLPACK_MAJOR: u32 = 1;
const DLPACK_MINOR: u32 = 0;

const LEGACY: &CStr = c"dltensor";
const LEGACY_USED: &CStr = c"used_dltensor";
const VERSIONED: &CStr = c"dltensor_versioned";
const VERSIONED_USED: &CStr = c"used_dltensor_versioned";

/// `DLDevice`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct DlDevice {
    device_type: i32,
    device_id: i32,
}

/// `DLDataType`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct DlDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

/// `DLTensor`.
#[repr(C)]
struct DlTensor {
    data: *mut c_void,
    device: DlDevice,
    ndim: i32,
    dtype: DlDataType,
    shape: *mut i64,
    /// In elements; null for a compact row-major tensor.
    strides: *mut i64,
    byte_offset: u64,
}

/// `DLManagedTensor` (the legacy, unversioned struct of capsule `dltensor`).
#[repr(C)]
struct DlManagedTensor {
    dl_tensor: DlTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DlManagedTensor)>,
}

/// `DLPackVersion`.
#[repr(C)]
struct DlPackVersion {
    major: u32,
    minor: u32,
}

/// `DLManagedTensorVersioned` (capsule `dltensor_versioned`).
#[repr(C)]
struct DlManagedTensorVersioned {
    version: DlPackVersion,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DlManagedTensorVersioned)>,
    flags: u64,
    dl_tensor: DlTensor,
}

// ---------------------------------------------------------------------------------------
// Export.

/// What an exported tensor's memory belongs to.
enum Held {
    /// The VM's storage, lent.
    Loan(#[allow(dead_code)] HostLoan),
    /// A copy (`copy=True`).
    F32(#[allow(dead_code)] Vec<f32>),
    I64(#[allow(dead_code)] Vec<i64>),
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
fn dl_dtype(d: DType) -> DlDataType {
    match d {
        DType::F32 => DlDataType { code: DL_FLOAT, bits: 32, lanes: 1 },
        DType::I64 => DlDataType { code: DL_INT, bits: 64, lanes: 1 },
    }
}

/// Whether `max_version` asks for a versioned capsule: `(major, minor)` with `major >= 1`.
fn wants_versioned(max_version: Option<&Bound<'_, PyAny>>) -> PyResult<bool> {
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

/// `Array.__dlpack__` (module docs).
pub(crate) fn export<'py>(
    py: Python<'py>,
    arr: &PyArr,
    stream: Option<&Bound<'py, PyAny>>,
    max_version: Option<&Bound<'py, PyAny>>,
    dl_device: Option<(i32, i32)>,
    copy: Option<bool>,
) -> PyResult<Bound<'py, PyAny>> {
    if let Some(d) = dl_device {
        if d != (DL_CPU, 0) {
            return Err(PyBufferError::new_err(format!(
                "eagervm exports host memory (DLPack device (1, 0)), not {d:?}"
            )));
        }
    }
    if stream.is_some_and(|s| !s.is_none()) {
        return Err(PyBufferError::new_err("a stream applies to device memory; eagervm exports host memory"));
    }
    let t = &arr.t;
    let host = t.device().is_host();
    if copy == Some(false) && !host {
        return Err(PyBufferError::new_err(format!(
            "the array is on {}; its host memory is a copy, so copy=False cannot be met (copy it with .to(\"cpu\"))",
            t.device()
        )));
    }
    let versioned = wants_versioned(max_version)?;
    arr.shared.flush(py);
    let held = {
        let t = t.clone();
        if copy == Some(true) {
            wait(py, move || -> Result<Held> {
                Ok(match t.dtype() {
                    DType::F32 => Held::F32(t.to_vec()?),
                    DType::I64 => Held::I64(t.to_vec()?),
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
        Held::F32(v) => v.as_ptr().cast_mut().cast(),
        Held::I64(v) => v.as_ptr().cast_mut().cast(),
    };
    Ok(make_capsule(py, t, data, held, versioned, copied)?.into_any())
}

/// Leak an `Exported` of `t`'s metadata over `data` and wrap it in a capsule.
fn make_capsule<'py>(
    py: Python<'py>,
    t: &Tensor,
    data: *mut c_void,
    held: Held,
    versioned: bool,
    copied: bool,
) -> PyResult<Bound<'py, PyCapsule>> {
    let shape: Vec<i64> = t.shape().iter().map(|&d| d as i64).collect();
    let mut strides = vec![1i64; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * shape[d + 1].max(1);
    }
    let dl = |shape: *mut i64, strides: *mut i64| DlTensor {
        data,
        device: DlDevice { device_type: DL_CPU, device_id: 0 },
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

// ---------------------------------------------------------------------------------------
// Import.

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
/// progress). Dropping it, on any thread, puts it on the list [`collect`] deletes from.
struct Owner(Option<Managed>);

// SAFETY: the managed tensor is only read on the importing thread, before the owner goes
// to the VM; after that it is only moved to the list and deleted there with the GIL, as
// the producer allows from any thread (DLPack: the deleter may be called from any thread).
unsafe impl Send for Owner {}

/// Managed tensors whose VM storage is freed, waiting for their deleters.
static DEAD: Mutex<Vec<Owner>> = Mutex::new(Vec::new());
/// Whether `DEAD` may hold something (set and cleared under its lock; read relaxed as a
/// hint: one missed is deleted at the next `collect`).
static ANY_DEAD: AtomicBool = AtomicBool::new(false);

impl Drop for Owner {
    fn drop(&mut self) {
        if let Some(m) = self.0.take() {
            let mut dead = DEAD.lock();
            dead.push(Owner(Some(m)));
            ANY_DEAD.store(true, Ordering::Relaxed);
        }
    }
}

/// Call the deleters of the producers' tensors that the VM has freed (module docs). Cheap
/// when there is none: one relaxed load.
pub(crate) fn collect(_py: Python<'_>) {
    if !ANY_DEAD.load(Ordering::Relaxed) {
        return;
    }
    let dead = {
        let mut dead = DEAD.lock();
        ANY_DEAD.store(false, Ordering::Relaxed);
        std::mem::take(&mut *dead)
    };
    // Outside the lock: a deleter may drop Python objects, whose destructors may free more.
    for mut o in dead {
        if let Some(m) = o.0.take() {
            // SAFETY: taken out of its owner, so deleted once; the GIL is held (`_py`).
            unsafe { m.delete() };
        }
    }
}

/// Call `x.__dlpack__(max_version=(1, 0))` (or `x.__dlpack__()` for a producer that does
/// not take the keyword) and take the managed tensor out of the capsule.
fn take_capsule(x: &Bound<'_, PyAny>) -> PyResult<Owner> {
    let py = x.py();
    let kw = PyDict::new(py);
    kw.set_item("max_version", (DLPACK_MAJOR, DLPACK_MINOR))?;
    let capsule = match x.call_method("__dlpack__", (), Some(&kw)) {
        Ok(c) => c,
        Err(e) if e.is_instance_of::<PyTypeError>(py) => x.call_method0("__dlpack__")?,
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

/// Read and check the producer's tensor: its device is the host, its dtype is one the VM
/// has, and its shape is a shape.
fn layout(m: &Managed) -> PyResult<Layout> {
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
    if dev.device_type != DL_CPU && dev.device_type != DL_CUDA_HOST {
        return Err(PyBufferError::new_err(format!(
            "eagervm imports host memory through DLPack, not memory of DLPack device ({}, {}): copy it to the host first (for PyTorch, x.cpu())",
            dev.device_type, dev.device_id
        )));
    }
    let dtype = match (dl.dtype.code, dl.dtype.bits, dl.dtype.lanes) {
        (DL_FLOAT, 32, 1) => DType::F32,
        (DL_INT, 64, 1) => DType::I64,
        (code, bits, lanes) => {
            return Err(PyTypeError::new_err(format!(
                "eagervm arrays hold float32 or int64, not the DLPack dtype (code {code}, {bits} bits, {lanes} lanes); convert it first"
            )))
        }
    };
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

/// `VM.from_dlpack(x, device, copy)` (module docs; `docs/python.md`, "DLPack").
pub(crate) fn import(
    py: Python<'_>,
    shared: &Arc<Shared>,
    x: &Bound<'_, PyAny>,
    device: Option<&str>,
    copy: Option<bool>,
) -> PyResult<PyArr> {
    let device = match device {
        Some(d) => parse_device(d)?,
        None => DeviceId::CPU,
    };
    if !x.hasattr("__dlpack__")? {
        return Err(PyTypeError::new_err(format!(
            "expected a DLPack producer (an object with __dlpack__), got {}",
            x.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "?".into())
        )));
    }
    if x.hasattr("__dlpack_device__")? {
        let (ty, id): (i32, i32) = x.call_method0("__dlpack_device__")?.extract()?;
        if ty != DL_CPU && ty != DL_CUDA_HOST {
            return Err(PyBufferError::new_err(format!(
                "eagervm imports host memory through DLPack, not memory of DLPack device ({ty}, {id}): copy it to the host first (for PyTorch, x.cpu())"
            )));
        }
    }
    let owner = take_capsule(x)?;
    let r = import_owned(py, shared, owner, device, copy);
    // The deleter of a copied (or refused) import runs now.
    collect(py);
    r
}

fn import_owned(
    py: Python<'_>,
    shared: &Arc<Shared>,
    owner: Owner,
    device: DeviceId,
    copy: Option<bool>,
) -> PyResult<PyArr> {
    let l = layout(owner.0.as_ref().expect("a fresh owner"))?;
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
    let vm = shared.vm();
    let host = if why_copy.is_some() || copy == Some(true) {
        let host = vm.empty(&l.shape, l.dtype, DeviceId::CPU).py_err()?;
        let r = match l.dtype {
            DType::F32 => shared.with_builder(py, |b| b.write(&host, &gather::<f32>(&l))),
            DType::I64 => shared.with_builder(py, |b| b.write(&host, &gather::<i64>(&l))),
        };
        r.py_err()?;
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
        unsafe { vm.from_host_memory(data, &l.shape, l.dtype, Box::new(owner)) }.py_err()?
    };
    if device.is_host() {
        return Ok(PyArr { shared: shared.clone(), t: host });
    }
    // One copy, through the device's host-to-device stream, waited for: the producer may
    // change its memory once this returns, as after a copy at the call. The host tensor's
    // `Release` follows the copy when `host` drops.
    let dst = vm.empty(&l.shape, l.dtype, device).py_err()?;
    let h2d = vm.stream(device, StreamType::H2D).py_err()?;
    let op = shared.ops.copy;
    shared.with_builder(py, |b| b.call_into(op, &[&host], &[&dst], Attrs::default(), h2d)).py_err()?;
    shared.flush(py);
    let copied = dst.clone();
    wait(py, move || copied.wait())?.py_err()?;
    Ok(PyArr { shared: shared.clone(), t: dst })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_structs_have_dlpack_s_layout() {
        // dlpack.h on a 64-bit target.
        assert_eq!(std::mem::size_of::<DlDevice>(), 8);
        assert_eq!(std::mem::size_of::<DlDataType>(), 4);
        assert_eq!(std::mem::size_of::<DlTensor>(), 48);
        assert_eq!(std::mem::offset_of!(DlTensor, shape), 24);
        assert_eq!(std::mem::offset_of!(DlTensor, byte_offset), 40);
        assert_eq!(std::mem::size_of::<DlManagedTensor>(), 64);
        assert_eq!(std::mem::offset_of!(DlManagedTensorVersioned, flags), 24);
        assert_eq!(std::mem::offset_of!(DlManagedTensorVersioned, dl_tensor), 32);
    }

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
