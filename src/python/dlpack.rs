//! DLPack exchange without copies, of host and CUDA memory (`docs/python.md`, "DLPack").
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
//! - **CUDA memory**, both ways, ordered on the device by DLPack's `stream` protocol. An
//!   export of an array on `cuda:N` issues a [`DeviceExport`] call on the device's compute
//!   stream, which the VM orders after the array's writes as any reader; at its launch it
//!   lends the device storage ([`Storage::lend_device`](crate::alloc::Storage::lend_device))
//!   and makes the consumer's stream wait for the compute stream (an event), and answers
//!   the export, which waits only for that launch ([`Pending`]). An import passes the VM's
//!   compute stream as `stream=`, so the producer orders its pending work before it, wraps
//!   the producer's pointer as device storage
//!   ([`VirtualMachine::from_device_memory`](crate::VirtualMachine::from_device_memory)),
//!   and writes the array with a `noop` on that stream, which the VM's other streams then
//!   follow.
//!
//! The structs are DLPack's C ABI (`dlpack.h`, v1.x), written out here: they are frozen, and
//! the Rust crates that carry them bring their own PyO3.

use std::collections::HashMap;
use std::ffi::{c_void, CStr};
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};
use pyo3::exceptions::{PyBufferError, PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyDict};

use super::array::PyArr;
use super::errors::IntoPy;
use super::issue::{flush, issued, read};
use super::wait::wait;
use crate::alloc::DeviceLoan;
use crate::eager::{Array, Context};
use crate::ep::{DeviceId, DeviceType};
use crate::framework::virtual_machine::HostAccess;
use crate::framework::{bf16, f16, Attrs, DType, HostLoan, Op, Tensor};
use crate::vm::{KernelCtx, OpKernel, OutSpecs, TensorMeta};

/// `DLDeviceType::kDLCPU`.
const DL_CPU: i32 = 1;
/// `kDLCUDA`: CUDA device memory.
pub(crate) const DL_CUDA: i32 = 2;
/// `kDLCUDAHost`: page-locked host memory, which the CPU reads as any other.
const DL_CUDA_HOST: i32 = 3;
/// `DLDataTypeCode::kDLInt`.
const DL_INT: u8 = 0;
/// `kDLUInt`.
const DL_UINT: u8 = 1;
/// `kDLFloat`.
const DL_FLOAT: u8 = 2;
/// `kDLBfloat`.
const DL_BFLOAT: u8 = 4;
/// `kDLBool`.
const DL_BOOL: u8 = 6;
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
fn dl_dtype(d: DType) -> DlDataType {
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
fn from_dl(t: DlDataType) -> Option<DType> {
    DType::ALL.into_iter().find(|&d| {
        let e = dl_dtype(d);
        (e.code, e.bits, e.lanes) == (t.code, t.bits, t.lanes)
    })
}

/// `bytes` in a buffer aligned for every dtype.
fn aligned(bytes: &[u8]) -> Vec<u64> {
    let mut words = vec![0u64; bytes.len().div_ceil(8)];
    for (w, c) in words.iter_mut().zip(bytes.chunks(8)) {
        let mut b = [0u8; 8];
        b[..c.len()].copy_from_slice(c);
        *w = u64::from_ne_bytes(b);
    }
    words
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
    let a = &arr.a;
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
        return export_cuda(py, arr, stream, max_version);
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
        flush(py, a.context());
        let lent = if view.is_some() { t.storage_owner().py_err()? } else { t.clone() };
        Held::Loan(wait(py, move || lent.lend_host())?.py_err()?)
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

/// The stream the consumer of a CUDA export named (DLPack's `stream` for `kDLCUDA`): the
/// raw handle to order after the VM's writes, or `None` for `-1` (no synchronisation).
/// `None` means the legacy default stream (1), as the protocol says; `0` is refused as
/// ambiguous, as it is there.
fn consumer_stream(stream: Option<&Bound<'_, PyAny>>) -> PyResult<Option<u64>> {
    let Some(s) = stream.filter(|s| !s.is_none()) else { return Ok(Some(CU_STREAM_LEGACY)) };
    let v: i128 = s.extract().map_err(|_| {
        PyTypeError::new_err(format!("stream must be an int (a CUDA stream handle) or None, not {s}"))
    })?;
    match v {
        -1 => Ok(None),
        0 => Err(PyValueError::new_err(
            "stream=0 is ambiguous for CUDA (DLPack): pass 1 (the legacy default stream), 2 (per-thread default) or a stream handle",
        )),
        v => u64::try_from(v)
            .map(Some)
            .map_err(|_| PyValueError::new_err(format!("stream must be -1, 1, 2 or a CUDA stream handle, not {v}"))),
    }
}

/// `CU_STREAM_LEGACY`: the legacy default stream's handle.
const CU_STREAM_LEGACY: u64 = 1;

/// The export of an array on `cuda:N` without a copy (module docs): a [`DeviceExport`] call
/// on the device's compute stream, ordered after every write of the array issued so far,
/// lends the storage and makes the consumer's stream wait for the compute stream there;
/// this waits (GIL released) until that call has been launched, not until it has run.
fn export_cuda<'py>(
    py: Python<'py>,
    arr: &PyArr,
    stream: Option<&Bound<'py, PyAny>>,
    max_version: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let consumer = consumer_stream(stream)?;
    let versioned = wants_versioned(max_version)?;
    let (a, cx) = (&arr.a, arr.a.context());
    let t = a.tensor_unflushed();
    let compute = cx.vm().compute_stream(t.device()).py_err()?;
    let pending = Pending::register(consumer);
    let token = pending.token;
    let op = Op::of_kernel(&DEVICE_EXPORT, &[DeviceType::Cuda, DeviceType::Mock]);
    let built = cx.build(&[], |b| b.call_into(op, &[t], &[], Attrs::scalar(token as f64), compute));
    if let Err(e) = issued(py, cx, built) {
        Pending::forget(token);
        return Err(e);
    }
    flush(py, cx);
    let answer = {
        let pending = pending.clone();
        wait(py, move || pending.wait())?
    };
    let loan = match answer {
        Ok(Lent::Device(l)) => l,
        Ok(Lent::Host(_)) => unreachable!("a CUDA array's storage is device memory"),
        Err(why) => {
            // Skipped: the array carries an error, or was never written. Raise the array's
            // own error, typed, where it has one.
            let t = t.clone();
            wait(py, move || t.wait())?.py_err()?;
            return Err(PyBufferError::new_err(format!("the array cannot be exported: {why}")));
        }
    };
    let data = loan.addr() as usize as *mut c_void;
    let device = DlDevice { device_type: DL_CUDA, device_id: i32::from(t.device().index) };
    // The call gets a view that is not all of its storage as a contiguous copy (a kernel
    // over whole operands): the consumer gets that copy.
    let copied = !t.is_whole();
    Ok(make_capsule(py, t, data, device, Held::Device(loan), versioned, copied, None)?.into_any())
}

/// What a [`DeviceExport`] call lent.
enum Lent {
    Device(DeviceLoan),
    Host(#[allow(dead_code)] HostLoan),
}

/// A DLPack export waiting for its [`DeviceExport`] call, which the call's scalar attribute
/// names (`token`).
struct Pending {
    token: u64,
    /// The consumer's stream to order after the VM's writes (`None`: no synchronisation).
    consumer: Option<u64>,
    answer: Mutex<Option<std::result::Result<Lent, String>>>,
    answered: Condvar,
}

/// Exports waiting for their calls, by token.
static PENDING: Mutex<Option<HashMap<u64, Arc<Pending>>>> = Mutex::new(None);
/// The next token; tokens stay below 2^53, so that an `f64` attribute carries them exactly.
static NEXT_TOKEN: AtomicU64 = AtomicU64::new(1);

impl Pending {
    fn register(consumer: Option<u64>) -> Arc<Pending> {
        let token = NEXT_TOKEN.fetch_add(1, Ordering::Relaxed) % (1 << 53);
        let p = Arc::new(Pending { token, consumer, answer: Mutex::new(None), answered: Condvar::new() });
        PENDING.lock().get_or_insert_with(HashMap::new).insert(token, p.clone());
        p
    }

    /// The export that `token` names, taken out of the table (each call answers once).
    fn take(token: u64) -> Option<Arc<Pending>> {
        PENDING.lock().as_mut().and_then(|m| m.remove(&token))
    }

    fn forget(token: u64) {
        drop(Pending::take(token));
    }

    fn answer(&self, r: std::result::Result<Lent, String>) {
        *self.answer.lock() = Some(r);
        self.answered.notify_all();
    }

    /// Block until the call has answered (on a helper thread: `wait`).
    fn wait(&self) -> std::result::Result<Lent, String> {
        let mut a = self.answer.lock();
        loop {
            if let Some(r) = a.take() {
                return r;
            }
            self.answered.wait(&mut a);
        }
    }
}

/// Answers its export when dropped without having answered (a panic in the kernel).
struct Answer(Option<Arc<Pending>>);

impl Answer {
    fn give(mut self, r: std::result::Result<Lent, String>) {
        if let Some(p) = self.0.take() {
            p.answer(r);
        }
    }
}

impl Drop for Answer {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            p.answer(Err("the export's call panicked".into()));
        }
    }
}

/// The call behind a device export (`dlpack_export`): one input, no output. Its read
/// access orders it after every write of the array issued before it, on the device (the
/// builder's stream waits); at its launch it lends the input's storage and, on CUDA, makes
/// the consumer's stream wait for its own stream there; it answers the waiting export then,
/// or when the VM skips it (an input that carries an error or was never written).
/// Registered on the mock device too, where it lends the host view and orders nothing
/// (the tests' way to run it without a GPU).
struct DeviceExport;

static DEVICE_EXPORT_KERNEL: DeviceExport = DeviceExport;
static DEVICE_EXPORT: &dyn OpKernel = &DEVICE_EXPORT_KERNEL;

impl OpKernel for DeviceExport {
    fn name(&self) -> &'static str {
        "dlpack_export"
    }

    fn infer(
        &self,
        inputs: &[&TensorMeta],
        _given: &[&TensorMeta],
        _attrs: &Attrs,
        _outputs: &mut OutSpecs,
    ) -> std::result::Result<(), String> {
        match inputs.len() {
            1 => Ok(()),
            n => Err(format!("dlpack_export takes one input, not {n}")),
        }
    }

    fn compute(&self, ctx: &mut KernelCtx<'_, '_>) -> std::result::Result<(), String> {
        let token = ctx.attrs.int() as u64;
        let Some(p) = Pending::take(token) else {
            return Err(format!("no export waits for call {token}"));
        };
        let consumer = p.consumer;
        let answer = Answer(Some(p));
        let input = ctx.inputs.first().ok_or("missing input 0")?;
        let r = match input.data.lend_device() {
            Some(loan) => match consumer {
                Some(c) if !loan.is_empty() => {
                    crate::ep::cuda::order_after_current(c).map(|()| Lent::Device(loan))
                }
                _ => Ok(Lent::Device(loan)),
            },
            None => Ok(Lent::Host(input.data.lend())),
        };
        // A failure is the export's (it raises), not the VM's: nothing was written.
        answer.give(r);
        Ok(())
    }

    fn skipped_call(&self, attrs: &Attrs, why: &dyn std::fmt::Display) {
        if let Some(p) = Pending::take(attrs.int() as u64) {
            p.answer(Err(why.to_string()));
        }
    }
}

/// Leak an `Exported` of `t`'s metadata over `data` and wrap it in a capsule: the
/// elements in row-major order, or at `strides` (in elements) where given.
#[allow(clippy::too_many_arguments)]
fn make_capsule<'py>(
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
    super::issue::access(py, &copied, HostAccess::Wait)?.py_err()?;
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

    /// Run a device export's call on `t` (on `mock:0`, where it lends the host view) and
    /// return its answer.
    fn export_call(vm: &crate::VirtualMachine, t: &Tensor) -> std::result::Result<Lent, String> {
        let p = Pending::register(Some(7));
        let op = Op::of_kernel(&DEVICE_EXPORT, &[DeviceType::Cuda, DeviceType::Mock]);
        let s = vm.compute_stream(DeviceId::mock(0)).unwrap();
        vm.run(|b| b.call_into(op, &[t], &[], Attrs::scalar(p.token as f64), s)).unwrap();
        let r = p.wait();
        assert!(Pending::take(p.token).is_none(), "a call answers once and leaves the table");
        r
    }

    fn mock_vm() -> crate::VirtualMachine {
        crate::VirtualMachine::new(crate::Config { mock_devices: 1, ..crate::Config::default() }).unwrap()
    }

    #[test]
    fn a_device_export_lends_the_storage_after_the_writes_issued_before_it() {
        let vm = mock_vm();
        let (scale, s) = (vm.op("scale").unwrap(), vm.compute_stream(DeviceId::mock(0)).unwrap());
        let x = vm.from_slice(&[1.0f32, 2.0, 3.0], &[3], DeviceId::mock(0)).unwrap();
        let y = vm.run(|b| b.call(scale, &[&x], Attrs::scalar(2.0), s)).unwrap();
        let loan = match export_call(&vm, &y) {
            Ok(Lent::Host(l)) => l,
            Ok(Lent::Device(_)) => panic!("mock memory is host memory"),
            Err(e) => panic!("{e}"),
        };
        assert_eq!(loan.len(), 12);
        // The mock stream ran `scale` before the call that answered (stream order), so the
        // product is there now, without a wait; and the loan outlives the tensor and the VM.
        let read = |loan: &HostLoan| {
            // SAFETY: the loan keeps 12 bytes allocated; nothing issued after the export
            // writes them.
            unsafe { std::slice::from_raw_parts(loan.as_ptr().cast::<f32>(), 3) }.to_vec()
        };
        assert_eq!(read(&loan), [2.0, 4.0, 6.0]);
        drop((x, y, vm));
        assert_eq!(read(&loan), [2.0, 4.0, 6.0]);
    }

    #[test]
    fn a_device_export_of_a_failed_or_unwritten_tensor_answers_with_the_reason() {
        let vm = mock_vm();
        let (fail, s) = (vm.op("fail").unwrap(), vm.compute_stream(DeviceId::mock(0)).unwrap());
        let e = vm.empty(&[2], DType::F32, DeviceId::mock(0)).unwrap();
        vm.run(|b| b.call_into(fail, &[], &[&e], Attrs::scalar(42.0), s)).unwrap();
        let why = export_call(&vm, &e).err().expect("skipped");
        assert!(why.contains("42"), "{why}");
        let never = vm.empty(&[2], DType::F32, DeviceId::mock(0)).unwrap();
        let why = export_call(&vm, &never).err().expect("skipped");
        assert!(why.contains("before anything wrote it"), "{why}");
        // Neither is a failure of the export: only the `fail` call failed.
        assert!(vm.sync().is_err());
        assert!(vm.sync().is_ok());
    }

    #[test]
    fn consumer_streams_follow_the_protocol() {
        pyo3::prepare_freethreaded_python();
        Python::with_gil(|py| {
            let int = |v: i64| v.into_pyobject(py).unwrap().into_any();
            assert_eq!(consumer_stream(None).unwrap(), Some(CU_STREAM_LEGACY));
            assert_eq!(consumer_stream(Some(&py.None().into_bound(py))).unwrap(), Some(CU_STREAM_LEGACY));
            assert_eq!(consumer_stream(Some(&int(-1))).unwrap(), None);
            assert_eq!(consumer_stream(Some(&int(1))).unwrap(), Some(1));
            assert_eq!(consumer_stream(Some(&int(2))).unwrap(), Some(2));
            assert_eq!(consumer_stream(Some(&int(0x7f00_1234))).unwrap(), Some(0x7f00_1234));
            assert!(consumer_stream(Some(&int(0))).unwrap_err().to_string().contains("ambiguous"));
            assert!(consumer_stream(Some(&int(-2))).is_err());
            let text = "s".into_pyobject(py).unwrap().into_any();
            assert!(consumer_stream(Some(&text)).unwrap_err().is_instance_of::<PyTypeError>(py));
        });
    }

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
        // SAFETY: 16 initialised bytes of two words.
        let back = unsafe { std::slice::from_raw_parts(words.as_ptr().cast::<u8>(), 16) };
        assert_eq!(&back[..11], &bytes[..]);
        assert_eq!(&back[11..], &[0; 5]);
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
