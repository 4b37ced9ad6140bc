//! A framework's own kernels on a VM (`VirtualMachine::with_registry`).

use eagervm::ep::DeviceType;
use eagervm::framework::{KernelCtx, OpKernel, OpRegistry, OutSpecs, TensorMeta};
use eagervm::prelude::*;

/// An `add` that writes 7 everywhere: to tell whose kernel ran.
struct Sevens;

impl OpKernel for Sevens {
    fn name(&self) -> &'static str {
        "add"
    }
    fn infer(
        &self,
        inputs: &[&TensorMeta],
        _: &[&TensorMeta],
        _: &Attrs,
        out: &mut OutSpecs,
    ) -> Result<(), String> {
        out.push(eagervm::framework::OutSpec { shape: inputs[0].shape.clone(), dtype: inputs[0].dtype });
        Ok(())
    }
    fn compute(&self, ctx: &mut KernelCtx<'_, '_>) -> Result<(), String> {
        // SAFETY: the output is a whole f32 storage (the kernel is not strided, so the builder
        // gives it one) that no input shares (the kernel does not work in place).
        let out = unsafe { ctx.outputs[0].data.bytes_mut() };
        for c in out.chunks_exact_mut(4) {
            c.copy_from_slice(&7.0f32.to_ne_bytes());
        }
        Ok(())
    }
}

#[test]
fn a_registered_kernel_replaces_the_builtin_of_its_name_on_its_device() {
    let mut registry = OpRegistry::with_builtins();
    registry.register(DeviceType::Cpu, &Sevens);
    let vm = VirtualMachine::with_registry(Config::default(), registry).unwrap();
    let x = vm.from_slice(&[1.0f32, 2.0], &[2], DeviceId::CPU).unwrap();
    let add = vm.op("add").unwrap();
    let cpu = vm.compute_stream(DeviceId::CPU).unwrap();
    let y = vm.run(|b| b.call(add, &[&x, &x], Attrs::default(), cpu)).unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), [7.0, 7.0]);
    // A view goes to a kernel over contiguous operands as a contiguous copy.
    let xt = x.view_layout(&[2], &[-1], 1).unwrap();
    let z = vm.run(|b| b.call(add, &[&xt, &xt], Attrs::default(), cpu)).unwrap();
    assert_eq!(z.to_vec::<f32>().unwrap(), [7.0, 7.0]);
}

#[test]
fn a_registry_without_the_builtins_is_refused() {
    match VirtualMachine::with_registry(Config::default(), OpRegistry::new()) {
        Err(Error::Config(m)) => assert!(m.contains("with_builtins") && m.contains("copy"), "{m}"),
        other => panic!("{other:?}"),
    }
}
