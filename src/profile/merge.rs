//! Merging the threads' records into a [`Profile`].
//!
//! Records about one instruction come from up to three threads (the scheduler admits and
//! dispatches it, a worker runs or launches it, a watcher sees it done); they are joined
//! by program number. Dependence edges name instructions by stream position, which the
//! admission records map to program numbers.

use std::collections::HashMap;
use std::time::Duration;

use super::{CounterSample, Flow, FlowKind, InstrSpan, Profile, ThreadRole, ThreadSlice};
use crate::vm::observe::{Chunk, InstrRef, Link, Nanos, Rec};
use crate::vm::StreamId;

/// What the admission record says: stream, name, link, operands, their storages, queued.
type Admitted = (u32, &'static str, Link, Vec<u64>, Vec<u64>, Nanos);

#[derive(Default)]
struct Partial {
    admit: Option<Admitted>,
    dispatched: Option<Nanos>,
    launched: Option<Nanos>,
    done: Option<Nanos>,
}

fn d(n: Nanos) -> Duration {
    Duration::from_nanos(n)
}

/// Build a profile from one session's chunks.
pub(crate) fn build(
    chunks: Vec<Chunk>,
    streams: Vec<String>,
    threads: Vec<(ThreadRole, String)>,
    allocators: &[String],
) -> Profile {
    let mut parts: HashMap<u64, Partial> = HashMap::new();
    let mut by_ref: HashMap<InstrRef, u64> = HashMap::new();
    let mut edges = Vec::new();
    let mut p = Profile { streams, threads, ..Profile::default() };
    for chunk in chunks {
        for r in chunk.recs {
            match r {
                Rec::Admit { program, at, stream, name, link, tensors, storages, queued, dispatched } => {
                    by_ref.insert(at, program);
                    let e = parts.entry(program).or_default();
                    // Each operand its own storage unless the record names the owners.
                    let storages = if storages.is_empty() { tensors.to_vec() } else { storages.into_vec() };
                    e.admit = Some((stream, name, link, tensors.into_vec(), storages, queued));
                    if dispatched.is_some() {
                        e.dispatched = dispatched;
                    }
                }
                Rec::Barrier { program, t } => p.barriers.push((program, d(t))),
                Rec::Dispatch { program, t } => parts.entry(program).or_default().dispatched = Some(t),
                Rec::Exec { program, start, end } => {
                    let e = parts.entry(program).or_default();
                    (e.launched, e.done) = (Some(start), Some(end));
                }
                Rec::Async { program, launched, done } => {
                    let e = parts.entry(program).or_default();
                    (e.launched, e.done) = (Some(launched), Some(done));
                }
                Rec::Edge { src, dst } => edges.push((src, dst)),
                Rec::Slice { name, start, end, count } => p.slices.push(ThreadSlice {
                    thread: chunk.thread,
                    name,
                    start: d(start),
                    end: d(end),
                    count,
                }),
                Rec::InFlight { t, value } => {
                    p.counters.push(CounterSample { name: "in flight".into(), at: d(t), value })
                }
                Rec::Alloc { t, index, bytes } => p.counters.push(CounterSample {
                    name: format!("allocator {}", allocators.get(index as usize).map_or("?", |s| s.as_str())),
                    at: d(t),
                    value: bytes,
                }),
            }
        }
    }
    let mut records: HashMap<u64, u64> = HashMap::new();
    let mut waits: Vec<(u64, u64)> = Vec::new();
    for (program, part) in parts {
        match part {
            Partial {
                admit: Some((stream, name, link, tensors, storages, queued)),
                dispatched: Some(dispatched),
                launched: Some(launched),
                done: Some(done),
            } => {
                match link {
                    Link::Record(id) => {
                        records.insert(id, program);
                    }
                    Link::Wait(id) => waits.push((id, program)),
                    Link::None => {}
                }
                p.instructions.push(InstrSpan {
                    program,
                    name,
                    stream: StreamId(stream),
                    tensors,
                    storages,
                    queued: d(queued),
                    dispatched: d(dispatched),
                    launched: d(launched),
                    done: d(done),
                });
            }
            _ => p.incomplete += 1,
        }
    }
    p.instructions.sort_unstable_by_key(|i| i.program);
    let complete = |prog: &u64| p.instructions.binary_search_by_key(prog, |i| i.program).is_ok();
    let mut flows = Vec::new();
    for (id, to) in waits {
        if let Some(&from) = records.get(&id) {
            flows.push(Flow { kind: FlowKind::EventWait, from, to });
        }
    }
    for (src, dst) in edges {
        if let (Some(&from), Some(&to)) = (by_ref.get(&src), by_ref.get(&dst)) {
            if complete(&from) && complete(&to) {
                flows.push(Flow { kind: FlowKind::Dependency, from, to });
            }
        }
    }
    flows.sort_unstable_by_key(|f| (f.to, f.from));
    p.flows = flows;
    p.slices.sort_unstable_by_key(|s| s.start);
    p.counters.sort_by_key(|c| c.at);
    p
}
