//! The export of an array on `cuda:N` without a copy (`python::dlpack`, "CUDA memory"):
//! a [`DeviceExport`] call on the device's compute stream lends the storage at its launch
//! and makes the consumer's stream wait for the compute stream there; the export waits for
//! that launch only ([`Pending`]).

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};
use pyo3::exceptions::{PyBufferError, PyTypeError, PyValueError};
use pyo3::prelude::*;

use super::capsule::{make_capsule, wants_versioned, Held};
use super::ffi::{DlDevice, DL_CUDA};
use crate::alloc::DeviceLoan;
use crate::eager::Array;
use crate::ep::DeviceType;
use crate::framework::{Attrs, HostLoan, Op};
use crate::python::errors::IntoPy;
use crate::python::issue::{flush, issued};
use crate::python::wait::wait;
use crate::vm::{KernelCtx, OpKernel, OutSpecs, TensorMeta};

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
pub(super) fn export_cuda<'py>(
    py: Python<'py>,
    a: &Array,
    stream: Option<&Bound<'py, PyAny>>,
    max_version: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let consumer = consumer_stream(stream)?;
    let versioned = wants_versioned(max_version)?;
    let (t, cx) = (a.tensor_unflushed(), a.context());
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ep::DeviceId;
    use crate::framework::DType;
    use crate::framework::Tensor;

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
}
