//! Dependency-graph analysis of a trace: how much parallelism the program offers, and a
//! picture of its graph that a person can read.
//!
//! The graph has one node per instruction and an edge wherever the VM would order two
//! instructions: the scheduler's operand rules, per storage (a write follows the last write
//! and every read since; a read follows the last write; a use through a view is a use of
//! its owner's storage, as the VM's one dependence object per storage has it), the stream FIFO (each instruction follows
//! the previous one on its stream), `record` → `wait` of one event, and barriers (a
//! barrier follows the last instruction of every stream before it, and the first
//! instruction of every stream after it follows the barrier). With every instruction
//! costing one unit, the *critical path* is the longest chain of edges, and the *available
//! parallelism* is instructions / critical path: how many streams could be kept busy on
//! average if the VM's overheads were zero.
//!
//! Drawn one node per instruction, the graph of even a small program is more than graphviz
//! can lay out in minutes and more than a person can read; [`Analysis::condensed`] draws
//! what matters instead (module `graph`): each run of instructions on one stream that no
//! other stream enters or leaves becomes one node, releases fold into the node of the
//! instruction after them, and the critical path is highlighted. [`Graph::dot`] caps the
//! drawing's size and says what it cut.

mod graph;

use std::collections::HashMap;

use super::format::{AccessKind, DTypeCount, Ref, Stmt, Trace};
use super::validate::{validate, ValidateOptions};
use super::TraceError;

pub use graph::{Dot, DotLimits, Graph, GraphEdge, GraphNode};

/// The statistics of a trace's dependency graph, and the graph itself.
#[derive(Debug, Clone)]
pub struct Analysis {
    /// Instruction statements.
    pub instructions: u64,
    /// Per stream: its number, its description (`mock:0 compute`) and its instructions.
    pub per_stream: Vec<(u32, String, u64)>,
    /// Dependency edges (operand, event and barrier edges; stream order not counted).
    pub edges: u64,
    /// Instructions on the longest dependency chain.
    pub critical_path: u64,
    /// `instructions / critical_path` (0 for an empty trace).
    pub parallelism: f64,
    /// The tensors and views the trace declares, per dtype ([`Trace::dtypes`]).
    pub dtypes: Vec<DTypeCount>,
    deps: Deps,
}

impl PartialEq for Analysis {
    /// Two analyses are equal when their statistics are (the graph follows from the trace).
    fn eq(&self, other: &Self) -> bool {
        self.instructions == other.instructions
            && self.per_stream == other.per_stream
            && self.edges == other.edges
            && self.critical_path == other.critical_path
            && self.parallelism == other.parallelism
            && self.dtypes == other.dtypes
    }
}

impl Analysis {
    /// The condensed graph: same-stream chains collapsed into one node each, releases
    /// folded away, the critical path marked (module docs of `graph`).
    pub fn condensed(&self) -> Graph {
        graph::build(&self.deps, true)
    }

    /// The graph with one node per instruction (releases included), the critical path
    /// marked. Only small traces give a drawing graphviz can lay out.
    pub fn full(&self) -> Graph {
        graph::build(&self.deps, false)
    }

    /// The condensed graph in Graphviz DOT, within the default [`DotLimits`].
    pub fn dot(&self) -> String {
        self.condensed().dot(&DotLimits::default()).text
    }
}

/// What an instruction is, for its label (ids index [`Deps::ops`] or name a tensor or event).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A `call` of the op with this index in [`Deps::ops`].
    Call(u32),
    /// `record` of this event.
    Record(u32),
    /// `wait` for this event.
    Wait(u32),
    /// A barrier.
    Barrier,
    /// `release` of this tensor.
    Release(u32),
    /// A host read of this tensor.
    Read(u32),
    /// A host wait for this tensor.
    HostWait(u32),
    /// A host write of this tensor.
    Write(u32),
}

/// One instruction of the graph.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Instr {
    /// Its stream's number.
    pub stream: u32,
    /// What it is.
    pub kind: Kind,
    /// Its line in the trace.
    pub line: u32,
}

/// Why one instruction follows another (besides stream order, which is not stored).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum EdgeKind {
    /// A tensor: a read after a write, or a write after a read or a write.
    Data,
    /// A `record` → `wait` of one event.
    Event,
    /// Into or out of a barrier.
    Barrier,
    /// The stream's FIFO: the next instruction (or collapsed chain) on the same stream.
    Stream,
}

/// The dependency graph, as the analysis pass built it: instructions in program order, the
/// edges between them, and one longest path.
#[derive(Debug, Clone, Default)]
pub(crate) struct Deps {
    /// Streams: number and description.
    pub streams: Vec<(u32, String)>,
    /// Instructions in program order.
    pub instrs: Vec<Instr>,
    /// Op names (and the names of the other kinds, for counting).
    pub ops: Vec<String>,
    /// Edges `(from, to, kind)` between instruction indices, `from < to`, stream order
    /// not included.
    pub edges: Vec<(u32, u32, EdgeKind)>,
    /// The instructions of one longest chain, in order.
    pub critical: Vec<u32>,
    /// The views the trace declares, by number: the owner of the storage and the view's
    /// type (`f32[3,2]`), for labels.
    pub views: HashMap<u32, (u32, String)>,
}

#[derive(Default)]
struct TensorDeps {
    last_write: Option<u32>,
    reads: Vec<u32>,
}

/// Analyse `trace` (it must be free of problems other than missing synchronisation).
pub fn analyze(trace: &Trace) -> Result<Analysis, TraceError> {
    validate(trace, &ValidateOptions { resync: true, ..Default::default() })?;
    let mut deps = Deps::default();
    let mut op_ids: HashMap<String, u32> = HashMap::new();
    // Per instruction: its depth (instructions on the longest chain ending there) and the
    // predecessor that chain comes through (`NONE` for the first).
    let mut depth: Vec<u64> = Vec::new();
    let mut via: Vec<u32> = Vec::new();
    let mut last_on: HashMap<u32, u32> = HashMap::new();
    let mut tensors: HashMap<u32, TensorDeps> = HashMap::new();
    let mut events: HashMap<u32, u32> = HashMap::new();
    // The last barrier, and the deepest instruction so far.
    let mut barrier: Option<u32> = None;
    let mut deepest: Option<u32> = None;
    let mut preds: Vec<(u32, EdgeKind)> = Vec::new();
    for l in &trace.lines {
        if let Stmt::Stream { id, device, ty } = &l.stmt {
            deps.streams.push((id.id, format!("{device} {}", ty.name())));
            continue;
        }
        if let Stmt::View { id, base, dtype, shape, .. } = &l.stmt {
            let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
            deps.views.insert(id.id, (base.id, format!("{dtype}[{}]", dims.join(","))));
            continue;
        }
        let Some(stream) = l.stmt.stream() else { continue };
        let n = deps.instrs.len() as u32;
        preds.clear();
        let (reads, writes): (&[Ref], &[Ref]) = match &l.stmt {
            Stmt::Call { inputs, outputs, .. } => (inputs, outputs),
            Stmt::Record { tensors, .. } => (tensors, &[]),
            Stmt::Release { tensor, .. } => (&[], std::slice::from_ref(tensor)),
            Stmt::Access { tensor, kind: AccessKind::Write(_), .. } => (&[], std::slice::from_ref(tensor)),
            Stmt::Access { tensor, .. } => (std::slice::from_ref(tensor), &[]),
            _ => (&[], &[]),
        };
        // The dependence object is the storage's: a view's accesses are its owner's.
        let storage = |r: &Ref| deps.views.get(&r.id).map_or(r.id, |v| v.0);
        for r in reads {
            let d = tensors.entry(storage(r)).or_default();
            if let Some(w) = d.last_write {
                preds.push((w, EdgeKind::Data));
            }
            d.reads.push(n);
        }
        for w in writes {
            let d = tensors.entry(storage(w)).or_default();
            preds.extend(d.last_write.iter().map(|&p| (p, EdgeKind::Data)));
            preds.extend(d.reads.iter().filter(|&&p| p != n).map(|&p| (p, EdgeKind::Data)));
            d.reads.clear();
            d.last_write = Some(n);
        }
        let kind = match &l.stmt {
            Stmt::Call { op, .. } => {
                let next = op_ids.len() as u32;
                Kind::Call(*op_ids.entry(op.clone()).or_insert_with(|| {
                    deps.ops.push(op.clone());
                    next
                }))
            }
            Stmt::Record { event, .. } => {
                events.insert(event.id, n);
                Kind::Record(event.id)
            }
            Stmt::Wait { event, .. } => {
                preds.extend(events.get(&event.id).map(|&p| (p, EdgeKind::Event)));
                Kind::Wait(event.id)
            }
            Stmt::Barrier { .. } => {
                // The last instruction of every other stream (its own is its stream
                // predecessor).
                let others = last_on.iter().filter(|(s, _)| **s != stream.id);
                preds.extend(others.map(|(_, &p)| (p, EdgeKind::Barrier)));
                Kind::Barrier
            }
            Stmt::Release { tensor, .. } => Kind::Release(tensor.id),
            Stmt::Access { tensor, kind, .. } => match kind {
                AccessKind::Read => Kind::Read(tensor.id),
                AccessKind::Wait => Kind::HostWait(tensor.id),
                AccessKind::Write(_) => Kind::Write(tensor.id),
            },
            _ => continue,
        };
        // The first instruction of a stream after a barrier (on another stream) follows it.
        if let Some(b) = barrier {
            let first_since = last_on.get(&stream.id).is_none_or(|&p| p < b);
            if first_since && deps.instrs[b as usize].stream != stream.id {
                preds.push((b, EdgeKind::Barrier));
            }
        }
        // Every predecessor is an earlier instruction, so `depth` has its entry; the stream
        // predecessor is considered first, so that a tie keeps the path on its stream.
        let mut best: (u64, u32) = (0, NONE);
        let stream_pred = last_on.get(&stream.id).map(|&p| (p, EdgeKind::Stream));
        for &(p, _) in stream_pred.iter().chain(preds.iter()) {
            if depth[p as usize] > best.0 {
                best = (depth[p as usize], p);
            }
        }
        if kind == Kind::Barrier {
            // Everything before a barrier precedes it; the deepest instruction does so
            // through the longest chain.
            if let Some(d) = deepest.filter(|&d| depth[d as usize] > best.0) {
                best = (depth[d as usize], d);
            }
            barrier = Some(n);
        }
        depth.push(best.0 + 1);
        via.push(best.1);
        if deepest.is_none_or(|d| depth[d as usize] < best.0 + 1) {
            deepest = Some(n);
        }
        last_on.insert(stream.id, n);
        preds.sort_unstable();
        preds.dedup_by_key(|p| p.0);
        deps.edges.extend(preds.iter().map(|&(p, k)| (p, n, k)));
        deps.instrs.push(Instr { stream: stream.id, kind, line: l.pos.line });
    }
    let critical_path = deepest.map_or(0, |d| depth[d as usize]);
    let mut at = deepest.unwrap_or(NONE);
    while at != NONE {
        deps.critical.push(at);
        at = via[at as usize];
    }
    deps.critical.reverse();
    let instructions = deps.instrs.len() as u64;
    let mut counts: HashMap<u32, u64> = HashMap::new();
    for i in &deps.instrs {
        *counts.entry(i.stream).or_default() += 1;
    }
    let per_stream = deps
        .streams
        .iter()
        .map(|(id, desc)| (*id, desc.clone(), counts.get(id).copied().unwrap_or(0)))
        .collect();
    let parallelism = if critical_path == 0 { 0.0 } else { instructions as f64 / critical_path as f64 };
    Ok(Analysis {
        instructions,
        per_stream,
        edges: deps.edges.len() as u64,
        critical_path,
        parallelism,
        dtypes: trace.dtypes(),
        deps,
    })
}

/// No predecessor.
const NONE: u32 = u32::MAX;
