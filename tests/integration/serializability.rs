//! Serialisability: random programs over CPU and two mock devices (three streams each),
//! with copies between them and host reads, give bit-identical results to a plain
//! sequential interpreter, with the mock devices' timing jittered. With a GPU, the same
//! property holds with collectives over mock communicators mixed in, and with `cuda:0` (three streams) in the mix: that test is
//! `#[ignore = "needs a GPU"]` (run it with `-- --ignored` on a machine with one).

use std::sync::OnceLock;

use eagervm::ep::mock::MockConfig;
use eagervm::vm::ThreadTopology;
use eagervm::VirtualMachine;
use proptest::prelude::*;
use proptest::test_runner::TestRunner;

use crate::common::{self, decode, decode_on, execute, interpret, vm, vm_on, Mix};

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(1000)
}

fn raw_program() -> impl Strategy<Value = (usize, common::Raw)> {
    (6usize..=12, prop::collection::vec(any::<(u8, u8, u8, u8, u8, i8)>(), 1..300))
}

macro_rules! serialisable_on {
    ($name:ident, $topology:expr, $sync:expr) => {
        proptest! {
            #![proptest_config(common::proptest_config(cases()))]
            #[test]
            fn $name((tensors, raw) in raw_program()) {
                static VM: OnceLock<VirtualMachine> = OnceLock::new();
                let vm = VM.get_or_init(|| vm(MockConfig::jittery(), $topology, $sync));
                let p = decode(tensors, &raw);
                let got = execute(vm, &p).expect("valid programs run");
                prop_assert_eq!(got, interpret(&p), "program: {:?}", p);
            }
        }
    };
}

serialisable_on!(random_programs_match_the_interpreter, ThreadTopology::PerStream, false);

macro_rules! serialisable_with_collectives_on {
    ($name:ident, $topology:expr, $sync:expr) => {
        proptest! {
            #![proptest_config(common::proptest_config(cases() / 2))]
            #[test]
            fn $name((tensors, raw) in raw_program()) {
                static VM: OnceLock<VirtualMachine> = OnceLock::new();
                let vm = VM.get_or_init(|| vm(MockConfig::jittery(), $topology, $sync));
                let p = decode_on(Mix::COLLECTIVES, tensors, &raw);
                let got = execute(vm, &p).expect("valid programs run");
                prop_assert_eq!(got, interpret(&p), "program: {:?}", p);
            }
        }
    };
}

// Collectives over mock communicators of two and three ranks (one led from the host), mixed
// into the random programs.
serialisable_with_collectives_on!(
    programs_with_collectives_match_the_interpreter,
    ThreadTopology::PerStream,
    false
);
serialisable_with_collectives_on!(
    programs_with_collectives_match_with_a_single_worker,
    ThreadTopology::Single,
    false
);
serialisable_with_collectives_on!(
    programs_with_collectives_match_in_synchronous_mode,
    ThreadTopology::PerStream,
    true
);
serialisable_on!(random_programs_match_with_one_worker_per_device, ThreadTopology::PerDevice, false);
serialisable_on!(random_programs_match_with_a_single_worker, ThreadTopology::Single, false);
serialisable_on!(synchronous_mode_matches_the_interpreter, ThreadTopology::PerStream, true);

macro_rules! serialisable_views_on {
    ($name:ident, $topology:expr, $sync:expr) => {
        proptest! {
            #![proptest_config(common::proptest_config(cases() / 2))]
            #[test]
            fn $name((tensors, raw) in raw_program()) {
                static VM: OnceLock<VirtualMachine> = OnceLock::new();
                let vm = VM.get_or_init(|| vm(MockConfig::jittery(), $topology, $sync));
                let p = common::views::decode(Mix::CPU_MOCK, tensors, &raw);
                let got = execute(vm, &p).expect("valid programs run");
                prop_assert_eq!(got, interpret(&p), "program: {:?}", p);
            }
        }
    };
}

// Every tensor a view of a shared storage (three a storage, some overlapping), with writes
// in place and through views of other layouts (transposed, strided).
serialisable_views_on!(programs_over_views_match_the_interpreter, ThreadTopology::PerStream, false);
serialisable_views_on!(programs_over_views_match_with_a_single_worker, ThreadTopology::Single, false);
serialisable_views_on!(programs_over_views_match_in_synchronous_mode, ThreadTopology::PerStream, true);

/// Cases of the CUDA mix: `PROPTEST_CASES`, else 256 (each case waits on the GPU).
fn cuda_cases() -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(256)
}

/// Random programs over cpu:0, mock:0, mock:1 and cuda:0, on two thread topologies. On
/// CUDA tensors the programs use only the ops whose CUDA kernels are bit-exact (see
/// `common`), so the comparison with the interpreter is exact.
#[test]
#[ignore = "needs a GPU"]
fn random_programs_with_cuda_match_the_interpreter() {
    for topology in [ThreadTopology::PerStream, ThreadTopology::Single] {
        let vm = match vm_on(Mix::WITH_CUDA, MockConfig::jittery(), topology, false) {
            Ok(vm) => vm,
            Err(e) => panic!("this test needs a GPU (cuda:0): {e}"),
        };
        let config = ProptestConfig { cases: cuda_cases(), ..ProptestConfig::default() };
        let result = TestRunner::new(config).run(&raw_program(), |(tensors, raw)| {
            let p = decode_on(Mix::WITH_CUDA, tensors, &raw);
            let got = execute(&vm, &p).map_err(|e| TestCaseError::fail(format!("program failed: {e}")))?;
            prop_assert_eq!(got, interpret(&p), "program: {:?}", p);
            Ok(())
        });
        if let Err(e) = result {
            panic!("{topology:?}: {e}");
        }
    }
}

#[test]
fn the_cuda_mix_puts_tensors_on_cuda_with_bit_exact_ops_only() {
    use common::Step;
    use eagervm::ep::DeviceId;
    // The generator's side of the CUDA mix, which needs no GPU.
    let raw: common::Raw =
        (0..=255u8).map(|i| (i, i.wrapping_mul(7), i.wrapping_mul(13), 3, i, -5)).collect();
    let stream = |s: &Step| match *s {
        Step::Fill { stream, .. }
        | Step::Unary { stream, .. }
        | Step::Binary { stream, .. }
        | Step::Copy { stream, .. } => Some(stream),
        Step::Read { .. } | Step::Recreate { .. } | Step::Collective { .. } => None,
    };
    let p = decode_on(Mix::WITH_CUDA, 8, &raw);
    let cuda = |t: usize| Mix::WITH_CUDA.device_of(t) == DeviceId::cuda(0);
    let mut on_cuda = 0;
    for step in &p.steps {
        let touches = match *step {
            Step::Binary { op, out, .. } if cuda(out) => {
                assert!(["add", "mul", "sub", "relu_grad"].contains(&op), "{op} on cuda");
                true
            }
            Step::Unary { out, .. } | Step::Fill { out, .. } => cuda(out),
            Step::Copy { src, dst, .. } => cuda(src) || cuda(dst),
            _ => false,
        };
        if touches {
            on_cuda += 1;
            // Every step with a CUDA operand runs on a CUDA stream (7-9).
            assert!(stream(step).is_some_and(|s| (7..=9).contains(&s)), "{step:?}");
        }
    }
    assert!(on_cuda > 10, "only {on_cuda} steps touch cuda:0");
    // The default mix stays on cpu:0 and the mock devices' streams (0-6).
    let p = decode(8, &raw);
    assert!(p.steps.iter().filter_map(stream).all(|s| s <= 6));
}

#[test]
fn the_collective_mix_issues_every_collective_on_both_communicators() {
    use common::{decode_on, Step};
    use eagervm::ep::ccl::Collective;
    let raw: common::Raw = (0..=255u8)
        .flat_map(|i| {
            (0..14u8).map(move |k| {
                (k.wrapping_add(i.wrapping_mul(14)), i, i.wrapping_mul(7), i ^ 0x55, i, i as i8)
            })
        })
        .collect();
    let p = decode_on(Mix::COLLECTIVES, 9, &raw);
    let mut seen = std::collections::HashSet::new();
    for s in &p.steps {
        if let Step::Collective { comm, op, ins, outs } = s {
            let kind = match op {
                Collective::Broadcast { .. } => "broadcast".to_string(),
                other => format!("{other:?}"),
            };
            seen.insert((*comm, kind));
            assert!(ins.iter().all(|i| !outs.contains(i)), "{s:?}");
        }
    }
    // 2 communicators × (4 reductions + broadcast).
    assert_eq!(seen.len(), 10, "{seen:?}");
    // The default mix has none.
    assert!(!decode(9, &raw).steps.iter().any(|s| matches!(s, Step::Collective { .. })));
}
