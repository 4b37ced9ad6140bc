//! Serialisability: random programs over CPU and two mock devices (three streams each),
//! with copies between them and host reads, give bit-identical results to a plain
//! sequential interpreter, with the mock devices' timing jittered.

mod common;

use std::sync::OnceLock;

use common::{decode, execute, interpret, vm};
use eagervm::ep::mock::MockConfig;
use eagervm::vm::ThreadTopology;
use eagervm::VirtualMachine;
use proptest::prelude::*;

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(1000)
}

fn raw_program() -> impl Strategy<Value = (usize, common::Raw)> {
    (6usize..=12, prop::collection::vec(any::<(u8, u8, u8, u8, u8, i8)>(), 1..300))
}

macro_rules! serialisable_on {
    ($name:ident, $topology:expr, $sync:expr) => {
        proptest! {
            #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]
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
serialisable_on!(random_programs_match_with_one_worker_per_device, ThreadTopology::PerDevice, false);
serialisable_on!(random_programs_match_with_a_single_worker, ThreadTopology::Single, false);
serialisable_on!(synchronous_mode_matches_the_interpreter, ThreadTopology::PerStream, true);
