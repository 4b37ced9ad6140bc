//! The graph a person can read: same-stream chains collapsed, releases folded, the critical
//! path marked, and a DOT export whose size is capped.
//!
//! **Chains.** A stream runs its instructions in order, so a run of consecutive instructions
//! of one stream that no other stream enters (no edge from another stream or a barrier into
//! any but its first) or leaves (no edge to another stream out of any but its last) orders
//! nothing that its first and last instruction do not: it is drawn as one node, labelled
//! with its stream, its instruction count, its lines and its most frequent ops. A stream's
//! chains are joined by its stream-order edges, and edges between streams join chains
//! end to start, so the condensed graph is a DAG and every edge goes from an earlier
//! chain to a later one in program order.
//!
//! **Releases** free a tensor once its readers are done; they matter to memory, not to the
//! picture. A release folds into the next instruction of its stream (which waits for it,
//! so the release's own waits become that instruction's), or, if its stream has none before
//! the next barrier, into the previous one (whose successors nothing orders after the
//! release). A stream that has nothing but releases keeps them as nodes.
//!
//! **Implied edges** are left out (`reduce`, a transitive reduction by vector clocks): an
//! edge that a path through other edges or stream order already implies orders nothing
//! more, and drawing it buries the edges that do (every reader of a copied tensor after an
//! event wait would point back at the copy).
//!
//! **The critical path** is one longest chain of the instruction graph; a node on it is
//! drawn red and bold, as is each edge it crosses between nodes.
//!
//! **The cap.** [`Graph::dot`] draws at most [`DotLimits::max_nodes`] nodes and
//! [`DotLimits::max_edges`] edges: the longest prefix of nodes in program order within
//! both, with a note in the drawing and in [`Dot`] of what it cut. Graphviz's layout time
//! grows much faster than the graph (a few hundred nodes take seconds, a few thousand
//! minutes), and no one reads a drawing of thousands of boxes.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;

use super::{Deps, EdgeKind, Kind};

/// A drawn node: one instruction, or a chain of instructions of one stream.
#[derive(Debug, Clone, PartialEq)]
pub struct GraphNode {
    /// The stream's number.
    pub stream: u32,
    /// Instructions in the node, folded releases not counted.
    pub instructions: u64,
    /// Releases folded into the node.
    pub releases: u64,
    /// Trace lines of its first and last instruction.
    pub lines: (u32, u32),
    /// Its ops (or instruction kinds: `record`, `wait`, `read`, ...) and how many of each,
    /// most frequent first.
    pub ops: Vec<(Arc<str>, u64)>,
    /// The label of a node of one instruction (`relu`, `wait e3`, `release t7`).
    pub single: Option<String>,
    /// Instructions of the critical path in it.
    pub critical: u64,
}

/// A drawn edge between two nodes (indices into [`Graph::nodes`], `from < to`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GraphEdge {
    /// The earlier node.
    pub from: usize,
    /// The later node.
    pub to: usize,
    /// Why (when several instruction edges join the two nodes, the first of stream order,
    /// barrier, event and data among them).
    pub kind: EdgeKind,
    /// Instruction edges it stands for (stream-order edges count 1).
    pub count: u64,
    /// Whether the critical path crosses it.
    pub critical: bool,
}

/// A graph of a trace ready to draw: [`Analysis::condensed`](super::Analysis::condensed)
/// or [`Analysis::full`](super::Analysis::full).
#[derive(Debug, Clone)]
pub struct Graph {
    /// The streams: number and description (`mock:0 compute`).
    pub streams: Vec<(u32, String)>,
    /// Nodes in program order of their first instruction.
    pub nodes: Vec<GraphNode>,
    /// Edges, ordered by their later node.
    pub edges: Vec<GraphEdge>,
    /// Whether chains are collapsed and releases folded.
    pub condensed: bool,
    /// The views of the trace, one line each (`t7 = view of t3 f32[3,2]`), for the
    /// drawing's legend: a view's accesses are its storage's, so its edges go to and from
    /// its owner's other uses.
    pub views: Vec<String>,
}

/// How much of a graph [`Graph::dot`] draws.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DotLimits {
    /// The most nodes drawn.
    pub max_nodes: usize,
    /// The most edges drawn.
    pub max_edges: usize,
}

impl Default for DotLimits {
    /// 300 nodes and 1200 edges: graphviz lays that out in seconds.
    fn default() -> Self {
        DotLimits { max_nodes: 300, max_edges: 1200 }
    }
}

/// A graph in Graphviz DOT, and how much of it was drawn.
#[derive(Debug, Clone, PartialEq)]
pub struct Dot {
    /// The DOT text.
    pub text: String,
    /// Nodes drawn, of [`Dot::nodes`].
    pub drawn_nodes: usize,
    /// Edges drawn, of [`Dot::edges`].
    pub drawn_edges: usize,
    /// Nodes in the graph.
    pub nodes: usize,
    /// Edges in the graph.
    pub edges: usize,
    /// The last trace line drawn, when the graph was cut.
    pub cut_after_line: Option<u32>,
}

impl Dot {
    /// Whether the cap left part of the graph out.
    pub fn is_cut(&self) -> bool {
        self.drawn_nodes < self.nodes || self.drawn_edges < self.edges
    }
}

/// Where a release goes: into another instruction's node, or its own.
const OWN: u32 = u32::MAX;

pub(super) fn build(deps: &Deps, condense: bool) -> Graph {
    let n = deps.instrs.len();
    // rep[i]: the instruction whose node holds i; forward[i]: whether i's in-edges carry
    // over to it (a release folded into a later instruction).
    let mut rep: Vec<u32> = (0..n as u32).collect();
    let mut forward = vec![true; n];
    if condense {
        fold_releases(deps, &mut rep, &mut forward);
    }
    // The edges between representatives; in the condensed graph only those between
    // streams (or into and out of barriers) order anything that stream order does not.
    let is_barrier = |i: u32| deps.instrs[i as usize].kind == Kind::Barrier;
    let mut mapped: Vec<(u32, u32, EdgeKind)> = Vec::new();
    for &(a, b, k) in &deps.edges {
        if !forward[b as usize] {
            continue;
        }
        let (ra, rb) = (rep[a as usize], rep[b as usize]);
        let (ra, rb) = (if ra == OWN { a } else { ra }, if rb == OWN { b } else { rb });
        if ra == rb {
            continue;
        }
        let cross = deps.instrs[ra as usize].stream != deps.instrs[rb as usize].stream
            || is_barrier(ra)
            || is_barrier(rb);
        if cross || !condense {
            mapped.push((ra, rb, k));
        }
    }
    reduce(deps, &rep, &mut mapped);
    let mut has_in = vec![false; n];
    let mut has_out = vec![false; n];
    for &(a, b, _) in &mapped {
        has_out[a as usize] = true;
        has_in[b as usize] = true;
    }
    // Chains, in program order.
    let mut chain_of: Vec<u32> = vec![OWN; n];
    let mut nodes: Vec<GraphNode> = Vec::new();
    // (node, op) of every instruction drawn, counted per node below (one vector, not a map
    // per node: a trace whose every instruction is a node has millions of them).
    let mut members: Vec<(u32, u32)> = Vec::new();
    let mut open: HashMap<u32, (u32, u32)> = HashMap::new(); // stream -> (chain, last member)
    let mut edges: Vec<GraphEdge> = Vec::new();
    let mut last_chain: HashMap<u32, u32> = HashMap::new();
    for i in 0..n {
        let r = rep[i];
        if r != OWN && r as usize != i {
            continue; // folded; counted below
        }
        let ins = &deps.instrs[i];
        let barrier = ins.kind == Kind::Barrier;
        if barrier {
            open.clear();
        }
        let joins = match open.get(&ins.stream) {
            Some(&(c, last)) if condense && !has_in[i] && !has_out[last as usize] => Some(c),
            _ => None,
        };
        let c = match joins {
            Some(c) => c,
            None => {
                let c = nodes.len() as u32;
                if let Some(prev) = last_chain.insert(ins.stream, c) {
                    let (from, to) = (prev as usize, c as usize);
                    edges.push(GraphEdge { from, to, kind: EdgeKind::Stream, count: 1, critical: false });
                }
                nodes.push(GraphNode {
                    stream: ins.stream,
                    instructions: 0,
                    releases: 0,
                    lines: (ins.line, ins.line),
                    ops: Vec::new(),
                    single: None,
                    critical: 0,
                });
                c
            }
        };
        chain_of[i] = c;
        let node = &mut nodes[c as usize];
        node.instructions += 1;
        node.lines.1 = ins.line;
        node.single = (node.instructions == 1).then(|| label(deps, ins.kind));
        members.push((c, op_key(deps, ins.kind)));
        if barrier {
            open.clear();
        } else {
            open.insert(ins.stream, (c, i as u32));
        }
    }
    // Folded releases count in their representative's node.
    for i in 0..n {
        let r = rep[i];
        if r != OWN && r as usize != i {
            let c = chain_of[r as usize] as usize;
            nodes[c].releases += 1;
            chain_of[i] = c as u32;
        }
    }
    let names: Vec<Arc<str>> =
        (0..deps.ops.len() as u32 + KINDS.len() as u32).map(|k| key_name(deps, k).into()).collect();
    members.sort_unstable();
    for run in members.chunk_by(|a, b| a.0 == b.0) {
        let node = &mut nodes[run[0].0 as usize];
        if node.instructions + node.releases > 1 {
            node.single = None;
        }
        let mut ops: Vec<(Arc<str>, u64)> = Vec::new();
        for same in run.chunk_by(|a, b| a.1 == b.1) {
            ops.push((names[same[0].1 as usize].clone(), same.len() as u64));
        }
        ops.sort_unstable_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        node.ops = ops;
    }
    // Edges between chains, merged per pair.
    let mut between: HashMap<(u32, u32), (EdgeKind, u64)> = HashMap::new();
    for &(a, b, k) in &mapped {
        let (ca, cb) = (chain_of[a as usize], chain_of[b as usize]);
        if ca != cb {
            let e = between.entry((ca, cb)).or_insert((k, 0));
            e.0 = e.0.max(k);
            e.1 += 1;
        }
    }
    for e in &mut edges {
        // A stream edge that also carries data stands for both.
        if let Some((_, count)) = between.remove(&(e.from as u32, e.to as u32)) {
            e.count += count;
        }
    }
    edges.extend(between.into_iter().map(|((a, b), (kind, count))| GraphEdge {
        from: a as usize,
        to: b as usize,
        kind,
        count,
        critical: false,
    }));
    edges.sort_unstable_by_key(|e| (e.to, e.from));
    // The critical path: its nodes, and the edges it crosses.
    let mut crossed: Vec<(usize, usize)> = Vec::new();
    let mut prev: Option<usize> = None;
    for &i in &deps.critical {
        let c = chain_of[i as usize] as usize;
        nodes[c].critical += 1;
        if let Some(p) = prev.filter(|&p| p != c) {
            crossed.push((p, c));
        }
        prev = Some(c);
    }
    crossed.sort_unstable();
    for e in &mut edges {
        e.critical = crossed.binary_search(&(e.from, e.to)).is_ok();
    }
    Graph {
        streams: deps.streams.clone(),
        nodes,
        edges,
        condensed: condense,
        views: view_legend(&deps.views),
    }
}

/// The most per-stream clock entries (streams × instructions) [`reduce`] keeps: 128 MiB.
const CLOCK_LIMIT: usize = 1 << 25;

/// Drop the edges that a path through other edges or stream order already implies (the
/// transitive reduction), which leaves the edges a reader needs: a copy read after its
/// stream waited on an event shows the wait, not one edge per reader.
///
/// With vector clocks: each node's clock holds, per stream, the last instruction of that
/// stream known to precede it. The edges into a node are visited from the latest source
/// back; one whose source the clock gathered so far (from the stream predecessor and the
/// sources kept) already covers is implied. Skipped, keeping every edge, when the clocks
/// would take more than [`CLOCK_LIMIT`] entries.
fn reduce(deps: &Deps, rep: &[u32], mapped: &mut Vec<(u32, u32, EdgeKind)>) {
    let n = deps.instrs.len();
    let mut index: HashMap<u32, usize> = HashMap::new();
    for i in &deps.instrs {
        let next = index.len();
        index.entry(i.stream).or_insert(next);
    }
    let streams = index.len();
    if streams.saturating_mul(n) > CLOCK_LIMIT {
        return;
    }
    let sidx: Vec<usize> = deps.instrs.iter().map(|i| index[&i.stream]).collect();
    mapped.sort_unstable_by_key(|&(a, b, _)| (b, std::cmp::Reverse(a)));
    // clock[i * streams + s]: 1 + the last instruction of stream s known to precede i, or 0.
    let mut clock = vec![0u32; streams * n];
    let mut last: Vec<Option<usize>> = vec![None; streams];
    let mut keep = vec![true; mapped.len()];
    let mut acc = vec![0u32; streams];
    let mut e = 0;
    for i in 0..n {
        if rep[i] != OWN && rep[i] as usize != i {
            continue; // folded into another node
        }
        let s = sidx[i];
        match last[s] {
            Some(p) => acc.copy_from_slice(&clock[p * streams..(p + 1) * streams]),
            None => acc.fill(0),
        }
        while e < mapped.len() && mapped[e].1 as usize == i {
            let a = mapped[e].0 as usize;
            if acc[sidx[a]] > a as u32 {
                keep[e] = false;
            } else {
                for (x, &c) in acc.iter_mut().zip(&clock[a * streams..(a + 1) * streams]) {
                    *x = (*x).max(c);
                }
            }
            e += 1;
        }
        acc[s] = i as u32 + 1;
        clock[i * streams..(i + 1) * streams].copy_from_slice(&acc);
        last[s] = Some(i);
    }
    let mut k = keep.iter();
    mapped.retain(|_| k.next().copied().unwrap_or(true));
}

/// Fold each release into the next instruction of its stream before the next barrier, or
/// else into the previous one since the last barrier; a release with neither keeps its node.
fn fold_releases(deps: &Deps, rep: &mut [u32], forward: &mut [bool]) {
    let mut pending: HashMap<u32, Vec<u32>> = HashMap::new(); // stream -> releases
    let mut prev: HashMap<u32, u32> = HashMap::new(); // stream -> last non-release since the barrier
    let mut settle = |pending: &mut HashMap<u32, Vec<u32>>, prev: &HashMap<u32, u32>| {
        for (s, rs) in pending.drain() {
            for r in rs {
                match prev.get(&s) {
                    Some(&p) => rep[r as usize] = p,
                    None => rep[r as usize] = OWN,
                }
                forward[r as usize] = false;
            }
        }
    };
    let mut into_next: Vec<(u32, u32)> = Vec::new();
    for (i, ins) in deps.instrs.iter().enumerate() {
        let i = i as u32;
        match ins.kind {
            Kind::Release(_) => pending.entry(ins.stream).or_default().push(i),
            Kind::Barrier => {
                settle(&mut pending, &prev);
                prev.clear();
            }
            _ => {
                if let Some(rs) = pending.remove(&ins.stream) {
                    into_next.extend(rs.into_iter().map(|r| (r, i)));
                }
                prev.insert(ins.stream, i);
            }
        }
    }
    settle(&mut pending, &prev);
    for (r, i) in into_next {
        rep[r as usize] = i;
    }
}

/// What an instruction counts as in its node's ops: the op, or the kind's name.
fn op_key(deps: &Deps, k: Kind) -> u32 {
    let kinds = deps.ops.len() as u32;
    match k {
        Kind::Call(op) => op,
        Kind::Record(_) => kinds,
        Kind::Wait(_) => kinds + 1,
        Kind::Barrier => kinds + 2,
        Kind::Release(_) => kinds + 3,
        Kind::Read(_) => kinds + 4,
        Kind::HostWait(_) => kinds + 5,
        Kind::Write(_) => kinds + 6,
    }
}

/// The names of the instruction kinds that are not calls, in [`op_key`]'s order.
const KINDS: [&str; 7] = ["record", "wait", "barrier", "release", "read", "host wait", "write"];

fn key_name(deps: &Deps, key: u32) -> String {
    match deps.ops.get(key as usize) {
        Some(op) => op.clone(),
        None => KINDS[key as usize - deps.ops.len()].to_string(),
    }
}

fn label(deps: &Deps, k: Kind) -> String {
    // A view is named with the storage it uses: `release t7 (view of t3)`.
    let t = |t: u32| match deps.views.get(&t) {
        Some((owner, _)) => format!("t{t} (view of t{owner})"),
        None => format!("t{t}"),
    };
    match k {
        Kind::Call(op) => deps.ops[op as usize].clone(),
        Kind::Record(e) => format!("record e{e}"),
        Kind::Wait(e) => format!("wait e{e}"),
        Kind::Barrier => "barrier".into(),
        Kind::Release(x) => format!("release {}", t(x)),
        Kind::Read(x) => format!("read {}", t(x)),
        Kind::HostWait(x) => format!("host wait {}", t(x)),
        Kind::Write(x) => format!("write {}", t(x)),
    }
}

/// Views listed in a drawing's legend; the rest are counted.
const VIEWS_SHOWN: usize = 12;

/// The legend's lines for `views` (number → owner and type): `t7 = view of t3 f32[3,2]`,
/// by number, at most [`VIEWS_SHOWN`] of them.
fn view_legend(views: &HashMap<u32, (u32, String)>) -> Vec<String> {
    let mut ids: Vec<&u32> = views.keys().collect();
    ids.sort_unstable();
    let mut out: Vec<String> = ids
        .iter()
        .take(VIEWS_SHOWN)
        .map(|&&v| {
            let (owner, ty) = &views[&v];
            format!("t{v} = view of t{owner} {ty}")
        })
        .collect();
    if ids.len() > VIEWS_SHOWN {
        out.push(format!("and {} more views", ids.len() - VIEWS_SHOWN));
    }
    out
}

/// Ops shown in a chain's label; the rest are counted.
const OPS_SHOWN: usize = 3;

impl GraphNode {
    /// The node's label, one item per line.
    pub fn label(&self) -> Vec<String> {
        if let Some(single) = &self.single {
            return vec![single.clone(), format!("line {}", self.lines.0)];
        }
        let mut out =
            vec![format!("{} instructions, lines {}-{}", self.instructions, self.lines.0, self.lines.1)];
        let mut ops: Vec<String> =
            self.ops.iter().take(OPS_SHOWN).map(|(op, n)| format!("{op} x{n}")).collect();
        if self.ops.len() > OPS_SHOWN {
            ops.push(format!("{} more kinds", self.ops.len() - OPS_SHOWN));
        }
        out.push(ops.join(", "));
        if self.releases > 0 {
            out.push(format!("+{} releases", self.releases));
        }
        if self.critical > 0 && self.critical < self.instructions + self.releases {
            out.push(format!("{} on the critical path", self.critical));
        }
        out
    }
}

impl Graph {
    /// The longest prefix of the graph within `limits`, in Graphviz DOT: one cluster per
    /// stream, stream order dotted grey, data edges between streams solid, event edges
    /// dashed blue, barrier edges bold grey, the critical path red and bold; an edge that
    /// stands for several instruction edges is labelled with their count. A cut graph ends
    /// with a note saying what was left out and how to draw more.
    pub fn dot(&self, limits: &DotLimits) -> Dot {
        // Edges are ordered by their later node, so a prefix of nodes keeps a prefix of edges.
        let mut k = 0;
        let mut e = 0;
        while k < self.nodes.len().min(limits.max_nodes) {
            let mut e2 = e;
            while e2 < self.edges.len() && self.edges[e2].to <= k {
                e2 += 1;
            }
            if e2 > limits.max_edges {
                break;
            }
            k += 1;
            e = e2;
        }
        let mut s = String::from(
            "digraph trace {\n  rankdir=LR;\n  nslimit=4;\n  nslimit1=4;\n  mclimit=0.5;\n  node [shape=box, fontsize=10, fontname=\"sans-serif\"];\n  edge [fontsize=9];\n",
        );
        for (id, desc) in &self.streams {
            let members: Vec<usize> = (0..k).filter(|&i| self.nodes[i].stream == *id).collect();
            if members.is_empty() {
                continue;
            }
            let _ = writeln!(s, "  subgraph cluster_s{id} {{\n    label=\"s{id} {}\";", escape(desc));
            for i in members {
                let node = &self.nodes[i];
                let label: Vec<String> = node.label().iter().map(|l| escape(l)).collect();
                let style = if node.critical > 0 { ", color=red, penwidth=2" } else { "" };
                let _ = writeln!(s, "    n{i} [label=\"{}\"{style}];", label.join("\\n"));
            }
            s.push_str("  }\n");
        }
        for edge in &self.edges[..e] {
            let mut attrs = match edge.kind {
                EdgeKind::Stream => "style=dotted, color=gray".to_string(),
                EdgeKind::Event => "style=dashed, color=blue".to_string(),
                EdgeKind::Barrier => "style=bold, color=gray40".to_string(),
                EdgeKind::Data => "color=black".to_string(),
            };
            if edge.critical {
                attrs.push_str(", color=red, penwidth=2");
            }
            if edge.count > 1 {
                let _ = write!(attrs, ", label=\"{}\"", edge.count);
            }
            let _ = writeln!(s, "  n{} -> n{} [{attrs}];", edge.from, edge.to);
        }
        if !self.views.is_empty() {
            let lines: Vec<String> = self.views.iter().map(|l| escape(l)).collect();
            let _ = writeln!(s, "  views [shape=note, label=\"{}\\l\"];", lines.join("\\l"));
        }
        let cut_after_line = (k < self.nodes.len() || e < self.edges.len())
            .then(|| self.nodes[..k].iter().map(|n| n.lines.1).max().unwrap_or(0));
        if let Some(line) = cut_after_line {
            let _ = writeln!(
                s,
                "  cut [shape=note, color=red, label=\"{} of {} nodes and {} of {} edges drawn (up to trace line {line});\\nraise --max-nodes / --max-edges to draw more\"];",
                k,
                self.nodes.len(),
                e,
                self.edges.len()
            );
        }
        s.push_str("}\n");
        Dot {
            text: s,
            drawn_nodes: k,
            drawn_edges: e,
            nodes: self.nodes.len(),
            edges: self.edges.len(),
            cut_after_line,
        }
    }
}

/// `s` inside a DOT string.
fn escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}
