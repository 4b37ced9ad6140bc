//! Dependency-graph analysis on traces whose graphs are known by hand.

use eagervm::trace::{self, parse_str};

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
