//! The error type of the whole crate.
//!
//! Every failure a user can cause or meet is a value of [`Error`]: bad calls are refused by
//! the builder before anything runs; failures at run time (a kernel that returns an error or
//! panics, a device error) are stored on the tensors the failed instruction writes and
//! returned by every later wait or read of those tensors. The VM itself keeps running.
//! `docs/errors.md` lists each variant with what to do about it.

use crate::ep::{DeviceId, EpError};
use crate::vm::DType;

/// Result with the crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in eagervm.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub enum Error {
    /// The builder was asked for an op that has no kernel for the stream's device.
    #[error("unknown op `{op}` on {device} (registered ops: {known})")]
    UnknownOp {
        /// The op name asked for.
        op: String,
        /// The device of the stream it was called on.
        device: DeviceId,
        /// The ops registered for that device.
        known: String,
    },
    /// The op refused its operands (count, shape or dtype).
    #[error("op `{op}`: {detail}")]
    InvalidOperands {
        /// The op.
        op: String,
        /// What is wrong, naming the operand.
        detail: String,
    },
    /// A given output tensor does not have the shape or dtype the op produces.
    #[error("op `{op}`: output {index} is {found}, but the op produces {expected}")]
    OutputMismatch {
        /// The op.
        op: String,
        /// Which output.
        index: usize,
        /// What the op produces.
        expected: String,
        /// What the given tensor is.
        found: String,
    },
    /// A tensor is used on a stream of another device (copy across devices with `copy`).
    #[error("op `{op}`: tensor {tensor} is on {tensor_device}, but the stream is on {stream_device}")]
    WrongDevice {
        /// The op.
        op: String,
        /// The tensor's id.
        tensor: u64,
        /// Where the tensor lives.
        tensor_device: DeviceId,
        /// Where the stream runs.
        stream_device: DeviceId,
    },
    /// An output tensor is also an input of the same call (or shares its storage with one,
    /// or with another output), and the op does not work in place.
    #[error("op `{op}`: tensor {tensor} is both an input and an output (or shares its storage with another operand); write to a new tensor")]
    Aliased {
        /// The op.
        op: String,
        /// The tensor's id.
        tensor: u64,
    },
    /// An output's elements overlap an input's, or each other, other than element for
    /// element (an in-place op writes exactly the elements it reads): the result would
    /// depend on the order the kernel visits them, as PyTorch refuses too.
    #[error("op `{op}`: output tensor {output} {detail}; clone() the input first")]
    Overlap {
        /// The op.
        op: String,
        /// The output's id.
        output: u64,
        /// Which elements overlap: `overlaps input tensor 3 (f32[4] (offset 1) of a storage
        /// of 5)`, `writes some elements more than once (strides [0, 1])`.
        detail: String,
    },
    /// A tensor made by another virtual machine was given to this one (each VM tracks the
    /// dependences of its own tensors only).
    #[error("op `{op}`: tensor {tensor} belongs to another virtual machine")]
    ForeignTensor {
        /// The op (`write` for a host write).
        op: String,
        /// The tensor's id (in the VM that made it).
        tensor: u64,
    },
    /// A tensor was used after its storage was released.
    #[error("tensor {tensor} was used after it was released")]
    Released {
        /// The tensor's id.
        tensor: u64,
    },
    /// A host access with the wrong dtype or length.
    #[error("host access to tensor {tensor}: {detail}")]
    Access {
        /// The tensor's id.
        tensor: u64,
        /// What is wrong.
        detail: String,
    },
    /// A tensor was read before anything wrote it.
    #[error("instruction #{instr} (`{op}`): tensor {tensor} is read before anything wrote it")]
    Uninitialized {
        /// Program-order number of the reading instruction.
        instr: u64,
        /// The op.
        op: String,
        /// The tensor's id.
        tensor: u64,
    },
    /// A kernel returned an error.
    #[error("instruction #{instr} (`{op}` on {stream}) failed: {message}")]
    Kernel {
        /// Program-order number of the failed instruction.
        instr: u64,
        /// The op.
        op: String,
        /// The stream it ran on.
        stream: String,
        /// The kernel's message.
        message: String,
    },
    /// A kernel panicked; the panic was caught on the worker.
    #[error("instruction #{instr} (`{op}` on {stream}) panicked: {message}")]
    Panic {
        /// Program-order number of the failed instruction.
        instr: u64,
        /// The op.
        op: String,
        /// The stream it ran on.
        stream: String,
        /// The panic payload, if it was a string.
        message: String,
    },
    /// An instruction could not get memory for its outputs (after the device's allocator
    /// freed its cache and retried once).
    #[error("instruction #{instr} (`{op}` on {stream}) cannot allocate its outputs: {source}")]
    Alloc {
        /// Program-order number of the failed instruction.
        instr: u64,
        /// The op.
        op: String,
        /// The stream it ran on.
        stream: String,
        /// The device's error (usually [`EpError::OutOfMemory`]).
        source: EpError,
    },
    /// A tensor is too large: its size in bytes is over the VM's cap on one tensor
    /// ([`Config::max_tensor_bytes`](crate::vm::Config::max_tensor_bytes)), or its element
    /// count or size overflows. Refused before anything runs, by the one size check
    /// (`framework::shape::check`) that `vm.empty`, `vm.from_slice`, the builder, the eager
    /// front end and the trace validator share.
    #[error("{at}: {} is too large: {}", describe(*dtype, shape), why_too_large(*dtype, *bytes, *limit))]
    TooLarge {
        /// Where it was asked for: `` `empty` on cpu:0 ``, `` output 0 of `matmul` on cpu:0 ``,
        /// `tensor t3` (of a trace).
        at: String,
        /// The shape asked for.
        shape: Vec<usize>,
        /// Its dtype.
        dtype: DType,
        /// Its size in bytes; `None` when the product of its nonzero dimensions and its
        /// element size overflows a `usize`.
        bytes: Option<u64>,
        /// The cap on one tensor's bytes in force.
        limit: u64,
    },
    /// The device layer failed.
    #[error(transparent)]
    Device(#[from] EpError),
    /// A dtype the call cannot handle.
    #[error("dtype mismatch: expected {expected}, found {found}")]
    DType {
        /// The dtype wanted.
        expected: DType,
        /// The dtype found.
        found: DType,
    },
    /// A configuration value is out of range.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// A collective call or a communicator that cannot be: a name already taken, a member
    /// on a device this VM lacks, a communicator of another VM, a backend that cannot start.
    #[error("communicator `{comm}`: {detail}")]
    Collective {
        /// The communicator's name.
        comm: String,
        /// What is wrong.
        detail: String,
    },
    /// The VM has shut down (or its scheduler thread died) and can take no more work.
    #[error("the virtual machine has shut down")]
    ShutDown,
    /// Some instructions failed since the last `sync`.
    #[error("{count} instruction(s) failed since the last sync; first: {first}")]
    Failed {
        /// How many failed.
        count: u64,
        /// The first failure.
        first: Box<Error>,
    },
}

/// `f32[2, 3]`: a shape as messages show it.
fn describe(dtype: DType, shape: &[usize]) -> String {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    format!("{dtype}[{}]", dims.join(", "))
}

/// The reason part of [`Error::TooLarge`]'s message.
fn why_too_large(dtype: DType, bytes: Option<u64>, limit: u64) -> String {
    let cap = "Config::max_tensor_bytes, EAGERVM_MAX_TENSOR_BYTES";
    match bytes {
        Some(b) => format!("{b} bytes, over the limit of {limit} bytes on one tensor ({cap})"),
        None => format!(
            "the product of its nonzero dimensions and its element size ({} bytes) overflows {} bits \
             (the limit on one tensor is {limit} bytes: {cap})",
            dtype.size(),
            usize::BITS
        ),
    }
}
