//! DLPack exchange without copies, of host and CUDA memory (`docs/python.md`, "DLPack").
//!
//! - **Export** (`Array.__dlpack__`): the array's own host storage, lent
//!   ([`Tensor::lend_host`](crate::framework::Tensor::lend_host)), as a `DLManagedTensorVersioned` (capsule `dltensor_versioned`)
//!   when the consumer asks for DLPack 1.x, else as a `DLManagedTensor` (`dltensor`). The
//!   manager context owns the loan; the deleter, called by the consumer on any thread,
//!   drops it and frees the struct. It never touches Python.
//! - **Import** (`VM.from_dlpack`): the producer's capsule is renamed `used_…` (it is ours
//!   from then on) and its memory becomes a VM tensor's storage
//!   ([`VirtualMachine::from_host_memory`](crate::VirtualMachine::from_host_memory)). The
//!   VM frees that storage on one of its threads, and the producer's deleter, which may need
//!   the GIL, runs at the binding's next call ([`deleters`](super::deleters)).
//! - **CUDA memory**, both ways, ordered on the device by DLPack's `stream` protocol. An
//!   export of an array on `cuda:N` issues a [`DeviceExport`](device_export::DeviceExport) call on the device's compute
//!   stream, which the VM orders after the array's writes as any reader; at its launch it
//!   lends the device storage ([`Storage::lend_device`](crate::alloc::Storage::lend_device))
//!   and makes the consumer's stream wait for the compute stream (an event), and answers
//!   the export, which waits only for that launch ([`Pending`](device_export::Pending)). An import passes the VM's
//!   compute stream as `stream=`, so the producer orders its pending work before it, wraps
//!   the producer's pointer as device storage
//!   ([`VirtualMachine::from_device_memory`](crate::VirtualMachine::from_device_memory)),
//!   and writes the array with a `noop` on that stream, which the VM's other streams then
//!   follow.
//!
//! The files: the C structs ([`ffi`]); the capsule an export makes ([`capsule`]); the
//! export of host memory ([`export`]) and of CUDA memory ([`device_export`]); the import
//! ([`import`]).

mod capsule;
mod device_export;
mod export;
mod ffi;
mod import;

pub(crate) use export::export;
pub(crate) use ffi::DL_CUDA;
pub(crate) use import::import;
