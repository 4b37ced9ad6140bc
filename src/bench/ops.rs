//! The workloads that W1–W4 skip: what an eager user's program makes the VM do.
//!
//! W1–W4 take the cheapest public path (`call_into` into preallocated outputs, one cached
//! signature, one in-order stream, so no dependency edge is ever made). These take the
//! others, each checking its result against a sequential reference after the timed runs:
//!
//! - **W5 DAG across streams**: a random DAG over 256 one-element tensors, half on `cpu:0`
//!   and half on a zero-delay mock device, on all four streams (the CPU's, and the mock
//!   device's compute, H2D and D2H); every other instruction a `copy` (across devices for
//!   about half of them), the others `noop`s reading two tensors and writing a third. Each
//!   use on a stream other than the last writer's makes an edge, which the scheduler parks
//!   until the writer retires and then releases; cross-device copies add soft sync's
//!   events. It runs `n / 10` instructions (at least 100): each costs microseconds.
//! - **W6 `call_into` add chain**: `x' = x + 1` into one of two preallocated tensors in turn
//!   (the output given): the "per op, chain of tiny adds" on the cheapest path.
//! - **W7 `call` add chain**: the same chain through `InstructionsBuilder::call`, which makes
//!   each output, and the previous one dropped (a `Release` instruction per op).
//! - **W8 eager add chain**: the same chain through the eager front end, `x = x.add(&one)`.
//! - **W9 round trip**: issue one eager add, then read its result (`item`), as a training
//!   loop reads its loss: the time from issue to value in hand. It runs `n / 100`
//!   round trips (at least 100), as each costs microseconds, not nanoseconds.
//!
//! Every chain adds `1.0` in `f32` to a zero, and the result must equal the same adds done
//! one by one on the host.

use std::time::{Duration, Instant};

use super::progress::Progress;
use super::spread::{disagree, median, range};
use super::{xorshift64star, CHUNK};
use crate::eager::Context;
use crate::ep::mock::MockConfig;
use crate::ep::{DeviceId, StreamType};
use crate::framework::{Attrs, DType, InstructionsBuilder, Op, Tensor};
use crate::vm::{Config, Result, StreamId};
use crate::VirtualMachine;

/// One of the workloads W5–W9.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpsWorkload {
    /// A random DAG across CPU and mock streams.
    W5,
    /// Add chain into given outputs (`call_into`).
    W6,
    /// Add chain making its outputs (`call`), with releases.
    W7,
    /// Add chain through the eager front end.
    W8,
    /// Issue one eager add, then read its result.
    W9,
}

impl OpsWorkload {
    /// All five, in order.
    pub const ALL: [OpsWorkload; 5] =
        [OpsWorkload::W5, OpsWorkload::W6, OpsWorkload::W7, OpsWorkload::W8, OpsWorkload::W9];

    /// `W5`..`W9`.
    pub fn name(self) -> &'static str {
        match self {
            OpsWorkload::W5 => "W5",
            OpsWorkload::W6 => "W6",
            OpsWorkload::W7 => "W7",
            OpsWorkload::W8 => "W8",
            OpsWorkload::W9 => "W9",
        }
    }

    /// A short description.
    pub fn describe(self) -> &'static str {
        match self {
            OpsWorkload::W5 => "DAG on 4 streams",
            OpsWorkload::W6 => "add, call_into",
            OpsWorkload::W7 => "add, call",
            OpsWorkload::W8 => "add, eager",
            OpsWorkload::W9 => "round trip",
        }
    }

    /// The public path each op takes (what the figure measures).
    pub fn path(self) -> &'static str {
        match self {
            OpsWorkload::W5 => "InstructionsBuilder::call_into, copy and noop, cpu:0 + mock:0 (3 streams)",
            OpsWorkload::W6 => "InstructionsBuilder::call_into (output given)",
            OpsWorkload::W7 => "InstructionsBuilder::call (makes its output; the previous one released)",
            OpsWorkload::W8 => "eager::Array::add (makes its output; the previous one dropped)",
            OpsWorkload::W9 => "eager::Array::add, then Array::item",
        }
    }

    /// Parse `5`..`9` or `W5`..`W9`.
    pub fn parse(s: &str) -> Option<OpsWorkload> {
        match s.trim().trim_start_matches(['W', 'w']) {
            "5" => Some(OpsWorkload::W5),
            "6" => Some(OpsWorkload::W6),
            "7" => Some(OpsWorkload::W7),
            "8" => Some(OpsWorkload::W8),
            "9" => Some(OpsWorkload::W9),
            _ => None,
        }
    }

    /// How many ops a run of size `n` issues: W5 `n / 10` and W9 `n / 100` (at least
    /// 100), as their ops cost microseconds rather than tens of nanoseconds.
    pub fn ops(self, n: usize) -> usize {
        match self {
            OpsWorkload::W5 => (n / 10).max(100),
            OpsWorkload::W9 => (n / 100).max(100),
            _ => n,
        }
    }
}

/// The measurements of one of W5–W9 (medians over the repetitions).
#[derive(Debug, Clone, serde::Serialize)]
pub struct OpsResult {
    /// `W5`..`W9`.
    pub workload: &'static str,
    /// The public path each op takes.
    pub path: &'static str,
    /// Ops per repetition.
    pub ops: u64,
    /// Repetitions measured.
    pub reps: u32,
    /// Wall time per op, from the first call to the end of the final wait (ns).
    pub ns_per_op: f64,
    /// The caller's time per op in the calls alone (ns); for W9 the same as `ns_per_op`.
    pub push_ns_per_op: f64,
    /// The fastest and slowest repetition's `ns_per_op`.
    pub ns_range: [f64; 2],
    /// Whether the repetitions disagree by more than twice (`spread::DISAGREEMENT`).
    pub noisy: bool,
    /// Whether every repetition's result matched the sequential reference.
    pub checked: bool,
}

/// One timed repetition: (caller's time in the calls, time to the end of the final wait),
/// and whether its result matched the sequential reference.
type Timed = (Duration, Duration, bool);

/// Measure `w` at size `n`, `reps` times, on a VM of `config` (plus one zero-delay mock
/// device for W5), after a warm-up of a tenth of a run. Each repetition's result is checked
/// against a sequential reference (`OpsResult::checked`).
pub fn measure(
    w: OpsWorkload,
    n: usize,
    reps: u32,
    config: &Config,
    progress: &Progress,
) -> Result<OpsResult> {
    let ops = w.ops(n);
    let reps = reps.max(1);
    let config = match w {
        OpsWorkload::W5 => config.clone().with_mock_devices(1, MockConfig::default()),
        _ => config.clone(),
    };
    let vm = VirtualMachine::new(config)?;
    let warm = (ops / 10).clamp(1, CHUNK);
    progress.start(format!("{} warm-up", w.name()), (warm + ops * reps as usize) as u64);
    let mut dag = match w {
        OpsWorkload::W5 => Some(Dag::new(&vm, ops.min(CHUNK))?),
        _ => None,
    };
    let mut once = |ops: usize| -> Result<Timed> {
        match (w, dag.as_mut()) {
            (OpsWorkload::W5, Some(dag)) => dag.run(&vm, ops, progress),
            (OpsWorkload::W6 | OpsWorkload::W7, _) => add_chain(&vm, ops, w == OpsWorkload::W7, progress),
            _ => eager_chain(&vm, ops, w == OpsWorkload::W9, progress),
        }
    };
    let mut checked = once(warm)?.2;
    let (mut per_op, mut push) = (Vec::new(), Vec::new());
    for rep in 0..reps {
        progress.phase(format!("{} rep {}/{reps}", w.name(), rep + 1));
        let (p, e, ok) = once(ops)?;
        checked &= ok;
        per_op.push(e.as_secs_f64() * 1e9 / ops as f64);
        push.push(p.as_secs_f64() * 1e9 / ops as f64);
    }
    if let Some(dag) = &dag {
        checked &= dag.check()?;
    }
    Ok(OpsResult {
        workload: w.name(),
        path: w.path(),
        ops: ops as u64,
        reps,
        ns_range: range(&per_op),
        noisy: disagree(&per_op),
        ns_per_op: median(&mut per_op),
        push_ns_per_op: median(&mut push),
        checked,
    })
}

/// `n` additions of 1 to 0 in `f32`, one at a time, as the chains do them. Past 2^24 the
/// sum stops growing (1 is below half its spacing), so at most 2^24 + 1 are done here.
fn adds(n: usize) -> f32 {
    let mut x = 0.0f32;
    for _ in 0..n.min((1 << 24) + 1) {
        x += 1.0;
    }
    x
}

/// `0..n` in chunks of at most [`CHUNK`], for issuing with progress between them.
fn chunks(n: usize) -> impl Iterator<Item = usize> {
    (0..n).step_by(CHUNK).map(move |start| CHUNK.min(n - start))
}

/// W6 (`making` false) and W7 (`making` true): `x' = x + 1`, `n` times, in one run per
/// chunk, then a wait for the last `x`.
fn add_chain(vm: &VirtualMachine, n: usize, making: bool, progress: &Progress) -> Result<Timed> {
    let (add, cpu, none) = (vm.op("add")?, vm.compute_stream(DeviceId::CPU)?, Attrs::default());
    let one = vm.from_slice(&[1.0f32], &[1], DeviceId::CPU)?;
    let mut x = vm.from_slice(&[0.0f32], &[1], DeviceId::CPU)?;
    // W6 writes into two tensors in turn (an output may not alias an input).
    let mut spare = vm.from_slice(&[0.0f32], &[1], DeviceId::CPU)?;
    vm.sync()?;
    let (t0, mut push) = (Instant::now(), Duration::ZERO);
    for len in chunks(n) {
        let t = Instant::now();
        vm.run(|b: &mut InstructionsBuilder<'_>| -> Result<()> {
            for _ in 0..len {
                if making {
                    x = b.call(add, &[&x, &one], none, cpu)?;
                } else {
                    b.call_into(add, &[&x, &one], &[&spare], none, cpu)?;
                    std::mem::swap(&mut x, &mut spare);
                }
            }
            Ok(())
        })?;
        push += t.elapsed();
        progress.advance(len as u64);
    }
    let got = x.to_vec::<f32>()?;
    let e2e = t0.elapsed();
    Ok((push, e2e, got == [adds(n)]))
}

/// W8 (`read_each` false) and W9 (`read_each` true): the eager front end's add chain.
///
/// Kept to this one function: the eager API's handles may change shape, and only this needs
/// to follow them.
fn eager_chain(vm: &VirtualMachine, n: usize, read_each: bool, progress: &Progress) -> Result<Timed> {
    let cx = Context::new(vm);
    let one = cx.from_slice(&[1.0f32], &[1], DeviceId::CPU)?;
    let mut x = cx.from_slice(&[0.0f32], &[1], DeviceId::CPU)?;
    cx.sync()?;
    let (t0, mut push, mut ok) = (Instant::now(), Duration::ZERO, true);
    let mut done = 0usize;
    for len in chunks(n) {
        let t = Instant::now();
        for i in 0..len {
            x = x.add(&one)?;
            if read_each {
                // What the read adds beyond the round trip is one comparison.
                let want = (done + i + 1) as f32;
                ok &= x.item::<f32>()? == want || done + i >= 1 << 24;
            }
        }
        push += t.elapsed();
        done += len;
        progress.advance(len as u64);
    }
    let got = x.item::<f32>()?;
    let e2e = t0.elapsed();
    Ok((push, e2e, ok && got == adds(n)))
}

/// W5's program and state: 256 one-element tensors (`0..128` on `cpu:0`, `128..256` on
/// `mock:0`), four streams, the ops of one chunk, and the values a sequential run gives.
struct Dag {
    tensors: Vec<Tensor>,
    /// `cpu:0`, then `mock:0`'s compute, H2D and D2H streams.
    streams: [StreamId; 4],
    copy: Op,
    noop: Op,
    ops: Vec<DagOp>,
    expect: Vec<f32>,
}

/// One W5 instruction: `copy a -> w`, or `noop` reading `a` and `b` and writing `w`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct DagOp {
    copy: bool,
    a: u8,
    b: u8,
    w: u8,
    stream: u8,
}

/// W5's tensors: the first half on the host.
const DAG_TENSORS: usize = 256;

impl DagOp {
    /// `len` ops from a fixed seed; see the module docs.
    fn generate(len: usize) -> Vec<DagOp> {
        let mut s = 0x5DEE_CE66_D1CE_4E5Bu64;
        let mut r = move |m: usize| (xorshift64star(&mut s) % m as u64) as usize;
        let half = DAG_TENSORS / 2;
        let on_host = |t: usize| t < half;
        (0..len)
            .map(|i| {
                let w = r(DAG_TENSORS);
                // A tensor on w's device other than w (and than `not`).
                let mut same = |not: usize| loop {
                    let t = (w / half) * half + r(half);
                    if t != w && t != not {
                        break t;
                    }
                };
                let mock_stream = |k: usize| 1 + k % 3;
                if i % 2 == 0 {
                    let a = loop {
                        let a = r(DAG_TENSORS);
                        if a != w {
                            break a;
                        }
                    };
                    let pick = r(12);
                    let stream = match (on_host(a), on_host(w)) {
                        (true, true) => 0,
                        (false, false) => mock_stream(pick),
                        // A copy between the devices runs on a stream of either one.
                        _ => pick % 4,
                    };
                    DagOp { copy: true, a: a as u8, b: 0, w: w as u8, stream: stream as u8 }
                } else {
                    let a = same(usize::MAX);
                    let b = same(a);
                    let stream = if on_host(w) { 0 } else { mock_stream(r(3)) };
                    DagOp { copy: false, a: a as u8, b: b as u8, w: w as u8, stream: stream as u8 }
                }
            })
            .collect()
    }
}

impl Dag {
    /// The tensors filled with their index, and `len` ops (one chunk's).
    fn new(vm: &VirtualMachine, len: usize) -> Result<Dag> {
        let mock = DeviceId::mock(0);
        let streams = [
            vm.compute_stream(DeviceId::CPU)?,
            vm.compute_stream(mock)?,
            vm.stream(mock, StreamType::H2D)?,
            vm.stream(mock, StreamType::D2H)?,
        ];
        let device = |t: usize| if t < DAG_TENSORS / 2 { DeviceId::CPU } else { mock };
        let tensors: Vec<Tensor> =
            (0..DAG_TENSORS).map(|t| vm.empty(&[1], DType::F32, device(t))).collect::<Result<_>>()?;
        let fill = vm.op("fill")?;
        vm.run(|b| {
            tensors.iter().enumerate().try_for_each(|(k, t)| {
                b.call_into(fill, &[], &[t], Attrs::scalar(k as f64), vm.compute_stream(device(k))?)
            })
        })?;
        vm.sync()?;
        Ok(Dag {
            tensors,
            streams,
            copy: vm.op("copy")?,
            noop: vm.op("noop")?,
            ops: DagOp::generate(len),
            expect: (0..DAG_TENSORS).map(|k| k as f32).collect(),
        })
    }

    /// Issue `n` ops (the chunk's, over and over), wait for all, and apply them to the
    /// reference (untimed).
    fn run(&mut self, vm: &VirtualMachine, n: usize, progress: &Progress) -> Result<Timed> {
        let (t, none) = (&self.tensors, Attrs::default());
        let (t0, mut push) = (Instant::now(), Duration::ZERO);
        for len in chunks(n) {
            let ops = &self.ops[..len];
            let tp = Instant::now();
            vm.run(|b| -> Result<()> {
                for o in ops {
                    let (a, w, s) = (&t[o.a as usize], &t[o.w as usize], self.streams[o.stream as usize]);
                    match o.copy {
                        true => b.call_into(self.copy, &[a], &[w], none, s)?,
                        false => b.call_into(self.noop, &[a, &t[o.b as usize]], &[w], none, s)?,
                    }
                }
                Ok(())
            })?;
            push += tp.elapsed();
            progress.advance(len as u64);
        }
        vm.sync()?;
        let e2e = t0.elapsed();
        for len in chunks(n) {
            for o in self.ops[..len].iter().filter(|o| o.copy) {
                self.expect[o.w as usize] = self.expect[o.a as usize];
            }
        }
        Ok((push, e2e, true))
    }

    /// Whether every tensor holds what the sequential run gives.
    fn check(&self) -> Result<bool> {
        for (t, want) in self.tensors.iter().zip(&self.expect) {
            if t.to_vec::<f32>()? != [*want] {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dag_crosses_devices_and_keeps_each_op_on_a_stream_of_its_tensors() {
        let ops = DagOp::generate(20_000);
        assert_eq!(ops, DagOp::generate(20_000), "the same DAG every run");
        let host = |t: u8| (t as usize) < DAG_TENSORS / 2;
        let mut cross = 0;
        for o in &ops {
            assert_ne!(o.a, o.w);
            if o.copy {
                match (host(o.a), host(o.w)) {
                    (true, true) => assert_eq!(o.stream, 0),
                    (false, false) => assert!((1..4).contains(&o.stream)),
                    _ => cross += 1,
                }
            } else {
                assert!(o.b != o.a && o.b != o.w);
                assert!(host(o.a) == host(o.w) && host(o.b) == host(o.w));
                assert_eq!(o.stream == 0, host(o.w));
            }
        }
        // About half the copies cross between the devices, on all four streams.
        assert!(cross > 4000, "{cross} cross-device copies of 10000");
        let streams: std::collections::BTreeSet<u8> = ops.iter().map(|o| o.stream).collect();
        assert_eq!(streams.len(), 4);
    }

    #[test]
    fn the_dag_check_reads_the_tensors_and_catches_a_wrong_value() {
        let vm = VirtualMachine::new(Config::default().with_mock_devices(1, MockConfig::default())).unwrap();
        let mut dag = Dag::new(&vm, 2000).unwrap();
        dag.run(&vm, 2000, &Progress::hidden()).unwrap();
        assert!(dag.check().unwrap(), "the VM's result is the sequential one");
        // Some tensor was copied over: the values moved away from the initial ones.
        assert!(dag.expect.iter().enumerate().any(|(k, &v)| v != k as f32));
        dag.expect[200] += 0.5;
        assert!(!dag.check().unwrap(), "a value other than the sequential one is caught");
    }

    #[test]
    fn the_reference_sum_stops_where_f32_does() {
        assert_eq!(adds(0), 0.0);
        assert_eq!(adds(1000), 1000.0);
        assert_eq!(adds(usize::MAX), 16_777_216.0);
    }
}
