//! The parts of a run's printed summary that come from its timeline, its replay report and
//! its trace: the per-stream table, the tensors by dtype, the caught kernel panics and the
//! op table (`--profile-summary`).
//! The binary prints what these return; `docs/cli.md` shows the output.

use std::fmt::Write as _;

use crate::profile::Profile;
use crate::trace::{DTypeCount, DeviceMap, ReplayReport};

/// The devices a replay ran on (`cpu:0`, `mock:1`), in the order of its streams: the device
/// part of each stream's name.
pub fn devices_ran(r: &ReplayReport) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for (name, _) in &r.per_stream {
        let device: String = name.split(':').take(2).collect::<Vec<_>>().join(":");
        if !out.contains(&device) {
            out.push(device);
        }
    }
    out
}

/// Where a replay ran, for its first line: `--device`'s mapping and the devices the VM ran
/// the trace on, with why they differ when the mapping named a device type the replay did
/// not use (`--device` maps the devices other than the host; a trace on `cpu:0` alone
/// stays there).
pub fn replay_devices(map: DeviceMap, r: &ReplayReport) -> String {
    let ran = devices_ran(r);
    let list = if ran.is_empty() { "no device".to_string() } else { ran.join(", ") };
    let asked = match map {
        DeviceMap::AsRecorded => return format!("devices as recorded: {list}"),
        DeviceMap::Cpu => return format!("--device cpu: {list}"),
        DeviceMap::Mock => "mock",
        DeviceMap::Cuda => "cuda",
    };
    if ran.iter().any(|d| d.starts_with(asked)) {
        format!("--device {asked}: {list}")
    } else {
        format!(
            "--device {asked}, ran on {list}: the trace uses no device but the host, and --device maps only \
             the others"
        )
    }
}

/// The host reads and the expectations of a replay, what each counts: the trace's
/// `access ... read` statements, run in program order, and its `expect` statements, checked
/// once the last instruction has run (`tolerance`: against a replay on `cpu:0` instead of
/// the recorded checksums).
pub fn replay_checks(r: &ReplayReport, tolerance: Option<f64>) -> String {
    let reads = format!("host reads: {} (`access ... read` statements)", r.reads.len());
    let expects = "`expect` statements, checked after the last instruction";
    if r.interrupted.is_some() {
        return format!("  {reads}; expected checksums: not checked (`expect` statements)");
    }
    match tolerance {
        None => format!("  {reads}; expected checksums matched: {} ({expects})", r.checked),
        Some(rel) => {
            format!(
                "  {reads}; expected tensors within {rel} of a replay on cpu:0: {} ({expects})",
                r.checked
            )
        }
    }
}

/// One table per stream of a replay: the instructions the VM ran on it, and, with a
/// timeline, its busy time (both counted by the VM, so they describe the same
/// instructions), then the `barrier` statements, which ran on no stream. Each line is
/// indented by two spaces.
pub fn replay_streams(r: &ReplayReport) -> String {
    let mut out = String::new();
    let busy = r.profile.as_ref().map(Profile::summary);
    match &busy {
        Some(b) => {
            let _ = writeln!(
                out,
                "  per stream: instructions the VM ran, and busy time (at least one of them launched \
                 and not done) over {:.3?} of device activity:",
                b.span
            );
            let _ = writeln!(
                out,
                "    {:<20} {:>12} {:>10} {:>7}",
                "stream", "instructions", "busy ms", "busy %"
            );
        }
        None => {
            let _ = writeln!(out, "  per stream: instructions the VM ran:");
        }
    }
    let span = busy.as_ref().map_or(0.0, |b| b.span.as_secs_f64());
    for (name, n) in &r.per_stream {
        match busy.as_ref().and_then(|b| b.streams.iter().find(|s| &s.name == name)) {
            Some(s) => {
                let pct = if span > 0.0 { 100.0 * s.busy.as_secs_f64() / span } else { 0.0 };
                let _ =
                    write!(out, "    {name:<20} {n:>12} {:>10.3} {pct:>6.1}%", s.busy.as_secs_f64() * 1e3);
                // The timeline leaves out instructions it saw only in part; say so if any.
                if s.instructions as u64 != *n {
                    let _ = write!(out, "  ({} timed)", s.instructions);
                }
                out.push('\n');
            }
            None => {
                let _ = writeln!(out, "    {name:<20} {n:>12}");
            }
        }
    }
    if r.barriers > 0 {
        let _ = writeln!(
            out,
            "  barriers: {} (counted among the instructions replayed; run by the scheduler, on no stream)",
            r.barriers
        );
    }
    out.truncate(out.trim_end().len());
    out
}

/// The tensors a trace declares, by dtype, on one line indented by two spaces: `tensors by
/// dtype: f32 9 (and 3 views), i64 2`; `None` for a trace that declares none.
pub fn dtypes(counts: &[DTypeCount]) -> Option<String> {
    if counts.is_empty() {
        return None;
    }
    let mut out = String::from("  tensors by dtype:");
    for (i, c) in counts.iter().enumerate() {
        let _ = write!(out, "{} {} {}", if i == 0 { "" } else { "," }, c.dtype, c.tensors);
        match c.views {
            0 => {}
            1 => out.push_str(" (and 1 view)"),
            n => {
                let _ = write!(out, " (and {n} views)");
            }
        }
    }
    Some(out)
}

/// The kernel panics the VM caught during a replay, one line each (up to the report's
/// first few), or `None` if there were none.
pub fn panics(r: &ReplayReport) -> Option<String> {
    if r.panics == 0 {
        return None;
    }
    let mut out = format!("  kernel panics caught: {} (each failed its instruction)", r.panics);
    for e in &r.panic_errors {
        let _ = write!(out, "\n    {e}");
    }
    let left = r.panics.saturating_sub(r.panic_errors.len() as u64);
    if left > 0 {
        let _ = write!(out, "\n    ... and {left} more");
    }
    Some(out)
}

/// The op table of a timeline ([`Profile::op_table`]), indented by four spaces under a
/// heading.
pub fn op_table(p: &Profile) -> String {
    let mut out = String::from(
        "  ops by total time (an instruction's time: its stream's time on it alone; shares of all streams' time):",
    );
    for line in p.op_table().to_string().lines() {
        out.push_str("\n    ");
        out.push_str(line);
    }
    out
}
