//! The call path: running an `OpCall`'s kernel on its operands.
//!
//! A call, the common instruction, runs inlined into the worker's loop ([`execute`]); the
//! common shapes of call run with their operand counts known, every other shape out of line
//! ([`op_call_general`], [`op_call_many`]). A call skips its kernel and carries an input's
//! error on to its outputs; a kernel that fails, and an output that cannot be allocated,
//! store an error on every output ([`fail`], the parent module's docs).
//!
//! [`execute`]: super::execute

use std::sync::Arc;

use smallvec::SmallVec;

use crate::alloc::Contents;
use crate::vm::tensor::Fetch;
use crate::vm::Error;
use crate::vm::{Attrs, KernelCtx, OpKernel, TensorView, TensorViewMut};

use super::super::instruction::Operand;
use super::ExecEnv;

/// Views of a call's operands, made in place as the operands are read: a buffer that
/// takes view `k` into slot `k` and lends the first `n` slots out as a slice.
trait Views<T> {
    fn new() -> Self;
    /// Put view `k` in slot `k`.
    fn put(&mut self, k: usize, v: T);
    /// The views in slots `0..n`.
    ///
    /// # Safety
    /// Each of slots `0..n` has been given a view by [`put`](Self::put).
    unsafe fn as_mut_slice(&mut self, n: usize) -> &mut [T];
}

impl<T, const N: usize> Views<T> for SmallVec<[T; N]> {
    #[inline(always)]
    fn new() -> Self {
        SmallVec::new()
    }
    #[inline(always)]
    fn put(&mut self, _k: usize, v: T) {
        // Views are put in order, so slot `k` is the next one; after a gap (an input without
        // storage) they shift, but then none is lent.
        SmallVec::push(self, v)
    }
    #[inline(always)]
    unsafe fn as_mut_slice(&mut self, n: usize) -> &mut [T] {
        &mut self[..n]
    }
}

/// At most `N` views, kept in the frame with no length: view `k` goes to slot `k`, so the
/// common call (few operands, their number known where the call is inlined) pays no
/// bookkeeping per view.
struct Fixed<T, const N: usize> {
    buf: [std::mem::MaybeUninit<T>; N],
}

impl<T, const N: usize> Views<T> for Fixed<T, N> {
    #[inline(always)]
    fn new() -> Self {
        Fixed { buf: [const { std::mem::MaybeUninit::uninit() }; N] }
    }
    #[inline(always)]
    fn put(&mut self, k: usize, v: T) {
        // `op_call` picks the buffer by operand count; the index check keeps a slot beyond
        // the buffer from being written if a caller did otherwise.
        self.buf[k].write(v);
    }
    #[inline(always)]
    unsafe fn as_mut_slice(&mut self, n: usize) -> &mut [T] {
        // SAFETY: slots `0..n` were written by `put` (the caller's contract) and never
        // moved out; the slicing checks that `n` is within the buffer.
        unsafe { std::slice::from_raw_parts_mut(self.buf[..n].as_mut_ptr().cast::<T>(), n) }
    }
}

// Views are references only: forgetting them (`Fixed` has no `Drop`) leaks nothing.
const _: () = assert!(!std::mem::needs_drop::<TensorView<'static>>());
const _: () = assert!(!std::mem::needs_drop::<TensorViewMut<'static>>());

/// Inputs and outputs a call may have for its views to live in fixed buffers.
const FIXED_INPUTS: usize = 16;
const FIXED_OUTPUTS: usize = 4;
/// The fixed buffers of the common shapes of call, inlined into the worker's loop (at most
/// two inputs and one output).
const INLINE_INPUTS: usize = 2;
const INLINE_OUTPUTS: usize = 1;

/// Run a call's kernel on its operands (the module docs say what happens on errors).
///
/// The common shapes of call (no input or one or two, and one output: fills, unary and
/// binary ops) are run here, inlined into the worker's loop, each with its operand counts
/// known, so that the loops over operands unroll and the views go straight to their slots;
/// every other shape goes to [`op_call_general`], out of line. (With the counts known, a
/// no-op call costs the worker much less: `docs/performance.md`, "Why the hot paths are
/// shaped so", has the measurement.)
#[inline(always)]
pub(super) fn op_call(
    kernel: &'static dyn OpKernel,
    attrs: Attrs,
    inputs: &[Operand],
    outputs: &[Operand],
    program: impl Fn() -> u64 + Copy,
    env: &ExecEnv,
) {
    type In<'t> = Fixed<TensorView<'t>, INLINE_INPUTS>;
    type Out<'t> = Fixed<TensorViewMut<'t>, INLINE_OUTPUTS>;
    match (inputs.len(), outputs.len()) {
        (0, 1) => op_call_with::<In, Out>(kernel, attrs, &inputs[..0], &outputs[..1], program, env),
        (1, 1) => op_call_with::<In, Out>(kernel, attrs, &inputs[..1], &outputs[..1], program, env),
        (2, 1) => op_call_with::<In, Out>(kernel, attrs, &inputs[..2], &outputs[..1], program, env),
        _ => op_call_general(kernel, attrs, inputs, outputs, program(), env),
    }
}

/// [`op_call`] for calls of any shape: views in fixed buffers up to [`FIXED_INPUTS`] inputs
/// and [`FIXED_OUTPUTS`] outputs, in small vectors beyond. (A small vector keeps its length
/// in memory and reloads it for every view it takes, a chain through memory that a fixed
/// buffer does not have: `docs/performance.md`, "Why the hot paths are shaped so", has the
/// measurement.)
#[inline(never)]
fn op_call_general(
    kernel: &'static dyn OpKernel,
    attrs: Attrs,
    inputs: &[Operand],
    outputs: &[Operand],
    program: u64,
    env: &ExecEnv,
) {
    if inputs.len() <= FIXED_INPUTS && outputs.len() <= FIXED_OUTPUTS {
        op_call_with::<Fixed<_, FIXED_INPUTS>, Fixed<_, FIXED_OUTPUTS>>(
            kernel,
            attrs,
            inputs,
            outputs,
            || program,
            env,
        )
    } else {
        op_call_many(kernel, attrs, inputs, outputs, program, env)
    }
}

/// A call with more operands than the fixed buffers take.
#[inline(never)]
fn op_call_many(
    kernel: &'static dyn OpKernel,
    attrs: Attrs,
    inputs: &[Operand],
    outputs: &[Operand],
    program: u64,
    env: &ExecEnv,
) {
    op_call_with::<SmallVec<[_; 8]>, SmallVec<[_; 2]>>(kernel, attrs, inputs, outputs, || program, env)
}

/// [`op_call`], its views made in buffers of types `I` (inputs) and `O` (outputs).
#[inline(always)]
fn op_call_with<'t, I: Views<TensorView<'t>>, O: Views<TensorViewMut<'t>>>(
    kernel: &'static dyn OpKernel,
    attrs: Attrs,
    inputs: &'t [Operand],
    outputs: &'t [Operand],
    program: impl Fn() -> u64 + Copy,
    env: &ExecEnv,
) {
    // Inputs, in one pass: one carrying an error makes this instruction skip its kernel and
    // carry the error on (whatever else is wrong); failing that, an input nothing has
    // written yet is an error of this instruction. Views are made as the inputs are read.
    // (Views are pushed in place, not collected and moved: a collected small vector is
    // written word by word and then copied in wider loads that the store buffer cannot
    // forward, a stall that costs more than the rest of a no-op's execution.)
    //
    // Values are reached through raw pointers, field by field: an output may share its
    // storage with an input (an in-place call), so no reference to a whole value is made
    // while views of its storage are alive. What is written through them is the `error`
    // field, and the `storage` field of an output nothing has written yet (which no input
    // view can point into: an unwritten input stops the call first).
    let mut ins = I::new();
    let mut uninitialized = None;
    for (k, op) in inputs.iter().enumerate() {
        // SAFETY: this OpCall is running, so each operand's tensor is alive
        // (`Operand::tensor`), and it holds a read access to each input's storage
        // (dependence rules): no other instruction writes the value meanwhile.
        // Each field is borrowed on its own: an output's `error` may be written below while
        // this input's storage is lent to its view.
        let (t, error, storage) = unsafe {
            let t = op.tensor();
            let v = t.value_ptr();
            (t, &(*v).error, &(*v).storage)
        };
        if let Some(e) = error {
            let e = e.clone();
            kernel.skipped_call(&attrs, &e);
            set_error(outputs, e);
            return;
        }
        match storage {
            Some(data) => ins.put(k, TensorView { meta: &t.meta, data }),
            None => uninitialized = uninitialized.or(Some(t.id)),
        }
    }
    if let Some(tensor) = uninitialized {
        read_unwritten(kernel, &attrs, outputs, tensor, program(), env);
        return;
    }
    // Outputs, in one pass: clear the error an earlier failed write left, if this write
    // replaces the whole storage (with nothing if the kernel succeeds, with its failure if
    // not; a write of part of a storage leaves the rest as it was, error included),
    // allocate those written for the first time, and make their views. (Cleared here rather
    // than after the kernel, nothing about the outputs is kept across the kernel's call.)
    let mut outs = O::new();
    for (k, op) in outputs.iter().enumerate() {
        // SAFETY: this OpCall is running, so each operand's tensor is alive; it holds the
        // write access to each output's storage. The builder refuses two outputs of one
        // storage, so each output's value is written through one pointer here.
        let (t, v) = unsafe {
            let t = op.tensor();
            (t, t.value_ptr())
        };
        // SAFETY: fields of a value this instruction may write (above); the `error` field is
        // never lent to a view.
        unsafe {
            if t.whole && (*v).error.is_some() {
                (*v).error = None;
            }
        }
        // SAFETY: as above; an output without storage shares none with an input (an input
        // without storage returned above), so no view points into this field while it is
        // written.
        if unsafe { (*v).storage.is_none() } {
            let owner = t.owner();
            // A kernel that writes its outputs whole overwrites every byte of an output that
            // is its whole storage (an owner, row-major or laid out like a pointwise op's
            // inputs, or a view of all of it in row-major order): no need to zero it
            // (`alloc::request`, "Unzeroed blocks").
            let all = t.whole || !t.is_view();
            let contents = if all && kernel.writes_outputs() { Contents::Unzeroed } else { Contents::Zeroed };
            match env.alloc.alloc_tensor(owner.id, owner.meta.device, owner.meta.bytes(), contents) {
                // SAFETY: as above.
                Ok(s) => unsafe { (*v).storage = Some(s) },
                Err(source) => {
                    drop(outs);
                    let e = Error::Alloc {
                        instr: program(),
                        op: kernel.name().into(),
                        stream: env.stream_name.clone(),
                        source,
                    };
                    kernel.skipped_call(&attrs, &e);
                    fail(outputs, e, env);
                    return;
                }
            }
        }
        // SAFETY: as above; from here on the field is only read, by views.
        let data = unsafe { (*v).storage.as_ref() }.expect("allocated above");
        outs.put(k, TensorViewMut { meta: &t.meta, data });
    }
    // SAFETY: every input and every output got its view (an input without storage, the one
    // way to skip a view, returned above).
    let (in_views, out_views) = unsafe { (ins.as_mut_slice(inputs.len()), outs.as_mut_slice(outputs.len())) };
    let result = kernel.compute(&mut KernelCtx { attrs, inputs: in_views, outputs: out_views });
    drop((ins, outs));
    if let Err(message) = result {
        kernel_failed(kernel, outputs, message, program(), env);
    }
}

/// A call's kernel returned an error, or reported bad data in its stream's fault record
/// (`vm::stream_policy`, "Checked launches"): it fails, and its outputs carry the error.
#[cold]
#[inline(never)]
pub(crate) fn kernel_failed(
    kernel: &dyn OpKernel,
    outputs: &[Operand],
    message: String,
    program: u64,
    env: &ExecEnv,
) {
    let e =
        Error::Kernel { instr: program, op: kernel.name().into(), stream: env.stream_name.clone(), message };
    fail(outputs, e, env);
}

/// A call read `tensor`, which nothing has written: an error of the call, stored on its
/// outputs and counted, unless the call is the copy to the host that `Tensor::to_vec` of a
/// device tensor or a view makes (its one output is the VM's [`Fetch`] tensor). That copy is
/// part of a host access and answers as the read of an unwritten host tensor does: it
/// stores `Uninitialized` with the op `Access` on its output (the read returns it), not
/// counted: a read is not a failed instruction.
#[cold]
#[inline(never)]
fn read_unwritten(
    kernel: &dyn OpKernel,
    attrs: &Attrs,
    outputs: &[Operand],
    tensor: u64,
    program: u64,
    env: &ExecEnv,
) {
    // SAFETY: the call is running, so its one output's tensor is alive.
    let fetch = |o: &Operand| unsafe { o.tensor() }.fetch;
    match outputs {
        [o] if fetch(o) == Fetch::Read => {
            set_error(outputs, Arc::new(Error::Uninitialized { instr: program, op: "Access".into(), tensor }))
        }
        _ => {
            let e = Error::Uninitialized { instr: program, op: kernel.name().into(), tensor };
            kernel.skipped_call(attrs, &e);
            fail(outputs, e, env)
        }
    }
}

pub(super) fn fail(outputs: &[Operand], e: Error, env: &ExecEnv) {
    tracing::debug!(error = %e, "instruction failed");
    env.failures.record(&e);
    set_error(outputs, Arc::new(e));
}

fn set_error(outputs: &[Operand], e: Arc<Error>) {
    for op in outputs {
        // SAFETY: the caller is running the instruction (its tensors are alive) and holds
        // the write access to every output's storage; only the `error` field is written,
        // which no view of the storage points into (an input's view may be alive).
        unsafe { (*op.tensor().value_ptr()).error = Some(e.clone()) };
    }
}

#[cfg(test)]
mod tests {
    use super::super::FailureLog;
    use super::*;
    use crate::alloc::HostAllocator;
    use crate::ep::DeviceId;
    use crate::vm::instruction::{AccessMode, TensorPtr};
    use crate::vm::tensor::TensorInner;
    use crate::vm::{DType, OutSpecs, TensorMeta};

    fn first(b: &[u8]) -> f32 {
        f32::from_le_bytes(b[..4].try_into().expect("4 bytes"))
    }

    /// Writes, into output `k`, the sum over inputs `j` of `(j + 1) * x_j` plus `k + 1`,
    /// where `x_j` is input `j`'s first element (so a view of the wrong tensor, or in the
    /// wrong place, changes the result); fails unless it got as many views as the
    /// attributes say.
    struct Probe;

    impl OpKernel for Probe {
        fn name(&self) -> &'static str {
            "probe"
        }
        fn infer(
            &self,
            _: &[&TensorMeta],
            _: &[&TensorMeta],
            _: &Attrs,
            _: &mut OutSpecs,
        ) -> Result<(), String> {
            Ok(())
        }
        fn compute(&self, ctx: &mut KernelCtx<'_, '_>) -> Result<(), String> {
            if ctx.inputs.len() + ctx.outputs.len() != ctx.attrs.float() as usize {
                return Err(format!("{} + {} views", ctx.inputs.len(), ctx.outputs.len()));
            }
            let sum: f32 =
                ctx.inputs.iter().enumerate().map(|(j, v)| (j + 1) as f32 * first(v.data.as_bytes())).sum();
            for (k, o) in ctx.outputs.iter_mut().enumerate() {
                // SAFETY: the call holds the write access to each output, and the test's outputs
                // share no storage with its inputs.
                let out = unsafe { o.data.bytes_mut() };
                out[..4].copy_from_slice(&(sum + k as f32 + 1.0).to_le_bytes());
            }
            Ok(())
        }
    }

    /// Writes 7.0 into element 0 of its one output and nothing else; says it writes its
    /// outputs whole if `.0` (a lie, to see which blocks the VM leaves unzeroed).
    struct FirstOnly(bool);

    impl OpKernel for FirstOnly {
        fn name(&self) -> &'static str {
            "first_only"
        }
        fn infer(
            &self,
            _: &[&TensorMeta],
            _: &[&TensorMeta],
            _: &Attrs,
            _: &mut OutSpecs,
        ) -> Result<(), String> {
            Ok(())
        }
        fn writes_outputs(&self) -> bool {
            self.0
        }
        fn compute(&self, ctx: &mut KernelCtx<'_, '_>) -> Result<(), String> {
            let o = &ctx.outputs[0];
            let at = o.meta.offset * 4;
            // SAFETY: the call holds the write access to its output, and has no inputs.
            unsafe { o.data.bytes_mut()[at..at + 4].copy_from_slice(&7.0f32.to_le_bytes()) };
            Ok(())
        }
    }

    /// An output written for the first time gets a block that is not zeroed only when its
    /// kernel says it writes its outputs whole and the output is its whole storage: a kernel
    /// that does not say so, and a view of part of a storage, read zeros where nothing wrote,
    /// even from a block an earlier storage left dirty.
    #[test]
    fn only_whole_outputs_of_kernels_that_write_them_whole_get_unzeroed_blocks() {
        use crate::vm::tensor::MetaId;
        use std::ptr::NonNull;

        let (env, _) = setup(0);
        let meta = TensorMeta::new(&[16], DType::F32, DeviceId::CPU);
        let dirty = || {
            let mut s = env.alloc.alloc(64);
            s.as_bytes_mut().fill(0xAB);
            drop(s);
        };
        let run_on = |t: &TensorInner, kernel: &'static dyn OpKernel| {
            dirty();
            // SAFETY: `t` outlives the operand, and no instruction holds it.
            let out = Operand::new(unsafe { TensorPtr::new(t) }, AccessMode::Write);
            op_call(kernel, Attrs::default(), &[], &[out], || 1, &env);
            assert!(env.failures.take().is_none());
            // SAFETY: nothing else touches the tensor.
            let v = unsafe { t.value() };
            v.storage.as_ref().expect("written").as_f32().to_vec()
        };
        let dirt = f32::from_le_bytes([0xAB; 4]);
        let with = |at: usize, rest: f32| {
            let mut v = vec![rest; 16];
            v[at] = 7.0;
            v
        };
        let fresh = |id| *TensorInner::for_test(id, meta.clone());
        // A kernel that does not say it writes its outputs whole: zeros.
        assert_eq!(run_on(&fresh(1), &FirstOnly(false)), with(0, 0.0));
        // One that says so: the block as the earlier storage left it (the VM trusts it).
        assert_eq!(run_on(&fresh(2), &FirstOnly(true)), with(0, dirt));
        // A view of part of an unwritten storage: the storage is zeroed, whatever the kernel.
        let owner = fresh(3);
        let part = meta.with_layout(&[8], &[1], 8);
        // SAFETY: `owner` is an owner and outlives the view; no count is kept in this test.
        let view = unsafe { TensorInner::new_view(4, part, MetaId::NONE, NonNull::from(&owner), false) };
        assert_eq!(run_on(&view, &FirstOnly(true)), with(8, 0.0));
        // A view that is all of its storage is written whole.
        let owner = fresh(5);
        let all = meta.with_layout(&[16], &[1], 0);
        // SAFETY: as above.
        let view = unsafe { TensorInner::new_view(6, all, MetaId::NONE, NonNull::from(&owner), false) };
        assert_eq!(run_on(&view, &FirstOnly(true)), with(0, dirt));
    }

    /// An executor's environment on the CPU, and `n` one-element `f32` tensors, unwritten (the
    /// vector is never grown, so the tensors stay where operands point).
    fn setup(n: u64) -> (ExecEnv, Vec<TensorInner>) {
        let env = ExecEnv {
            stream_name: "cpu:0/compute".into(),
            alloc: HostAllocator::new("test"),
            failures: Arc::new(FailureLog::default()),
        };
        let meta = TensorMeta::new(&[1], DType::F32, DeviceId::CPU);
        (env, (0..n).map(|i| *TensorInner::for_test(i, meta.clone())).collect())
    }

    #[test]
    fn calls_with_few_and_many_operands_see_each_operand_in_place() {
        let (env, tensors) = setup(24);
        // Inputs: tensor j holds j + 1.
        for (j, t) in tensors.iter().enumerate().take(18) {
            let mut s = env.alloc.alloc(4);
            s.as_bytes_mut().copy_from_slice(&(j as f32 + 1.0).to_le_bytes());
            // SAFETY: nothing else touches these tensors.
            unsafe { t.value_mut() }.storage = Some(s);
        }
        // SAFETY: the tensors outlive every operand made here, and no instruction holds one.
        let op = |i: usize, mode| Operand::new(unsafe { TensorPtr::new(&tensors[i]) }, mode);
        // The shapes run inline, then fewer than, as many as, and more than the fixed buffers
        // take (16 inputs, 4 outputs); outputs 23, 22, ...
        let shapes = [
            (0, 1),
            (1, 1),
            (2, 1),
            (0, 2),
            (1, 2),
            (4, 2),
            (0, 3),
            (5, 1),
            (8, 3),
            (16, 4),
            (17, 1),
            (2, 5),
            (18, 5),
        ];
        for (n_in, n_out) in shapes {
            let ins: Vec<_> = (0..n_in).map(|j| op(j, AccessMode::Read)).collect();
            let outs: Vec<_> = (0..n_out).map(|k| op(23 - k, AccessMode::Write)).collect();
            op_call(&Probe, Attrs::scalar((n_in + n_out) as f64), &ins, &outs, || 7, &env);
            assert!(env.failures.take().is_none(), "{n_in} inputs, {n_out} outputs");
            let sum: f32 = (0..n_in).map(|j| ((j + 1) * (j + 1)) as f32).sum();
            for k in 0..n_out {
                // SAFETY: nothing else touches these tensors.
                let v = unsafe { tensors[23 - k].value() };
                let got = first(v.storage.as_ref().expect("written").as_bytes());
                assert_eq!(got, sum + k as f32 + 1.0, "output {k} of {n_in} + {n_out}");
            }
        }
    }

    /// An output that carries an error from an earlier failed write: the next write clears
    /// it when its kernel succeeds and replaces it with its own failure when it fails, on
    /// the inline shapes and the general one alike; a failure names the call's program
    /// number.
    #[test]
    fn a_write_replaces_the_error_its_output_carried() {
        let (env, tensors) = setup(4);
        // SAFETY: the tensors outlive every operand made here, and no instruction holds one.
        let op = |i: usize, mode| Operand::new(unsafe { TensorPtr::new(&tensors[i]) }, mode);
        // SAFETY: nothing else touches these tensors.
        let error_of = |k: usize| unsafe { tensors[k].value() }.error.clone();
        let poison = |k: usize| {
            let e = Arc::new(Error::Kernel {
                instr: 1,
                op: "earlier".into(),
                stream: "s".into(),
                message: "old".into(),
            });
            // SAFETY: as above, and no view of the tensor is alive.
            unsafe { tensors[k].value_mut() }.error = Some(e);
        };
        for n_out in [1, 2] {
            let outs: Vec<_> = (0..n_out).map(|k| op(k, AccessMode::Write)).collect();
            // The probe fails unless its scalar is its operand count.
            for (scalar, program) in [(n_out as f64, 7), (99.0, 8)] {
                (0..n_out).for_each(poison);
                op_call(&Probe, Attrs::scalar(scalar), &[], &outs, || program, &env);
                for k in 0..n_out {
                    match error_of(k).as_deref() {
                        None if program == 7 => {}
                        Some(Error::Kernel { instr: 8, op, .. }) if program == 8 => assert_eq!(op, "probe"),
                        other => panic!("output {k} of {n_out}, program {program}: {other:?}"),
                    }
                }
            }
            assert!(env.failures.take().is_some(), "the failed write is counted");
        }
    }
}
