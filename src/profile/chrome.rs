//! The Chrome trace-event JSON writer (the "JSON Object Format" of the Trace Event Format,
//! which chrome://tracing and ui.perfetto.dev both read).
//!
//! Layout: process 1, `eagervm streams`, has one complete (`X`) event per instruction, on
//! its stream's tracks; process 2, `eagervm threads`, has one track per VM thread
//! (scheduler 1, worker `i` 100 + `i`, watcher of stream `s` 1000 + `s`) with the batch
//! slices and barrier instants, and the counters (`C`). Timestamps are microseconds since
//! the VM started.
//!
//! **Lanes.** The format requires the `X` events of one track to nest or be disjoint;
//! Perfetto's importer drops a slice that starts inside an earlier one and ends after it
//! (`slice_drop_overlapping_complete_event`), and with it the arrows bound to it. The slices
//! of an asynchronous stream do overlap that way (the worker launches ahead of the device,
//! and each slice runs from launch to completion), so each stream has as many tracks
//! (*lanes*) as it had instructions in flight at once: an instruction goes on the lowest
//! lane whose last slice has ended by its launch (greedy interval partitioning, which uses
//! the fewest lanes possible). Lane 0 of stream `s` is thread `s + 1` and is named after
//! the stream; lane `k > 0` is thread `LANE_TID * k + s + 1`, named `<stream> lane k`, and
//! sorts right after it. A stream that runs one instruction at a time (`cpu:0`) has one
//! lane.
//!
//! **Arrows** are flow events of the first version (`s`, then `f` with `bp: "e"`), one id
//! per arrow, written after every slice. The importer binds each to the topmost open slice
//! of its track when it reads it, in timestamp order; on a lane, where no slices nest, that
//! is the last slice that began at or before the flow event. So each end is placed inside
//! its instruction's slice (one nanosecond in from either edge when the slice is that long)
//! and the `s` no later than the `f`: the importer needs the start of a flow before its end.
//! The `s` goes as late in the source slice as the target allows (a dependency leaves its
//! source when it is done), the `f` as early in the target as the source allows.
//!
//! There is no `displayTimeUnit`: the format defines it as a display preference, but
//! Perfetto versions have read `"ns"` there as the unit of every timestamp.

use std::io::{self, Write};
use std::time::Duration;

use serde_json::{json, Value};

use super::{FlowKind, Profile, ThreadRole};

const STREAMS_PID: u32 = 1;
const THREADS_PID: u32 = 2;

/// The track (thread id in process 2) of a VM thread.
pub(crate) fn thread_tid(t: ThreadRole) -> u32 {
    match t {
        ThreadRole::Scheduler => 1,
        ThreadRole::Worker(i) => 100 + i,
        ThreadRole::Watcher(s) => 1000 + s,
    }
}

/// Thread ids of the lanes beyond the first: lane `k` of stream `s` is `LANE_TID * k + s + 1`.
const LANE_TID: u32 = 100_000;

fn us(d: Duration) -> f64 {
    d.as_nanos() as f64 / 1000.0
}

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

fn us_ns(n: u64) -> f64 {
    n as f64 / 1000.0
}

/// The track of lane `lane` of stream index `stream`.
fn lane_tid(stream: u32, lane: u32) -> u32 {
    LANE_TID.saturating_mul(lane).saturating_add(stream + 1)
}

/// The lane of each instruction (indexed as `p.instructions`), and the number of lanes per
/// stream: per stream, each instruction in launch order takes the lowest lane whose last
/// slice ended by its launch, or a new one.
pub(crate) fn lanes(p: &Profile) -> (Vec<u32>, Vec<u32>) {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    let mut per: Vec<Vec<usize>> = vec![Vec::new(); p.streams.len()];
    for (k, i) in p.instructions.iter().enumerate() {
        if let Some(v) = per.get_mut(i.stream.index()) {
            v.push(k);
        }
    }
    let mut lane = vec![0u32; p.instructions.len()];
    let mut count = vec![0u32; p.streams.len()];
    for (s, mut ks) in per.into_iter().enumerate() {
        ks.sort_by_key(|&k| (p.instructions[k].launched, p.instructions[k].program));
        let mut busy: BinaryHeap<Reverse<(Duration, u32)>> = BinaryHeap::new();
        let mut free: BinaryHeap<Reverse<u32>> = BinaryHeap::new();
        for k in ks {
            let i = &p.instructions[k];
            while let Some(&Reverse((end, l))) = busy.peek() {
                if end > i.launched {
                    break;
                }
                busy.pop();
                free.push(Reverse(l));
            }
            let l = match free.pop() {
                Some(Reverse(l)) => l,
                None => {
                    count[s] += 1;
                    count[s] - 1
                }
            };
            lane[k] = l;
            // A slice of no length holds its lane for a nanosecond, so that a slice that
            // begins at the same instant goes on another lane: on one lane, a flow event at
            // that instant would bind to the later of the two.
            let end = i.done.max(i.launched + Duration::from_nanos(1));
            busy.push(Reverse((end, l)));
        }
    }
    (lane, count)
}

/// The nanoseconds where a flow event binds to a slice of `[start, end]`: one in from
/// either edge when the slice is longer than two, else its start.
fn inner(start: u64, end: u64) -> (u64, u64) {
    if end >= start.saturating_add(2) {
        (start + 1, end - 1)
    } else {
        (start, start)
    }
}

/// Where an arrow's `s` and `f` go, given the inner ranges of its source and target slices:
/// the `s` as late as the `f` allows, the `f` as early as the source allows, `s <= f`.
/// `None` when the target's slice ends before the source's begins.
pub(crate) fn flow_points(src: (u64, u64), dst: (u64, u64)) -> Option<(u64, u64)> {
    if dst.1 < src.0 {
        return None;
    }
    let f = dst.0.max(src.0);
    Some((src.1.min(f), f))
}

fn emit(w: &mut impl Write, first: &mut bool, v: &Value) -> io::Result<()> {
    if !*first {
        w.write_all(b",\n")?;
    }
    *first = false;
    serde_json::to_writer(&mut *w, v).map_err(io::Error::from)
}

fn track_names(
    w: &mut impl Write,
    first: &mut bool,
    pid: u32,
    tid: u32,
    name: &str,
    sort: u64,
) -> io::Result<()> {
    emit(
        w,
        first,
        &json!({"ph": "M", "pid": pid, "tid": tid, "name": "thread_name", "args": {"name": name}}),
    )?;
    emit(
        w,
        first,
        &json!({"ph": "M", "pid": pid, "tid": tid, "name": "thread_sort_index", "args": {"sort_index": sort}}),
    )
}

pub(crate) fn write(p: &Profile, w: &mut impl Write) -> io::Result<()> {
    w.write_all(b"{\"traceEvents\":[\n")?;
    let first = &mut true;
    for (pid, name) in [(STREAMS_PID, "eagervm streams"), (THREADS_PID, "eagervm threads")] {
        emit(
            w,
            first,
            &json!({"ph": "M", "pid": pid, "tid": 0, "name": "process_name", "args": {"name": name}}),
        )?;
        emit(
            w,
            first,
            &json!({"ph": "M", "pid": pid, "tid": 0, "name": "process_sort_index", "args": {"sort_index": pid}}),
        )?;
    }
    let (lane, lanes) = lanes(p);
    for (i, name) in p.streams.iter().enumerate() {
        let s = i as u32;
        // Lanes sort after their stream's first track and before the next stream's.
        let sort = |l: u32| (u64::from(s) + 1) * 1_000_000 + u64::from(l);
        track_names(w, first, STREAMS_PID, lane_tid(s, 0), name, sort(0))?;
        for l in 1..lanes[i] {
            track_names(w, first, STREAMS_PID, lane_tid(s, l), &format!("{name} lane {l}"), sort(l))?;
        }
    }
    for (role, name) in &p.threads {
        let tid = thread_tid(*role);
        track_names(w, first, THREADS_PID, tid, name, u64::from(tid))?;
    }
    for (k, i) in p.instructions.iter().enumerate() {
        let stream = p.streams.get(i.stream.index()).map_or("?", |s| s.as_str());
        emit(
            w,
            first,
            &json!({
                "ph": "X", "cat": "instruction", "name": i.name,
                "pid": STREAMS_PID, "tid": lane_tid(i.stream.0, lane[k]),
                "ts": us(i.launched), "dur": us(i.done.saturating_sub(i.launched)),
                "args": {
                    "program": i.program, "stream": stream, "lane": lane[k], "tensors": i.tensors,
                    "operands": i.operand_names(),
                    "queued_us": us(i.queued), "dispatched_us": us(i.dispatched),
                    "launched_us": us(i.launched), "done_us": us(i.done),
                }
            }),
        )?;
    }
    for s in &p.slices {
        emit(
            w,
            first,
            &json!({
                "ph": "X", "cat": "thread", "name": s.name, "pid": THREADS_PID, "tid": thread_tid(s.thread),
                "ts": us(s.start), "dur": us(s.end.saturating_sub(s.start)), "args": {"count": s.count}
            }),
        )?;
    }
    for &(program, at) in &p.barriers {
        emit(
            w,
            first,
            &json!({
                "ph": "i", "s": "t", "cat": "thread", "name": "Barrier", "pid": THREADS_PID,
                "tid": thread_tid(ThreadRole::Scheduler), "ts": us(at), "args": {"program": program}
            }),
        )?;
    }
    let find = |prog: u64| p.instructions.binary_search_by_key(&prog, |i| i.program).ok();
    let span = |k: usize| {
        let i = &p.instructions[k];
        inner(ns(i.launched), ns(i.done).max(ns(i.launched)))
    };
    for (id, f) in p.flows.iter().enumerate() {
        let (Some(src), Some(dst)) = (find(f.from), find(f.to)) else { continue };
        let Some((ts, tf)) = flow_points(span(src), span(dst)) else { continue };
        let name = match f.kind {
            FlowKind::EventWait => "event wait",
            FlowKind::Dependency => "dependency",
        };
        let (a, b) = (&p.instructions[src], &p.instructions[dst]);
        emit(
            w,
            first,
            &json!({"ph": "s", "cat": "flow", "name": name, "id": id, "pid": STREAMS_PID,
                    "tid": lane_tid(a.stream.0, lane[src]), "ts": us_ns(ts)}),
        )?;
        emit(
            w,
            first,
            &json!({"ph": "f", "bp": "e", "cat": "flow", "name": name, "id": id, "pid": STREAMS_PID,
                    "tid": lane_tid(b.stream.0, lane[dst]), "ts": us_ns(tf)}),
        )?;
    }
    for c in &p.counters {
        let (name, series) = match c.name.strip_prefix("allocator ") {
            Some(dev) => (format!("allocator {dev} (bytes in use)"), "bytes"),
            None => (c.name.clone(), "instructions"),
        };
        emit(
            w,
            first,
            &json!({"ph": "C", "name": name, "pid": THREADS_PID, "tid": 0, "ts": us(c.at), "args": {series: c.value}}),
        )?;
    }
    w.write_all(b"\n]}\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flow_points_stay_inside_both_slices_and_in_order() {
        // A dependency: the target starts after the source ends; the arrow leaves the
        // source's end and enters the target's start.
        assert_eq!(flow_points((11, 19), (31, 39)), Some((19, 31)));
        // An event wait launched while its record is still in flight.
        assert_eq!(flow_points((11, 99), (21, 29)), Some((21, 21)));
        // The target launched before the source, ending after the source began.
        assert_eq!(flow_points((21, 29), (11, 39)), Some((21, 21)));
        // The target ended before the source began: no order fits.
        assert_eq!(flow_points((21, 29), (11, 19)), None);
        assert_eq!(inner(5, 6), (5, 5));
        assert_eq!(inner(5, 7), (6, 6));
    }
}
