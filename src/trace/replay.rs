//! Replay: run a trace on a fresh VM and check what it states.
//!
//! Two modes:
//! - **As recorded** (the default): every instruction is emitted exactly as the trace lists
//!   it, through the builder's raw emission path (no soft sync), with the trace's own
//!   `record`/`wait` instructions; event numbers are mapped to fresh VM event ids. This
//!   needs the recorded device layout. An `after` emits nothing: the scheduler orders the
//!   same instructions, admitted in the same order, exactly as it did when they were
//!   recorded.
//! - **Resync** ([`ReplayOptions::resync`]): `record`, `wait` and `after` are dropped and calls go
//!   through the ordinary builder, which derives the synchronisation again. A trace recorded
//!   on one device layout then replays on another ([`DeviceMap`]).
//!
//! Statements that block the host (`access ... read|wait`, `barrier`) end the current
//! batch, as the recorded program's `to_vec`, `wait` and `sync` did. After the last
//! statement the replay syncs, reads every `expect`ed tensor and compares checksums, and
//! matches the failures it saw against the trace's `expect error` (a failure the trace does
//! not expect is an error, and so is an expected one that does not happen).

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom};
use std::time::{Duration, Instant};

use smallvec::SmallVec;

use super::format::{
    AccessKind, DTypeCount, Data, DeviceKind, FailureKind, Line, Ref, Stmt, Trace, TraceDevice,
};
use super::progress::{Phase, Progress, STRIDE};
use super::record::failure_of;
use super::validate::{kernel_device, validate_with, ValidateOptions};
use super::{checksum, Diagnostic, TraceError};
use crate::ep::{DeviceId, DeviceType, EpError, StreamType};
use crate::framework::{DType, Tensor};
use crate::profile::Profile;
use crate::vm::instruction::AccessSlot;
use crate::vm::Error;
use crate::vm::StreamId;
use crate::{Config, VirtualMachine};

/// Where the trace's devices run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceMap {
    /// On the devices the trace names (`mock:1` on `mock:1`, `cuda:0` on `cuda:0`, which
    /// is a typed "device unavailable" error where the machine has no CUDA driver or GPU).
    #[default]
    AsRecorded,
    /// Everything on the host, `cpu:0` (needs `resync`).
    Cpu,
    /// Every non-host device on the mock device of the same index (needs `resync` unless
    /// the trace already uses only `cpu` and `mock`).
    Mock,
    /// Every non-host device on the CUDA device of the same index, modulo the number of
    /// GPUs the machine has (needs `resync` unless the trace already uses only `cpu` and
    /// `cuda` on as many GPUs).
    Cuda,
}

impl std::fmt::Display for DeviceMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DeviceMap::AsRecorded => "as recorded",
            DeviceMap::Cpu => "all on cpu:0",
            DeviceMap::Mock => "mock",
            DeviceMap::Cuda => "cuda",
        })
    }
}

impl std::str::FromStr for DeviceMap {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "recorded" => Ok(DeviceMap::AsRecorded),
            "cpu" => Ok(DeviceMap::Cpu),
            "mock" => Ok(DeviceMap::Mock),
            "cuda" => Ok(DeviceMap::Cuda),
            _ => Err(format!("unknown device `{s}` (expected cpu, mock, cuda or recorded)")),
        }
    }
}

/// How to replay.
#[derive(Debug, Clone, Default)]
pub struct ReplayOptions {
    /// Drop the recorded `record`/`wait` and let the builder derive synchronisation.
    pub resync: bool,
    /// Where the trace's devices run.
    pub device: DeviceMap,
    /// The VM's configuration (threads, batching, mock timing); its `mock_devices` is set
    /// from the trace.
    pub config: Config,
    /// Take a timeline of the replay ([`ReplayReport::profile`]): per-stream busy time, and
    /// a Chrome/Perfetto trace if written out. Ignored in synchronous mode.
    pub profile: bool,
    /// Check each `expect`ed tensor against a reference replay of the same trace on `cpu:0`
    /// (which must match the trace's checksums itself) within this relative tolerance,
    /// instead of against the checksums: for replays on devices whose kernels are not
    /// bit-exact with the CPU's (cuBLAS products and reductions on CUDA). A float tensor
    /// passes when every element is within `tolerance × max|reference|` of the reference's
    /// (NaN matching NaN); an integer tensor must be equal.
    pub tolerance: Option<f64>,
}

/// The result of one `access ... read` of the trace.
#[derive(Debug, Clone, PartialEq)]
pub struct ReadResult {
    /// The statement's line.
    pub line: u32,
    /// The tensor read.
    pub tensor: u32,
    /// The bytes read, or the error the tensor carried.
    pub result: Result<Vec<u8>, Error>,
}

/// What a replay did.
#[derive(Debug, Clone)]
pub struct ReplayReport {
    /// Instruction statements replayed (in resync mode `record`/`wait` are skipped and the
    /// builder adds its own).
    pub instructions: u64,
    /// Wall time from the first statement to the end of the final sync.
    pub wall: Duration,
    /// Instructions the VM ran per stream (name, count), streams that ran none left out:
    /// the instruction statements placed on each stream, less the `record`/`wait` a resync
    /// replay drops, plus the synchronisation the builder adds in their place. Counted by
    /// the VM's scheduler (each stream's last position), so it agrees with a timeline's
    /// per-stream counts; in synchronous mode, which has no scheduler, the statements.
    /// `barrier` statements run on the scheduler, on no stream: see
    /// [`barriers`](Self::barriers).
    pub per_stream: Vec<(String, u64)>,
    /// `barrier` statements replayed (counted in [`instructions`](Self::instructions), on no
    /// stream).
    pub barriers: u64,
    /// The tensors and views the trace declares, per dtype ([`Trace::dtypes`]).
    pub dtypes: Vec<DTypeCount>,
    /// Kernel panics the VM caught during the replay (each is also a failure, an
    /// [`Error::Panic`], on the tensors its instruction writes).
    pub panics: u64,
    /// The errors of the first caught panics (up to 16), naming instruction, op, stream and
    /// message.
    pub panic_errors: Vec<Error>,
    /// Every `access ... read`, in order.
    pub reads: Vec<ReadResult>,
    /// `expect` checksums that matched.
    pub checked: usize,
    /// Failures seen (kernel errors and panics), each with the line where it surfaced.
    pub failures: Vec<(u32, Error)>,
    /// Whether the trace's `expect error` was matched.
    pub expected_failure: Option<String>,
    /// The timeline, if [`ReplayOptions::profile`] asked for one.
    pub profile: Option<Profile>,
    /// Where the replay stopped, if its [`Progress`] asked it to stop before the end: the
    /// line of the first statement it did not replay. What it had submitted ran to the end
    /// (the counts, failures and timeline above are of that part); the trace's expectations
    /// were not checked.
    pub interrupted: Option<u32>,
}

/// Replay `trace` (see the module docs).
pub fn replay(trace: &Trace, opts: &ReplayOptions) -> Result<ReplayReport, TraceError> {
    replay_with(trace, opts, super::progress::none())
}

/// [`replay`], advancing `progress` as it goes: lines validated, then instructions
/// submitted, then the instructions still in flight while it waits for them. Once
/// `progress` asks for a stop, it stops submitting at the next statement (ending the batch
/// it was building, which it submits), waits for what it submitted, and returns the report
/// of that part with [`ReplayReport::interrupted`] set; before the replay proper (during
/// validation or the reference replay of a tolerance check) it returns
/// [`TraceError::Interrupted`].
pub fn replay_with(
    trace: &Trace,
    opts: &ReplayOptions,
    progress: &Progress,
) -> Result<ReplayReport, TraceError> {
    let r = replay_checked(trace, opts, progress);
    progress.finish();
    r
}

fn replay_checked(
    trace: &Trace,
    opts: &ReplayOptions,
    progress: &Progress,
) -> Result<ReplayReport, TraceError> {
    validate_with(trace, &validate_options(opts), progress)?;
    let Some(rel) = opts.tolerance else {
        return replay_inner(trace, opts, progress, Phase::Replaying, Expected::Checksums);
    };
    // The reference: the same trace on cpu:0, checked against the trace's checksums.
    let on_cpu = ReplayOptions {
        resync: true,
        device: DeviceMap::Cpu,
        config: Config { profile: false, ..opts.config.clone() },
        profile: false,
        tolerance: None,
    };
    let mut reference = Vec::new();
    let r = replay_inner(trace, &on_cpu, progress, Phase::Reference, Expected::Collect(&mut reference))?;
    if r.interrupted.is_some() {
        return Err(TraceError::Interrupted);
    }
    replay_inner(trace, opts, progress, Phase::Replaying, Expected::Within { rel, reference: &reference })
}

/// What `expect` statements are checked against.
enum Expected<'r> {
    /// The trace's checksums.
    Checksums,
    /// The trace's checksums, keeping each expected tensor's bytes (in statement order).
    Collect(&'r mut Vec<Vec<u8>>),
    /// A reference replay's bytes (in statement order), within a relative tolerance.
    Within { rel: f64, reference: &'r [Vec<u8>] },
}

/// One replay of a validated trace.
fn replay_inner(
    trace: &Trace,
    opts: &ReplayOptions,
    progress: &Progress,
    phase: Phase,
    mut expected: Expected<'_>,
) -> Result<ReplayReport, TraceError> {
    let map = Mapping::new(trace, opts)?;
    let mut config = opts.config.clone();
    config.mock_devices = map.mock_devices;
    config.cuda_devices = map.cuda_devices;
    let vm = VirtualMachine::new(config).map_err(|error| match error {
        Error::Device(EpError::CudaUnavailable { device, reason }) => TraceError::DeviceUnavailable {
            device: device.to_string(),
            reason: format!("{reason}; replay with `--resync --device mock` or `--resync --device cpu`"),
        },
        error => vm_err(trace, trace.lines.first(), error),
    })?;
    let mut r = Replayer {
        trace,
        opts,
        map,
        vm: &vm,
        streams: HashMap::new(),
        tensors: HashMap::new(),
        events: HashMap::new(),
        report: ReplayReport {
            instructions: 0,
            wall: Duration::ZERO,
            per_stream: Vec::new(),
            reads: Vec::new(),
            checked: 0,
            failures: Vec::new(),
            expected_failure: None,
            profile: None,
            barriers: 0,
            dtypes: trace.dtypes(),
            panics: 0,
            panic_errors: Vec::new(),
            interrupted: None,
        },
        per_stream: Vec::new(),
        total: trace.instructions() as u64,
    };
    let profile = opts.profile && !vm.config().synchronous;
    if profile {
        vm.start_profiling().map_err(|e| TraceError::Profile(e.to_string()))?;
    }
    let t0 = Instant::now();
    progress.start(phase, r.total);
    progress.attach(vm.engine());
    let ran = r.run(progress);
    if ran.is_err() {
        progress.detach();
    }
    ran?;
    r.drain(progress);
    progress.detach();
    let end = trace.lines.last().map_or(1, |l| l.pos.line);
    if let Err(e) = vm.sync() {
        r.failed(end, e);
    }
    r.report.wall = t0.elapsed();
    if profile {
        r.report.profile = Some(vm.stop_profiling().map_err(|e| TraceError::Profile(e.to_string()))?);
    }
    // Before the expectations' reads, which add instructions of their own.
    r.report.per_stream = r.ran_per_stream();
    (r.report.panics, r.report.panic_errors) = vm.engine().caught_panics();
    if r.report.interrupted.is_none() {
        r.check_expectations(&mut expected)?;
    }
    Ok(r.report)
}

/// The validation a replay under `opts` needs: its synchronisation mode, and the cap on one
/// tensor of the VM it will run on.
fn validate_options(opts: &ReplayOptions) -> ValidateOptions {
    ValidateOptions { resync: opts.resync, max_tensor_bytes: opts.config.max_tensor_bytes }
}

fn diag(trace: &Trace, line: Option<&Line>, col: u32) -> Diagnostic {
    Diagnostic {
        file: trace.file.clone(),
        line: line.map_or(1, |l| l.pos.line),
        col: if col == 0 { line.map_or(1, |l| l.pos.col) } else { col },
        message: String::new(),
    }
}

fn vm_err(trace: &Trace, line: Option<&Line>, error: Error) -> TraceError {
    TraceError::Vm { at: diag(trace, line, 0), error: Box::new(error) }
}

/// Trace devices to VM devices.
struct Mapping {
    devices: HashMap<TraceDevice, DeviceId>,
    mock_devices: u16,
    cuda_devices: u16,
}

impl Mapping {
    fn new(trace: &Trace, opts: &ReplayOptions) -> Result<Mapping, TraceError> {
        let mut devices = HashMap::new();
        let mut changed = None;
        // Mapped onto CUDA, device i runs on cuda:(i mod the GPUs there are), so a trace of
        // two devices replays on one GPU; where none is found, on cuda:i, which fails with
        // the reason when the VM opens it.
        let gpus = match opts.device {
            DeviceMap::Cuda => crate::ep::cuda::device_count().ok().filter(|&n| n > 0),
            _ => None,
        };
        for l in &trace.lines {
            let Stmt::Device(d) = &l.stmt else { continue };
            let target = match (opts.device, d.kind) {
                (DeviceMap::Cpu, _) | (_, DeviceKind::Cpu) => DeviceId::CPU,
                (DeviceMap::Mock, _) | (DeviceMap::AsRecorded, DeviceKind::Mock) => DeviceId::mock(d.index),
                (DeviceMap::Cuda, _) => DeviceId::cuda(gpus.map_or(d.index, |n| d.index % n)),
                (DeviceMap::AsRecorded, DeviceKind::Cuda) => DeviceId::cuda(d.index),
            };
            if TraceDevice::of(target) != *d && changed.is_none() {
                changed = Some(l);
            }
            devices.insert(*d, target);
        }
        if let (Some(l), false) = (changed, opts.resync) {
            let mut at = diag(trace, Some(l), 0);
            at.message =
                "the trace's record/wait instructions fit only the device layout it was recorded on; \
                          replay on another layout with --resync"
                    .into();
            return Err(TraceError::Invalid { diagnostics: vec![at] });
        }
        // Cannot overflow: the validator keeps mock and CUDA indices below `MAX_MOCK_DEVICES`.
        let count =
            |ty: DeviceType| devices.values().filter(|d| d.ty == ty).map(|d| d.index + 1).max().unwrap_or(0);
        let (mock_devices, cuda_devices) = (count(DeviceType::Mock), count(DeviceType::Cuda));
        Ok(Mapping { devices, mock_devices, cuda_devices })
    }
}

struct Replayer<'a> {
    trace: &'a Trace,
    opts: &'a ReplayOptions,
    map: Mapping,
    vm: &'a VirtualMachine,
    streams: HashMap<u32, (StreamId, TraceDevice)>,
    tensors: HashMap<u32, Tensor>,
    events: HashMap<u32, u64>,
    report: ReplayReport,
    /// Instruction statements per VM stream index.
    per_stream: Vec<u64>,
    total: u64,
}

/// Whether the statement makes the host wait (ends the batch being built).
fn blocks(s: &Stmt) -> bool {
    matches!(s, Stmt::Barrier { .. } | Stmt::Access { kind: AccessKind::Read | AccessKind::Wait, .. })
}

impl Replayer<'_> {
    fn err(&self, l: &Line, col: u32, error: Error) -> TraceError {
        TraceError::Vm { at: diag(self.trace, Some(l), col), error: Box::new(error) }
    }

    fn failed(&mut self, line: u32, e: Error) {
        self.report.failures.push((line, e));
    }

    // Replay runs validated traces only (`replay_checked` validates first, under the options
    // asked for; the reference replay of a tolerance check adds `resync`, which only drops
    // checks): every stream, tensor, event and device a statement names is declared (and
    // the tensor live, the event recorded) by the time the statement runs, so the lookups
    // by it below cannot fail.

    fn stream(&self, r: Ref) -> StreamId {
        self.streams[&r.id].0
    }

    fn tensor(&self, r: Ref) -> &Tensor {
        &self.tensors[&r.id]
    }

    fn run(&mut self, progress: &Progress) -> Result<(), TraceError> {
        let trace = self.trace;
        let lines = &trace.lines;
        let mut i = 0;
        while i < lines.len() {
            let vm = self.vm;
            // A stop is checked before each statement (one relaxed load); the closure then
            // returns, and `run` submits the batch built so far: nothing built is dropped.
            let mut stop = false;
            let stopped = vm.run(|b| -> Result<usize, TraceError> {
                while i < lines.len() && !blocks(&lines[i].stmt) {
                    if progress.stop_requested() {
                        stop = true;
                        break;
                    }
                    self.statement(b, &lines[i])?;
                    self.count(&lines[i], progress);
                    i += 1;
                }
                Ok(i)
            })?;
            if let Some(l) = lines.get(stopped).filter(|_| !stop && !progress.stop_requested()) {
                self.blocking(l)?;
                self.count(l, progress);
            } else if let Some(l) = lines.get(stopped) {
                self.report.interrupted = Some(l.pos.line);
                break;
            }
            i = stopped + 1;
        }
        progress.set_done(self.report.instructions);
        Ok(())
    }

    /// Report progress while the submitted instructions finish (the caller submits far
    /// ahead of the devices; the VM's in-flight count says how far behind they are).
    fn drain(&mut self, progress: &Progress) {
        let shared = self.vm.engine();
        let t0 = Instant::now();
        let submitted = self.report.instructions;
        let mut phase_started = false;
        loop {
            let left = self.vm.in_flight() as u64;
            if left > 0 && !phase_started {
                progress.start(Phase::Finishing, submitted);
                phase_started = true;
            }
            progress.set_done(submitted.saturating_sub(left));
            if left == 0 || shared.is_dead() {
                break;
            }
            // Short naps at first, so that a short replay is not made longer by them.
            let nap = (t0.elapsed() / 16).clamp(Duration::from_micros(200), Duration::from_millis(50));
            std::thread::sleep(nap);
        }
    }

    /// Instructions the VM ran per stream (see [`ReplayReport::per_stream`]).
    fn ran_per_stream(&self) -> Vec<(String, u64)> {
        let vm = self.vm;
        if vm.config().synchronous {
            let streams = vm.streams();
            // `per_stream` is indexed by the VM's stream indices, so `streams[i]` exists.
            return (self.per_stream.iter().enumerate())
                .filter(|(_, &n)| n > 0)
                .map(|(i, &n)| (streams[i].3.clone(), n))
                .collect();
        }
        // A stream's positions count from 1, one per instruction admitted on it; the
        // instructions a waiter ran itself take none.
        vm.flight_record()
            .streams
            .into_iter()
            .filter(|s| s.admitted + s.ran_inline > 0)
            .map(|s| (s.name, s.admitted + s.ran_inline))
            .collect()
    }

    fn count(&mut self, l: &Line, progress: &Progress) {
        let Some(s) = l.stmt.stream() else { return };
        self.report.instructions += 1;
        if self.report.instructions % STRIDE == 0 {
            progress.set_done(self.report.instructions);
        }
        match &l.stmt {
            Stmt::Barrier { .. } => self.report.barriers += 1,
            // Dropped: the builder derives its own.
            Stmt::Record { .. } | Stmt::Wait { .. } if self.opts.resync => {}
            _ => {
                let i = self.stream(s).index();
                if i >= self.per_stream.len() {
                    self.per_stream.resize(i + 1, 0);
                }
                self.per_stream[i] += 1;
            }
        }
    }

    /// The op called `name`: a built-in, or a collective of a declared communicator
    /// (`all_reduce.sum@pair`).
    fn resolve(&self, name: &str) -> Result<crate::framework::Op, Error> {
        if let Some((c, comm)) = crate::kernels::collective::parse_op_name(name) {
            if let Some(op) = self.vm.find_communicator(comm).and_then(|k| k.op(c)) {
                return Ok(op);
            }
        }
        self.vm.op(name)
    }

    /// The tensors `refs` name (the replay holds every tensor's handle until it emits the
    /// tensor's `Release`, or until it ends, after its last batch).
    fn tensors_of(&self, refs: &[Ref]) -> SmallVec<[&Tensor; 4]> {
        refs.iter().map(|r| self.tensor(*r)).collect()
    }

    fn statement(
        &mut self,
        b: &mut crate::framework::InstructionsBuilder<'_>,
        l: &Line,
    ) -> Result<(), TraceError> {
        let raw = !self.opts.resync;
        match &l.stmt {
            // `after` states an ordering that the scheduler derives again from the operands.
            Stmt::Device(_) | Stmt::Expect { .. } | Stmt::ExpectError { .. } | Stmt::After { .. } => {}
            Stmt::Stream { id, device, ty } => {
                let d = self.map.devices[device];
                let ty = if d.is_host() && *ty != StreamType::Collective { StreamType::Compute } else { *ty };
                let s = self.vm.stream(d, ty).map_err(|e| self.err(l, 0, e))?;
                self.streams.insert(id.id, (s, *device));
            }
            Stmt::Comm { name, members, .. } => {
                // The validator admits mock communicators only.
                let devices: Vec<DeviceId> = members.iter().map(|d| self.map.devices[d]).collect();
                if self.vm.find_communicator(name).is_none() {
                    self.vm.mock_communicator(name, &devices).map_err(|e| self.err(l, 0, e))?;
                }
            }
            Stmt::Tensor { id, dtype, shape, device, strides } => {
                let dev = self.map.devices[device];
                let t = match strides {
                    None => self.vm.empty(shape, *dtype, dev),
                    Some(strides) => self.vm.empty_strided(shape, strides, *dtype, dev),
                }
                .map_err(|e| self.err(l, 0, e))?;
                self.tensors.insert(id.id, t);
            }
            // A view of the replayed owner's storage, wherever the device map put it; nothing
            // runs.
            Stmt::View { id, base, shape, strides, offset, type_col, .. } => {
                let v = self
                    .tensor(*base)
                    .view_layout(shape, strides, *offset)
                    .map_err(|e| self.err(l, *type_col, e))?;
                self.tensors.insert(id.id, v);
            }
            Stmt::Call { stream, op, op_col, inputs, outputs, attrs } => {
                let s = self.stream(*stream);
                let attrs = *attrs;
                let resolved = self.resolve(op).map_err(|e| self.err(l, *op_col, e))?;
                if raw {
                    let dev = self.streams[&stream.id].1;
                    let kernel = resolved.kernel_ref(kernel_device(dev)).ok_or_else(|| {
                        self.err(l, *op_col, Error::Config(format!("no kernel for `{op}`")))
                    })?;
                    // Cannot truncate: the validator allows at most `MAX_INPUTS` (255) inputs.
                    let ins = self.tensors_of(inputs);
                    let outs = self.tensors_of(outputs);
                    b.raw().call(kernel, &ins, &outs, attrs, s);
                } else {
                    let ins: SmallVec<[&Tensor; 4]> = inputs.iter().map(|r| self.tensor(*r)).collect();
                    let outs: SmallVec<[&Tensor; 2]> = outputs.iter().map(|r| self.tensor(*r)).collect();
                    b.call_into(resolved, &ins, &outs, attrs, s).map_err(|e| self.err(l, *op_col, e))?;
                }
            }
            Stmt::Record { stream, event, tensors } => {
                if raw {
                    let id = self.vm.engine().next_event_id();
                    self.events.insert(event.id, id);
                    b.raw().record_event(id, self.stream(*stream), &self.tensors_of(tensors));
                }
            }
            Stmt::Wait { stream, event } => {
                if raw {
                    let id = self.events[&event.id];
                    b.raw().stream_wait(id, self.stream(*stream));
                }
            }
            Stmt::Release { stream, tensor } => {
                let t = self.tensors.remove(&tensor.id).expect("validated: declared and live");
                if raw {
                    // Marked released, so that dropping the handle emits nothing more.
                    b.raw().release(&t, self.stream(*stream));
                }
                drop(t);
            }
            Stmt::Access { stream, tensor, kind: AccessKind::Write(data) } => {
                let bytes = self.data(l, data)?;
                let t = self.tensor(*tensor);
                if raw {
                    b.raw().write(t, bytes.into_boxed_slice(), self.stream(*stream));
                } else {
                    use crate::framework::Element;
                    let oom = |e| {
                        crate::framework::tensor::out_of_host_memory(t.id(), bytes.len(), "the values", e)
                    };
                    macro_rules! write_as {
                        ($ty:ty) => {
                            <$ty>::try_from_bytes(&bytes).map_err(oom).and_then(|v| b.write(t, &v))
                        };
                    }
                    let r = match t.dtype() {
                        DType::Bool => write_as!(bool),
                        DType::U8 => write_as!(u8),
                        DType::I32 => write_as!(i32),
                        DType::I64 => write_as!(i64),
                        DType::F16 => write_as!(crate::vm::f16),
                        DType::BF16 => write_as!(crate::vm::bf16),
                        DType::F32 => write_as!(f32),
                        DType::F64 => write_as!(f64),
                    };
                    r.map_err(|e| self.err(l, tensor.col, e))?;
                }
            }
            Stmt::Access { .. } | Stmt::Barrier { .. } => unreachable!("blocking statements end the batch"),
        }
        Ok(())
    }

    fn blocking(&mut self, l: &Line) -> Result<(), TraceError> {
        match &l.stmt {
            Stmt::Barrier { .. } => {
                if let Err(e) = self.vm.sync() {
                    self.failed(l.pos.line, e);
                }
            }
            Stmt::Access { stream, tensor, kind } => {
                let wait = *kind == AccessKind::Wait;
                let t = self.tensor(*tensor).clone();
                let result = if self.opts.resync {
                    if wait {
                        t.wait().map(|()| Vec::new())
                    } else {
                        t.read_bytes()
                    }
                } else {
                    let slot = AccessSlot::new();
                    let s = self.stream(*stream);
                    self.vm.run(|b| b.raw().read(&t, s, slot.clone(), wait));
                    self.vm.engine().wait_access(&slot)
                };
                if let Err(e) = &result {
                    self.failed(l.pos.line, e.clone());
                }
                if !wait {
                    self.report.reads.push(ReadResult { line: l.pos.line, tensor: tensor.id, result });
                }
            }
            _ => unreachable!("only blocking statements"),
        }
        Ok(())
    }

    /// The bytes of a host write, reading (and checking) the sidecar slice if there is one.
    fn data(&self, l: &Line, data: &Data) -> Result<Vec<u8>, TraceError> {
        match data {
            Data::Inline(_, bytes) => Ok(bytes.clone()),
            Data::File { path, offset, bytes, checksum: want } => {
                let full = super::sidecar::resolve(self.trace, path);
                let io = |e| TraceError::io(&full, e);
                let mut f = std::fs::File::open(&full).map_err(io)?;
                f.seek(SeekFrom::Start(*offset)).map_err(io)?;
                // The slice is the size of its tensor: allocated fallibly, so that a slice
                // too large for the machine is an error and not an abort.
                let mut buf = Vec::new();
                usize::try_from(*bytes)
                    .ok()
                    .and_then(|n| buf.try_reserve_exact(n).ok().map(|()| n))
                    .ok_or_else(|| TraceError::Io {
                        path: full.display().to_string(),
                        message: format!("cannot allocate {bytes} bytes for the slice at offset {offset}"),
                    })?;
                f.take(*bytes).read_to_end(&mut buf).map_err(io)?;
                if buf.len() as u64 != *bytes {
                    let e = std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        "the file ends within the slice",
                    );
                    return Err(io(e));
                }
                let found = checksum(&buf);
                if found != *want {
                    let mut at = diag(self.trace, Some(l), 0);
                    at.message = format!(
                        "the sidecar slice at offset {offset} has checksum 0x{found:016x}, the trace states 0x{want:016x}"
                    );
                    return Err(TraceError::Invalid { diagnostics: vec![at] });
                }
                Ok(buf)
            }
        }
    }

    fn check_expectations(&mut self, against: &mut Expected<'_>) -> Result<(), TraceError> {
        let mut expected = None;
        let mut k = 0;
        for l in &self.trace.lines {
            match &l.stmt {
                Stmt::Expect { tensor, checksum: want } => {
                    let t = self.tensor(*tensor).clone();
                    let bytes = t.read_bytes().map_err(|e| self.err(l, tensor.col, e))?;
                    if let Expected::Within { rel, reference } = against {
                        let Some(want) = reference.get(k) else {
                            unreachable!("the reference replay ran the same trace")
                        };
                        if let Err((index, found, expected)) = within(&bytes, want, t.dtype(), *rel) {
                            let at = diag(self.trace, Some(l), tensor.col);
                            let rel = *rel;
                            return Err(TraceError::OutOfTolerance {
                                at,
                                tensor: tensor.id,
                                index,
                                found,
                                expected,
                                rel,
                            });
                        }
                    } else {
                        let found = checksum(&bytes);
                        if found != *want {
                            let at = diag(self.trace, Some(l), tensor.col);
                            return Err(TraceError::Mismatch {
                                at,
                                tensor: tensor.id,
                                expected: *want,
                                found,
                            });
                        }
                    }
                    if let Expected::Collect(keep) = against {
                        keep.push(bytes);
                    }
                    k += 1;
                    self.report.checked += 1;
                }
                Stmt::ExpectError { kind, op, message } => expected = Some((l, *kind, op, message)),
                _ => {}
            }
        }
        let seen = |k: FailureKind, o: &str, m: &str| {
            self.report
                .failures
                .iter()
                .any(|(_, e)| failure_of(e).is_some_and(|(a, b, c)| a == k && b == o && c == m))
        };
        match expected {
            Some((l, kind, op, message)) => {
                if !seen(kind, op, message) {
                    let mut at = diag(self.trace, Some(l), 0);
                    at.message = format!("expected {} failure of `{op}`: {message}", kind.name());
                    let observed = self.report.failures.iter().map(|(_, e)| e.to_string()).collect();
                    return Err(TraceError::MissingFailure { at, observed });
                }
                self.report.expected_failure = Some(format!("{} in `{op}`: {message}", kind.name()));
                // Every failure must be the expected one or carried from it.
                if let Some((line, e)) = self.report.failures.iter().find(|(_, e)| {
                    failure_of(e).is_none_or(|(a, b, c)| a != kind || b != *op || c != *message)
                }) {
                    let at = Diagnostic {
                        file: self.trace.file.clone(),
                        line: *line,
                        col: 1,
                        message: String::new(),
                    };
                    return Err(TraceError::Vm { at, error: Box::new(e.clone()) });
                }
                Ok(())
            }
            None => match self.report.failures.first() {
                Some((line, e)) => {
                    let at = Diagnostic {
                        file: self.trace.file.clone(),
                        line: *line,
                        col: 1,
                        message: String::new(),
                    };
                    Err(TraceError::Vm { at, error: Box::new(e.clone()) })
                }
                None => Ok(()),
            },
        }
    }
}

/// Whether `found` is within `rel` of `want` (see [`ReplayOptions::tolerance`]); else the
/// first element off, with both values. Element by element, with no copy of either: both
/// are as large as the tensor.
fn within(found: &[u8], want: &[u8], dtype: DType, rel: f64) -> Result<(), (usize, f64, f64)> {
    let n = (found.len().min(want.len())) / dtype.size();
    let length_differs = found.len() != want.len();
    let at = |b: &[u8], i: usize| crate::vm::read_element(dtype, b, i).map_or(f64::NAN, |v| v.as_f64());
    if dtype.is_floating() {
        let scale = (0..want.len() / dtype.size())
            .map(|i| at(want, i))
            .filter(|x| x.is_finite())
            .fold(0.0f64, |m, x| m.max(x.abs()));
        let bound = rel * scale;
        for i in 0..n {
            let (a, b) = (at(found, i), at(want, i));
            let ok = a == b || (a.is_nan() && b.is_nan()) || (a - b).abs() <= bound;
            if !ok {
                return Err((i, a, b));
            }
        }
    } else {
        let exact = |b: &[u8], i: usize| crate::vm::read_element(dtype, b, i).map(|v| v.as_i64());
        for i in 0..n {
            if exact(found, i) != exact(want, i) {
                return Err((i, at(found, i), at(want, i)));
            }
        }
    }
    if length_differs {
        return Err((n, f64::NAN, f64::NAN));
    }
    Ok(())
}

#[cfg(test)]
mod tolerance_tests {
    use super::*;

    fn f32s(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn floats_pass_within_the_tensor_relative_bound_only() {
        let want = f32s(&[100.0, -1.0, 0.0, f32::NAN]);
        // 100 * 1e-4 = 0.01: each element may be off by up to 0.01.
        assert_eq!(within(&f32s(&[100.005, -1.009, 0.0099, f32::NAN]), &want, DType::F32, 1e-4), Ok(()));
        let (i, found, expected) =
            within(&f32s(&[100.0, -1.02, 0.0, f32::NAN]), &want, DType::F32, 1e-4).unwrap_err();
        assert_eq!(i, 1);
        assert!((found - -1.02).abs() < 1e-6 && expected == -1.0);
        // NaN only matches NaN.
        assert!(within(&f32s(&[100.0, -1.0, 0.0, 1.0]), &want, DType::F32, 1e-4).is_err());
    }

    #[test]
    fn integers_must_be_equal() {
        let b = |v: &[i64]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        assert_eq!(within(&b(&[1, 2]), &b(&[1, 2]), DType::I64, 0.5), Ok(()));
        assert_eq!(within(&b(&[1, 3]), &b(&[1, 2]), DType::I64, 0.5), Err((1, 3.0, 2.0)));
    }
}
