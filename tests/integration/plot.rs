//! `eagervm plot` and graph rendering: each picture is a valid SVG (parsed: its axis labels
//! and its series are there) or PNG (its header and size), bad inputs are typed errors, a
//! failed write names the file, and graphviz is stopped at its time bound.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use eagervm::cli::graph::{render_svg, RenderError};
use eagervm::cli::plot::{self, BenchRow, Format, PlotError, Timeline, Track};
use eagervm::trace::{self, ReplayOptions};

fn dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("eagervm-plot-tests-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

/// The texts of an SVG file, and its elements of each name.
struct Svg {
    texts: Vec<String>,
    rects: usize,
    polylines: Vec<(String, usize)>, // stroke, points
}

fn svg(path: &Path) -> Svg {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let doc =
        roxmltree::Document::parse(&text).unwrap_or_else(|e| panic!("{}: not XML: {e}", path.display()));
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    let nodes: Vec<_> = doc.descendants().filter(|n| n.is_element()).collect();
    Svg {
        texts: nodes
            .iter()
            .filter(|n| n.tag_name().name() == "text")
            .map(|n| n.text().unwrap_or("").trim().to_string())
            .collect(),
        rects: nodes.iter().filter(|n| n.tag_name().name() == "rect").count(),
        polylines: nodes
            .iter()
            .filter(|n| n.tag_name().name() == "polyline")
            .map(|n| {
                let points = n.attribute("points").unwrap_or("").split_whitespace().count();
                (n.attribute("stroke").unwrap_or("").to_string(), points)
            })
            .collect(),
    }
}

/// A PNG's width and height, from its signature and IHDR chunk.
fn png_size(path: &Path) -> (u32, u32) {
    let b = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(&b[..8], b"\x89PNG\r\n\x1a\n", "a PNG signature");
    assert_eq!(&b[12..16], b"IHDR");
    let be = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    assert!(b.len() > 2000, "a drawn picture, not an empty one: {} bytes", b.len());
    (be(16), be(20))
}

#[test]
fn the_loss_curve_as_svg_and_png() {
    let losses: Vec<f32> = (0..40).map(|i| 1.0 / (1.0 + i as f32)).collect();
    let out = dir().join("loss.svg");
    plot::plot_loss(&losses, "mlp: training loss", &out, None).unwrap();
    let s = svg(&out);
    for label in ["mlp: training loss", "training step", "loss (log scale)"] {
        assert!(s.texts.iter().any(|t| t == label), "{label} in {:?}", s.texts);
    }
    // The series: one blue line through every step.
    assert!(s.polylines.iter().any(|(stroke, n)| stroke == "#0000FF" && *n == 40), "{:?}", s.polylines);
    let png = dir().join("loss.png");
    plot::plot_loss(&losses, "loss", &png, None).unwrap();
    assert_eq!(png_size(&png), (800, 450));
    // A file name without a format, with --format.
    let bare = dir().join("loss-picture");
    assert!(matches!(plot::plot_loss(&losses, "l", &bare, None), Err(PlotError::Format { .. })));
    plot::plot_loss(&losses, "l", &bare, Some(Format::Png)).unwrap();
    assert_eq!(png_size(&bare), (800, 450));
}

#[test]
fn the_loss_curve_reads_its_losses() {
    let json = dir().join("report.json");
    std::fs::write(&json, r#"{"program": "mlp", "device": "cpu:0", "losses": [0.9, 0.5, 0.25]}"#).unwrap();
    assert_eq!(plot::read_losses(&json).unwrap(), [0.9, 0.5, 0.25]);
    let plain = dir().join("losses.txt");
    std::fs::write(&plain, "0.9\n0.5, 0.25\n").unwrap();
    assert_eq!(plot::read_losses(&plain).unwrap(), [0.9, 0.5, 0.25]);
    std::fs::write(&plain, "0.9 lots\n").unwrap();
    let e = plot::read_losses(&plain).unwrap_err();
    assert!(matches!(&e, PlotError::Input { message, .. } if message.contains("`lots`")), "{e}");
    let e = plot::plot_loss(&[], "l", &dir().join("empty.svg"), None).unwrap_err();
    assert!(matches!(e, PlotError::Empty { .. }), "{e}");
    let e = plot::plot_loss(&[f32::NAN], "l", &dir().join("nan.svg"), None).unwrap_err();
    assert!(e.to_string().contains("no finite loss"), "{e}");
}

#[test]
fn a_failed_write_names_the_file() {
    let e = plot::plot_loss(&[1.0, 0.5], "l", Path::new("/dev/full"), Some(Format::Svg)).unwrap_err();
    assert!(matches!(&e, PlotError::Write { path, .. } if path == Path::new("/dev/full")), "{e}");
    let e = plot::plot_loss(&[1.0, 0.5], "l", Path::new("/no/such/folder/l.png"), None).unwrap_err();
    assert!(e.to_string().contains("/no/such/folder/l.png"), "{e}");
    let e = eagervm::cli::graph::write_file(Path::new("/dev/full"), b"digraph {}").unwrap_err();
    assert!(e.to_string().contains("/dev/full"), "{e}");
}

#[test]
fn the_timeline_of_a_replay() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("instructions/pipeline.trace");
    let t = trace::load(&path).unwrap_or_else(|e| panic!("{e}"));
    let r = trace::replay(&t, &ReplayOptions { profile: true, ..Default::default() }).unwrap();
    let profile = r.profile.expect("a profile");
    let json = dir().join("pipeline.json");
    profile.write_chrome_json(&json).unwrap();
    // Read back from the file, and from the profile itself: the same tracks.
    let read = Timeline::read(&json).unwrap();
    let direct = Timeline::from_profile(&profile);
    let names = |t: &Timeline| t.tracks.iter().map(|t| t.name.clone()).collect::<Vec<_>>();
    assert_eq!(names(&read), ["cpu:0", "mock:0:compute", "mock:0:h2d", "mock:0:d2h"]);
    assert_eq!(names(&read), names(&direct));
    for (a, b) in read.tracks.iter().zip(&direct.tracks) {
        assert!(
            (a.busy_us() - b.busy_us()).abs() <= 1e-3 * b.busy_us().max(1.0),
            "{} {} {}",
            a.name,
            a.busy_us(),
            b.busy_us()
        );
        assert!(a.busy_us() > 0.0);
    }
    let out = dir().join("busy.svg");
    plot::plot_timeline(&read, &out, None).unwrap();
    let s = svg(&out);
    assert!(s.texts.iter().any(|t| t == "busy time per stream"), "{:?}", s.texts);
    assert!(s.texts.iter().any(|t| t.starts_with("time since the first instruction")), "{:?}", s.texts);
    assert!(s.texts.iter().any(|t| t.starts_with("mock:0:compute ") && t.ends_with('%')), "{:?}", s.texts);
    // The background, and at least one box per stream.
    assert!(s.rects > 1 + 4, "{} rects", s.rects);
    let png = dir().join("busy.png");
    plot::plot_timeline(&read, &png, None).unwrap();
    assert_eq!(png_size(&png).0, 1000);
}

#[test]
fn the_timeline_reader_is_tolerant() {
    // Complete slices, B/E pairs and async b/e pairs on a named track; another process's
    // thread slices, counters and flows are ignored.
    let json = r#"{"traceEvents": [
      {"ph": "M", "pid": 1, "tid": 0, "name": "process_name", "args": {"name": "eagervm streams"}},
      {"ph": "M", "pid": 2, "tid": 0, "name": "process_name", "args": {"name": "eagervm threads"}},
      {"ph": "M", "pid": 1, "tid": 2, "name": "thread_name", "args": {"name": "mock:0:compute"}},
      {"ph": "M", "pid": 1, "tid": 1, "name": "thread_name", "args": {"name": "cpu:0"}},
      {"ph": "X", "pid": 1, "tid": 1, "ts": 0, "dur": 10, "name": "relu", "args": {"program": 1}},
      {"ph": "X", "pid": 1, "tid": 1, "ts": 5, "dur": 10, "name": "add"},
      {"ph": "b", "pid": 1, "tid": 2, "ts": 20, "cat": "device", "id": 7, "name": "matmul"},
      {"ph": "e", "pid": 1, "tid": 2, "ts": 50, "cat": "device", "id": 7, "name": "matmul"},
      {"ph": "B", "pid": 1, "tid": 2, "ts": 60},
      {"ph": "E", "pid": 1, "tid": 2, "ts": 70},
      {"ph": "X", "pid": 2, "tid": 1, "ts": 0, "dur": 1000, "name": "intake"},
      {"ph": "C", "pid": 2, "ts": 3, "name": "in flight", "args": {"instructions": 3}},
      {"ph": "s", "pid": 1, "tid": 1, "ts": 3, "id": 1, "name": "dependency"},
      {"ph": "zz", "unknown": true}
    ]}"#;
    let path = dir().join("tolerant.json");
    std::fs::write(&path, json).unwrap();
    let t = Timeline::read(&path).unwrap();
    assert_eq!(
        t.tracks,
        [
            Track { name: "cpu:0".into(), busy: vec![(0.0, 15.0)] },
            Track { name: "mock:0:compute".into(), busy: vec![(20.0, 50.0), (60.0, 70.0)] },
        ]
    );
    std::fs::write(&path, "not json").unwrap();
    assert!(matches!(Timeline::read(&path), Err(PlotError::Input { .. })));
    let e = plot::plot_timeline(&Timeline::default(), &dir().join("none.svg"), None).unwrap_err();
    assert!(matches!(e, PlotError::Empty { .. }), "{e}");
}

#[test]
fn bench_results_across_workloads() {
    // As `eagervm bench --json` writes them, with a workload the plot has never heard of.
    let lines = [
        r#"{"workload":"W1","e2e_instr_per_s":5.0e7,"baseline_instr_per_s":2.0e8,"ratio":0.25,"cpu_ns_per_instr":{"caller":12.5}}"#,
        r#"{"workload":"W2","e2e_instr_per_s":8.0e7,"baseline_instr_per_s":2.2e8,"ratio":0.36,"cpu_ns_per_instr":null}"#,
        r#"{"workload":"W9 gather","e2e_instr_per_s":3.0e7,"baseline_instr_per_s":null,"ratio":0.1}"#,
    ];
    let path = dir().join("bench.json");
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    let rows = plot::read_bench(&path).unwrap();
    assert_eq!(rows.iter().map(|r| r.workload.as_str()).collect::<Vec<_>>(), ["W1", "W2", "W9 gather"]);
    assert_eq!(rows[0].values["cpu_ns_per_instr.caller"], 12.5);
    let out = dir().join("bench.svg");
    plot::plot_bench(&rows, &[], &out, None).unwrap();
    let s = svg(&out);
    for label in ["W1", "W2", "W9 gather", "workload", "e2e_instr_per_s", "baseline_instr_per_s"] {
        assert!(s.texts.iter().any(|t| t == label), "{label} in {:?}", s.texts);
    }
    // Five bars (W9 has no baseline), two legend swatches, the background, the legend box.
    assert!(s.rects >= 8, "{} rects", s.rects);
    let png = dir().join("bench.png");
    plot::plot_bench(&rows, &["ratio".to_string()], &png, None).unwrap();
    assert!(png_size(&png).0 >= 640);
    // Bad inputs.
    let e = plot::plot_bench(&rows, &["speed".to_string()], &out, None).unwrap_err();
    assert!(
        matches!(&e, PlotError::Empty { why, .. } if why.contains("`speed`") && why.contains("ratio")),
        "{e}"
    );
    let nameless = vec![BenchRow { workload: "W1".into(), values: Default::default() }];
    assert!(matches!(plot::plot_bench(&nameless, &[], &out, None), Err(PlotError::Empty { .. })));
    std::fs::write(&path, r#"{"e2e_instr_per_s": 1}"#).unwrap();
    let e = plot::read_bench(&path).unwrap_err();
    assert!(e.to_string().contains("names no workload"), "{e}");
    std::fs::write(&path, "{\"workload\": \"W1\"}\n{oops\n").unwrap();
    let e = plot::read_bench(&path).unwrap_err();
    assert!(e.to_string().contains("line 2"), "{e}");
}

/// A stand-in for graphviz: a shell script in a folder of its own.
fn fake_dot(name: &str, body: &str) -> PathBuf {
    let d = dir().join(name);
    std::fs::create_dir_all(&d).unwrap();
    let path = d.join("dot");
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

#[test]
fn graphviz_is_stopped_at_its_time_bound() {
    // A `dot` that never reads its input and never finishes, with a child of its own that
    // keeps the pipes open: all of it is killed.
    let slow = fake_dot("slow", "sleep 30 & sleep 30");
    let big = "digraph g {}\n".repeat(50_000); // more than a pipe holds
    let t0 = Instant::now();
    let out = dir().join("slow.svg");
    let e = render_svg(slow.as_os_str(), &big, &out, Duration::from_millis(500)).unwrap_err();
    assert!(matches!(e, RenderError::TimedOut { .. }), "{e}");
    assert!(
        e.to_string().contains("did not finish within 0.5 s") && e.to_string().contains("--max-nodes"),
        "{e}"
    );
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    assert!(!out.exists());
    // One that fails says why; one that is missing says so.
    let failing = fake_dot("failing", "echo 'syntax error in line 1' >&2; exit 3");
    let e = render_svg(failing.as_os_str(), "digraph g {}", &out, Duration::from_secs(30)).unwrap_err();
    assert!(matches!(&e, RenderError::Failed { stderr, .. } if stderr.contains("syntax error")), "{e}");
    let missing = dir().join("no-such-dot");
    let e = render_svg(missing.as_os_str(), "digraph g {}", &out, Duration::from_secs(30)).unwrap_err();
    assert!(
        matches!(e, RenderError::NotInstalled { .. }) && e.to_string().contains("install graphviz"),
        "{e}"
    );
    // One that works: its standard output becomes the file.
    let echo = fake_dot("echo", "cat > /dev/null; echo '<svg/>'");
    render_svg(echo.as_os_str(), &big, &out, Duration::from_secs(30)).unwrap();
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "<svg/>\n");
}

fn eagervm(args: &[&str], path: Option<&Path>) -> (bool, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_eagervm"));
    cmd.args(args);
    if let Some(p) = path {
        cmd.env("PATH", p);
    }
    let o = cmd.output().expect("the binary runs");
    (
        o.status.success(),
        format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)),
    )
}

#[test]
fn the_command_line_draws_caps_and_bounds() {
    let d = dir();
    let branches = Path::new(env!("CARGO_MANIFEST_DIR")).join("instructions/branches.trace");
    let branches = branches.to_str().unwrap();
    let dot = d.join("b.dot");
    let (ok, out) = eagervm(&["analyze", branches, "--dot", dot.to_str().unwrap()], None);
    assert!(ok, "{out}");
    assert!(
        out.contains("available parallelism: 2.") && out.contains("same-stream chains collapsed"),
        "{out}"
    );
    assert!(std::fs::read_to_string(&dot).unwrap().starts_with("digraph"));
    // The cap, said on the command line.
    let (ok, out) = eagervm(&["analyze", branches, "--dot", dot.to_str().unwrap(), "--max-nodes", "5"], None);
    assert!(ok && out.contains("drawing the first 5 nodes") && out.contains("--max-nodes"), "{out}");
    // A full disk, a slow graphviz, no graphviz: each an error that says so.
    let (ok, out) = eagervm(&["analyze", branches, "--dot", "/dev/full"], None);
    assert!(!ok && out.contains("/dev/full"), "{out}");
    let slow = fake_dot("slow-cli", "sleep 30");
    let svg = d.join("b.svg");
    let args = ["analyze", branches, "--svg", svg.to_str().unwrap(), "--render-timeout", "0.5"];
    let with_slow =
        format!("{}:{}", slow.parent().unwrap().display(), std::env::var("PATH").unwrap_or_default());
    let (ok, out) = eagervm(&args, Some(Path::new(&with_slow)));
    assert!(!ok && out.contains("did not finish within 0.5 s"), "{out}");
    let (ok, out) = eagervm(&args, Some(&d.join("empty-path")));
    assert!(!ok && out.contains("install graphviz"), "{out}");
    // A picture from the command line, and a bad one.
    let bench = d.join("cli-bench.json");
    std::fs::write(&bench, r#"{"workload":"W1","e2e_instr_per_s":5.0e7}"#).unwrap();
    let png = d.join("cli-bench.png");
    let (ok, out) = eagervm(&["plot", "bench", bench.to_str().unwrap(), "-o", png.to_str().unwrap()], None);
    assert!(ok, "{out}");
    assert!(png_size(&png).0 >= 640);
    let (ok, out) =
        eagervm(&["plot", "timeline", bench.to_str().unwrap(), "-o", png.to_str().unwrap()], None);
    assert!(!ok && out.contains("not a Chrome trace-event JSON file"), "{out}");
    let (ok, out) = eagervm(&["plot", "loss", "--steps", "4", "-o", d.join("l.svg").to_str().unwrap()], None);
    assert!(ok && out.contains("loss curve of 4 steps"), "{out}");
}

#[test]
fn plot_and_its_pictures_have_help() {
    for args in [
        &["plot", "--help"][..],
        &["plot", "loss", "--help"],
        &["plot", "timeline", "--help"],
        &["plot", "bench", "--help"],
    ] {
        let (ok, out) = eagervm(args, None);
        assert!(ok && out.contains("Usage"), "{args:?}: {out}");
    }
    let (ok, out) = eagervm(&["plot", "loss", "-o", "x.gif", "--format", "gif"], None);
    assert!(!ok && out.contains("not a picture format"), "{out}");
    let branches = Path::new(env!("CARGO_MANIFEST_DIR")).join("instructions/branches.trace");
    let svg = dir().join("never.svg");
    let args = ["analyze", branches.to_str().unwrap(), "--svg", svg.to_str().unwrap(), "--render-timeout=-1"];
    let (ok, out) = eagervm(&args, None);
    assert!(!ok && out.contains("--render-timeout -1: not a number of seconds"), "{out}");
}
