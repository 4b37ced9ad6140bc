//! Pictures for `eagervm plot`: the loss curve of the MLP, per-stream busy time over a run
//! (a compact timeline for readers without Perfetto at hand), and benchmark results across
//! workloads, as SVG or PNG, drawn with [plotters](https://docs.rs/plotters).
//!
//! Text in a PNG is drawn with DejaVu Sans, compiled in (the `dejavu` crate) and laid out
//! by `ab_glyph`, so that drawing needs no system font library (fontconfig, freetype); an
//! SVG names the `sans-serif` family and leaves the font to the viewer. Every picture is
//! drawn in memory and then written with one call whose failure (a full disk) names the
//! file. The inputs are read tolerantly: a profile by its trace events (complete `X`
//! slices, `B`/`E` pairs and async `b`/`e` pairs), whatever else it holds; a benchmark
//! result by its workload names and numeric fields, whatever they are.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use plotters::prelude::*;
use serde::Deserialize;
use serde_json::Value;

/// Why a picture could not be made.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    /// The picture's format is neither given nor told by its file name.
    #[error("{}: cannot tell the picture's format from its name: name it .svg or .png, or pass --format svg|png", path.display())]
    Format {
        /// The output file.
        path: PathBuf,
    },
    /// An input file could not be read or is not what the plot needs.
    #[error("{}: {message}", path.display())]
    Input {
        /// The input file.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// The input holds nothing to plot.
    #[error("{what}: nothing to plot ({why})")]
    Empty {
        /// The plot.
        what: &'static str,
        /// Why there is nothing.
        why: String,
    },
    /// Drawing failed.
    #[error("drawing the {what}: {message}")]
    Draw {
        /// The plot.
        what: &'static str,
        /// What plotters said.
        message: String,
    },
    /// The picture could not be written.
    #[error("cannot write {}: {source}", path.display())]
    Write {
        /// The output file.
        path: PathBuf,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
}

/// A picture's file format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Scalable vector graphics (text; small; the README's pictures).
    Svg,
    /// A PNG bitmap.
    Png,
}

impl Format {
    /// `svg` or `png` (any case).
    pub fn parse(s: &str) -> Option<Format> {
        match s.to_ascii_lowercase().as_str() {
            "svg" => Some(Format::Svg),
            "png" => Some(Format::Png),
            _ => None,
        }
    }

    /// `given`, else the format `path`'s extension names.
    pub fn for_path(path: &Path, given: Option<Format>) -> Result<Format, PlotError> {
        given
            .or_else(|| path.extension().and_then(|e| e.to_str()).and_then(Format::parse))
            .ok_or_else(|| PlotError::Format { path: path.to_path_buf() })
    }
}

/// One row of a timeline: a stream and the intervals it was busy.
#[derive(Debug, Clone, PartialEq)]
pub struct Track {
    /// The stream's name (`mock:0:compute`).
    pub name: String,
    /// Disjoint busy intervals in microseconds, in order.
    pub busy: Vec<(f64, f64)>,
}

impl Track {
    /// Total busy time, in microseconds.
    pub fn busy_us(&self) -> f64 {
        self.busy.iter().map(|(a, b)| b - a).sum()
    }
}

/// Per-stream busy time over a run.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Timeline {
    /// One track per stream, in stream order.
    pub tracks: Vec<Track>,
}

impl Timeline {
    /// From a profile taken in this process: one track per stream of the VM that ran an
    /// instruction, busy from each instruction's launch to its completion.
    pub fn from_profile(p: &crate::profile::Profile) -> Timeline {
        let mut per: Vec<Vec<(f64, f64)>> = vec![Vec::new(); p.stream_names().len()];
        for i in p.instructions() {
            if let Some(v) = per.get_mut(i.stream.index()) {
                v.push((i.launched.as_secs_f64() * 1e6, i.done.as_secs_f64() * 1e6));
            }
        }
        let tracks = p
            .stream_names()
            .iter()
            .zip(per)
            .filter(|(_, spans)| !spans.is_empty())
            .map(|(name, spans)| Track { name: name.clone(), busy: merge(spans) })
            .collect();
        Timeline { tracks }
    }

    /// From a Chrome trace-event JSON file (`--profile OUT.json`): the tracks of the process
    /// named `eagervm streams` (or of every process, in a file that names none), each busy
    /// wherever one of its slices is.
    pub fn read(path: &Path) -> Result<Timeline, PlotError> {
        let bad = |message: String| PlotError::Input { path: path.to_path_buf(), message };
        let text = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
        let events = match serde_json::from_slice::<TraceFile>(&text) {
            Ok(TraceFile::Object { trace_events }) => trace_events,
            Ok(TraceFile::Array(events)) => events,
            Err(e) => return Err(bad(format!("not a Chrome trace-event JSON file: {e}"))),
        };
        Ok(timeline_of(events))
    }

    /// The time from the first busy instant to the last, in microseconds.
    fn span(&self) -> (f64, f64) {
        let lo = self.tracks.iter().filter_map(|t| t.busy.first()).map(|b| b.0).fold(f64::INFINITY, f64::min);
        let hi =
            self.tracks.iter().filter_map(|t| t.busy.last()).map(|b| b.1).fold(f64::NEG_INFINITY, f64::max);
        (lo, hi)
    }
}

#[derive(Deserialize)]
#[serde(untagged)]
enum TraceFile {
    Object {
        #[serde(rename = "traceEvents")]
        trace_events: Vec<Event>,
    },
    Array(Vec<Event>),
}

#[derive(Deserialize)]
struct Event {
    #[serde(default)]
    ph: String,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    cat: Option<String>,
    #[serde(default)]
    pid: Option<Value>,
    #[serde(default)]
    tid: Option<Value>,
    #[serde(default)]
    id: Option<Value>,
    #[serde(default)]
    ts: Option<f64>,
    #[serde(default)]
    dur: Option<f64>,
    #[serde(default)]
    args: Option<MetaArgs>,
}

/// The arguments of a metadata event (`process_name`, `thread_name`, `thread_sort_index`).
#[derive(Deserialize)]
struct MetaArgs {
    #[serde(default)]
    name: Option<Value>,
    #[serde(default)]
    sort_index: Option<f64>,
}

fn key(v: &Option<Value>) -> String {
    match v {
        Some(Value::String(s)) => s.clone(),
        Some(v) => v.to_string(),
        None => String::new(),
    }
}

fn timeline_of(events: Vec<Event>) -> Timeline {
    // Which processes hold stream tracks.
    let mut streams_pids: Vec<String> = Vec::new();
    let mut names: HashMap<(String, String), String> = HashMap::new();
    let mut sort: HashMap<(String, String), f64> = HashMap::new();
    for e in events.iter().filter(|e| e.ph == "M") {
        let arg = e.args.as_ref();
        match e.name.as_deref() {
            Some("process_name")
                if arg.and_then(|a| a.name.as_ref()).and_then(Value::as_str) == Some("eagervm streams") =>
            {
                streams_pids.push(key(&e.pid));
            }
            Some("thread_name") => {
                if let Some(n) = arg.and_then(|a| a.name.as_ref()).and_then(Value::as_str) {
                    names.insert((key(&e.pid), key(&e.tid)), n.to_string());
                }
            }
            Some("thread_sort_index") => {
                if let Some(i) = arg.and_then(|a| a.sort_index) {
                    sort.insert((key(&e.pid), key(&e.tid)), i);
                }
            }
            _ => {}
        }
    }
    let wanted = |pid: &str| streams_pids.is_empty() || streams_pids.iter().any(|p| p == pid);
    let mut spans: HashMap<(String, String), Vec<(f64, f64)>> = HashMap::new();
    // Open `B` slices per track, and open async `b` slices per (track, cat, name, id).
    let mut open: HashMap<(String, String), Vec<f64>> = HashMap::new();
    let mut open_async: HashMap<(String, String, String, String, String), Vec<f64>> = HashMap::new();
    for e in &events {
        let pid = key(&e.pid);
        if !wanted(&pid) {
            continue;
        }
        let Some(ts) = e.ts.filter(|t| t.is_finite()) else { continue };
        // An async slice without a thread goes on a track named after its category.
        let tid = match &e.tid {
            Some(_) => key(&e.tid),
            None => format!("async {}", e.cat.as_deref().unwrap_or("")),
        };
        let track = (pid, tid);
        match e.ph.as_str() {
            "X" => {
                if let Some(d) = e.dur.filter(|d| d.is_finite() && *d >= 0.0) {
                    spans.entry(track).or_default().push((ts, ts + d));
                }
            }
            "B" => open.entry(track).or_default().push(ts),
            "E" => {
                if let Some(start) = open.get_mut(&track).and_then(|v| v.pop()) {
                    spans.entry(track).or_default().push((start, ts.max(start)));
                }
            }
            "b" | "e" => {
                let k = (
                    track.0.clone(),
                    track.1.clone(),
                    e.cat.clone().unwrap_or_default(),
                    e.name.clone().unwrap_or_default(),
                    key(&e.id),
                );
                if e.ph == "b" {
                    open_async.entry(k).or_default().push(ts);
                } else if let Some(start) = open_async.get_mut(&k).and_then(|v| v.pop()) {
                    spans.entry(track).or_default().push((start, ts.max(start)));
                }
            }
            _ => {}
        }
    }
    let mut keys: Vec<(String, String)> = spans.keys().cloned().collect();
    let order =
        |k: &(String, String)| sort.get(k).copied().or_else(|| k.1.parse::<f64>().ok()).unwrap_or(f64::MAX);
    keys.sort_by(|a, b| a.0.cmp(&b.0).then(order(a).total_cmp(&order(b))).then(a.1.cmp(&b.1)));
    // The lanes of one stream (`<stream> lane k`, `docs/profiling.md`) are one stream's
    // work: drawn as one row, in the place of the stream's first lane.
    let mut rows: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    for k in keys {
        let name = names.get(&k).cloned().unwrap_or_else(|| format!("pid {} tid {}", k.0, k.1));
        let stream = stream_of_lane(&name).to_string();
        let s = spans.remove(&k).unwrap_or_default();
        match rows.iter_mut().find(|(n, _)| *n == stream) {
            Some((_, v)) => v.extend(s),
            None => rows.push((stream, s)),
        }
    }
    let tracks = rows.into_iter().map(|(name, s)| Track { name, busy: merge(s) }).collect();
    Timeline { tracks }
}

/// The stream a track named `name` belongs to: `mock:0:compute lane 3` is a lane of
/// `mock:0:compute`; any other name is its own.
fn stream_of_lane(name: &str) -> &str {
    match name.rsplit_once(" lane ") {
        Some((stream, k)) if !k.is_empty() && k.bytes().all(|b| b.is_ascii_digit()) => stream,
        _ => name,
    }
}

/// The union of `spans`, as disjoint intervals in order.
fn merge(mut spans: Vec<(f64, f64)>) -> Vec<(f64, f64)> {
    spans.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut out: Vec<(f64, f64)> = Vec::with_capacity(spans.len());
    for (s, e) in spans {
        match out.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

/// Intervals closer than `gap` joined, so that a picture has at most one box per pixel.
fn coarsen(spans: &[(f64, f64)], gap: f64) -> Vec<(f64, f64)> {
    let mut out: Vec<(f64, f64)> = Vec::new();
    for &(s, e) in spans {
        match out.last_mut() {
            Some(last) if s - last.1 < gap => last.1 = last.1.max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

/// One workload's results from `eagervm bench --json`: its name and its numeric fields.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchRow {
    /// The workload (`W1`, ...).
    pub workload: String,
    /// Every numeric field of its object, by name (nested objects as `outer.inner`).
    pub values: HashMap<String, f64>,
}

/// The metrics `eagervm plot bench` draws unless told others: throughput of the VM, of the
/// bare pipeline and of the floor, where the results have them.
pub const DEFAULT_BENCH_METRICS: [&str; 3] = ["e2e_instr_per_s", "baseline_instr_per_s", "floor_instr_per_s"];

/// Read `eagervm bench --json` output: one JSON object per line (or a JSON array of them),
/// each naming its workload in `workload` (or `name`).
pub fn read_bench(path: &Path) -> Result<Vec<BenchRow>, PlotError> {
    let bad = |message: String| PlotError::Input { path: path.to_path_buf(), message };
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    let objects: Vec<Value> = match serde_json::from_str::<Value>(&text) {
        Ok(Value::Array(v)) => v,
        Ok(v) => vec![v],
        Err(_) => {
            let mut v = Vec::new();
            for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
                v.push(
                    serde_json::from_str(line).map_err(|e| bad(format!("line {}: not JSON: {e}", i + 1)))?,
                );
            }
            v
        }
    };
    let mut rows = Vec::new();
    for (i, o) in objects.iter().enumerate() {
        let Some(map) = o.as_object() else {
            return Err(bad(format!("result {} is not a JSON object", i + 1)));
        };
        let workload =
            map.get("workload").or_else(|| map.get("name")).and_then(Value::as_str).ok_or_else(|| {
                bad(format!("result {} names no workload (no string field `workload`)", i + 1))
            })?;
        let mut values = HashMap::new();
        numbers("", o, &mut values);
        rows.push(BenchRow { workload: workload.to_string(), values });
    }
    if rows.is_empty() {
        return Err(bad("no benchmark results in it (expected `eagervm bench --json` output)".into()));
    }
    Ok(rows)
}

fn numbers(prefix: &str, v: &Value, out: &mut HashMap<String, f64>) {
    if let Some(map) = v.as_object() {
        for (k, v) in map {
            let name = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
            match v {
                Value::Number(n) => {
                    if let Some(x) = n.as_f64() {
                        out.insert(name, x);
                    }
                }
                Value::Object(_) => numbers(&name, v, out),
                _ => {}
            }
        }
    }
}

/// Read losses: the JSON report of the `mlp` program (`{"losses": [...]}`), a JSON array
/// of numbers, or numbers separated by white space or commas.
pub fn read_losses(path: &Path) -> Result<Vec<f32>, PlotError> {
    let bad = |message: String| PlotError::Input { path: path.to_path_buf(), message };
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    let list = match serde_json::from_str::<Value>(&text) {
        Ok(Value::Object(m)) => {
            m.get("losses").cloned().ok_or_else(|| bad("a JSON object without `losses`".into()))?
        }
        Ok(v) => v,
        Err(_) => {
            return text
                .split(|c: char| c.is_whitespace() || c == ',')
                .filter(|w| !w.is_empty())
                .map(|w| w.parse::<f32>().map_err(|_| bad(format!("`{w}` is not a number"))))
                .collect();
        }
    };
    let Value::Array(items) = list else { return Err(bad("`losses` is not a list".into())) };
    items
        .iter()
        .map(|x| x.as_f64().map(|x| x as f32).ok_or_else(|| bad(format!("`{x}` is not a number"))))
        .collect()
}

/// The picture's bytes: `$body` (a block that draws on `$root` and returns
/// `Result<(), String>`) run on a `$size` SVG or PNG backend as `$format` says. A macro,
/// not a function: the block is compiled once per backend type.
macro_rules! render {
    ($format:expr, $size:expr, $what:expr, |$root:ident| $body:block) => {{
        font()?;
        let size: (u32, u32) = $size;
        let fail = |message: String| PlotError::Draw { what: $what, message };
        match $format {
            Format::Svg => {
                let mut text = String::new();
                {
                    let $root = SVGBackend::with_string(&mut text, size).into_drawing_area();
                    let drawn: Result<(), String> = (|| $body)();
                    drawn.map_err(fail)?;
                }
                text.into_bytes()
            }
            Format::Png => {
                let mut pixels = vec![0u8; size.0 as usize * size.1 as usize * 3];
                {
                    let $root = BitMapBackend::with_buffer(&mut pixels, size).into_drawing_area();
                    let drawn: Result<(), String> = (|| $body)();
                    drawn.map_err(fail)?;
                }
                encode_png(&pixels, size).map_err(|e| fail(e.to_string()))?
            }
        }
    }};
}

/// Draw the loss curve (loss against training step) into `out`.
pub fn plot_loss(losses: &[f32], title: &str, out: &Path, format: Option<Format>) -> Result<(), PlotError> {
    const WHAT: &str = "loss curve";
    let points: Vec<(f64, f64)> = losses
        .iter()
        .enumerate()
        .filter(|(_, l)| l.is_finite())
        .map(|(i, &l)| ((i + 1) as f64, l as f64))
        .collect();
    if points.is_empty() {
        let why = if losses.is_empty() { "no losses".to_string() } else { "no finite loss".to_string() };
        return Err(PlotError::Empty { what: WHAT, why });
    }
    let lo = points.iter().map(|p| p.1).fold(f64::INFINITY, f64::min);
    let hi = points.iter().map(|p| p.1).fold(f64::NEG_INFINITY, f64::max);
    let steps = losses.len() as f64;
    // A loss that falls by orders of magnitude reads best on a log scale.
    let log = lo > 0.0 && hi / lo > 20.0;
    let bytes = render!(Format::for_path(out, format)?, (800, 450), WHAT, |root| {
        root.fill(&WHITE).map_err(s)?;
        let mut b = ChartBuilder::on(&root);
        b.caption(title, ("sans-serif", 20)).margin(12).x_label_area_size(40).y_label_area_size(70);
        let series = LineSeries::new(points.iter().copied(), BLUE.stroke_width(2));
        let x = 1.0..steps.max(2.0);
        if log {
            let mut c = b.build_cartesian_2d(x, (lo * 0.8..hi * 1.25).log_scale()).map_err(s)?;
            c.configure_mesh().x_desc("training step").y_desc("loss (log scale)").draw().map_err(s)?;
            c.draw_series(series).map_err(s)?;
        } else {
            let pad = ((hi - lo) * 0.1).max(hi.abs() * 0.01).max(1e-12);
            let mut c = b.build_cartesian_2d(x, (lo - pad).min(0.0f64.max(lo - pad))..hi + pad).map_err(s)?;
            c.configure_mesh().x_desc("training step").y_desc("loss").draw().map_err(s)?;
            c.draw_series(series).map_err(s)?;
        }
        root.present().map_err(s)
    });
    write(out, &bytes)
}

/// Draw per-stream busy time over the run into `out`: one row per stream with its busy %, a
/// box wherever it was busy (boxes closer than a pixel joined).
pub fn plot_timeline(t: &Timeline, out: &Path, format: Option<Format>) -> Result<(), PlotError> {
    const WHAT: &str = "timeline";
    let tracks: Vec<&Track> = t.tracks.iter().filter(|t| !t.busy.is_empty()).collect();
    if tracks.is_empty() {
        return Err(PlotError::Empty {
            what: WHAT,
            why: "no stream was busy (no instruction slices)".into(),
        });
    }
    let (lo, hi) = t.span();
    let span = (hi - lo).max(1e-3);
    let width = 1000u32;
    let gap = span / f64::from(width);
    let rows: Vec<(String, Vec<(f64, f64)>)> = tracks
        .iter()
        .map(|t| {
            let pct = 100.0 * t.busy_us() / span;
            let ms: Vec<(f64, f64)> =
                coarsen(&t.busy, gap).iter().map(|&(a, b)| ((a - lo) / 1e3, (b - lo) / 1e3)).collect();
            (format!("{} {pct:.0}%", t.name), ms)
        })
        .collect();
    let n = rows.len();
    let height = 110 + 34 * n as u32;
    let colors = [BLUE, RED, GREEN, MAGENTA, CYAN, BLACK];
    let bytes = render!(Format::for_path(out, format)?, (width, height), WHAT, |root| {
        root.fill(&WHITE).map_err(s)?;
        let mut c = ChartBuilder::on(&root)
            .caption("busy time per stream", ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(190)
            .build_cartesian_2d(0.0..span / 1e3, (0..n).into_segmented())
            .map_err(s)?;
        let label = |v: &SegmentValue<usize>| match v {
            SegmentValue::CenterOf(i) | SegmentValue::Exact(i) => {
                rows.get(*i).map_or(String::new(), |r| r.0.clone())
            }
            SegmentValue::Last => String::new(),
        };
        c.configure_mesh()
            .disable_y_mesh()
            .y_labels(n)
            .y_label_formatter(&label)
            .x_desc("time since the first instruction (ms)")
            .y_desc("stream, busy %")
            .draw()
            .map_err(s)?;
        for (i, (_, spans)) in rows.iter().enumerate() {
            let color = colors[i % colors.len()].mix(0.8).filled();
            c.draw_series(spans.iter().map(|&(a, b)| {
                let b = b.max(a + gap / 1e3);
                Rectangle::new([(a, SegmentValue::Exact(i)), (b, SegmentValue::Exact(i + 1))], color)
            }))
            .map_err(s)?;
        }
        root.present().map_err(s)
    });
    write(out, &bytes)
}

/// Draw `metrics` of every workload in `rows` as grouped bars into `out`; an empty
/// `metrics` means those of [`DEFAULT_BENCH_METRICS`] the results have.
pub fn plot_bench(
    rows: &[BenchRow],
    metrics: &[String],
    out: &Path,
    format: Option<Format>,
) -> Result<(), PlotError> {
    const WHAT: &str = "benchmark chart";
    let has = |m: &str| rows.iter().any(|r| r.values.get(m).is_some_and(|v| v.is_finite()));
    let metrics: Vec<String> = if metrics.is_empty() {
        DEFAULT_BENCH_METRICS.iter().filter(|m| has(m)).map(|m| m.to_string()).collect()
    } else {
        metrics.to_vec()
    };
    let mut known: Vec<&String> = rows.iter().flat_map(|r| r.values.keys()).collect();
    known.sort();
    known.dedup();
    let known = known.iter().map(|k| k.as_str()).collect::<Vec<_>>().join(", ");
    if metrics.is_empty() {
        let why = format!(
            "none of {} in the results; pick some with --metric (they have: {known})",
            DEFAULT_BENCH_METRICS.join(", ")
        );
        return Err(PlotError::Empty { what: WHAT, why });
    }
    if let Some(m) = metrics.iter().find(|m| !has(m)) {
        return Err(PlotError::Empty {
            what: WHAT,
            why: format!("no workload has a number `{m}` (they have: {known})"),
        });
    }
    let top = rows
        .iter()
        .flat_map(|r| metrics.iter().filter_map(|m| r.values.get(m)))
        .copied()
        .filter(|v| v.is_finite())
        .fold(0.0f64, f64::max);
    let bot = rows
        .iter()
        .flat_map(|r| metrics.iter().filter_map(|m| r.values.get(m)))
        .copied()
        .filter(|v| v.is_finite())
        .fold(0.0f64, f64::min);
    // Each workload takes one slot per metric and a spare one between groups.
    let per = metrics.len() + 1;
    let slots = rows.len() * per;
    let colors = [BLUE, RED, GREEN, MAGENTA, CYAN, BLACK];
    let width = (200 + 60 * slots as u32).clamp(640, 1600);
    let bytes = render!(Format::for_path(out, format)?, (width, 450), WHAT, |root| {
        root.fill(&WHITE).map_err(s)?;
        let mut c = ChartBuilder::on(&root)
            .caption("eagervm bench", ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(80)
            .build_cartesian_2d((0..slots).into_segmented(), bot * 1.1..(top * 1.15).max(1e-12))
            .map_err(s)?;
        let label = |v: &SegmentValue<usize>| match v {
            SegmentValue::CenterOf(k) | SegmentValue::Exact(k) if k % per == metrics.len() / 2 => {
                rows.get(k / per).map_or(String::new(), |r| r.workload.clone())
            }
            _ => String::new(),
        };
        c.configure_mesh()
            .disable_x_mesh()
            .x_labels(slots)
            .x_label_formatter(&label)
            .y_label_formatter(&|v| si(*v))
            .x_desc("workload")
            .y_desc(metrics.join(", ").chars().take(60).collect::<String>())
            .draw()
            .map_err(s)?;
        for (j, m) in metrics.iter().enumerate() {
            let color = colors[j % colors.len()];
            let bars = rows.iter().enumerate().filter_map(|(i, r)| {
                let v = r.values.get(m).copied().filter(|v| v.is_finite())?;
                let k = i * per + j;
                Some(Rectangle::new(
                    [(SegmentValue::Exact(k), 0.0), (SegmentValue::Exact(k + 1), v)],
                    color.mix(0.8).filled(),
                ))
            });
            c.draw_series(bars)
                .map_err(s)?
                .label(m.as_str())
                .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
        }
        c.configure_series_labels().border_style(BLACK).background_style(WHITE.mix(0.9)).draw().map_err(s)?;
        root.present().map_err(s)
    });
    write(out, &bytes)
}

/// `v` with an SI suffix: `120M`, `3.5k`.
fn si(v: f64) -> String {
    let a = v.abs();
    let (d, suffix) = match a {
        _ if a >= 1e9 => (1e9, "G"),
        _ if a >= 1e6 => (1e6, "M"),
        _ if a >= 1e3 => (1e3, "k"),
        _ => (1.0, ""),
    };
    let x = v / d;
    if x.fract().abs() < 1e-9 {
        format!("{x:.0}{suffix}")
    } else {
        format!("{x:.1}{suffix}")
    }
}

fn s(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// Register the compiled-in font once (the text of every picture is laid out with it).
fn font() -> Result<(), PlotError> {
    static FONT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let ok = *FONT.get_or_init(|| {
        plotters::style::register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular()).is_ok()
    });
    match ok {
        true => Ok(()),
        false => {
            Err(PlotError::Draw { what: "font", message: "the compiled-in DejaVu Sans did not load".into() })
        }
    }
}

/// RGB pixels as a PNG file.
fn encode_png(pixels: &[u8], (w, h): (u32, u32)) -> Result<Vec<u8>, png::EncodingError> {
    let mut out = Vec::new();
    let mut enc = png::Encoder::new(&mut out, w, h);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    let mut writer = enc.write_header()?;
    writer.write_image_data(pixels)?;
    writer.finish()?;
    Ok(out)
}

fn write(path: &Path, bytes: &[u8]) -> Result<(), PlotError> {
    std::fs::write(path, bytes).map_err(|source| PlotError::Write { path: path.to_path_buf(), source })
}

/// Train the MLP (`eagervm run mlp`; `steps`, default 60) on a VM with `config` and return
/// its loss before each step's update.
pub fn mlp_losses(config: crate::Config, steps: Option<usize>) -> crate::Result<Vec<f32>> {
    let vm = crate::VirtualMachine::new(config)?;
    let mut opts = crate::programs::MlpOptions::default();
    opts.steps = steps.unwrap_or(opts.steps);
    let report = crate::programs::mlp(&vm, &opts)?;
    vm.sync()?;
    Ok(report.losses)
}
