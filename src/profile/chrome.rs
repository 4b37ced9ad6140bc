//! The Chrome trace-event JSON writer (the "JSON Object Format" of the Trace Event Format,
//! which chrome://tracing and ui.perfetto.dev both read).
//!
//! Layout: process 1, `eagervm streams`, has one track (thread id = stream index + 1) per
//! stream, with one complete (`X`) event per instruction; process 2, `eagervm threads`,
//! has one track per VM thread (scheduler 1, worker `i` 100 + `i`, watcher of stream `s`
//! 1000 + `s`) with the batch slices and barrier instants, and the counters (`C`).
//! Arrows are flow events (`s` at the source's launch, `f` with `bp: "e"` at the target's
//! launch) with one id per arrow. Timestamps are microseconds since the VM started.

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

fn us(d: Duration) -> f64 {
    d.as_nanos() as f64 / 1000.0
}

fn emit(w: &mut impl Write, first: &mut bool, v: &Value) -> io::Result<()> {
    if !*first {
        w.write_all(b",\n")?;
    }
    *first = false;
    serde_json::to_writer(&mut *w, v).map_err(io::Error::from)
}

pub(crate) fn write(p: &Profile, w: &mut impl Write) -> io::Result<()> {
    w.write_all(b"{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n")?;
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
    for (i, name) in p.streams.iter().enumerate() {
        let tid = i as u32 + 1;
        emit(
            w,
            first,
            &json!({"ph": "M", "pid": STREAMS_PID, "tid": tid, "name": "thread_name", "args": {"name": name}}),
        )?;
        emit(
            w,
            first,
            &json!({"ph": "M", "pid": STREAMS_PID, "tid": tid, "name": "thread_sort_index", "args": {"sort_index": tid}}),
        )?;
    }
    for (role, name) in &p.threads {
        let tid = thread_tid(*role);
        emit(
            w,
            first,
            &json!({"ph": "M", "pid": THREADS_PID, "tid": tid, "name": "thread_name", "args": {"name": name}}),
        )?;
        emit(
            w,
            first,
            &json!({"ph": "M", "pid": THREADS_PID, "tid": tid, "name": "thread_sort_index", "args": {"sort_index": tid}}),
        )?;
    }
    for i in &p.instructions {
        let stream = p.streams.get(i.stream.index()).map_or("?", |s| s.as_str());
        emit(
            w,
            first,
            &json!({
                "ph": "X", "cat": "instruction", "name": i.name,
                "pid": STREAMS_PID, "tid": i.stream.0 + 1,
                "ts": us(i.launched), "dur": us(i.done.saturating_sub(i.launched)),
                "args": {
                    "program": i.program, "stream": stream, "tensors": i.tensors,
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
    let find = |prog: u64| {
        p.instructions.binary_search_by_key(&prog, |i| i.program).ok().map(|k| &p.instructions[k])
    };
    for (id, f) in p.flows.iter().enumerate() {
        let (Some(src), Some(dst)) = (find(f.from), find(f.to)) else { continue };
        let name = match f.kind {
            FlowKind::EventWait => "event wait",
            FlowKind::Dependency => "dependency",
        };
        emit(
            w,
            first,
            &json!({"ph": "s", "cat": "flow", "name": name, "id": id, "pid": STREAMS_PID,
                    "tid": src.stream.0 + 1, "ts": us(src.launched)}),
        )?;
        emit(
            w,
            first,
            &json!({"ph": "f", "bp": "e", "cat": "flow", "name": name, "id": id, "pid": STREAMS_PID,
                    "tid": dst.stream.0 + 1, "ts": us(dst.launched)}),
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
