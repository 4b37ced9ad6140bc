//! Dependency-graph analysis of a trace: how much parallelism the program offers.
//!
//! The graph has one node per instruction and an edge wherever the VM would order two
//! instructions: the scheduler's operand rules (a write follows the last write and every
//! read since; a read follows the last write), the stream FIFO (each instruction follows
//! the previous one on its stream), `record` → `wait` of one event, and barriers (a
//! barrier follows everything before it, and everything after it follows the barrier).
//! With every instruction costing one unit, the *critical path* is the longest chain of
//! edges, and the *available parallelism* is instructions / critical path: how many
//! streams could be kept busy on average if the VM's overheads were zero.

use std::collections::HashMap;
use std::fmt::Write as _;

use super::format::{AccessKind, Ref, Stmt, Trace};
use super::validate::{validate, ValidateOptions};
use super::TraceError;

/// The statistics of a trace's dependency graph.
#[derive(Debug, Clone, PartialEq)]
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
    dot: String,
}

impl Analysis {
    /// The graph in Graphviz DOT: one cluster per stream, nodes in program order,
    /// operand edges solid (cross-stream ones red), event edges dashed.
    pub fn dot(&self) -> &str {
        &self.dot
    }
}

#[derive(Default)]
struct TensorDeps {
    last_write: Option<usize>,
    reads: Vec<usize>,
}

/// Analyse `trace` (it must be free of problems other than missing synchronisation).
pub fn analyze(trace: &Trace) -> Result<Analysis, TraceError> {
    validate(trace, &ValidateOptions { resync: true, ..Default::default() })?;
    let mut streams: Vec<(u32, String)> = Vec::new();
    let mut nodes: Vec<(u32, String, u32)> = Vec::new(); // (stream, label, line)
    let mut depth: Vec<u64> = Vec::new();
    let mut edges: Vec<(usize, usize, &'static str)> = Vec::new();
    let mut last_on: HashMap<u32, usize> = HashMap::new();
    let mut tensors: HashMap<u32, TensorDeps> = HashMap::new();
    let mut events: HashMap<u32, usize> = HashMap::new();
    let mut floor = 0u64; // depth of the last barrier
    let mut max_depth = 0u64;
    for l in &trace.lines {
        if let Stmt::Stream { id, device, ty } = &l.stmt {
            streams.push((id.id, format!("{device} {}", ty.name())));
            continue;
        }
        let Some(stream) = l.stmt.stream() else { continue };
        let n = nodes.len();
        let mut preds: Vec<(usize, &'static str)> = Vec::new();
        let (reads, writes): (Vec<Ref>, Vec<Ref>) = match &l.stmt {
            Stmt::Call { inputs, outputs, .. } => (inputs.clone(), outputs.clone()),
            Stmt::Record { tensors, .. } => (tensors.clone(), vec![]),
            Stmt::Release { tensor, .. } => (vec![], vec![*tensor]),
            Stmt::Access { tensor, kind: AccessKind::Write(_), .. } => (vec![], vec![*tensor]),
            Stmt::Access { tensor, .. } => (vec![*tensor], vec![]),
            _ => (vec![], vec![]),
        };
        for r in &reads {
            let d = tensors.entry(r.id).or_default();
            if let Some(w) = d.last_write {
                preds.push((w, "data"));
            }
            d.reads.push(n);
        }
        for w in &writes {
            let d = tensors.entry(w.id).or_default();
            preds.extend(d.last_write.iter().map(|&p| (p, "data")));
            preds.extend(d.reads.iter().filter(|&&p| p != n).map(|&p| (p, "data")));
            d.reads.clear();
            d.last_write = Some(n);
        }
        match &l.stmt {
            Stmt::Record { event, .. } => {
                events.insert(event.id, n);
            }
            Stmt::Wait { event, .. } => preds.extend(events.get(&event.id).map(|&p| (p, "event"))),
            _ => {}
        }
        // Every predecessor is an earlier node, so `depth` has its entry.
        let mut d = floor;
        if let Some(&p) = last_on.get(&stream.id) {
            d = d.max(depth[p]);
        }
        for &(p, _) in &preds {
            d = d.max(depth[p]);
        }
        if matches!(l.stmt, Stmt::Barrier { .. }) {
            d = d.max(max_depth);
            floor = d + 1;
        }
        depth.push(d + 1);
        max_depth = max_depth.max(d + 1);
        last_on.insert(stream.id, n);
        preds.sort_unstable();
        preds.dedup_by_key(|p| p.0);
        edges.extend(preds.into_iter().map(|(p, k)| (p, n, k)));
        let label = match &l.stmt {
            Stmt::Call { op, .. } => op.clone(),
            Stmt::Record { event, .. } => format!("record e{}", event.id),
            Stmt::Wait { event, .. } => format!("wait e{}", event.id),
            Stmt::Barrier { .. } => "barrier".into(),
            Stmt::Release { tensor, .. } => format!("release t{}", tensor.id),
            Stmt::Access { tensor, kind, .. } => {
                let k = match kind {
                    AccessKind::Read => "read",
                    AccessKind::Wait => "wait",
                    AccessKind::Write(_) => "write",
                };
                format!("{k} t{}", tensor.id)
            }
            _ => String::new(),
        };
        nodes.push((stream.id, label, l.pos.line));
    }
    let instructions = nodes.len() as u64;
    let per_stream = streams
        .iter()
        .map(|(id, desc)| (*id, desc.clone(), nodes.iter().filter(|n| n.0 == *id).count() as u64))
        .collect();
    let parallelism = if max_depth == 0 { 0.0 } else { instructions as f64 / max_depth as f64 };
    let dot = to_dot(&streams, &nodes, &edges);
    Ok(Analysis {
        instructions,
        per_stream,
        edges: edges.len() as u64,
        critical_path: max_depth,
        parallelism,
        dot,
    })
}

fn to_dot(streams: &[(u32, String)], nodes: &[(u32, String, u32)], edges: &[(usize, usize, &str)]) -> String {
    let mut s = String::from("digraph trace {\n  rankdir=LR;\n  node [shape=box, fontsize=10];\n");
    for (id, desc) in streams {
        let _ = writeln!(s, "  subgraph cluster_s{id} {{\n    label=\"s{id} {desc}\";");
        let mut prev = None;
        for (n, node) in nodes.iter().enumerate().filter(|(_, n)| n.0 == *id) {
            let _ = writeln!(s, "    n{n} [label=\"{}\\nline {}\"];", node.1.replace('"', "'"), node.2);
            if let Some(p) = prev {
                let _ = writeln!(s, "    n{p} -> n{n} [style=dotted, color=gray];");
            }
            prev = Some(n);
        }
        s.push_str("  }\n");
    }
    for &(a, b, kind) in edges {
        // Edges join nodes of the same graph.
        let style = match (kind, nodes[a].0 == nodes[b].0) {
            ("event", _) => "style=dashed, color=blue",
            (_, true) => "color=black",
            (_, false) => "color=red",
        };
        let _ = writeln!(s, "  n{a} -> n{b} [{style}];");
    }
    s.push_str("}\n");
    s
}
