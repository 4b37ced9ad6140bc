//! Diagnostic ops: `noop` (measures the VM's own overhead), `fail` and `panic` (exercise
//! error propagation and panic containment from user code and tests).
//!
//! All three take any inputs and write the outputs the caller gives, unchanged in shape and
//! dtype; their `infer` never refuses.

use crate::vm::{Attrs, DType, KernelCtx, OpKernel, OutSpecs, TensorMeta};

/// The given outputs' specs, unchanged (the caller chooses them; none means no outputs).
fn given_specs(given: &[&TensorMeta], outputs: &mut OutSpecs) {
    outputs.extend(given.iter().map(|m| super::spec_of(m)));
}

/// `noop`: any number of inputs and outputs; does nothing. Outputs are whatever the caller
/// gave, so an instruction costs only the VM's own work (dependencies, dispatch, retire).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoopKernel;

impl OpKernel for NoopKernel {
    fn name(&self) -> &'static str {
        "noop"
    }

    fn dtypes(&self) -> &'static [DType] {
        &DType::ALL
    }

    fn infer(
        &self,
        _inputs: &[&TensorMeta],
        given: &[&TensorMeta],
        _attrs: &Attrs,
        outputs: &mut OutSpecs,
    ) -> Result<(), String> {
        given_specs(given, outputs);
        Ok(())
    }

    fn compute(&self, _ctx: &mut KernelCtx<'_, '_>) -> Result<(), String> {
        Ok(())
    }
}

/// `fail`: a test and diagnostic op whose `compute` returns the error
/// `fail op: <attrs.scalar>`. The VM marks the instruction failed and its outputs carry the
/// error to every later reader and wait.
#[derive(Debug, Clone, Copy, Default)]
pub struct FailKernel;

impl OpKernel for FailKernel {
    fn name(&self) -> &'static str {
        "fail"
    }

    fn dtypes(&self) -> &'static [DType] {
        &DType::ALL
    }

    fn infer(
        &self,
        _inputs: &[&TensorMeta],
        given: &[&TensorMeta],
        _attrs: &Attrs,
        outputs: &mut OutSpecs,
    ) -> Result<(), String> {
        given_specs(given, outputs);
        Ok(())
    }

    fn compute(&self, ctx: &mut KernelCtx<'_, '_>) -> Result<(), String> {
        Err(format!("fail op: {}", ctx.attrs.value()))
    }
}

/// `panic`: a test and diagnostic op whose `compute` panics with `panic op: <attrs.scalar>`.
/// The VM must catch the panic and treat it like a returned error, so this op checks that
/// a misbehaving kernel cannot take the worker thread (or the process) down.
#[derive(Debug, Clone, Copy, Default)]
pub struct PanicKernel;

impl OpKernel for PanicKernel {
    fn name(&self) -> &'static str {
        "panic"
    }

    fn dtypes(&self) -> &'static [DType] {
        &DType::ALL
    }

    fn infer(
        &self,
        _inputs: &[&TensorMeta],
        given: &[&TensorMeta],
        _attrs: &Attrs,
        outputs: &mut OutSpecs,
    ) -> Result<(), String> {
        given_specs(given, outputs);
        Ok(())
    }

    fn compute(&self, ctx: &mut KernelCtx<'_, '_>) -> Result<(), String> {
        panic!("panic op: {}", ctx.attrs.value())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testing::{as_f32, run, t_f32, t_i64};

    #[test]
    fn noop_gives_back_given_outputs() {
        let given = [t_f32(&[2], &[0.0; 2]).0, t_i64(&[], &[0]).0];
        let ins = vec![t_f32(&[3], &[1.0; 3]), t_i64(&[1], &[4])];
        let out = run(&NoopKernel, 0.0, ins, &given).unwrap();
        assert_eq!(out.len(), 2);
        assert_eq!((&out[0].0, &out[1].0), (&given[0], &given[1]));
        assert_eq!(as_f32(&out[0]), vec![0.0; 2]);
        assert!(run(&NoopKernel, 0.0, vec![], &[]).unwrap().is_empty());
    }

    #[test]
    fn fail_returns_its_scalar() {
        let given = [t_f32(&[1], &[0.0]).0];
        let err = run(&FailKernel, 7.0, vec![t_f32(&[1], &[1.0])], &given).unwrap_err();
        assert_eq!(err, "fail op: 7");
        assert_eq!(run(&FailKernel, -1.5, vec![], &[]).unwrap_err(), "fail op: -1.5");
    }

    #[test]
    fn panic_panics_with_its_scalar() {
        let caught = std::panic::catch_unwind(|| run(&PanicKernel, 3.0, vec![], &[]));
        let payload = caught.unwrap_err();
        let msg = payload.downcast_ref::<String>().expect("a formatted panic message");
        assert_eq!(msg, "panic op: 3");
    }
}
