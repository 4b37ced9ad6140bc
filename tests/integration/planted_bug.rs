//! A test of the serialisability test: a VM that skips the device-side wait of its
//! `StreamWaitEvent`s must be caught giving wrong results by the same random programs, and
//! so must one whose views of a storage keep dependence objects of their own (a dropped
//! storage edge), by the programs over views.

use std::time::Duration;

use eagervm::ep::mock::MockConfig;
use eagervm::vm::{Config, ThreadTopology};
use eagervm::VirtualMachine;
use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::TestRunner;

use crate::common::{self, decode, execute, interpret, vm};

fn faulty_vm() -> VirtualMachine {
    let mock = MockConfig { launch_delay: Duration::from_micros(200), ..MockConfig::jittery() };
    let mut c = Config::default().with_mock_devices(2, mock);
    c.fault.skip_stream_wait_every = 1;
    VirtualMachine::new(c).expect("vm starts")
}

fn programs() -> impl Strategy<Value = (usize, common::Raw)> {
    (6usize..=12, proptest::collection::vec(proptest::arbitrary::any::<(u8, u8, u8, u8, u8, i8)>(), 50..200))
}

#[test]
fn skipping_stream_waits_is_caught() {
    let bad = faulty_vm();
    let mut runner = TestRunner::deterministic();
    let mut caught = 0;
    for case in 0..200 {
        let (tensors, raw) = programs().new_tree(&mut runner).expect("strategy").current();
        let p = decode(tensors, &raw);
        // Caught: wrong values, or a read that overtook the write it depends on.
        if execute(&bad, &p).ok() != Some(interpret(&p)) {
            caught += 1;
            if caught == 3 {
                eprintln!("caught after {} programs", case + 1);
                return;
            }
        }
    }
    panic!("the planted bug went unnoticed ({caught} mismatches in 200 programs)");
}

#[test]
fn the_same_programs_pass_without_the_fault() {
    let good = vm(
        MockConfig { launch_delay: Duration::from_micros(200), ..MockConfig::jittery() },
        ThreadTopology::PerStream,
        false,
    );
    let mut runner = TestRunner::deterministic();
    for _ in 0..20 {
        let (tensors, raw) = programs().new_tree(&mut runner).expect("strategy").current();
        let p = decode(tensors, &raw);
        assert_eq!(execute(&good, &p).expect("runs"), interpret(&p));
    }
}

/// Programs of fills, collectives and reads only: every value a collective reads was written
/// on a compute stream, so reaching the collective stream depends on the device-side wait.
fn collective_programs(runner: &mut TestRunner) -> common::Program {
    use common::{decode_on, Mix, Step};
    loop {
        let (tensors, raw) = programs().new_tree(runner).expect("strategy").current();
        let mut p = decode_on(Mix::COLLECTIVES, tensors, &raw);
        p.steps.retain(|s| matches!(s, Step::Fill { .. } | Step::Collective { .. } | Step::Read { .. }));
        if p.steps.iter().filter(|s| matches!(s, Step::Collective { .. })).count() >= 3 {
            return p;
        }
    }
}

#[test]
fn collectives_that_skip_the_wait_for_their_inputs_are_caught() {
    let bad = faulty_vm();
    let mut runner = TestRunner::deterministic();
    let caught = (0..200).position(|_| {
        let p = collective_programs(&mut runner);
        execute(&bad, &p).ok() != Some(interpret(&p))
    });
    let case = caught.expect("the planted bug went unnoticed in 200 programs of collectives");
    eprintln!("caught after {} programs", case + 1);
}

#[test]
fn the_same_collective_programs_pass_without_the_fault() {
    let good = vm(
        MockConfig { launch_delay: Duration::from_micros(200), ..MockConfig::jittery() },
        ThreadTopology::PerStream,
        false,
    );
    let mut runner = TestRunner::deterministic();
    for _ in 0..20 {
        let p = collective_programs(&mut runner);
        assert_eq!(execute(&good, &p).expect("runs"), interpret(&p));
    }
}

fn split_views_vm() -> VirtualMachine {
    let mock = MockConfig { launch_delay: Duration::from_micros(200), ..MockConfig::jittery() };
    let mut c = Config::default().with_mock_devices(2, mock);
    c.fault.split_view_dependences = true;
    VirtualMachine::new(c).expect("vm starts")
}

#[test]
fn views_with_dependences_of_their_own_are_caught() {
    use common::{views, Mix};
    let bad = split_views_vm();
    let mut runner = TestRunner::deterministic();
    let caught = (0..200).position(|_| {
        let (tensors, raw) = programs().new_tree(&mut runner).expect("strategy").current();
        let p = views::decode(Mix::CPU_MOCK, tensors, &raw);
        execute(&bad, &p).ok() != Some(interpret(&p))
    });
    let case = caught.expect("the planted bug went unnoticed in 200 programs over views");
    eprintln!("caught after {} programs", case + 1);
}

#[test]
fn the_same_programs_over_views_pass_without_the_fault() {
    use common::{views, Mix};
    let good = vm(
        MockConfig { launch_delay: Duration::from_micros(200), ..MockConfig::jittery() },
        ThreadTopology::PerStream,
        false,
    );
    let mut runner = TestRunner::deterministic();
    for _ in 0..20 {
        let (tensors, raw) = programs().new_tree(&mut runner).expect("strategy").current();
        let p = views::decode(Mix::CPU_MOCK, tensors, &raw);
        assert_eq!(execute(&good, &p).expect("runs"), interpret(&p));
    }
}
