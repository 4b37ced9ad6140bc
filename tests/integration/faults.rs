//! Checked launches on an asynchronous device: a kernel that finds bad data only when it
//! runs reports it in its stream's fault record (`ep::fault`), and the call fails as a CPU
//! kernel's returned error does (`vm::stream_policy`, "Checked launches"). Shown with a
//! framework's own kernel on `mock:0`, which writes the record as the CUDA index kernels do.

use eagervm::ep::fault::{self, DataFault, FaultCode};
use eagervm::ep::DeviceType;
use eagervm::framework::{KernelCtx, OpKernel, OpRegistry, OutSpec, OutSpecs, TensorMeta};
use eagervm::prelude::*;

/// `pick(x, idx)`: `x[idx[j]]` for each `j` (`f32` values, `i64` indices), 0 where an index
/// is out of range, which it reports to the stream's fault record instead of failing: the
/// shape of a CUDA index kernel.
struct Pick;

impl OpKernel for Pick {
    fn name(&self) -> &'static str {
        "pick"
    }
    fn infer(
        &self,
        inputs: &[&TensorMeta],
        _: &[&TensorMeta],
        _: &Attrs,
        out: &mut OutSpecs,
    ) -> Result<(), String> {
        match inputs {
            [x, i]
                if x.dtype == DType::F32
                    && i.dtype == DType::I64
                    && x.shape.len() == 1
                    && i.shape.len() == 1 =>
            {
                out.push(OutSpec { shape: i.shape.clone(), dtype: DType::F32 });
                Ok(())
            }
            _ => Err("pick takes f32[n] values and i64[m] indices".into()),
        }
    }
    fn checks_data(&self, _: &Attrs) -> bool {
        true
    }
    fn compute(&self, ctx: &mut KernelCtx<'_, '_>) -> Result<(), String> {
        let (x, i) = (&ctx.inputs[0], &ctx.inputs[1]);
        let xs: Vec<f32> = x.data.as_bytes()[x.meta.offset * 4..]
            .chunks_exact(4)
            .take(x.meta.shape[0])
            .map(|c| f32::from_ne_bytes(c.try_into().expect("4 bytes")))
            .collect();
        let is: Vec<i64> = i.data.as_bytes()[i.meta.offset * 8..]
            .chunks_exact(8)
            .take(i.meta.shape[0])
            .map(|c| i64::from_ne_bytes(c.try_into().expect("8 bytes")))
            .collect();
        let picked: Vec<f32> = is
            .iter()
            .enumerate()
            .map(|(j, &v)| match usize::try_from(v).ok().and_then(|k| xs.get(k)) {
                Some(&x) => x,
                None => {
                    let bound = xs.len() as i64;
                    let f = DataFault {
                        code: FaultCode::Index as u32,
                        dim: 0,
                        value: v,
                        bound,
                        position: j as i64,
                    };
                    fault::report(f);
                    0.0
                }
            })
            .collect();
        // SAFETY: the output is a whole f32 storage of `m` elements (the kernel is not
        // strided, so the builder gives it one) that no input shares (not in place).
        let out = unsafe { ctx.outputs[0].data.bytes_mut() };
        for (c, v) in out.chunks_exact_mut(4).zip(picked) {
            c.copy_from_slice(&v.to_ne_bytes());
        }
        Ok(())
    }
}

const MOCK: DeviceId = DeviceId::mock(0);

fn vm(config: Config) -> VirtualMachine {
    let mut registry = OpRegistry::with_builtins();
    registry.register(DeviceType::Mock, &Pick);
    VirtualMachine::with_registry(Config { mock_devices: 1, ..config }, registry).unwrap()
}

/// `pick(x, idx)` then `out + out`, on `mock:0`.
fn pick_and_add(vm: &VirtualMachine, x: &Tensor, idx: &[i64]) -> (Tensor, Tensor) {
    let i = vm.from_slice(idx, &[idx.len()], MOCK).unwrap();
    let (pick, add) = (vm.op("pick").unwrap(), vm.op("add").unwrap());
    let s = vm.compute_stream(MOCK).unwrap();
    vm.run(|b| {
        let p = b.call(pick, &[x, &i], Attrs::default(), s)?;
        let sum = b.call(add, &[&p, &p], Attrs::default(), s)?;
        Ok::<_, Error>((p, sum))
    })
    .unwrap()
}

fn expect_index_error(r: Result<Vec<f32>, Error>, what: &str) {
    match r {
        Err(Error::Kernel { op, message, .. }) => {
            assert_eq!(op, "pick", "{what}");
            assert_eq!(message, "pick: index 7 is out of range for dimension 0 of size 3", "{what}");
        }
        other => panic!("{what}: {other:?}"),
    }
}

/// One bad index among good ones: the call fails with the CPU's kind of error and message,
/// a later call that reads its output skips and carries the error, an independent tensor
/// computed after it reads fine, and the next call with good data succeeds (the record was
/// reset), in both the asynchronous and the synchronous mode.
#[test]
fn a_fault_fails_the_call_and_what_reads_it_and_nothing_else() {
    for synchronous in [false, true] {
        let vm =
            vm(Config { synchronous, mock: eagervm::ep::mock::MockConfig::jittery(), ..Config::default() });
        let x = vm.from_slice(&[1.0f32, 2.0, 3.0], &[3], MOCK).unwrap();
        let (p, sum) = pick_and_add(&vm, &x, &[2, 7, 0]);
        let other = vm.from_slice(&[5.0f32], &[1], MOCK).unwrap();
        let add = vm.op("add").unwrap();
        let s = vm.compute_stream(MOCK).unwrap();
        let twice = vm.run(|b| b.call(add, &[&other, &other], Attrs::default(), s)).unwrap();
        expect_index_error(p.to_vec::<f32>(), "the call");
        expect_index_error(sum.to_vec::<f32>(), "a call that reads it");
        assert_eq!(twice.to_vec::<f32>().unwrap(), [10.0], "synchronous {synchronous}");
        assert!(matches!(vm.sync(), Err(Error::Failed { .. })), "the failure is counted");
        let (p, sum) = pick_and_add(&vm, &x, &[2, 1, 0]);
        assert_eq!(p.to_vec::<f32>().unwrap(), [3.0, 2.0, 1.0], "synchronous {synchronous}");
        assert_eq!(sum.to_vec::<f32>().unwrap(), [6.0, 4.0, 2.0], "synchronous {synchronous}");
        vm.sync().unwrap();
    }
}

/// Many calls in one run, every other one bad: each fails or succeeds on its own data (no
/// fault is carried over to the call after it).
#[test]
fn each_call_answers_for_its_own_data() {
    let vm = vm(Config { mock: eagervm::ep::mock::MockConfig::jittery(), ..Config::default() });
    let x = vm.from_slice(&[1.0f32, 2.0, 3.0], &[3], MOCK).unwrap();
    let pick = vm.op("pick").unwrap();
    let s = vm.compute_stream(MOCK).unwrap();
    let (good, bad) =
        (vm.from_slice(&[1i64], &[1], MOCK).unwrap(), vm.from_slice(&[7i64], &[1], MOCK).unwrap());
    let outs = vm
        .run(|b| {
            (0..20)
                .map(|k| b.call(pick, &[&x, if k % 2 == 0 { &good } else { &bad }], Attrs::default(), s))
                .collect::<Result<Vec<_>, _>>()
        })
        .unwrap();
    for (k, o) in outs.iter().enumerate() {
        if k % 2 == 0 {
            assert_eq!(o.to_vec::<f32>().unwrap(), [2.0], "call {k}");
        } else {
            expect_index_error(o.to_vec::<f32>(), &format!("call {k}"));
        }
    }
}

/// With `check_data` off the call is not checked: it succeeds, the bad element 0.
#[test]
fn without_the_check_a_bad_index_gives_zero() {
    let vm = vm(Config { check_data: false, ..Config::default() });
    let x = vm.from_slice(&[1.0f32, 2.0, 3.0], &[3], MOCK).unwrap();
    let (p, sum) = pick_and_add(&vm, &x, &[2, 7, 0]);
    assert_eq!(p.to_vec::<f32>().unwrap(), [3.0, 0.0, 1.0]);
    assert_eq!(sum.to_vec::<f32>().unwrap(), [6.0, 0.0, 2.0]);
    vm.sync().unwrap();
}
