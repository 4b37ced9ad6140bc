//! Instruction policies: what running each kind of instruction does to its tensors, one
//! file per kind.
//!
//! [`execute`] runs on whichever thread executes the stream's work: the `ThreadCtx`
//! worker for synchronous (CPU) streams and for CUDA launches (which enqueue the kernels on
//! the device stream), the device's own thread for the mock device (the worker launches a
//! closure that calls it), or the caller in synchronous mode (the stream policies,
//! `vm::stream_policy`, say which). The dependence rules guarantee that while it runs, no
//! other instruction writes the tensors it reads or touches the tensors it writes.
//!
//! | instruction kind (`Body`) | file | what running it does |
//! | --- | --- | --- |
//! | `OpCall` | `op_call.rs` | allocate the outputs written for the first time, run the kernel on views of the operands |
//! | `Release` | `release.rs` | free the tensor's storage and clear its error |
//! | `Read`, `Wait`, `Write` | `access.rs` | host accesses: copy the bytes or the error out to the caller, or overwrite the tensor |
//! | `RecordEvent`, `StreamWaitEvent`, `WaitEvent` | `event.rs` | on a synchronous stream, nothing (the work before them is done); an event-recorded stream's worker handles them itself (`stream_policy::event`) |
//! | `Barrier` | `barrier.rs` | in synchronous mode, run its callback (otherwise the scheduler runs it: `stream_policy::scheduler`) |
//!
//! # Errors are values
//!
//! Errors are values (DESIGN.md): a kernel that fails or panics stores an [`Error`] on
//! every tensor it writes; an instruction that reads a tensor carrying an error skips its
//! kernel and stores the same error on its outputs; a later successful write clears it.
//!
//! Out of memory is one of those errors: storage is allocated here, fallibly
//! ([`HostAllocator::alloc_tensor`]), when a call or a host write first writes a tensor; an
//! allocation that fails stores [`Error::Alloc`] on every tensor the instruction writes, and
//! the kernel does not run. A host read's copy for the caller is allocated fallibly too; if
//! it fails, the read returns `Error::Alloc` to its caller and the tensor is untouched.
//!
//! # How to add an instruction kind
//!
//! 1. Its `Body` variant in `src/vm/instruction.rs`, with its name in `Body::name`.
//! 2. Its file here, `src/vm/instruction_policy/<kind>.rs`, declared below, with the
//!    function that runs it.
//! 3. The one `match` arm in [`execute_other`] that calls it.
//! 4. Its observer view: an `InstrKind` variant in `src/vm/observe/mod.rs` and its arm in
//!    `InstrView::kind`.
//! 5. If traces record it: its record in the trace format (`src/trace/record.rs`,
//!    `src/trace/parse.rs`, `docs/trace-format.md`).
//!
//! A kind the scheduler runs itself, rather than a worker, also takes the scheduler-thread
//! stream policy: `StreamPolicy::on_scheduler` in `src/vm/stream_policy/kind.rs`.

mod access;
mod barrier;
mod event;
mod op_call;
mod release;

use std::sync::Arc;

use parking_lot::Mutex;

use crate::alloc::HostAllocator;
use crate::vm::Error;

use super::instruction::{Body, Instruction, Operand};
pub(crate) use op_call::kernel_failed;
use op_call::{fail, op_call};

/// Failures since the last `sync`, shared by every executor of a VM.
#[derive(Debug, Default)]
pub(crate) struct FailureLog {
    inner: Mutex<(u64, Option<Error>)>,
    /// Kernel panics caught over the VM's life: their count and the first
    /// [`KEPT_PANICS`], which `sync` does not take.
    panics: Mutex<(u64, Vec<Error>)>,
}

/// The caught panics a [`FailureLog`] keeps the errors of (it counts them all).
pub(crate) const KEPT_PANICS: usize = 16;

impl FailureLog {
    /// Note a caught kernel panic (its error is also recorded as a failure, by [`fail`]).
    fn record_panic(&self, e: &Error) {
        let mut g = self.panics.lock();
        g.0 += 1;
        if g.1.len() < KEPT_PANICS {
            g.1.push(e.clone());
        }
    }

    /// The kernel panics caught so far: their count, and the errors of the first
    /// [`KEPT_PANICS`].
    pub(crate) fn panics(&self) -> (u64, Vec<Error>) {
        self.panics.lock().clone()
    }

    fn record(&self, e: &Error) {
        let mut g = self.inner.lock();
        g.0 += 1;
        if g.1.is_none() {
            g.1 = Some(e.clone());
        }
    }

    /// Record a failure that no tensor carries (a device that refused a launch).
    pub(crate) fn record_external(&self, e: Error) {
        self.record(&e);
    }

    /// Take the failures recorded so far (count and first), resetting the log.
    pub(crate) fn take(&self) -> Option<Error> {
        let mut g = self.inner.lock();
        let (count, first) = std::mem::take(&mut *g);
        first.map(|f| Error::Failed { count, first: Box::new(f) })
    }
}

/// What an executor needs besides the instruction.
#[derive(Debug)]
pub(crate) struct ExecEnv {
    pub(crate) stream_name: String,
    pub(crate) alloc: Arc<HostAllocator>,
    pub(crate) failures: Arc<FailureLog>,
}

/// Run `ins` in place. `program` is its program number, for the errors it may raise. A
/// `Barrier` reaches here only in synchronous mode (the scheduler runs barriers itself
/// otherwise); its callback is taken out and called. A synchronous worker then empties the
/// batch, dropping what the instructions still hold, and hands it back to the pool.
///
/// A kernel's panic unwinds out of this function: the caller catches it (a worker once per
/// batch; [`execute_catching`] once per instruction, for work launched on an asynchronous
/// stream and in synchronous mode) and hands it to [`panicked`]. Catching once per batch
/// keeps the landing pad, and the indirect call it takes, off every instruction.
///
/// A call, the common case, is run here, inlined into the worker's loop; every other kind
/// goes to [`execute_other`], kept out of line.
#[inline(always)]
pub(crate) fn execute(body: &mut Body, n_inputs: u8, ops: &[Operand], program: u64, env: &ExecEnv) {
    execute_at(body, n_inputs, ops, || program, env)
}

/// [`execute`], the program number asked for only where an error names it: the worker's
/// loop works it out from the instruction's place in its batch, off the common path.
#[inline(always)]
pub(crate) fn execute_at(
    body: &mut Body,
    n_inputs: u8,
    ops: &[Operand],
    program: impl Fn() -> u64 + Copy,
    env: &ExecEnv,
) {
    if let &mut Body::OpCall { kernel, attrs } = body {
        let (inputs, outputs) = ops.split_at(n_inputs as usize);
        op_call(kernel.get(), attrs, inputs, outputs, program, env);
    } else {
        execute_other(body, ops, program(), env);
    }
}

/// [`execute`] for everything but a call: the one `match` over the other kinds, each arm a
/// call into its kind's file.
#[inline(never)]
fn execute_other(body: &mut Body, ops: &[Operand], program: u64, env: &ExecEnv) {
    match body {
        Body::OpCall { .. } => unreachable!("calls are run by `execute`"),
        Body::Release { .. } => release::release(ops),
        Body::Read(slot) => access::read_access(&ops[0], slot, false, program, env),
        Body::Wait(slot) => access::read_access(&ops[0], slot, true, program, env),
        Body::Write(bytes) => access::write_access(&ops[0], bytes, program, env),
        Body::RecordEvent { .. } | Body::StreamWaitEvent { .. } => event::record_or_wait(),
        Body::WaitEvent { event } => event::wait_event(event),
        Body::Barrier { callback } => barrier::run(callback),
    }
}

/// [`execute`], catching a panic: for work launched on an asynchronous stream (run on the
/// mock device's thread, or on the worker by a CUDA launch) and in synchronous mode.
pub(crate) fn execute_catching(ins: &mut Instruction, ops: &[Operand], program: u64, env: &ExecEnv) {
    if let Err(payload) =
        crate::vm::panic_hook::catching(|| execute(&mut ins.body, ins.n_inputs, ops, program, env))
    {
        panicked(ins, ops, program, payload, env);
    }
}

/// `ins` panicked while it ran (its kernel, as a rule): it failed, and the tensors it
/// writes carry an [`Error::Panic`] with the panic's message.
#[cold]
pub(crate) fn panicked(
    ins: &Instruction,
    ops: &[Operand],
    program: u64,
    payload: Box<dyn std::any::Any + Send>,
    env: &ExecEnv,
) {
    let message = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".into());
    let e =
        Error::Panic { instr: program, op: ins.body.name().into(), stream: env.stream_name.clone(), message };
    env.failures.record_panic(&e);
    fail(&ops[ins.n_inputs as usize..], e, env);
}
