//! Dependency-graph analysis on traces whose graphs are known by hand.

use eagervm::trace::{self, parse_str, DotLimits, EdgeKind};

fn analyse(body: &str) -> trace::Analysis {
    let text = format!(
        "eagervm-trace 1\ndevice cpu:0\ndevice mock:0\nstream s0 cpu:0 compute\nstream s1 mock:0 compute\n\
         stream s2 mock:0 h2d\n{body}"
    );
    let (t, d) = parse_str("a.trace", &text);
    assert!(d.is_empty(), "{d:?}");
    trace::analyze(&t).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn two_independent_chains_and_a_join() {
    // s1: fill a, relu a->b, relu b->c      (chain of 3)
    // s2: fill x, fill y                   (chain of 2 by stream order)
    // s1: add c,y -> z                      (after c and y: depth 4)
    let a = analyse(
        "tensor t0 f32[2] mock:0\ntensor t1 f32[2] mock:0\ntensor t2 f32[2] mock:0\n\
         tensor t3 f32[2] mock:0\ntensor t4 f32[2] mock:0\ntensor t5 f32[2] mock:0\n\
         call s1 fill out=t0\ncall s1 relu in=t0 out=t1\ncall s1 relu in=t1 out=t2\n\
         call s2 fill out=t3\ncall s2 fill out=t4\n\
         call s1 add in=t2,t4 out=t5\n",
    );
    assert_eq!(a.instructions, 6);
    assert_eq!(a.critical_path, 4);
    assert!((a.parallelism - 1.5).abs() < 1e-9);
    let per: Vec<u64> = a.per_stream.iter().map(|s| s.2).collect();
    assert_eq!(per, [0, 4, 2]);
    // Data edges: t0->relu, t1->relu, t2->add, t4->add.
    assert_eq!(a.edges, 4);
    assert!(a.dot().contains("cluster_s2") && a.dot().contains("color=red"), "{}", a.dot());
}

#[test]
fn writes_wait_for_readers_and_barriers_split_the_graph() {
    // Two readers of t0 on different streams, then a write of t0 that must follow both;
    // a barrier, then an independent instruction that still comes after it.
    let a = analyse(
        "tensor t0 f32[2] cpu:0\ntensor t1 f32[2] cpu:0\ntensor t2 f32[2] mock:0\ntensor t3 f32[2] mock:0\n\
         access s0 write t0 f32 1 2\n\
         call s0 relu in=t0 out=t1\n\
         call s2 copy in=t0 out=t2\n\
         access s0 write t0 f32 3 4\n\
         barrier s0\n\
         call s1 fill out=t3\n",
    );
    // write(1) -> relu(2), copy(2) -> write(3) -> barrier(4) -> fill(5)
    assert_eq!(a.critical_path, 5);
    assert_eq!(a.instructions, 6);
    // Drawn: the first write leaves s0 for the copy, so it ends its chain; the barrier is a
    // node of its own, entered by stream order (the copy's edge into it is implied through
    // the second write) and leaving for s1's fill.
    let g = a.condensed();
    assert_eq!(g.nodes.len(), 6, "{g:#?}");
    let edges: Vec<(usize, usize, EdgeKind)> = g.edges.iter().map(|e| (e.from, e.to, e.kind)).collect();
    assert_eq!(
        edges,
        [
            (0, 1, EdgeKind::Stream),
            (0, 2, EdgeKind::Data),
            (1, 3, EdgeKind::Stream),
            (2, 3, EdgeKind::Data),
            (3, 4, EdgeKind::Stream),
            (4, 5, EdgeKind::Barrier)
        ]
    );
    assert!(g.nodes[4].single.as_deref() == Some("barrier") && g.nodes[5].critical == 1);
}

#[test]
fn an_event_orders_its_wait() {
    let a = analyse(
        "tensor t0 f32[2] mock:0\ntensor t1 f32[2] mock:0\n\
         call s2 fill out=t0\ncall s2 fill out=t1\nrecord s2 e0 t1\nwait s1 e0\n",
    );
    assert_eq!(a.critical_path, 4);
    assert!(a.dot().contains("style=dashed"));
}

/// A trace in `trace_analyze`'s layout: s0 on cpu:0, s1 and s2 on mock:0.
fn parsed(body: &str) -> trace::Trace {
    let text = format!(
        "eagervm-trace 1\ndevice cpu:0\ndevice mock:0\nstream s0 cpu:0 compute\nstream s1 mock:0 compute\n\
         stream s2 mock:0 h2d\n{body}"
    );
    let (t, d) = parse_str("a.trace", &text);
    assert!(d.is_empty(), "{d:?}");
    t
}

#[test]
fn chains_collapse_releases_fold_and_implied_edges_go() {
    // s1: fill a, relu a->b, relu b->c, release a   (one chain: nothing enters or leaves)
    // s2: fill x, fill y                            (one chain)
    // s1: add c,y -> z, release b                   (entered from s2: a chain of its own)
    // s1: relu z -> w                               (joins the add's chain)
    let a = analyse(
        "tensor t0 f32[2] mock:0\ntensor t1 f32[2] mock:0\ntensor t2 f32[2] mock:0\n\
         tensor t3 f32[2] mock:0\ntensor t4 f32[2] mock:0\ntensor t5 f32[2] mock:0\ntensor t6 f32[2] mock:0\n\
         call s1 fill out=t0\ncall s1 relu in=t0 out=t1\ncall s1 relu in=t1 out=t2\nrelease s1 t0\n\
         call s2 fill out=t3\ncall s2 fill out=t4\n\
         call s1 add in=t2,t4 out=t5\nrelease s1 t1\ncall s1 relu in=t5 out=t6\n",
    );
    assert_eq!(a.instructions, 9);
    let g = a.condensed();
    let shape: Vec<(u32, u64, u64)> =
        g.nodes.iter().map(|n| (n.stream, n.instructions, n.releases)).collect();
    // The first release folds into the add (the next instruction of s1), the second into the relu.
    assert_eq!(shape, [(1, 3, 0), (2, 2, 0), (1, 2, 2)], "{g:#?}");
    assert_eq!(g.nodes[0].ops, [("relu".into(), 2), ("fill".into(), 1)]);
    // s1's stream order (node 0 -> 2) and y -> add (node 1 -> 2); the edge c -> add is s1's own.
    let edges: Vec<(usize, usize, EdgeKind)> = g.edges.iter().map(|e| (e.from, e.to, e.kind)).collect();
    assert_eq!(edges, [(0, 2, EdgeKind::Stream), (1, 2, EdgeKind::Data)]);
    // The full graph keeps one node per instruction, releases included.
    assert_eq!(a.full().nodes.len(), 9);
    let dot = a.dot();
    assert!(dot.contains("3 instructions, lines") && dot.contains("+2 releases"), "{dot}");
}

#[test]
fn an_edge_implied_by_an_event_wait_is_not_drawn() {
    // The copy on s2 writes t1; s1 waits for its event, then reads t1 twice. The data edges
    // copy -> relu and copy -> scale are implied by record -> wait.
    let a = analyse(
        "tensor t0 f32[2] mock:0\ntensor t1 f32[2] mock:0\ntensor t2 f32[2] mock:0\ntensor t3 f32[2] mock:0\n\
         call s2 fill out=t0\ncall s2 copy in=t0 out=t1\nrecord s2 e0 t1\nwait s1 e0\n\
         call s1 relu in=t1 out=t2\ncall s1 scale in=t1 out=t3 scalar=2\n",
    );
    let g = a.condensed();
    // s2's chain, then s1's: the wait, relu and scale in one node, entered once.
    let shape: Vec<(u32, u64)> = g.nodes.iter().map(|n| (n.stream, n.instructions)).collect();
    assert_eq!(shape, [(2, 3), (1, 3)], "{g:#?}");
    assert_eq!(g.edges.len(), 1, "{g:#?}");
    assert_eq!(g.edges[0].kind, EdgeKind::Event);
}

#[test]
fn the_critical_path_is_highlighted() {
    // s1: a chain of 4; s2: a chain of 1 joined into s1's end. The critical path is s1's
    // four instructions then the add: s1's nodes and the edge into the add are red.
    let a = analyse(
        "tensor t0 f32[2] mock:0\ntensor t1 f32[2] mock:0\ntensor t2 f32[2] mock:0\ntensor t3 f32[2] mock:0\n\
         tensor t4 f32[2] mock:0\ntensor t5 f32[2] mock:0\n\
         call s2 fill out=t4\n\
         call s1 fill out=t0\ncall s1 relu in=t0 out=t1\ncall s1 relu in=t1 out=t2\ncall s1 relu in=t2 out=t3\n\
         call s2 add in=t3,t4 out=t5\n",
    );
    assert_eq!(a.critical_path, 5);
    let g = a.condensed();
    let critical: Vec<(u32, u64)> = g.nodes.iter().map(|n| (n.stream, n.critical)).collect();
    // Node 0: s2's fill (not critical); node 1: s1's chain of 4; node 2: the add.
    assert_eq!(critical, [(2, 0), (1, 4), (2, 1)], "{g:#?}");
    let into_add: Vec<_> = g.edges.iter().filter(|e| e.to == 2).map(|e| (e.from, e.critical)).collect();
    assert_eq!(into_add, [(0, false), (1, true)]);
    let dot = a.dot();
    let red = |n: &str| {
        dot.lines().any(|l| l.trim_start().starts_with(&format!("{n} [")) && l.contains("color=red"))
    };
    assert!(red("n1") && red("n2") && !red("n0"), "{dot}");
    assert!(dot.contains("n1 -> n2 [color=black, color=red, penwidth=2]"), "{dot}");
}

/// `n` rounds of ping-pong between s1 and s2: every instruction is entered from the other
/// stream, so no chain collapses.
fn ping_pong(n: usize) -> trace::Trace {
    let mut body = String::from("tensor t0 f32[2] mock:0\ntensor t1 f32[2] mock:0\ncall s1 fill out=t0\n");
    for _ in 0..n {
        body.push_str("call s2 relu in=t0 out=t1\ncall s1 relu in=t1 out=t0\n");
    }
    parsed(&body)
}

#[test]
fn the_drawing_is_capped_and_says_what_it_cut() {
    let a = trace::analyze(&ping_pong(2000)).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(a.instructions, 4001);
    assert_eq!(a.critical_path, 4001);
    let g = a.condensed();
    assert_eq!(g.nodes.len(), 4001);
    let dot = g.dot(&DotLimits { max_nodes: 50, max_edges: 10_000 });
    assert!(dot.is_cut());
    assert_eq!((dot.drawn_nodes, dot.nodes), (50, 4001));
    assert_eq!(dot.text.matches(" -> ").count(), dot.drawn_edges);
    assert!(dot.text.contains("50 of 4001 nodes") && dot.text.contains("raise --max-nodes"), "{}", dot.text);
    assert!(!dot.text.contains("n50 "), "node 50 is cut");
    // The edge cap cuts too, at a node boundary.
    let dot = g.dot(&DotLimits { max_nodes: 1000, max_edges: 20 });
    assert!(dot.drawn_edges <= 20 && dot.drawn_nodes < 1000 && dot.is_cut(), "{dot:?}");
    // The default cap keeps the DOT of any trace small.
    let dot = g.dot(&DotLimits::default());
    assert_eq!(dot.drawn_nodes, DotLimits::default().max_nodes);
    assert!(dot.text.len() < 100_000, "{} bytes", dot.text.len());
    // Uncut: no note.
    let small = trace::analyze(&ping_pong(3)).unwrap().condensed().dot(&DotLimits::default());
    assert!(!small.is_cut() && small.cut_after_line.is_none() && !small.text.contains("raise --max-nodes"));
}

#[test]
fn the_shipped_branches_trace_shows_parallelism() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("instructions/branches.trace");
    let t = trace::load(&path).unwrap_or_else(|e| panic!("{e}"));
    let a = trace::analyze(&t).unwrap_or_else(|e| panic!("{e}"));
    assert!(a.parallelism > 2.0, "parallelism {}", a.parallelism);
    assert!(a.per_stream.iter().filter(|s| s.2 > 0).count() >= 5, "{:?}", a.per_stream);
    let g = a.condensed();
    // Small enough to draw whole, and the critical path runs through several streams.
    assert!(!g.dot(&DotLimits::default()).is_cut());
    let critical_streams: std::collections::BTreeSet<u32> =
        g.nodes.iter().filter(|n| n.critical > 0).map(|n| n.stream).collect();
    assert!(critical_streams.len() >= 3, "{critical_streams:?}");
    let on_path: u64 = g.nodes.iter().map(|n| n.critical).sum();
    assert_eq!(on_path, a.critical_path);
}
