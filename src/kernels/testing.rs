//! Helpers for the kernels' unit tests: tensors and raw storages from values, views over a
//! storage, a kernel call that infers, allocates the outputs and computes, the way the VM
//! does, and a call of `compute` alone on given operands, the way a caller that skipped
//! `infer` would.

use std::sync::{Arc, OnceLock};

use crate::alloc::{HostAllocator, Storage};
use crate::ep::DeviceId;
use crate::vm::{Attrs, Element, KernelCtx, OpKernel, OutSpecs, TensorMeta, TensorView, TensorViewMut};

/// A tensor made by the tests: its meta and its storage.
pub(crate) type Owned = (TensorMeta, Storage);

fn allocator() -> &'static Arc<HostAllocator> {
    static A: OnceLock<Arc<HostAllocator>> = OnceLock::new();
    A.get_or_init(|| HostAllocator::new("test"))
}

/// A storage holding `bytes`.
pub(crate) fn storage(bytes: &[u8]) -> Storage {
    let mut data = allocator().alloc(bytes.len());
    data.as_bytes_mut().copy_from_slice(bytes);
    data
}

/// A contiguous CPU tensor of `shape` holding `values`.
pub(crate) fn tensor<T: Element>(shape: &[usize], values: &[T]) -> Owned {
    let meta = TensorMeta::new(shape, T::DTYPE, DeviceId::CPU);
    assert_eq!(meta.numel(), values.len(), "test tensor of shape {shape:?}");
    (meta, storage(&T::to_bytes(values)))
}

/// An `f32` tensor on the CPU.
pub(crate) fn t_f32(shape: &[usize], values: &[f32]) -> Owned {
    tensor(shape, values)
}

/// An `i64` tensor on the CPU.
pub(crate) fn t_i64(shape: &[usize], values: &[i64]) -> Owned {
    tensor(shape, values)
}

/// The whole storage of a tensor as `T`s.
pub(crate) fn values<T: Element>(t: &Owned) -> Vec<T> {
    T::from_bytes(t.1.as_bytes())
}

/// A tensor's storage as `f32`s.
pub(crate) fn as_f32(t: &Owned) -> Vec<f32> {
    values(t)
}

/// A tensor's storage as `i64`s.
pub(crate) fn as_i64(t: &Owned) -> Vec<i64> {
    values(t)
}

/// Infer, allocate the outputs (zeroed) and compute, as an `OpCall` does. For a kernel that
/// says it writes its outputs whole (`OpKernel::writes_outputs`), which the VM then gives
/// blocks that are not zeroed, the call is also made on outputs whose every byte is `0xFF`
/// (NaN in every float dtype, -1 in every integer one), and must give the same bytes, or
/// the same error: an element the kernel leaves unwritten, or reads before writing, fails
/// the test that made the call.
pub(crate) fn run(
    kernel: &dyn OpKernel,
    scalar: f64,
    inputs: Vec<Owned>,
    given: &[TensorMeta],
) -> Result<Vec<Owned>, String> {
    run_with(kernel, Attrs::scalar(scalar), inputs, given)
}

/// [`run`] with any attributes.
pub(crate) fn run_with(
    kernel: &dyn OpKernel,
    attrs: Attrs,
    inputs: Vec<Owned>,
    given: &[TensorMeta],
) -> Result<Vec<Owned>, String> {
    let in_metas: Vec<&TensorMeta> = inputs.iter().map(|t| &t.0).collect();
    let given: Vec<&TensorMeta> = given.iter().collect();
    let mut specs = OutSpecs::new();
    kernel.infer(&in_metas, &given, &attrs, &mut specs)?;
    let zeroed = compute_into(kernel, attrs, &inputs, &specs, 0);
    if kernel.writes_outputs() {
        let dirty = compute_into(kernel, attrs, &inputs, &specs, 0xFF);
        let bytes = |r: &Result<Vec<Owned>, String>| {
            r.as_ref()
                .map(|outs| outs.iter().map(|o| o.1.as_bytes().to_vec()).collect::<Vec<_>>())
                .map_err(String::clone)
        };
        assert_eq!(
            bytes(&dirty),
            bytes(&zeroed),
            "{} says it writes its outputs whole, but its outputs depend on what they held before",
            kernel.name()
        );
    }
    zeroed
}

/// New outputs of `specs`, every byte `fill`, computed by `kernel` from `inputs`.
fn compute_into(
    kernel: &dyn OpKernel,
    attrs: Attrs,
    inputs: &[Owned],
    specs: &OutSpecs,
    fill: u8,
) -> Result<Vec<Owned>, String> {
    let mut outs: Vec<Owned> = specs
        .iter()
        .map(|s| {
            let meta = TensorMeta::new(&s.shape, s.dtype, DeviceId::CPU);
            let mut data = allocator().alloc(meta.bytes());
            data.as_bytes_mut().fill(fill);
            (meta, data)
        })
        .collect();
    {
        let views: Vec<TensorView<'_>> =
            inputs.iter().map(|(meta, data)| TensorView { meta, data }).collect();
        let mut out_views: Vec<TensorViewMut<'_>> =
            outs.iter_mut().map(|(meta, data)| TensorViewMut { meta, data }).collect();
        let mut ctx = KernelCtx { attrs, inputs: &views, outputs: &mut out_views };
        kernel.compute(&mut ctx)?;
    }
    Ok(outs)
}

/// Call `compute` alone on the given operands (views of storages, which may be shared).
pub(crate) fn compute_raw(
    kernel: &dyn OpKernel,
    attrs: Attrs,
    inputs: &[(&TensorMeta, &Storage)],
    output: (&TensorMeta, &Storage),
) -> Result<(), String> {
    let views: Vec<TensorView<'_>> = inputs.iter().map(|&(meta, data)| TensorView { meta, data }).collect();
    let mut outs = [TensorViewMut { meta: output.0, data: output.1 }];
    kernel.compute(&mut KernelCtx { attrs, inputs: &views, outputs: &mut outs })
}

/// The message `infer` refuses the operands with (panics if it accepts them).
pub(crate) fn infer_err(kernel: &dyn OpKernel, inputs: &[&TensorMeta], given: &[&TensorMeta]) -> String {
    let mut specs = OutSpecs::new();
    match kernel.infer(inputs, given, &Attrs::default(), &mut specs) {
        Ok(()) => panic!("{} accepted the operands: {specs:?}", kernel.name()),
        Err(e) => e,
    }
}

/// Run `f` on its own thread and return its result, or panic if it takes more than `secs`
/// seconds: a kernel that loops without bound fails its test instead of hanging the run.
pub(crate) fn within_secs<R: Send + 'static>(secs: u64, f: impl FnOnce() -> R + Send + 'static) -> R {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(std::time::Duration::from_secs(secs)) {
        Ok(r) => r,
        Err(e) => panic!("did not finish within {secs} s ({e})"),
    }
}
