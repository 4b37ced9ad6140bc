//! The validator: every semantic problem of a trace, without running it.
//!
//! It walks the statements in order with the same knowledge the builder has while it
//! builds a program, and checks what the builder would refuse (unknown op on the stream's
//! device, wrong operand count, shape or dtype through the kernel's own `infer`, tensors
//! on the wrong device, aliasing, undeclared or released tensors) plus what only a trace
//! can get wrong: declarations (duplicates, unknown devices, stream types a device does
//! not have, tensors that `vm.empty` would refuse as too large: the same size check,
//! `framework::shape`, under [`ValidateOptions::max_tensor_bytes`]), event order (waited on before recorded, recorded twice, waited on from
//! another device), access data of the wrong size, and cross-stream uses with no
//! synchronisation. Views (version 3) are checked against their storages (`views`).
//!
//! # The synchronisation rule
//!
//! It is the rule of the builder's soft sync (OneFlow's `SoftSyncStream`), with `after` for
//! the uses the scheduler ordered on its own; `trace::sync` states it and holds the one
//! implementation, which the recorder applies too. A trace meant for `replay --resync` may
//! leave all of that out ([`ValidateOptions::resync`]).

mod views;

use std::collections::HashMap;

use super::format::{AccessKind, Data, DeviceKind, Line, Ref, Stmt, Trace, TraceDevice};
use super::progress::{Phase, Progress, STRIDE};
use super::sync::TensorSync;
use super::{Diagnostic, TraceError};
use crate::ep::{DeviceId, DeviceType, StreamType};
use crate::framework::layout::is_dense;
use crate::framework::{shape, Attrs, DType, OpRegistry, OutSpecs, TensorMeta};
use crate::vm::default_max_tensor_bytes;

/// The most mock devices a trace may use (`mock:0` .. `mock:15`).
pub const MAX_MOCK_DEVICES: u16 = 16;

/// What the validator checks.
#[derive(Debug, Clone)]
pub struct ValidateOptions {
    /// The trace will be replayed with its synchronisation derived anew: do not require
    /// `record`/`wait` before cross-stream uses.
    pub resync: bool,
    /// The most bytes one tensor may hold, as [`Config::max_tensor_bytes`](crate::vm::Config::max_tensor_bytes) caps it in the
    /// VM that will replay the trace (replay passes its VM's). Default
    /// [`default_max_tensor_bytes`] (half the machine's physical memory).
    pub max_tensor_bytes: u64,
}

impl Default for ValidateOptions {
    fn default() -> Self {
        ValidateOptions { resync: false, max_tensor_bytes: default_max_tensor_bytes() }
    }
}

/// Check `trace`; [`TraceError::Invalid`] lists every problem with its line and column.
pub fn validate(trace: &Trace, opts: &ValidateOptions) -> Result<(), TraceError> {
    validate_with(trace, opts, super::progress::none())
}

/// [`validate`], counting the lines checked in `progress` ([`Phase::Validating`]) and
/// stopping with [`TraceError::Interrupted`] once `progress` asks for a stop.
pub fn validate_with(trace: &Trace, opts: &ValidateOptions, progress: &Progress) -> Result<(), TraceError> {
    let diagnostics = check(trace, opts, progress)?;
    if diagnostics.is_empty() {
        Ok(())
    } else {
        Err(TraceError::Invalid { diagnostics })
    }
}

/// The VM device type whose kernels serve a trace device.
pub(crate) fn kernel_device(d: TraceDevice) -> DeviceType {
    match d.kind {
        DeviceKind::Cpu => DeviceType::Cpu,
        DeviceKind::Mock => DeviceType::Mock,
        DeviceKind::Cuda => DeviceType::Cuda,
    }
}

struct TensorState {
    dtype: DType,
    shape: Vec<usize>,
    device: TraceDevice,
    released: Option<u32>,
    /// Refused by the size check at its declaration (or, for a view, refused there): the VM
    /// would have no such tensor, so calls that use it are not checked further (the
    /// declaration's diagnostic says why).
    too_large: bool,
    /// For a view: whose storage it is, and where in it.
    view: Option<ViewOf>,
    /// For an owner: its views declared and not released yet, with their declaration lines.
    live_views: Vec<(u32, u32)>,
    /// For an owner: its storage's last use and what synchronises it (`trace::sync`); a
    /// view's uses are its storage's.
    sync: TensorSync,
}

/// Where a view lies: the owner of its storage, and its layout there.
struct ViewOf {
    base: u32,
    strides: Vec<isize>,
    offset: usize,
}

struct EventState {
    stream: u32,
    line: u32,
    tensors: Vec<u32>,
}

struct Checker<'t> {
    trace: &'t Trace,
    opts: &'t ValidateOptions,
    ops: OpRegistry,
    out: Vec<Diagnostic>,
    devices: Vec<TraceDevice>,
    streams: HashMap<u32, (TraceDevice, StreamType)>,
    tensors: HashMap<u32, TensorState>,
    events: HashMap<u32, EventState>,
    /// Communicators declared so far, by name.
    comms: HashMap<String, Vec<TraceDevice>>,
    line: u32,
}

/// Every problem of `trace`, in file order; [`TraceError::Interrupted`] if `progress` asks
/// for a stop first.
pub(crate) fn check(
    trace: &Trace,
    opts: &ValidateOptions,
    progress: &Progress,
) -> Result<Vec<Diagnostic>, TraceError> {
    let mut c = Checker {
        trace,
        opts,
        ops: OpRegistry::with_builtins(),
        out: Vec::new(),
        devices: Vec::new(),
        streams: HashMap::new(),
        tensors: HashMap::new(),
        events: HashMap::new(),
        comms: HashMap::new(),
        line: 0,
    };
    let mut expects = Vec::new();
    progress.start(Phase::Validating, trace.lines.len() as u64);
    for (i, l) in trace.lines.iter().enumerate() {
        if i as u64 % STRIDE == 0 {
            progress.set_done(i as u64);
            if progress.stop_requested() {
                return Err(TraceError::Interrupted);
            }
        }
        c.line = l.pos.line;
        c.statement(l, &mut expects);
    }
    progress.set_done(trace.lines.len() as u64);
    for (line, r) in expects {
        c.line = line;
        if let Some(t) = c.tensors.get(&r.id) {
            if let Some(at) = t.released {
                c.err(
                    r.col,
                    format!("tensor t{} is expected at the end, but it is released at line {at}", r.id),
                );
            }
        }
    }
    c.out.sort_by_key(|d| (d.line, d.col));
    Ok(c.out)
}

impl Checker<'_> {
    fn err(&mut self, col: u32, message: String) {
        self.out.push(Diagnostic { file: self.trace.file.clone(), line: self.line, col, message });
    }

    fn stream(&mut self, r: Ref) -> Option<(TraceDevice, StreamType)> {
        let s = self.streams.get(&r.id).copied();
        if s.is_none() {
            self.err(
                r.col,
                format!("stream s{} is not declared (declare it with `stream s{} DEVICE TYPE`)", r.id, r.id),
            );
        }
        s
    }

    /// A declared, live tensor.
    fn tensor(&mut self, r: Ref) -> bool {
        match self.tensors.get(&r.id) {
            None => {
                self.err(
                    r.col,
                    format!(
                        "tensor t{} is not declared (declare it with `tensor t{} TYPE DEVICE`)",
                        r.id, r.id
                    ),
                );
                false
            }
            Some(t) => match t.released {
                Some(at) => {
                    self.err(r.col, format!("tensor t{} is used after its release at line {at}", r.id));
                    false
                }
                None => true,
            },
        }
    }

    fn device_declared(&mut self, d: TraceDevice, col: u32) {
        if !self.devices.contains(&d) {
            self.err(col, format!("device {d} is not declared (declare it with `device {d}`)"));
        }
    }

    /// The synchronisation rule (`trace::sync`), then mark the tensor used on `stream`.
    fn use_on(&mut self, r: Ref, stream: u32) {
        if !self.streams.contains_key(&stream) {
            return;
        }
        let storage = self.storage(r.id);
        let Some(t) = self.tensors.get(&storage) else { return };
        let streams = &self.streams;
        let unsynced = t.sync.unsynced(stream, |s| streams.get(&s).map(|s| s.0));
        if let Some(u) = unsynced.filter(|_| !self.opts.resync) {
            let (src, id) = (u.source, r.id);
            let who = match storage == id {
                true => format!("tensor t{id}"),
                false => format!("the storage of tensor t{id} (a view of t{storage})"),
            };
            let m = if u.same_device {
                format!(
                    "{who} was last used on s{src} and is used on s{stream} of the same device with no \
                     synchronisation (expected `record s{src} eN t{id}` then `wait s{stream} eN`, or \
                     `after s{stream} s{src} t{id}`, before this)"
                )
            } else {
                format!(
                    "{who} was last used on s{src} ({}) and is used on s{stream} with no \
                     synchronisation (expected `record s{src} eN t{id}`, or `after s{stream} s{src} t{id}`, \
                     before this)",
                    u.device
                )
            };
            self.err(r.col, m);
        }
        if let Some(t) = self.tensors.get_mut(&storage) {
            t.sync.used(stream);
        }
    }

    /// `after stream source tensors`: the scheduler ordered the tensors' next uses on
    /// `stream` after their last uses on `source` (`trace::sync`).
    fn after(&mut self, col: u32, stream: Ref, source: Ref, tensors: &[Ref]) {
        let known = self.stream(stream).is_some() & self.stream(source).is_some();
        if stream.id == source.id {
            let m = format!(
                "`after` orders uses on one stream after uses on another, but both are s{}",
                stream.id
            );
            self.err(col, m);
            return;
        }
        for &r in tensors {
            if !self.tensor(r) || !known {
                continue;
            }
            let who = self.named(r.id);
            let storage = self.storage(r.id);
            let Some(t) = self.tensors.get_mut(&storage) else { continue };
            let last = t.sync.last();
            if !t.sync.after(stream.id, source.id) {
                let m = match last {
                    Some(s) => format!("{who} was last used on s{s}, not on s{}", source.id),
                    None => format!("{who} has not been used yet, so not on s{}", source.id),
                };
                self.err(r.col, m);
            }
        }
    }

    fn statement(&mut self, l: &Line, expects: &mut Vec<(u32, Ref)>) {
        let col = l.pos.col;
        match &l.stmt {
            Stmt::Device(d) => {
                if !d.is_host() && d.index >= MAX_MOCK_DEVICES {
                    self.err(
                        col,
                        format!(
                            "device {d}: at most {MAX_MOCK_DEVICES} devices of a type (indices 0-{})",
                            MAX_MOCK_DEVICES - 1
                        ),
                    );
                }
                if self.devices.contains(d) {
                    self.err(col, format!("device {d} is declared twice"));
                } else {
                    self.devices.push(*d);
                }
            }
            Stmt::Stream { id, device, ty } => {
                self.device_declared(*device, col);
                if device.is_host() && !matches!(ty, StreamType::Compute | StreamType::Collective) {
                    self.err(
                        col,
                        format!("{device} has only a compute and a collective stream, not {}", ty.name()),
                    );
                }
                if self.streams.insert(id.id, (*device, *ty)).is_some() {
                    self.err(id.col, format!("stream s{} is declared twice", id.id));
                }
            }
            Stmt::Comm { name, backend, members } => self.comm(col, name, backend, members),
            Stmt::Tensor { id, dtype, shape, device, strides } => {
                self.device_declared(*device, col);
                if let Some(strides) = strides {
                    // `VirtualMachine::empty_strided`'s own check, which replay would meet.
                    let meta = TensorMeta::new(shape, *dtype, DeviceId::CPU).with_layout(shape, strides, 0);
                    if strides.len() != shape.len() || strides.iter().any(|&s| s < 0) || !is_dense(&meta) {
                        self.err(
                            col,
                            format!(
                                "tensor t{}: strides {strides:?} do not lay out {shape:?} densely (each \
                                 element once, in some order of the dimensions)",
                                id.id
                            ),
                        );
                    }
                }
                // `vm.empty`'s own check, which replay would meet here.
                let checked =
                    shape::check(shape, *dtype, self.opts.max_tensor_bytes, || format!("tensor t{}", id.id));
                if let Err(e) = &checked {
                    self.err(col, e.to_string());
                }
                let state = TensorState {
                    dtype: *dtype,
                    shape: shape.clone(),
                    device: *device,
                    released: None,
                    too_large: checked.is_err(),
                    view: None,
                    live_views: Vec::new(),
                    sync: TensorSync::default(),
                };
                if self.tensors.insert(id.id, state).is_some() {
                    self.err(id.col, format!("tensor t{} is declared twice", id.id));
                }
            }
            Stmt::View { id, base, dtype, shape, strides, offset, type_col } => {
                let (shape, strides, offset, type_col) = (&shape[..], &strides[..], *offset, *type_col);
                self.view(views::ViewDecl {
                    id: *id,
                    base: *base,
                    dtype: *dtype,
                    shape,
                    strides,
                    offset,
                    type_col,
                });
            }
            Stmt::Call { stream, op, op_col, inputs, outputs, attrs } => {
                self.call(*stream, op, *op_col, inputs, outputs, attrs);
            }
            Stmt::Record { stream, event, tensors } => {
                let dev = self.stream(*stream);
                let live: Vec<Ref> = tensors.iter().copied().filter(|&t| self.tensor(t)).collect();
                if let Some(prev) = self.events.get(&event.id) {
                    let at = prev.line;
                    self.err(
                        event.col,
                        format!("event e{} is recorded twice (first at line {at})", event.id),
                    );
                    return;
                }
                if dev.is_none() {
                    return;
                }
                let mut covered = Vec::new();
                for t in live {
                    // An event covers storages: a view's is its owner's.
                    let s = self.storage(t.id);
                    let ts = self.tensors.get_mut(&s).expect("`live` holds declared tensors only");
                    if ts.sync.record(stream.id, u64::from(event.id)).0 && !covered.contains(&s) {
                        covered.push(s);
                    }
                }
                self.events
                    .insert(event.id, EventState { stream: stream.id, line: self.line, tensors: covered });
            }
            Stmt::Wait { stream, event } => {
                let dev = self.stream(*stream);
                let Some(ev) = self.events.get(&event.id) else {
                    self.err(
                        event.col,
                        format!("event e{} is waited on before it is recorded (expected `record sN e{} ...` earlier)", event.id, event.id),
                    );
                    return;
                };
                let (src, tensors) = (ev.stream, ev.tensors.clone());
                let Some((dev, _)) = dev else { return };
                // Cannot fail: an event is filed only when its stream is declared, and a
                // stream, once declared, stays.
                let src_dev = self.streams[&src].0;
                if src_dev != dev || !dev.is_async() || src == stream.id {
                    self.err(
                        col,
                        format!(
                            "s{} waits for e{} recorded on s{src}; a device-side wait needs another stream of the \
                             same asynchronous device",
                            stream.id, event.id
                        ),
                    );
                    return;
                }
                for t in tensors {
                    if let Some(ts) = self.tensors.get_mut(&t) {
                        ts.sync.waited(stream.id, u64::from(event.id));
                    }
                }
            }
            Stmt::After { stream, source, tensors } => self.after(col, *stream, *source, tensors),
            Stmt::Barrier { stream } => {
                self.stream(*stream);
            }
            Stmt::Release { stream, tensor } => {
                if self.stream(*stream).is_some() && self.tensor(*tensor) {
                    self.releasing(*tensor);
                    self.use_on(*tensor, stream.id);
                    let line = self.line;
                    self.tensors.get_mut(&tensor.id).expect("checked above: declared").released = Some(line);
                }
            }
            Stmt::Access { stream, tensor, kind } => self.access(*stream, *tensor, kind),
            Stmt::Expect { tensor, .. } => {
                if !self.tensors.contains_key(&tensor.id) {
                    self.err(tensor.col, format!("tensor t{} is not declared", tensor.id));
                }
                expects.push((self.line, *tensor));
            }
            Stmt::ExpectError { op, .. } => {
                if self.ops.get(op).is_none() {
                    self.err(
                        col,
                        format!("unknown op `{op}` (registered ops: {})", self.ops.names().join(", ")),
                    );
                }
            }
        }
    }

    /// A `comm` declaration: a mock communicator over declared devices, whose collective
    /// ops the calls after it may use.
    fn comm(&mut self, col: u32, name: &str, backend: &str, members: &[TraceDevice]) {
        for d in members {
            self.device_declared(*d, col);
        }
        if self.comms.contains_key(name) {
            self.err(col, format!("communicator `{name}` is declared twice"));
            return;
        }
        if backend != "mock" {
            self.err(
                col,
                format!(
                    "communicator `{name}` uses the {backend} backend: a replay runs the collectives of mock \
                     communicators only (record with one, or run the program under its launcher)"
                ),
            );
            return;
        }
        let devices: Vec<crate::ep::DeviceId> = members.iter().map(|d| d.device_id()).collect();
        match crate::ep::ccl::mock::MockBackend::new(&devices) {
            Ok(b) => {
                for op in crate::framework::collective::ops_of(name, std::sync::Arc::new(b)) {
                    self.ops.insert(op);
                }
                self.comms.insert(name.to_string(), members.to_vec());
            }
            Err(e) => self.err(col, format!("communicator `{name}`: {e}")),
        }
    }

    fn call(&mut self, stream: Ref, op: &str, op_col: u32, inputs: &[Ref], outputs: &[Ref], attrs: &Attrs) {
        let dev = self.stream(stream);
        let kernel = match self.ops.get(op) {
            None => {
                self.err(
                    op_col,
                    format!("unknown op `{op}` (registered ops: {})", self.ops.names().join(", ")),
                );
                None
            }
            Some(o) => match dev {
                Some((d, _)) => {
                    let k = o.kernel(kernel_device(d));
                    if k.is_none() {
                        self.err(op_col, format!("op `{op}` has no kernel for {d}"));
                    }
                    k
                }
                None => None,
            },
        };
        let mut ok = true;
        if inputs.len() > crate::framework::MAX_INPUTS {
            let max = crate::framework::MAX_INPUTS;
            self.err(op_col, format!("`{op}` has {} inputs; a call takes at most {max}", inputs.len()));
            ok = false;
        }
        for &r in inputs.iter().chain(outputs) {
            ok &= self.tensor(r);
        }
        let (Some((device, _)), Some(kernel), true) = (dev, kernel, ok) else { return };
        // From here on every operand is declared (`ok`), so indexing `tensors` by one
        // cannot fail.
        if inputs.iter().chain(outputs).any(|r| self.tensors[&r.id].too_large) {
            return;
        }
        let all: Vec<Ref> = inputs.iter().chain(outputs).copied().collect();
        let dev_of = |r: &Ref| self.tensors[&r.id].device;
        let wrong: Vec<Ref> = all.iter().filter(|r| dev_of(r) != device).copied().collect();
        // The builder's device rule: a copy needs one operand on the stream's device (if it
        // has any operands; `infer` then refuses a copy with none).
        let device_ok =
            if kernel.cross_device() { all.is_empty() || wrong.len() < all.len() } else { wrong.is_empty() };
        if !device_ok {
            // Cannot fail: not `device_ok` means some operand is off the device.
            let r = wrong[0];
            let m = format!("tensor t{} is on {}, but s{} is on {device}", r.id, dev_of(&r), stream.id);
            self.err(r.col, m);
            return;
        }
        if !self.outputs_allowed(op, kernel, inputs, outputs) || !self.layouts_allowed(op, kernel, &all) {
            return;
        }
        let in_metas: Vec<TensorMeta> = inputs.iter().map(|r| self.meta_of(r.id)).collect();
        let out_metas: Vec<TensorMeta> = outputs.iter().map(|r| self.meta_of(r.id)).collect();
        let (ins, outs): (Vec<&TensorMeta>, Vec<&TensorMeta>) =
            (in_metas.iter().collect(), out_metas.iter().collect());
        let mut specs = OutSpecs::new();
        if let Err(m) = kernel.infer(&ins, &outs, attrs, &mut specs) {
            self.err(op_col, format!("`{op}` refuses its operands: {m}"));
            return;
        }
        // The builder's size check of each output the call makes, as it runs it.
        for (i, s) in specs.iter().enumerate() {
            let at = || format!("output {i} of `{op}`");
            if let Err(e) = shape::check(&s.shape, s.dtype, self.opts.max_tensor_bytes, at) {
                self.err(op_col, e.to_string());
                return;
            }
        }
        if specs.len() != outputs.len() {
            self.err(op_col, format!("`{op}` produces {} output(s), {} given", specs.len(), outputs.len()));
            return;
        }
        for ((s, o), m) in specs.iter().zip(outputs).zip(&out_metas) {
            if s.shape != m.shape || s.dtype != m.dtype {
                let want = TensorMeta::new(&s.shape, s.dtype, m.device);
                let msg =
                    format!("tensor t{} is {}, but `{op}` produces {}", o.id, m.describe(), want.describe());
                self.err(o.col, msg);
                return;
            }
        }
        for &r in &all {
            self.use_on(r, stream.id);
        }
    }

    fn access(&mut self, stream: Ref, tensor: Ref, kind: &AccessKind) {
        let dev = self.stream(stream);
        if !self.tensor(tensor) {
            return;
        }
        let Some((dev, _)) = dev else { return };
        if !dev.is_host() {
            self.err(
                stream.col,
                format!("host accesses run on the host stream, but s{} is on {dev}", stream.id),
            );
            return;
        }
        // Cannot fail: `self.tensor` found it declared.
        let t = &self.tensors[&tensor.id];
        if t.too_large {
            return;
        }
        if !t.device.is_host() {
            let m = format!(
                "tensor t{} is on {}; only host tensors are accessed (copy it first)",
                tensor.id, t.device
            );
            self.err(tensor.col, m);
            return;
        }
        if !matches!(kind, AccessKind::Wait) && !self.is_whole(tensor.id) {
            let m = format!(
                "{} is {}, not its whole storage: a host access reads or writes whole storages (copy the \
                 view to a new tensor first, as the VM does to read one)",
                self.named(tensor.id),
                self.meta_of(tensor.id).describe()
            );
            self.err(tensor.col, m);
            return;
        }
        let t = &self.tensors[&tensor.id];
        let want = t.shape.iter().fold(t.dtype.size(), |n, &d| n.saturating_mul(d));
        let tdtype = t.dtype;
        if let AccessKind::Write(data) = kind {
            match data {
                Data::Inline(dtype, bytes) => {
                    if *dtype != tdtype {
                        self.err(
                            tensor.col,
                            format!("tensor t{} is {tdtype}, but the data is {dtype}", tensor.id),
                        );
                        return;
                    }
                    if bytes.len() != want {
                        let (n, m) = (bytes.len() / dtype.size(), want / dtype.size());
                        self.err(
                            tensor.col,
                            format!("tensor t{} has {m} elements, {n} values given", tensor.id),
                        );
                        return;
                    }
                }
                Data::File { path, offset, bytes, .. } => {
                    if *bytes != want as u64 {
                        self.err(
                            tensor.col,
                            format!("tensor t{} has {want} bytes, the data slice {bytes}", tensor.id),
                        );
                        return;
                    }
                    let full = super::sidecar::resolve(self.trace, path);
                    match std::fs::metadata(&full) {
                        Err(e) => self.err(tensor.col, format!("sidecar file {}: {e}", full.display())),
                        Ok(m) if offset.checked_add(*bytes).is_none_or(|end| m.len() < end) => self.err(
                            tensor.col,
                            format!(
                                "sidecar file {} has {} bytes, the slice of {bytes} bytes at offset {offset} \
                                 ends beyond it",
                                full.display(),
                                m.len(),
                            ),
                        ),
                        Ok(_) => {}
                    }
                }
            }
        }
        self.use_on(tensor, stream.id);
    }
}
