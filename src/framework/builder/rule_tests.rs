//! The rule's caches against the rule (`rule.rs`): on random calls over tensors of every
//! kind the rule tells apart (live or released, of this VM or another, views, on the CPU or
//! a mock device, last used on the call's stream, another or none, outputs that are inputs),
//! each cache either says it cannot tell or answers what the rule answers; and once the rule
//! has accepted a call that a cache covers, the cache answers for it.

use std::cell::RefCell;
use std::sync::atomic::Ordering;

use proptest::prelude::*;
use proptest::test_runner::{Config as Cases, RngAlgorithm, TestRng, TestRunner};

use crate::ep::mock::MockConfig;
use crate::framework::infer_cache::KEY_OPS;
use crate::prelude::*;
use crate::vm::tensor::NO_STREAM;

use super::rule::Outputs;
use super::InstructionsBuilder;

/// The ops the calls take: binary, unary, with an attribute, a copy across devices, any
/// number of operands (`noop`), and a product of 2-d tensors.
const OPS: [&str; 6] = ["add", "relu", "scale", "copy", "noop", "matmul"];

/// One random call: indices into the ops, the tensors (inputs, then outputs if given) and
/// the streams; what happens to each tensor first; the attribute.
#[derive(Debug, Clone)]
struct Case {
    op: usize,
    inputs: Vec<usize>,
    /// `None`: the builder makes the outputs (`call`); else `call_into`'s.
    outputs: Option<Vec<usize>>,
    stream: usize,
    scale: bool,
    /// Per tensor of the pool, which is first marked last used on the call's stream (when it
    /// is one of the VM's): 0 leaves it so, 2 marks it last used on another stream, 3 never
    /// used; 4 releases it for the call.
    state: Vec<u8>,
}

/// How many tensors the pool holds (`pool`).
const POOL: usize = 16;

/// Tensors of the pool that go together: `f32[2]` on the CPU, on `mock:0`, `f32[2, 2]`
/// (one a view) on the CPU; and the stream (index in the VM's table) where they run.
const GROUPS: [(&[usize], usize); 3] = [(&[0, 1, 2, 12, 13, 14], 0), (&[7, 8, 15], 1), (&[10, 5], 0)];

/// Inputs each op takes (`noop`: any number).
fn arity(op: usize) -> std::ops::Range<usize> {
    match OPS[op] {
        "add" | "matmul" => 2..3,
        "noop" => 5..8,
        _ => 1..2,
    }
}

fn case() -> impl Strategy<Value = Case> {
    // Per operand: a tensor of the call's group, or now and then any tensor.
    let operand = (any::<prop::sample::Index>(), 0..POOL, prop::bool::weighted(0.15));
    (
        0..OPS.len(),
        0..GROUPS.len(),
        prop::collection::vec(operand.clone(), 10),
        prop::option::weighted(
            0.7,
            (prop_oneof![1 => Just(0usize), 6 => Just(1), 1 => Just(2)], prop::collection::vec(operand, 2)),
        ),
        prop::option::weighted(0.2, 0..8usize),
        any::<bool>(),
        prop::collection::vec(
            prop_oneof![30 => Just(0u8), 2 => Just(2u8), 2 => Just(3u8), 1 => Just(4u8)],
            POOL,
        ),
    )
        .prop_flat_map(|(op, group, ins, outs, stream, scale, state)| {
            let pick = move |(i, any, wild): &(prop::sample::Index, usize, bool)| {
                if *wild {
                    *any
                } else {
                    *i.get(GROUPS[group].0)
                }
            };
            (arity(op), Just((op, group, ins, outs, stream, scale, state))).prop_map(
                move |(n, (op, group, ins, outs, stream, scale, state))| {
                    let inputs: Vec<usize> = ins[..n].iter().map(pick).collect();
                    // Mostly one output, as the ops make, and mostly not an input.
                    let fresh: Vec<usize> =
                        GROUPS[group].0.iter().copied().filter(|t| !inputs.contains(t)).collect();
                    let out = |o: &(prop::sample::Index, usize, bool)| match (o.2, fresh.is_empty()) {
                        (false, false) => *o.0.get(&fresh),
                        _ => pick(o),
                    };
                    let outputs = outs.map(|(k, o)| o[..k].iter().map(out).collect());
                    Case { op, inputs, outputs, stream: stream.unwrap_or(GROUPS[group].1), scale, state }
                },
            )
        })
}

/// The tensors the calls take: of this VM on the CPU and on `mock:0`, of two dtypes and
/// three shapes; two views; and one of `other`, another VM.
fn pool(vm: &VirtualMachine, other: &VirtualMachine) -> Vec<Tensor> {
    let (cpu, mock) = (DeviceId::CPU, DeviceId::mock(0));
    let f = |n: usize, dev| vm.from_slice(&vec![1.0f32; n], &[n], dev).expect("a tensor");
    let square = vm.from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2], cpu).expect("a tensor");
    let four = f(4, cpu);
    let t = vec![
        f(2, cpu),
        f(2, cpu),
        f(2, cpu),
        f(3, cpu),
        vm.from_slice(&[1i32, 2], &[2], cpu).expect("a tensor"),
        square.view_layout(&[2, 2], &[1, 2], 0).expect("a transposed view"),
        four.view_layout(&[2], &[1], 2).expect("a view of half"),
        f(2, mock),
        f(2, mock),
        vm.from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2], mock).expect("a tensor"),
        square,
        other.from_slice(&[1.0f32, 2.0], &[2], cpu).expect("another VM's tensor"),
        f(2, cpu),
        f(2, cpu),
        f(2, cpu),
        f(2, mock),
    ];
    assert_eq!(t.len(), POOL);
    t
}

/// What a run found, so that it cannot pass without each cache answering and the rule
/// refusing.
#[derive(Default, Debug)]
struct Seen {
    making: usize,
    into: usize,
    wide: usize,
    refused: usize,
}

/// Check one call (module docs).
fn check(
    b: &mut InstructionsBuilder<'_>,
    ops: &[Op],
    tensors: &[Tensor],
    streams: &[StreamId],
    c: &Case,
    seen: &mut Seen,
) {
    let op = ops[c.op];
    let stream = streams[c.stream % streams.len()];
    // The VM's own streams only: a tensor's last stream is where its `Release` goes.
    let valid = |s: StreamId| s.index() < streams.len() - 1;
    let other = streams[(c.stream + 1) % (streams.len() - 1)];
    let attrs = if c.scale && OPS[c.op] == "scale" { Attrs::scalar(2.0) } else { Attrs::default() };
    for (t, &s) in tensors.iter().zip(&c.state) {
        let last = &t.inner().owner().last_stream;
        // As in a loop: each tensor last used on the call's stream, unless the case says.
        if valid(stream) {
            last.store(stream.0, Ordering::Relaxed);
        }
        match s {
            2 => last.store(other.0, Ordering::Relaxed),
            3 => last.store(NO_STREAM, Ordering::Relaxed),
            4 => t.inner().released.store(true, Ordering::Relaxed),
            _ => {}
        }
    }
    let inputs: Vec<&Tensor> = c.inputs.iter().map(|&i| &tensors[i]).collect();
    match &c.outputs {
        None => {
            let cached = b.cached_making(&op, &inputs, attrs, stream);
            let rule = b.rule(op, &inputs, Outputs::Made, &attrs, stream);
            if rule.is_err() {
                seen.refused += 1;
            }
            if let Some(cached) = cached {
                seen.making += 1;
                let rule = rule
                    .as_ref()
                    .unwrap_or_else(|e| panic!("{c:?}: the cache passed what the rule refuses: {e}"));
                assert!(std::ptr::eq(cached.kernel.get(), rule.kernel.get()), "{c:?}: another kernel");
                let (a, b_) = (b.outputs_of(cached), b.outputs_of(*rule));
                assert_eq!((a.0.as_slice(), a.1), (b_.0.as_slice(), b_.1), "{c:?}: other outputs");
            }
            let plain = inputs.len() <= KEY_OPS
                && inputs.iter().all(|t| {
                    t.is_whole() && !t.is_view() && t.check_live().is_ok() && t.inner().belongs_to(b.me)
                });
            if rule.is_ok() && plain {
                assert!(
                    b.cached_making(&op, &inputs, attrs, stream).is_some(),
                    "{c:?}: accepted, then not cached"
                );
            }
        }
        Some(outs) => {
            let outputs: Vec<&Tensor> = outs.iter().map(|&i| &tensors[i]).collect();
            let n = inputs.len() + outputs.len();
            let ask = |b: &mut InstructionsBuilder<'_>| {
                if n <= KEY_OPS {
                    b.cached_into(&op, &inputs, &outputs, attrs, stream)
                } else {
                    b.cached_into_wide(&op, &inputs, &outputs, attrs, stream)
                }
            };
            let cached = ask(b);
            let rule = b.rule(op, &inputs, Outputs::Given(&outputs), &attrs, stream);
            if rule.is_err() {
                seen.refused += 1;
            }
            let all = || inputs.iter().chain(&outputs);
            if let Some(cached) = cached {
                *(if n <= KEY_OPS { &mut seen.into } else { &mut seen.wide }) += 1;
                let rule = rule
                    .as_ref()
                    .unwrap_or_else(|e| panic!("{c:?}: the cache passed what the rule refuses: {e}"));
                assert!(std::ptr::eq(cached.kernel.get(), rule.kernel.get()), "{c:?}: another kernel");
                let last = |t: &&&Tensor| t.inner().owner().last_stream.load(Ordering::Relaxed);
                assert!(
                    all().all(|t| last(&t) == stream.0 || last(&t) == NO_STREAM),
                    "{c:?}: soft sync skipped"
                );
                // Written at once: a view would need its storage's checks and, for some
                // kernels, a copy.
                assert!(all().all(|t| !t.is_view()), "{c:?}: a view written at once");
                assert_eq!(cached.first_use, all().any(|t| last(&t) == NO_STREAM), "{c:?}: first use");
            }
            let distinct = outputs.iter().enumerate().all(|(i, o)| {
                !inputs.iter().chain(&outputs[..i]).any(|t| std::ptr::eq(t.inner(), o.inner()))
            });
            let synced = all().all(|t| {
                let last = t.inner().last_stream.load(Ordering::Relaxed);
                last == stream.0 || last == NO_STREAM
            });
            let plain = !outputs.is_empty()
                && n <= crate::framework::infer_cache::WIDE_OPS
                && distinct
                && synced
                && all().all(|t| !t.is_view() && t.check_live().is_ok() && t.inner().belongs_to(b.me));
            if rule.is_ok() && plain {
                assert!(ask(b).is_some(), "{c:?}: accepted, then not cached");
            }
        }
    }
    for t in tensors {
        t.inner().released.store(false, Ordering::Relaxed);
    }
}

#[test]
fn each_cache_of_the_rule_answers_as_the_rule_does() {
    let config = || Config::default().with_mock_devices(1, MockConfig::default());
    let vm = VirtualMachine::new(config()).expect("a VM");
    let other = VirtualMachine::new(config()).expect("another VM");
    let tensors = pool(&vm, &other);
    let mut streams: Vec<StreamId> = vm.streams().into_iter().map(|s| s.0).collect();
    // A stream the VM does not have.
    streams.push(StreamId(999));
    let ops: Vec<Op> = OPS.iter().map(|o| vm.op(o).expect("a built-in op")).collect();
    let seen = RefCell::new(Seen::default());
    vm.run(|b| {
        let b = RefCell::new(b);
        let cases = Cases { cases: 5000, failure_persistence: None, ..Cases::default() };
        let mut runner = TestRunner::new_with_rng(cases, TestRng::deterministic_rng(RngAlgorithm::ChaCha));
        runner
            .run(&case(), |c| {
                check(&mut b.borrow_mut(), &ops, &tensors, &streams, &c, &mut seen.borrow_mut());
                Ok(())
            })
            .unwrap_or_else(|e| panic!("{e}"));
    });
    let seen = seen.into_inner();
    drop(tensors);
    vm.sync().expect("the VM still runs");
    other.sync().expect("the other VM still runs");
    assert!(seen.making > 0 && seen.into > 0 && seen.wide > 0 && seen.refused > 0, "{seen:?}");
}
