//! Random tensor programs, a plain sequential interpreter for them, and a runner that
//! executes them on the VM: the pieces of the serialisability property tests. The
//! interpreter also models failures (`fail` and `panic` steps, allocations that fail), for
//! the fault-injection soak of `lifecycle`.
//!
//! A program's tensors live on the devices of its [`Mix`]: `cpu:0`, `mock:0` and `mock:1`
//! by default, and `cuda:0` as well in [`Mix::WITH_CUDA`]. On CUDA tensors the programs use
//! only ops whose CUDA kernels give the CPU's result bit for bit (`fill`, `copy`, `add`,
//! `mul`, `sub`, `relu_grad`, `scale`, `relu`: one IEEE operation per element), never
//! `matmul`, whose cuBLAS result may differ in the last bits; so the comparison with the
//! interpreter stays exact on every device.
//!
//! Beside them: the fuzz targets' helpers ([`fuzz`]), the proptest configuration of the
//! property tests ([`proptest_config`]), and [`alone`], which runs a test in a process of
//! its own.

use eagervm::ep::mock::MockConfig;
use eagervm::framework::Scalar;
use eagervm::kernels::exp_f32;
use eagervm::prelude::*;
use eagervm::vm::ThreadTopology;
use proptest::test_runner::{Config as ProptestConfig, FileFailurePersistence};

/// Random programs over views of shared storages.
pub mod views;

/// The fuzz targets' inputs and harness (`fuzz`).
pub mod fuzz {
    pub mod builder_case;
    pub mod builder_input;
    pub mod harness;
    pub mod trace_input;
}

/// A proptest configuration of `cases` cases whose failures are kept in the
/// `.proptest-regressions` file beside the test's source file and replayed first on every
/// run. (Proptest's default, which looks for the directory of a `main.rs`, would keep them
/// in `tests/proptest-regressions/`.)
pub fn proptest_config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))),
        ..ProptestConfig::default()
    }
}

/// The name the test harness gives the test `name` of the module `module` (its
/// `module_path!()`): the module path without the crate, then the name.
pub fn test_name(module: &str, name: &str) -> String {
    match module.split_once("::") {
        Some((_crate, path)) => format!("{path}::{name}"),
        None => name.to_string(),
    }
}

/// Set in a child process that [`alone`] starts: the name of the one test it runs.
const ALONE: &str = "EAGERVM_TEST_ALONE";

/// For a test that must have its process to itself (it counts the process's threads or
/// measures its resident memory, installs a process-wide subscriber, or needs its own
/// environment), as the other tests of this binary run beside it: `true` in a child process
/// of this test binary that runs that test alone, where the test then runs its body;
/// elsewhere it starts that child, with `env` added to its environment, checks that the
/// child ran the test and that it passed (failing with the child's output otherwise), and
/// returns `false`. `module` is the test's `module_path!()`, `name` its function's name.
pub fn alone(module: &str, name: &str, env: &[(&str, &str)]) -> bool {
    let test = test_name(module, name);
    if std::env::var(ALONE).is_ok_and(|t| t == test) {
        return true;
    }
    let out = std::process::Command::new(std::env::current_exe().expect("the test binary's path"))
        .args(["--exact", &test, "--test-threads=1", "--nocapture"])
        .env(ALONE, &test)
        .envs(env.iter().copied())
        .output()
        .expect("the test binary runs again");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success() && stdout.contains("test result: ok. 1 passed"),
        "{test} in a child process: {}\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        out.status
    );
    // Shown with `--nocapture`, as the test's own output would be.
    print!("{stdout}");
    eprint!("{stderr}");
    false
}

/// Every tensor is f32[2, 2], so that every op (matmul included) applies to any of them.
pub const SHAPE: [usize; 2] = [2, 2];
pub const N: usize = 4;

/// The devices a program's tensors live on, cycling over [`Mix::devices`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Mix {
    /// Whether `cuda:0` is one of them.
    pub cuda: bool,
    /// Whether programs also issue collectives over the mock communicators of [`COMMS`].
    pub collectives: bool,
}

/// The mock communicators the collective steps use: a name and its members, rank order.
/// The second leads from the host, so its collectives run on `cpu:0`'s collective stream.
pub const COMMS: [(&str, &[DeviceId]); 2] = [
    ("pair", &[DeviceId::mock(0), DeviceId::mock(1)]),
    ("trio", &[DeviceId::CPU, DeviceId::mock(1), DeviceId::mock(0)]),
];

impl Mix {
    /// `cpu:0`, `mock:0`, `mock:1`: runs everywhere.
    pub const CPU_MOCK: Mix = Mix { cuda: false, collectives: false };
    /// The default devices, with collectives among them.
    pub const COLLECTIVES: Mix = Mix { cuda: false, collectives: true };
    /// `cpu:0`, `mock:0`, `mock:1`, `cuda:0`: needs a GPU.
    pub const WITH_CUDA: Mix = Mix { cuda: true, collectives: false };

    /// The devices, in the order tensors cycle over them.
    pub fn devices(self) -> &'static [DeviceId] {
        const BASE: [DeviceId; 3] = [DeviceId::CPU, DeviceId::mock(0), DeviceId::mock(1)];
        const CUDA: [DeviceId; 4] = [DeviceId::CPU, DeviceId::mock(0), DeviceId::mock(1), DeviceId::cuda(0)];
        if self.cuda {
            &CUDA
        } else {
            &BASE
        }
    }

    /// Where tensor `t` lives.
    pub fn device_of(self, t: usize) -> DeviceId {
        let d = self.devices();
        d[t % d.len()]
    }

    /// The streams of `d`, as indices into the table [`execute`] builds: for each device in
    /// order, its compute stream (the host's only stream), then H2D and D2H. For the default
    /// mix: 0 cpu, 1-3 mock:0 compute/h2d/d2h, 4-6 mock:1 compute/h2d/d2h; then 7-9 cuda:0.
    pub fn streams_of(self, d: DeviceId) -> &'static [usize] {
        match d.ty {
            eagervm::ep::DeviceType::Cpu => &[0],
            eagervm::ep::DeviceType::Mock if d.index == 0 => &[1, 2, 3],
            eagervm::ep::DeviceType::Mock => &[4, 5, 6],
            eagervm::ep::DeviceType::Cuda => &[7, 8, 9],
        }
    }

    /// The stream table of `vm` in the order of [`Mix::streams_of`].
    pub fn stream_table(self, vm: &VirtualMachine) -> eagervm::Result<Vec<StreamId>> {
        let mut table = Vec::new();
        for &d in self.devices() {
            if d.is_host() {
                table.push(vm.compute_stream(d)?);
            } else {
                for ty in StreamType::DEVICE {
                    table.push(vm.stream(d, ty)?);
                }
            }
        }
        Ok(table)
    }

    /// The binary ops a program uses on tensors of `d`.
    fn binary_ops(self, d: DeviceId) -> [&'static str; 4] {
        if d.ty == eagervm::ep::DeviceType::Cuda {
            ["add", "mul", "sub", "relu_grad"]
        } else {
            ["add", "mul", "matmul", "maximum"]
        }
    }
}

/// Where each of the program's tensors lives in the default mix: host, mock:0, mock:1,
/// cycling.
pub fn device_of(t: usize) -> DeviceId {
    Mix::CPU_MOCK.device_of(t)
}

/// One step of a program.
#[derive(Debug, Clone)]
pub enum Step {
    Fill {
        out: usize,
        value: f32,
        stream: usize,
    },
    Unary {
        op: &'static str,
        a: usize,
        out: usize,
        factor: f32,
        stream: usize,
    },
    Binary {
        op: &'static str,
        a: usize,
        b: usize,
        out: usize,
        stream: usize,
    },
    Copy {
        src: usize,
        dst: usize,
        stream: usize,
    },
    /// A collective over communicator `comm` of [`COMMS`]: input and output `k` on its
    /// member `k`'s device.
    Collective {
        comm: usize,
        op: eagervm::ep::ccl::Collective,
        ins: Vec<usize>,
        outs: Vec<usize>,
    },
    /// Read a tensor back to the host at this point of the program.
    Read {
        t: usize,
    },
    /// Drop a tensor's handle and replace it with a new tensor on the same device.
    Recreate {
        t: usize,
    },
}

/// A program over `tensors` tensors (the first `tensors` are filled before the steps).
#[derive(Debug, Clone)]
pub struct Program {
    pub tensors: usize,
    pub steps: Vec<Step>,
    /// The devices its tensors live on.
    pub mix: Mix,
    /// Whether its tensors are views of shared storages ([`views`]).
    pub views: bool,
}

/// The streams of the VM built by [`vm`], by index: 0 cpu, 1-3 mock:0 compute/h2d/d2h,
/// 4-6 mock:1 compute/h2d/d2h.
pub fn streams_of(d: DeviceId) -> &'static [usize] {
    Mix::CPU_MOCK.streams_of(d)
}

/// Raw random numbers that [`decode`] turns into a program: one tuple per step.
pub type Raw = Vec<(u8, u8, u8, u8, u8, i8)>;

/// Decode raw random numbers into a valid program on the default mix (so proptest can
/// shrink the numbers).
pub fn decode(tensors: usize, raw: &[(u8, u8, u8, u8, u8, i8)]) -> Program {
    decode_on(Mix::CPU_MOCK, tensors, raw)
}

/// Decode raw random numbers into a valid program over the devices of `mix`.
pub fn decode_on(mix: Mix, tensors: usize, raw: &[(u8, u8, u8, u8, u8, i8)]) -> Program {
    decode_with(mix, tensors, raw, |t| mix.device_of(t))
}

/// [`decode_on`], with tensor `t` on `device_of(t)` (a device of `mix`).
pub fn decode_with(
    mix: Mix,
    tensors: usize,
    raw: &[(u8, u8, u8, u8, u8, i8)],
    device_of: impl Fn(usize) -> DeviceId,
) -> Program {
    let same_device = |tensors: usize, out: usize, pick: u8| -> Option<usize> {
        let cands: Vec<usize> =
            (0..tensors).filter(|&x| x != out && device_of(x) == device_of(out)).collect();
        (!cands.is_empty()).then(|| cands[pick as usize % cands.len()])
    };
    let streams_of = |d: DeviceId| mix.streams_of(d);
    let mut steps = Vec::new();
    let kinds = if mix.collectives { 14 } else { 12 };
    for &(kind, a, b, c, s, v) in raw {
        let t = |x: u8| x as usize % tensors;
        let value = v as f32 / 16.0;
        if kind % kinds >= 12 {
            let Some(step) = collective_step(mix, tensors, kind / kinds, [a, b, c, s], v) else { continue };
            steps.push(step);
            continue;
        }
        let step = match kind % 12 {
            0 => {
                let out = t(a);
                let ss = streams_of(device_of(out));
                Step::Fill { out, value, stream: ss[s as usize % ss.len()] }
            }
            1 | 2 => {
                // Same-device unary op: pick tensors on the output's device.
                let out = t(a);
                let Some(a) = same_device(tensors, out, b) else { continue };
                let ss = streams_of(device_of(out));
                // Kind 1: one of the unary ops (relu only on CUDA, which has no `tril`).
                let op = match kind % 12 {
                    1 if device_of(out).ty == eagervm::ep::DeviceType::Cuda => "relu",
                    1 => UNARY_OPS[c as usize % UNARY_OPS.len()],
                    _ => "scale",
                };
                Step::Unary { op, a, out, factor: value, stream: ss[s as usize % ss.len()] }
            }
            3..=6 => {
                let out = t(a);
                let (Some(x), Some(y)) = (same_device(tensors, out, b), same_device(tensors, out, c)) else {
                    continue;
                };
                let op = mix.binary_ops(device_of(out))[(kind % 12 - 3) as usize];
                let ss = streams_of(device_of(out));
                Step::Binary { op, a: x, b: y, out, stream: ss[s as usize % ss.len()] }
            }
            7..=9 => {
                let (src, dst) = (t(a), t(b));
                if src == dst {
                    continue;
                }
                // A copy runs on a stream of either device; one with a CUDA end on a CUDA
                // stream (the host kernels cannot reach device memory).
                let (from, to) = (device_of(src), device_of(dst));
                let cuda = [from, to].into_iter().find(|d| d.ty == eagervm::ep::DeviceType::Cuda);
                let mut ss: Vec<usize> = streams_of(cuda.unwrap_or(from)).to_vec();
                if cuda.is_none() {
                    ss.extend_from_slice(streams_of(to));
                }
                Step::Copy { src, dst, stream: ss[s as usize % ss.len()] }
            }
            10 => Step::Read { t: t(a) },
            _ => Step::Recreate { t: t(a) },
        };
        steps.push(step);
    }
    Program { tensors, steps, mix, views: false }
}

/// A collective step from raw numbers: its communicator and op from `sel`, one input and a
/// distinct output per member from `picks` (`None` when a device has too few tensors).
fn collective_step(mix: Mix, tensors: usize, sel: u8, picks: [u8; 4], v: i8) -> Option<Step> {
    use eagervm::ep::ccl::{Collective, ReduceOp};
    let comm = usize::from(sel % 2);
    let members = COMMS[comm].1;
    let op = match (sel / 2) % 5 {
        4 => Collective::Broadcast { root: v.unsigned_abs() as usize % members.len() },
        r => Collective::AllReduce(ReduceOp::ALL[r as usize]),
    };
    let (mut ins, mut outs) = (Vec::new(), Vec::new());
    for (k, &d) in members.iter().enumerate() {
        let on: Vec<usize> = (0..tensors).filter(|&x| mix.device_of(x) == d).collect();
        if on.len() < 2 {
            return None;
        }
        let (pick, n) = (picks[k % 4].wrapping_add(k as u8) as usize, on.len());
        // Distinct: the output is 1 to n - 1 places after the input.
        ins.push(on[pick % n]);
        outs.push(on[(pick % n + 1 + (pick / n) % (n - 1)) % n]);
    }
    // An output may not be another member's input either (an input and an output of one
    // call never alias): inputs and outputs of different members are on different devices.
    Some(Step::Collective { comm, op, ins, outs })
}

/// The unary ops of the random programs besides `scale`: pointwise math, and ops whose
/// parameter list ([`unary_attrs`]) comes from the step's factor.
pub const UNARY_OPS: [&str; 8] = ["relu", "exp", "tanh", "sigmoid", "abs", "tril", "triu", "clamp_scalar"];

/// The diagonal (-1, 0 or 1) a `tril` or `triu` step with `factor` keeps.
fn diagonal_of(factor: f32) -> i64 {
    ((factor * 16.0) as i64).rem_euclid(3) - 1
}

/// The attributes of a unary step of `op` with `factor`: the factor as the scalar (`scale`,
/// and the codes of `fail` and `panic`), the diagonal of `tril` and `triu`, the bounds
/// `[factor, factor + 1]` of `clamp_scalar`.
pub fn unary_attrs(op: &str, factor: f32) -> Attrs {
    let with =
        |ints: &[i64], scalars: &[Scalar]| Attrs::default().with_params(ints, scalars).expect("few lists");
    match op {
        "tril" | "triu" => with(&[diagonal_of(factor)], &[]),
        "clamp_scalar" => {
            with(&[1, 1], &[Scalar::Float(f64::from(factor)), Scalar::Float(f64::from(factor) + 1.0)])
        }
        _ => Attrs::scalar(factor as f64),
    }
}

/// PyTorch's `maximum` and `minimum` of two floats: a NaN of either propagates.
fn extreme(a: f32, b: f32, max: bool) -> f32 {
    if a.is_nan() || (!b.is_nan() && if max { a >= b } else { a <= b }) {
        a
    } else {
        b
    }
}

/// The value tensor `t` starts with (and gets again when it is re-created).
pub fn initial(t: usize) -> Vec<f32> {
    (0..N).map(|k| (t * N + k) as f32 * 0.25 - 2.0).collect()
}

fn matmul(a: &[f32], b: &[f32]) -> Vec<f32> {
    let mut out = vec![0.0f32; N];
    for i in 0..2 {
        for k in 0..2 {
            for j in 0..2 {
                out[i * 2 + j] += a[i * 2 + k] * b[k * 2 + j];
            }
        }
    }
    out
}

/// The result of a program: every `Read` in order, then every tensor's final value.
pub type Outcome = Vec<Vec<u32>>;

pub fn bits(v: &[f32]) -> Vec<u32> {
    // All NaNs compare equal; everything else bit for bit.
    v.iter().map(|x| if x.is_nan() { u32::MAX } else { x.to_bits() }).collect()
}

/// Where the error a tensor carries came from, as the sequential reference tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// The kernel of a `fail` step (a `Unary` step with op `fail`) whose factor was this tag.
    Fail(u32),
    /// The kernel of a `panic` step with this tag.
    Panic(u32),
    /// The storage of the tensor with this id could not be allocated.
    Alloc(u64),
}

impl Origin {
    /// The origin a VM error names: the `fail` or `panic` op's tag (its scalar attribute,
    /// which its message repeats), or the tensor an out-of-memory error names; `None` for
    /// any other error.
    pub fn of(e: &eagervm::Error) -> Option<Origin> {
        use eagervm::ep::EpError;
        use eagervm::Error;
        let tag = |m: &str, prefix: &str| m.strip_prefix(prefix)?.parse::<u32>().ok();
        match e {
            Error::Kernel { op, message, .. } if op == "fail" => tag(message, "fail op: ").map(Origin::Fail),
            Error::Panic { op, message, .. } if op == "panic" => {
                tag(message, "panic op: ").map(Origin::Panic)
            }
            Error::Alloc { source: EpError::OutOfMemory { detail, .. }, .. } => {
                let rest = detail.strip_prefix("tensor ")?;
                rest[..rest.find(':')?].parse().ok().map(Origin::Alloc)
            }
            _ => None,
        }
    }
}

/// A tensor's value in the reference: its elements, or the failure it carries.
pub type Value = Result<Vec<f32>, Origin>;

/// An allocation the reference asks about (see [`Interpreter`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Site {
    /// Making tensor `t` (at the start, or re-creating it) with its initial value.
    Create(usize),
    /// A step writing tensor `t`, which allocates it if it has no storage yet.
    Write(usize),
    /// Reading tensor `t` back to the host (through a copy, for a device tensor).
    Read(usize),
}

/// The sequential reference: runs a program's steps one at a time on plain vectors. An
/// instruction that reads a failed tensor carries the failure on; otherwise one whose
/// output cannot be allocated fails with [`Origin::Alloc`]; otherwise a `fail` or `panic`
/// step fails with its tag; otherwise the step computes. `alloc` answers, for each
/// [`Site`], whether its allocation fails and with which origin; the serialisability tests
/// answer "never".
pub struct Interpreter {
    val: Vec<Value>,
    /// Instructions that failed themselves (what the VM's failure log counts) since the
    /// last [`Interpreter::take_failures`].
    failures: u64,
}

/// The reference's answer, for each allocation, whether it fails.
pub type Allocs<'a> = &'a mut dyn FnMut(Site) -> Option<Origin>;

impl Interpreter {
    /// `tensors` tensors, each created with its initial value.
    pub fn new(tensors: usize, alloc: Allocs<'_>) -> Self {
        let mut me = Interpreter { val: Vec::with_capacity(tensors), failures: 0 };
        for t in 0..tensors {
            let v = me.create(t, alloc);
            me.val.push(v);
        }
        me
    }

    fn create(&mut self, t: usize, alloc: Allocs<'_>) -> Value {
        match alloc(Site::Create(t)) {
            Some(o) => {
                self.failures += 1;
                Err(o)
            }
            None => Ok(initial(t)),
        }
    }

    /// Tensor `t`'s value now.
    pub fn value(&self, t: usize) -> &Value {
        &self.val[t]
    }

    /// Set the values of the tensors given (growing the table as needed).
    pub fn load(&mut self, values: impl Iterator<Item = (usize, Vec<f32>)>) {
        for (t, v) in values {
            if self.val.len() <= t {
                self.val.resize(t + 1, Ok(Vec::new()));
            }
            self.val[t] = Ok(v);
        }
    }

    /// The failures counted since the last call.
    pub fn take_failures(&mut self) -> u64 {
        std::mem::take(&mut self.failures)
    }

    /// Write `out` from `inputs` (see the type's docs for the order of the checks).
    fn write(&mut self, out: usize, inputs: &[usize], alloc: Allocs<'_>, f: impl FnOnce(&[&[f32]]) -> Value) {
        let mut args: Vec<&[f32]> = Vec::with_capacity(inputs.len());
        for &i in inputs {
            match &self.val[i] {
                Ok(v) => args.push(v),
                Err(o) => {
                    self.val[out] = Err(o.clone());
                    return;
                }
            }
        }
        let v = match alloc(Site::Write(out)) {
            Some(o) => Err(o),
            None => f(&args),
        };
        self.failures += u64::from(v.is_err());
        self.val[out] = v;
    }

    /// Run one step; a `Read` returns what the read gives.
    pub fn step(&mut self, s: &Step, alloc: Allocs<'_>) -> Option<Value> {
        match *s {
            Step::Fill { out, value, .. } => self.write(out, &[], alloc, |_| Ok(vec![value; N])),
            Step::Unary { op, a, out, factor, .. } => self.write(out, &[a], alloc, |x| match op {
                "fail" => Err(Origin::Fail(factor as u32)),
                "panic" => Err(Origin::Panic(factor as u32)),
                "relu" => Ok(x[0].iter().map(|&x| if x < 0.0 { 0.0 } else { x }).collect()),
                // The kernels' `f32` `exp` (`eagervm::kernels::exp_f32`), which std's is not.
                "exp" => Ok(x[0].iter().map(|&x| exp_f32(x)).collect()),
                "tanh" => Ok(x[0].iter().map(|&x| x.tanh()).collect()),
                "sigmoid" => Ok(x[0].iter().map(|&x| 1.0 / (1.0 + exp_f32(-x))).collect()),
                "abs" => Ok(x[0].iter().map(|&x| x.abs()).collect()),
                // [2, 2]: element (i, j) at 2i + j; tril keeps j - i <= d, triu j - i >= d.
                "tril" | "triu" => {
                    let d = diagonal_of(factor);
                    let keep = |k: usize| {
                        let off = (k % 2) as i64 - (k / 2) as i64;
                        if op == "tril" {
                            off <= d
                        } else {
                            off >= d
                        }
                    };
                    Ok(x[0].iter().enumerate().map(|(k, &x)| if keep(k) { x } else { 0.0 }).collect())
                }
                "clamp_scalar" => {
                    Ok(x[0].iter().map(|&x| extreme(extreme(x, factor, true), factor + 1.0, false)).collect())
                }
                "scale" => Ok(x[0].iter().map(|&x| x * factor).collect()),
                other => panic!("the interpreter has no unary op `{other}`"),
            }),
            Step::Binary { op, a, b, out, .. } => self.write(out, &[a, b], alloc, |x| {
                let (a, b) = (x[0], x[1]);
                Ok(match op {
                    "add" => a.iter().zip(b).map(|(x, y)| x + y).collect(),
                    "mul" => a.iter().zip(b).map(|(x, y)| x * y).collect(),
                    "sub" => a.iter().zip(b).map(|(x, y)| x - y).collect(),
                    // Inputs (dy, x).
                    "relu_grad" => a.iter().zip(b).map(|(&dy, &x)| if x > 0.0 { dy } else { 0.0 }).collect(),
                    "maximum" => a.iter().zip(b).map(|(&x, &y)| extreme(x, y, true)).collect(),
                    "matmul" => matmul(a, b),
                    other => panic!("the interpreter has no op `{other}`"),
                })
            }),
            Step::Copy { src, dst, .. } => self.write(dst, &[src], alloc, |x| Ok(x[0].to_vec())),
            Step::Collective { op, ref ins, ref outs, .. } => {
                use eagervm::ep::ccl::{Collective, ReduceOp};
                // The first failed input (in member order) is carried onto every output.
                let args: Result<Vec<&[f32]>, Origin> =
                    ins.iter().map(|&i| self.val[i].as_deref().map_err(Clone::clone)).collect();
                let result: Value = args.map(|x| match op {
                    Collective::Broadcast { root } => x[root].to_vec(),
                    Collective::AllReduce(r) => {
                        // In member order, as the mock backend combines them.
                        let mut acc = x[0].to_vec();
                        for y in &x[1..] {
                            for (a, &b) in acc.iter_mut().zip(y.iter()) {
                                *a = match r {
                                    ReduceOp::Sum | ReduceOp::Mean => *a + b,
                                    ReduceOp::Max if a.is_nan() || b.is_nan() => f32::NAN,
                                    ReduceOp::Min if a.is_nan() || b.is_nan() => f32::NAN,
                                    ReduceOp::Max => a.max(b),
                                    ReduceOp::Min => a.min(b),
                                };
                            }
                        }
                        if r == ReduceOp::Mean {
                            acc.iter_mut().for_each(|a| *a /= x.len() as f32);
                        }
                        acc
                    }
                    other => panic!("the programs issue no {other:?}"),
                });
                for &o in outs {
                    self.val[o] = result.clone();
                }
            }
            Step::Read { t } => {
                return Some(match &self.val[t] {
                    Err(o) => Err(o.clone()),
                    Ok(v) => match alloc(Site::Read(t)) {
                        Some(o) => {
                            self.failures += 1;
                            Err(o)
                        }
                        None => Ok(v.clone()),
                    },
                })
            }
            Step::Recreate { t } => self.val[t] = self.create(t, alloc),
        }
        None
    }
}

/// Run the program one step at a time on plain vectors (no step fails).
pub fn interpret(p: &Program) -> Outcome {
    if p.views {
        return views::interpret(p);
    }
    let never = &mut |_| None;
    let mut it = Interpreter::new(p.tensors, never);
    let ok = |v: Value| bits(&v.expect("the serialisability programs have no failing steps"));
    let mut out: Outcome = p.steps.iter().filter_map(|s| it.step(s, never)).map(ok).collect();
    out.extend((0..p.tensors).map(|t| ok(it.value(t).clone())));
    out
}

/// A VM with `cpu:0`, `mock:0`, `mock:1` and the given timing and topology.
pub fn vm(mock: MockConfig, threads: ThreadTopology, synchronous: bool) -> VirtualMachine {
    vm_on(Mix::CPU_MOCK, mock, threads, synchronous).expect("vm starts")
}

/// A VM with the devices of `mix` and the given timing and topology; an error (for
/// example `CudaUnavailable`) when a device cannot be opened.
pub fn vm_on(
    mix: Mix,
    mock: MockConfig,
    threads: ThreadTopology,
    synchronous: bool,
) -> eagervm::Result<VirtualMachine> {
    let mut c = Config::default().with_mock_devices(2, mock).with_cuda_devices(u16::from(mix.cuda));
    c.threads = threads;
    c.synchronous = synchronous;
    c.batch_size = 16; // small batches: more interleaving between caller and scheduler
                       // On the asynchronous streams, launches covered by an event of the interval as well as
                       // by the one behind each worker batch.
    c.event_interval = 5;
    VirtualMachine::new(c)
}

/// Emit step `s` (any step but `Read` and `Recreate`) on `b`, over the program's tensors
/// `ts` and the stream table `streams` ([`Mix::stream_table`]).
pub fn emit(
    vm: &VirtualMachine,
    b: &mut eagervm::framework::InstructionsBuilder<'_>,
    s: &Step,
    ts: &[Tensor],
    streams: &[StreamId],
) -> eagervm::Result<()> {
    let ops = |n: &str| vm.op(n).expect("built-in");
    match *s {
        Step::Read { .. } | Step::Recreate { .. } => panic!("{s:?} is not emitted on a builder"),
        Step::Fill { out: o, value, stream } => {
            b.call_into(ops("fill"), &[], &[&ts[o]], Attrs::scalar(value as f64), streams[stream])
        }
        Step::Unary { op, a, out: o, factor, stream } => {
            b.call_into(ops(op), &[&ts[a]], &[&ts[o]], unary_attrs(op, factor), streams[stream])
        }
        Step::Binary { op, a, b: y, out: o, stream } => {
            b.call_into(ops(op), &[&ts[a], &ts[y]], &[&ts[o]], Attrs::default(), streams[stream])
        }
        Step::Copy { src, dst, stream } => {
            b.call_into(ops("copy"), &[&ts[src]], &[&ts[dst]], Attrs::default(), streams[stream])
        }
        Step::Collective { comm, op, ref ins, ref outs } => {
            let comm = communicator(vm, comm)?;
            let ins: Vec<&Tensor> = ins.iter().map(|&i| &ts[i]).collect();
            let outs: Vec<&Tensor> = outs.iter().map(|&o| &ts[o]).collect();
            b.collective_into(&comm, op, &ins, &outs)
        }
    }
}

/// Communicator `k` of [`COMMS`] on `vm`, made on first use.
pub fn communicator(vm: &VirtualMachine, k: usize) -> eagervm::Result<eagervm::framework::Communicator> {
    let (name, members) = COMMS[k];
    match vm.find_communicator(name) {
        Some(c) => Ok(c),
        None => vm.mock_communicator(name, members),
    }
}

/// Run the program on `vm`, which must have the devices of the program's mix.
pub fn execute(vm: &VirtualMachine, p: &Program) -> eagervm::Result<Outcome> {
    if p.views {
        return views::execute(vm, p);
    }
    let streams = p.mix.stream_table(vm)?;
    let make =
        |t: usize| -> eagervm::Result<Tensor> { vm.from_slice(&initial(t), &SHAPE, p.mix.device_of(t)) };
    let mut ts: Vec<Tensor> = (0..p.tensors).map(make).collect::<eagervm::Result<_>>()?;
    let mut out = Vec::new();
    let mut i = 0;
    while i < p.steps.len() {
        // Submit up to the next read or recreate in one `run`; a read goes with the batch
        // (`InstructionsBuilder::to_vec`), so that an idle VM lets this thread run it.
        vm.run(|b| -> eagervm::Result<()> {
            while i < p.steps.len() {
                match p.steps[i] {
                    Step::Read { t } => {
                        out.push(bits(&b.to_vec::<f32>(&ts[t])?));
                        break;
                    }
                    Step::Recreate { .. } => break,
                    _ => emit(vm, b, &p.steps[i], &ts, &streams)?,
                }
                i += 1;
            }
            Ok(())
        })?;
        if let Some(Step::Recreate { t }) = p.steps.get(i) {
            ts[*t] = make(*t)?;
        }
        i += 1;
    }
    for t in &ts {
        out.push(bits(&t.to_vec::<f32>()?));
    }
    Ok(out)
}
