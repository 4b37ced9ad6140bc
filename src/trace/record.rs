//! The recorder: writes the trace of whatever a VM runs while it is attached.
//!
//! # Cost on the hot path
//!
//! The VM calls [`Capture::capture`] once per batch it receives (`Engine::submit`, a few
//! hundred instructions at a time), under a lock that also covers the splice into the
//! inbox, so the trace lists batches exactly in the order the scheduler receives them.
//! `capture` only copies a compact description of each instruction (op name pointer,
//! scalar, stream index, tensor ids, the bytes of host writes) plus the metadata of each
//! tensor the first time it appears (a bitset of seen ids): for a view, its layout and its
//! owner's id, after the owner's own metadata if the owner has not appeared yet. Descriptions are gathered into
//! messages of a few thousand and sent through a bounded channel, so the writer thread is
//! woken rarely (each wake-up is a system call on the VM's side and a context switch);
//! emptied buffers come back through a pool, so steady recording allocates nothing. The
//! writer thread renumbers tensors and events densely, formats the lines (integers without
//! the formatting machinery) and writes them through a buffered writer; large host writes
//! go to a sidecar binary file. When the writer falls behind by more than the channel's
//! capacity, the program waits for it (bounded memory) instead of growing without limit.
//!
//! # Synchronisation as the scheduler admitted it
//!
//! The trace lists instructions in the order the scheduler admitted them, which is not the
//! order builders open at once (a nested `vm.run`, threads sharing a tensor) made their soft
//! sync in: a use may reach the scheduler with no `record`/`wait` for the stream its tensor
//! was last used on in that order. The scheduler orders it by its dependence rules all the
//! same. The writer thread follows each tensor's last stream in admission order with the
//! validator's own rule (`trace::sync`) and writes an `after` before each use the rule finds
//! unsynchronised, so that every recording validates and replays as recorded. This costs
//! the VM nothing: it is all in the writer thread.
//!
//! `eagervm record PROGRAM -o FILE --overhead N` measures the cost; `docs/cli.md` has the
//! figures.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;

use crossbeam_queue::SegQueue;
use fnv::FnvHashMap;
use smallvec::SmallVec;

use super::format::{
    quote, write_attrs, write_strides, write_values, write_view, FailureKind, TraceDevice, INLINE_LIMIT,
    MAGIC, VERSION,
};
use super::sync::TensorSync;
use super::{checksum, TraceError};
use crate::framework::{Attrs, DType, Tensor, TensorMeta};
use crate::vm::contiguous_strides;
use crate::vm::observe::{InstrKind, SubmitObserver, Submitted};
use crate::vm::Engine;
use crate::vm::Error;
use crate::VirtualMachine;

/// Messages in flight between the VM and the writer thread before the VM waits.
const CHANNEL_BATCHES: usize = 64;

/// Bytes of formatted text gathered before they are written to the file.
const CHUNK: usize = 1 << 18;

/// Descriptions gathered before they are sent to the writer: several VM batches per
/// message, so that the writer thread wakes (a system call on the VM's side) rarely.
const SEND_AT: usize = 4096;

/// What kind of instruction, in the compact form the hot path copies.
enum RecKind {
    Call { op: &'static str, attrs: Attrs, n_inputs: u8 },
    Record { id: u64 },
    Wait { id: u64 },
    Barrier,
    Release,
    Read,
    AccessWait,
    Write(Vec<u8>),
}

enum Rec {
    /// A tensor seen for the first time: declare it.
    Tensor {
        id: u64,
        meta: TensorMeta,
    },
    /// A view seen for the first time, after its owner's declaration: declare it.
    View {
        id: u64,
        owner: u64,
        meta: TensorMeta,
    },
    Instr {
        kind: RecKind,
        stream: u32,
        tensors: SmallVec<[u64; 4]>,
    },
}

enum Msg {
    Batch(Vec<Rec>),
    /// The end of the trace: expected checksums by VM tensor id, the declarations of the
    /// views among those tensors (`Rec::View`), an expected failure.
    Finish {
        expects: Vec<(u64, u64)>,
        views: Vec<Rec>,
        failure: Option<(FailureKind, String, String)>,
    },
}

/// The part of a recorder that the VM holds while it is attached (see the module docs).
struct Capture {
    /// Which recorder this is (a recorder only ever detaches its own capture).
    owner: u64,
    tx: SyncSender<Msg>,
    /// Emptied batch buffers handed back by the writer, so that steady recording allocates
    /// nothing.
    pool: Arc<SegQueue<Vec<Rec>>>,
    /// Bit `id` is set once tensor `id` has been declared.
    seen: Vec<u64>,
    /// Descriptions not yet sent.
    pending: Vec<Rec>,
}

impl std::fmt::Debug for Capture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Capture").field("pending", &self.pending.len()).finish_non_exhaustive()
    }
}

/// Mark tensor `id` seen in `seen`; returns whether it was seen for the first time.
#[inline]
fn first_sight(seen: &mut Vec<u64>, id: u64) -> bool {
    let (word, bit) = ((id / 64) as usize, 1u64 << (id % 64));
    if word >= seen.len() {
        seen.resize(word + 1 + word / 2, 0);
    }
    let first = seen[word] & bit == 0;
    seen[word] |= bit;
    first
}

impl Capture {
    /// Copy the description of `batch` and hand it to the writer thread.
    fn capture(&mut self, batch: Submitted<'_>) {
        let recs = &mut self.pending;
        for ins in batch.instructions() {
            for o in ins.operands() {
                if !first_sight(&mut self.seen, o.id) {
                    continue;
                }
                match o.owner {
                    None => recs.push(Rec::Tensor { id: o.id, meta: o.meta.clone() }),
                    Some((owner, owner_meta)) => {
                        // A view's declaration names its owner, which a replay makes the
                        // view of: declared first, if nothing used it yet.
                        if first_sight(&mut self.seen, owner) {
                            recs.push(Rec::Tensor { id: owner, meta: owner_meta.clone() });
                        }
                        recs.push(Rec::View { id: o.id, owner, meta: o.meta.clone() });
                    }
                }
            }
            let kind = match ins.kind() {
                InstrKind::Call { op, attrs, n_inputs } => RecKind::Call { op, attrs, n_inputs },
                InstrKind::RecordEvent { id } => RecKind::Record { id },
                InstrKind::StreamWaitEvent { id } => RecKind::Wait { id },
                InstrKind::Barrier => RecKind::Barrier,
                InstrKind::Release => RecKind::Release,
                InstrKind::Read => RecKind::Read,
                InstrKind::Wait => RecKind::AccessWait,
                InstrKind::Write(bytes) => RecKind::Write(bytes.to_vec()),
            };
            let tensors = ins.operands().map(|o| o.id).collect();
            recs.push(Rec::Instr { kind, stream: ins.stream().index() as u32, tensors });
        }
        if recs.len() >= SEND_AT {
            self.send();
        }
    }

    /// Send what has been gathered to the writer.
    fn send(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let fresh = self.pool.pop().unwrap_or_else(|| Vec::with_capacity(SEND_AT + SEND_AT / 2));
        let recs = std::mem::replace(&mut self.pending, fresh);
        // A writer that died has kept its error for `finish`; nothing to do here.
        let _ = self.tx.send(Msg::Batch(recs));
    }
}

impl SubmitObserver for Capture {
    fn submitted(&mut self, batch: Submitted<'_>) {
        self.capture(batch);
    }

    fn owner(&self) -> u64 {
        self.owner
    }
}

impl Drop for Capture {
    /// Detached: send the rest.
    fn drop(&mut self) {
        self.send();
    }
}

/// What a finished recording wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordSummary {
    /// The trace file.
    pub path: PathBuf,
    /// Instructions written.
    pub instructions: u64,
    /// Tensors declared.
    pub tensors: u64,
    /// `expect` checksums written.
    pub expects: usize,
    /// The expected failure written, if the program failed on purpose.
    pub failure: Option<String>,
    /// The sidecar binary file, if any host write was too large to inline.
    pub sidecar: Option<PathBuf>,
}

/// Records the trace of a VM (see the module docs).
///
/// ```
/// use eagervm::prelude::*;
/// use eagervm::trace::Recorder;
///
/// let vm = VirtualMachine::new(Config::default())?;
/// let path = std::env::temp_dir().join(format!("doc-{}.trace", std::process::id()));
/// let rec = Recorder::start(&vm, &path).expect("trace file");
/// let cpu = vm.compute_stream(DeviceId::CPU)?;
/// let x = vm.from_slice(&[1.0f32, -2.0], &[2], DeviceId::CPU)?;
/// let y = vm.run(|b| b.call(vm.op("relu")?, &[&x], Attrs::default(), cpu))?;
/// let summary = rec.finish(&vm, &[&y], None).expect("written");
/// assert_eq!(summary.expects, 1);
/// # std::fs::remove_file(&path).ok();
/// # Ok::<(), eagervm::Error>(())
/// ```
#[derive(Debug)]
pub struct Recorder {
    id: u64,
    path: PathBuf,
    vm: Weak<Engine>,
    tx: Option<SyncSender<Msg>>,
    writer: Option<JoinHandle<Result<RecordSummary, TraceError>>>,
}

impl Recorder {
    /// Create the trace file at `path`, write its header and the VM's devices and streams,
    /// and attach to `vm`: everything the VM receives from now on is recorded. One recorder
    /// records a VM at a time: starting another replaces this one, which then records
    /// nothing more (its `finish` still ends its own file).
    pub fn start(vm: &VirtualMachine, path: impl AsRef<Path>) -> Result<Recorder, TraceError> {
        let path = path.as_ref().to_path_buf();
        let file = File::create(&path).map_err(|e| TraceError::io(&path, e))?;
        let mut out = BufWriter::with_capacity(1 << 16, file);
        let mut head = format!("{MAGIC} {VERSION}\n");
        let mut devices: Vec<TraceDevice> = Vec::new();
        for (_, d, _, _) in vm.streams() {
            let d = TraceDevice::of(d);
            if !devices.contains(&d) {
                devices.push(d);
                head.push_str(&format!("device {d}\n"));
            }
        }
        let mut stream_devices = Vec::new();
        for (id, d, ty, _) in vm.streams() {
            head.push_str(&format!("stream s{} {} {}\n", id.index(), TraceDevice::of(d), ty.name()));
            if id.index() >= stream_devices.len() {
                stream_devices.resize(id.index() + 1, None);
            }
            stream_devices[id.index()] = Some(TraceDevice::of(d));
        }
        // The communicators made so far: their collectives' op names (`all_reduce.sum@pair`)
        // name them. One made after this is not declared, and a replay refuses its calls.
        for c in vm.communicators() {
            let members: Vec<String> =
                c.members().iter().map(|m| TraceDevice::of(m.device).to_string()).collect();
            head.push_str(&format!("comm {} {} {}\n", c.name(), c.backend(), members.join(",")));
        }
        out.write_all(head.as_bytes()).map_err(|e| TraceError::io(&path, e))?;
        let (tx, rx) = sync_channel(CHANNEL_BATCHES);
        let pool = Arc::new(SegQueue::new());
        let w = Writer::new(path.clone(), out, pool.clone(), stream_devices);
        let writer = std::thread::Builder::new()
            .name("eagervm-trace-writer".into())
            .spawn(move || w.run(rx))
            .map_err(|e| TraceError::io(&path, e))?;
        let engine = vm.engine();
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let id = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let pending = Vec::with_capacity(SEND_AT + SEND_AT / 2);
        let capture = Capture { owner: id, tx: tx.clone(), pool, seen: Vec::new(), pending };
        engine.set_submit_observer(Some(Box::new(capture)));
        Ok(Recorder { id, path, vm: Arc::downgrade(engine), tx: Some(tx), writer: Some(writer) })
    }

    /// Stop recording, and end the trace with what a replay must reproduce: an `expect`
    /// checksum for each of `outputs` that reads back without error, and an `expect error`
    /// for the first kernel failure seen in `result` (the program's own error, if any), in
    /// the VM's pending failures, or in the outputs. Waits for the writer to finish.
    pub fn finish(
        mut self,
        vm: &VirtualMachine,
        outputs: &[&Tensor],
        result: Option<&Error>,
    ) -> Result<RecordSummary, TraceError> {
        detach(vm.engine(), self.id);
        let mut failures: Vec<Error> = result.into_iter().cloned().collect();
        if let Err(e) = vm.sync() {
            failures.push(e);
        }
        let mut expects = Vec::new();
        let mut views = Vec::new();
        for t in outputs {
            match t.read_bytes() {
                Ok(bytes) => expects.push((t.id(), checksum(&bytes))),
                Err(e) => failures.push(e),
            }
            // A view no instruction used is declared with its expectation, if its storage
            // is in the trace (`Writer::run`).
            if t.is_view() {
                let owner = t.inner().owner();
                views.push(Rec::View { id: t.id(), owner: owner.id, meta: t.meta().clone() });
            }
        }
        let failure = failures.iter().find_map(failure_of);
        let tx = self.tx.take().expect("finish runs once");
        let _ = tx.send(Msg::Finish { expects, views, failure });
        drop(tx);
        self.join()
    }

    fn join(&mut self) -> Result<RecordSummary, TraceError> {
        let h = self.writer.take().expect("joined once");
        h.join().unwrap_or_else(|_| {
            Err(TraceError::Recording {
                path: self.path.display().to_string(),
                message: "the writer thread panicked".into(),
            })
        })
    }
}

impl Drop for Recorder {
    /// A recorder dropped without `finish` detaches and closes its trace (with no
    /// expectations).
    fn drop(&mut self) {
        if self.writer.is_none() {
            return;
        }
        if let Some(vm) = self.vm.upgrade() {
            detach(&vm, self.id);
        }
        self.tx = None;
        let _ = self.join();
    }
}

/// Detach recorder `id`'s capture from `vm`, leaving another recorder attached since alone.
/// The detached capture sends what it still holds as it drops.
fn detach(vm: &Engine, id: u64) {
    if let Some(other) = vm.set_submit_observer(None).filter(|c| c.owner() != id) {
        vm.set_submit_observer(Some(other));
    }
}

/// The kernel failure (kind, op, message) inside `e`, if it is one.
pub(crate) fn failure_of(e: &Error) -> Option<(FailureKind, String, String)> {
    match e {
        Error::Kernel { op, message, .. } => Some((FailureKind::Kernel, op.clone(), message.clone())),
        Error::Panic { op, message, .. } => Some((FailureKind::Panic, op.clone(), message.clone())),
        Error::Failed { first, .. } => failure_of(first),
        _ => None,
    }
}

/// The background thread's state: dense numbering and the open files.
struct Writer {
    path: PathBuf,
    pool: Arc<SegQueue<Vec<Rec>>>,
    out: BufWriter<File>,
    sidecar: Option<(PathBuf, BufWriter<File>, u64)>,
    /// Each VM tensor declared so far, indexed by VM tensor id (ids are handed out in
    /// sequence, so the table stays dense).
    tensors: Vec<Option<Declared>>,
    declared: u32,
    events: HashMap<u64, u32>,
    instructions: u64,
    line: String,
    /// The device of each VM stream, by index.
    devices: Vec<Option<TraceDevice>>,
    /// The synchronisation state of each live storage that has been used, by the VM id of
    /// the tensor that owns it, in the order the scheduler admitted the uses
    /// (`trace::sync`): a view's uses are its storage's, as the builder's soft sync has it.
    sync: FnvHashMap<u64, TensorSync>,
    /// The storages (by owner) each VM event was recorded for, while one of them is still
    /// covered by it (how many, and which): what a `wait` for it synchronises.
    covers: FnvHashMap<u64, (u32, SmallVec<[u64; 2]>)>,
    /// Scratch for the `after` statements before one instruction: source stream, tensors
    /// (one per storage).
    afters: SmallVec<[(u32, SmallVec<[u64; 4]>); 2]>,
}

/// A VM tensor the trace has declared.
#[derive(Debug, Clone, Copy)]
struct Declared {
    /// Its number in the trace.
    n: u32,
    dtype: DType,
    /// The VM id of the tensor that owns its storage (its own, or a view's owner's).
    storage: u64,
}

impl Writer {
    fn new(
        path: PathBuf,
        out: BufWriter<File>,
        pool: Arc<SegQueue<Vec<Rec>>>,
        devices: Vec<Option<TraceDevice>>,
    ) -> Self {
        Writer {
            path,
            pool,
            out,
            sidecar: None,
            tensors: Vec::new(),
            declared: 0,
            events: HashMap::new(),
            instructions: 0,
            line: String::with_capacity(CHUNK + 4096),
            devices,
            sync: FnvHashMap::default(),
            covers: FnvHashMap::default(),
            afters: SmallVec::new(),
        }
    }

    fn run(mut self, rx: Receiver<Msg>) -> Result<RecordSummary, TraceError> {
        let mut ending = None;
        for msg in rx {
            match msg {
                Msg::Batch(mut recs) => {
                    for r in recs.drain(..) {
                        self.rec(r)?;
                    }
                    if self.pool.len() < CHANNEL_BATCHES {
                        self.pool.push(recs);
                    }
                }
                Msg::Finish { expects, views, failure } => {
                    ending = Some((expects, views, failure));
                    break;
                }
            }
        }
        let (expects, views, failure) = ending.unwrap_or_default();
        // An expected view that no instruction used has no declaration yet: it gets one
        // where its owner has (the storage it reads is in the trace); otherwise it is not
        // expected, as an expected tensor no instruction used is not.
        for v in views {
            if let Rec::View { id, owner, .. } = &v {
                if self.declared(*id).is_none() && self.declared(*owner).is_some() {
                    self.rec(v)?;
                }
            }
        }
        let mut written = 0;
        for (id, sum) in expects {
            if let Some(Some(Declared { n: t, .. })) = self.tensors.get(id as usize) {
                self.line.push_str(&format!("expect t{t} fnv1a64=0x{sum:016x}"));
                self.emit()?;
                written += 1;
            }
        }
        let failure_text = failure.map(|(kind, op, message)| {
            self.line.push_str(&format!("expect error {} op={op} message=", kind.name()));
            quote(&mut self.line, &message);
            format!("{} in `{op}`: {message}", kind.name())
        });
        if failure_text.is_some() {
            self.emit()?;
        }
        let io = |p: &Path, e| TraceError::io(p, e);
        self.out.write_all(self.line.as_bytes()).map_err(|e| io(&self.path, e))?;
        self.out.flush().map_err(|e| io(&self.path, e))?;
        let sidecar = match self.sidecar.take() {
            Some((p, mut w, _)) => {
                w.flush().map_err(|e| io(&p, e))?;
                Some(p)
            }
            None => None,
        };
        Ok(RecordSummary {
            path: self.path,
            instructions: self.instructions,
            tensors: self.declared as u64,
            expects: written,
            failure: failure_text,
            sidecar,
        })
    }

    /// End the current line; hand the text to the file once a large chunk has gathered.
    fn emit(&mut self) -> Result<(), TraceError> {
        self.line.push('\n');
        if self.line.len() >= CHUNK {
            let r = self.out.write_all(self.line.as_bytes());
            self.line.clear();
            r.map_err(|e| TraceError::io(&self.path, e))?;
        }
        Ok(())
    }

    /// The trace number of VM tensor `id` (declared before any instruction that uses it).
    fn tensor(&self, id: u64) -> u32 {
        self.declared(id).map_or(u32::MAX, |t| t.n)
    }

    fn declared(&self, id: u64) -> Option<Declared> {
        self.tensors.get(id as usize).copied().flatten()
    }

    /// The storage (its owner's VM id) of VM tensor `id`.
    fn storage(&self, id: u64) -> u64 {
        self.declared(id).map_or(id, |t| t.storage)
    }

    /// Number VM tensor `id` in the trace.
    fn declare(&mut self, id: u64, dtype: DType, storage: u64) -> u32 {
        let n = self.declared;
        self.declared += 1;
        let i = id as usize;
        if i >= self.tensors.len() {
            self.tensors.resize(i + 1 + i / 2, None);
        }
        self.tensors[i] = Some(Declared { n, dtype, storage });
        n
    }

    fn event(&mut self, id: u64) -> u32 {
        let n = self.events.len() as u32;
        *self.events.entry(id).or_insert(n)
    }

    fn rec(&mut self, r: Rec) -> Result<(), TraceError> {
        let (kind, stream, tensors) = match r {
            Rec::Tensor { id, meta } => {
                let n = self.declare(id, meta.dtype, id);
                let l = &mut self.line;
                l.push_str("tensor");
                push_id(l, " t", n as u64);
                l.push(' ');
                l.push_str(meta.dtype.name());
                l.push('[');
                for (k, d) in meta.shape.iter().enumerate() {
                    push_id(l, if k == 0 { "" } else { "," }, *d as u64);
                }
                l.push_str("] ");
                let dev = TraceDevice::of(meta.device);
                l.push_str(dev.kind.name());
                push_id(l, ":", dev.index as u64);
                // A pointwise op's output laid out like its inputs.
                if meta.strides != contiguous_strides(&meta.shape) {
                    write_strides(l, &meta.strides);
                }
                return self.emit();
            }
            Rec::View { id, owner, meta } => {
                let base = self.tensor(owner);
                let n = self.declare(id, meta.dtype, owner);
                write_view(&mut self.line, n, base, meta.dtype, &meta.shape, &meta.strides, meta.offset);
                return self.emit();
            }
            Rec::Instr { kind, stream, tensors } => (kind, stream, tensors),
        };
        self.instructions += 1;
        let uses = !matches!(kind, RecKind::Record { .. } | RecKind::Wait { .. } | RecKind::Barrier);
        if uses {
            self.sync_before(stream, &tensors)?;
        }
        let names: SmallVec<[u32; 4]> = tensors.iter().map(|&t| self.tensor(t)).collect();
        let first = names.first().copied().unwrap_or(u32::MAX) as u64;
        let (keyword, tail) = match &kind {
            RecKind::Call { .. } => ("call", ""),
            RecKind::Record { .. } => ("record", ""),
            RecKind::Wait { .. } => ("wait", ""),
            RecKind::Barrier => ("barrier", ""),
            RecKind::Release => ("release", ""),
            RecKind::Read => ("access", " read"),
            RecKind::AccessWait => ("access", " wait"),
            RecKind::Write(_) => ("access", " write"),
        };
        self.line.push_str(keyword);
        push_id(&mut self.line, " s", stream as u64);
        self.line.push_str(tail);
        match kind {
            RecKind::Call { op, attrs, n_inputs } => {
                let l = &mut self.line;
                l.push(' ');
                l.push_str(op);
                let (ins, outs) = names.split_at((n_inputs as usize).min(names.len()));
                for (key, list) in [(" in=t", ins), (" out=t", outs)] {
                    for (i, &t) in list.iter().enumerate() {
                        push_id(l, if i == 0 { key } else { ",t" }, t as u64);
                    }
                }
                write_attrs(l, &attrs);
            }
            RecKind::Record { id } => {
                let e = self.event(id);
                push_id(&mut self.line, " e", e as u64);
                for &t in &names {
                    push_id(&mut self.line, " t", t as u64);
                }
                self.recorded(stream, id, &tensors);
            }
            RecKind::Wait { id } => {
                let e = self.event(id);
                push_id(&mut self.line, " e", e as u64);
                if let Some((_, covered)) = self.covers.get(&id) {
                    for t in covered {
                        if let Some(s) = self.sync.get_mut(t) {
                            s.waited(stream, id);
                        }
                    }
                }
            }
            RecKind::Barrier => {}
            RecKind::Release => {
                push_id(&mut self.line, " t", first);
                self.used(stream, &tensors);
                // The owner's release ends its storage (after every view's); a view's leaves
                // it to the owner.
                for &t in &tensors {
                    if self.storage(t) == t {
                        self.sync.remove(&t);
                    }
                }
                return self.emit();
            }
            RecKind::Read | RecKind::AccessWait => push_id(&mut self.line, " t", first),
            RecKind::Write(bytes) => {
                push_id(&mut self.line, " t", first);
                let dtype = self.declared(tensors[0]).map_or(DType::F32, |t| t.dtype);
                self.write_data(dtype, &bytes)?;
            }
        }
        if uses {
            self.used(stream, &tensors);
        }
        self.emit()
    }

    /// Before an instruction on `stream` that uses `tensors`: an `after` for those that the
    /// rule finds unsynchronised (module docs), one per source stream.
    fn sync_before(&mut self, stream: u32, tensors: &[u64]) -> Result<(), TraceError> {
        let devices = &self.devices;
        let device = |s: u32| devices.get(s as usize).copied().flatten();
        for &t in tensors {
            let storage = self.storage(t);
            let Some(u) = self.sync.get(&storage).and_then(|s| s.unsynced(stream, device)) else { continue };
            // One tensor per storage: the `after` synchronises the storage.
            let named = |ts: &SmallVec<[u64; 4]>| ts.iter().any(|&x| self.storage(x) == storage);
            match self.afters.iter().position(|(src, _)| *src == u.source) {
                Some(i) if named(&self.afters[i].1) => {}
                Some(i) => self.afters[i].1.push(t),
                None => self.afters.push((u.source, SmallVec::from_slice(&[t]))),
            }
        }
        if self.afters.is_empty() {
            return Ok(());
        }
        let mut afters = std::mem::take(&mut self.afters);
        for (source, ts) in afters.drain(..) {
            self.line.push_str("after");
            push_id(&mut self.line, " s", stream as u64);
            push_id(&mut self.line, " s", source as u64);
            for &t in &ts {
                let n = self.tensor(t);
                push_id(&mut self.line, " t", n as u64);
                let storage = self.storage(t);
                if let Some(s) = self.sync.get_mut(&storage) {
                    s.after(stream, source);
                }
            }
            self.emit()?;
        }
        self.afters = afters;
        Ok(())
    }

    /// `tensors`' storages are used on `stream` (`TensorSync::used`).
    fn used(&mut self, stream: u32, tensors: &[u64]) {
        for &t in tensors {
            let storage = self.storage(t);
            if let Some(e) = self.sync.entry(storage).or_default().used(stream) {
                self.uncover(e);
            }
        }
    }

    /// VM event `id` is recorded on `stream` for `tensors`' storages (`TensorSync::record`).
    fn recorded(&mut self, stream: u32, id: u64, tensors: &[u64]) {
        for &t in tensors {
            let t = self.storage(t);
            let (covered, before) = self.sync.entry(t).or_default().record(stream, id);
            if covered && before != Some(id) {
                let c = self.covers.entry(id).or_default();
                c.0 += 1;
                c.1.push(t);
            }
            if let Some(e) = before.filter(|&e| e != id) {
                self.uncover(e);
            }
        }
    }

    /// A tensor covered by event `id` is covered by it no longer; forget the event's list
    /// once none is.
    fn uncover(&mut self, id: u64) {
        if let Some(c) = self.covers.get_mut(&id) {
            c.0 = c.0.saturating_sub(1);
            if c.0 == 0 {
                self.covers.remove(&id);
            }
        }
    }

    /// The data of a host write: inline when small, else appended to the sidecar.
    fn write_data(&mut self, dtype: DType, bytes: &[u8]) -> Result<(), TraceError> {
        use std::fmt::Write as _;
        if bytes.len() / dtype.size() <= INLINE_LIMIT {
            let _ = write!(self.line, " {dtype}");
            write_values(&mut self.line, dtype, bytes);
            return Ok(());
        }
        if self.sidecar.is_none() {
            let mut p = self.path.clone().into_os_string();
            p.push(".bin");
            let p = PathBuf::from(p);
            let f = File::create(&p).map_err(|e| TraceError::io(&p, e))?;
            self.sidecar = Some((p, BufWriter::new(f), 0));
        }
        let (p, w, offset) = self.sidecar.as_mut().expect("opened above");
        w.write_all(bytes).map_err(|e| TraceError::io(p, e))?;
        let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let _ = write!(self.line, " file=");
        quote(&mut self.line, &name);
        let _ =
            write!(self.line, " offset={offset} bytes={} fnv1a64=0x{:016x}", bytes.len(), checksum(bytes));
        *offset += bytes.len() as u64;
        Ok(())
    }
}

/// Append `prefix` and the decimal digits of `n` (without the formatting machinery: this
/// runs for every operand of every recorded instruction).
fn push_id(out: &mut String, prefix: &str, n: u64) {
    out.push_str(prefix);
    out.push_str(itoa::Buffer::new().format(n));
}
