//! `eagervm bench`'s selection of workloads and its report: three tables (W1–W4, W5–W9,
//! the MLP step) or one JSON object per workload, then a warning for each workload whose
//! repetitions disagree by more than twice. Every report says how many busy loops ran beside
//! the measurement (`--busy`) and the load average it was taken under.

use std::io::Write;

use super::busy::{self, Competitors, Conditions};
use super::mlp::{self, MlpShape};
use super::ops::{self, OpsWorkload};
use super::progress::Progress;
use super::spread::DISAGREEMENT;
use super::{Workload, FLOOR_TARGET};
use crate::ep::DeviceId;
use crate::vm::{Config, Error, Result};
use crate::VirtualMachine;

/// One item of a selection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Item {
    /// W1–W4.
    Pipeline(Workload),
    /// W5–W9.
    Ops(OpsWorkload),
    /// The MLP step at a shape.
    Mlp(MlpShape),
}

/// The workloads to run, in the order given, each once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selection(pub Vec<Item>);

impl Selection {
    /// Every workload: W1–W9, then the MLP step at both shapes.
    pub fn all() -> Selection {
        let mut items: Vec<Item> = Workload::ALL.into_iter().map(Item::Pipeline).collect();
        items.extend(OpsWorkload::ALL.into_iter().map(Item::Ops));
        items.extend([Item::Mlp(MlpShape::SMALL), Item::Mlp(MlpShape::LARGE)]);
        Selection(items)
    }

    /// Parse `-w`'s values: `1`..`9` or `W1`..`W9`, ranges like `5-9`, `mlp` (64×8×32),
    /// `mlp-large` (1024×1024×1024), `all`. An unknown name is an error that lists the
    /// known ones.
    pub fn parse(names: &[String]) -> std::result::Result<Selection, String> {
        let one = |s: &str| -> Option<Item> {
            Workload::parse(s).map(Item::Pipeline).or_else(|| OpsWorkload::parse(s).map(Item::Ops)).or_else(
                || match s.to_ascii_lowercase().as_str() {
                    "mlp" => Some(Item::Mlp(MlpShape::SMALL)),
                    "mlp-large" => Some(Item::Mlp(MlpShape::LARGE)),
                    _ => None,
                },
            )
        };
        let unknown = |s: &str| {
            format!("unknown workload `{s}` (use 1-9, W1-W9, a range like 5-9, mlp, mlp-large or all)")
        };
        let mut items = Vec::new();
        for name in names.iter().map(|s| s.trim()).filter(|s| !s.is_empty()) {
            if name.eq_ignore_ascii_case("all") {
                items.extend(Selection::all().0);
                continue;
            }
            let range = name.split_once('-').and_then(|(a, b)| {
                let num = |x: &str| x.trim().trim_start_matches(['W', 'w']).parse::<u8>().ok();
                Some((num(a)?, num(b)?))
            });
            match range {
                Some((a, b)) if a <= b => {
                    for k in a..=b {
                        items.push(one(&k.to_string()).ok_or_else(|| unknown(name))?);
                    }
                }
                Some(_) => return Err(unknown(name)),
                None => items.push(one(name).ok_or_else(|| unknown(name))?),
            }
        }
        if items.is_empty() {
            return Err("no workload given".into());
        }
        let mut seen = Vec::new();
        items.retain(|i| {
            !seen.contains(i) && {
                seen.push(*i);
                true
            }
        });
        Ok(Selection(items))
    }
}

/// A line to `out`, ignoring a closed pipe (`eagervm bench | head`).
macro_rules! line {
    ($out:expr, $($arg:tt)*) => {{
        let _ = writeln!($out, $($arg)*);
    }};
}

/// How [`run`] measures and reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// Instructions per workload (`-n`).
    pub n: usize,
    /// Repetitions of each workload (`-r`); the median is reported.
    pub reps: u32,
    /// One JSON object per workload instead of the tables (`--json`).
    pub json: bool,
    /// Busy loops run beside the whole measurement, warm-ups included (`--busy`,
    /// [`busy::Competitors`]).
    pub busy: usize,
}

/// One line of `--json`: a workload's figures, then the conditions they were taken under.
fn json_line<T: serde::Serialize>(result: &T, conditions: Conditions) -> String {
    #[derive(serde::Serialize)]
    struct Line<'a, T: serde::Serialize> {
        #[serde(flatten)]
        result: &'a T,
        #[serde(flatten)]
        conditions: Conditions,
    }
    serde_json::to_string(&Line { result, conditions }).unwrap_or_default()
}

/// The competitors' command as a shell would take it: `sh -c 'while :; do :; done'`.
fn busy_loop_text() -> String {
    let [sh, c, script] = busy::BUSY_LOOP;
    format!("{sh} {c} '{script}'")
}

/// A load average as the text report shows it.
fn load_text(load: Option<f64>) -> String {
    load.map_or_else(|| "unknown (no /proc/loadavg)".into(), |l| format!("{l:.2}"))
}

/// Run `selection` as `opts` say, with `opts.busy` busy loops beside it, and print the report
/// (tables or JSON lines) to `out`. Returns whether every checked workload (W5–W9, the MLP)
/// matched its sequential reference. The busy loops are stopped before it returns, whether
/// it succeeds or not.
pub fn run(
    selection: &Selection,
    opts: &Options,
    config: &Config,
    progress: &Progress,
    out: &mut dyn Write,
) -> Result<bool> {
    let Options { n, reps, json, busy } = *opts;
    // Read before the competitors start: an average over the last minute, it then says what
    // else the machine was doing.
    let load_start = busy::load_average();
    // Held to the end of this function: its drop stops the competitors on every way out.
    let competitors = Competitors::start(busy).map_err(|e| {
        Error::Config(format!("cannot start {busy} busy loop(s) (`{}`): {e}", busy_loop_text()))
    })?;
    // Each JSON line carries the load average at its own workload's start and end.
    let mut load_before = load_start;
    let mut conditions = || {
        let load_after = busy::load_average();
        let c = Conditions { busy, load_1m_start: load_before, load_1m_end: load_after };
        load_before = load_after;
        c
    };
    let mut warnings = Vec::new();
    let mut checked = true;
    let mut header = None;
    let mut heading = |out: &mut dyn Write, which: u8| {
        if json || header == Some(which) {
            return;
        }
        header = Some(which);
        match which {
            0 => {
                line!(out, "W1-W4: {n} no-op instructions each on cpu:0 through InstructionsBuilder::call_into, median of {reps}");
                line!(
                    out,
                    "{:<4} {:<15} {:>10} {:>14} {:>14} {:>7} {:>6} {:>8}  {:<7}  {}",
                    "",
                    "workload",
                    "push ns/i",
                    "e2e instr/s",
                    "baseline /s",
                    "ratio",
                    "floor",
                    "of floor",
                    "result",
                    "cpu ns/i: caller sched workers"
                );
            }
            1 => {
                line!(
                    out,
                    "\nW5-W9: the paths W1-W4 skip, each checked against a sequential run, median of {reps}"
                );
                line!(
                    out,
                    "{:<4} {:<17} {:>8} {:>10} {:>10} {:>21}  {}",
                    "",
                    "workload",
                    "ops",
                    "ns/op",
                    "push ns",
                    "range ns/op",
                    "path"
                );
            }
            _ => {
                line!(out, "\nMLP step of `eagervm run mlp` (24 eager calls, hand-written backward), median of {reps}");
                line!(
                    out,
                    "{:<16} {:>7} {:>12} {:>18} {:>21}",
                    "shape",
                    "steps",
                    "us/step",
                    "loss read us/step",
                    "range us/step"
                );
            }
        }
    };
    for item in &selection.0 {
        match *item {
            Item::Pipeline(w) => {
                let r = super::measure_with(w, n, reps, config, progress)?;
                let c = conditions();
                progress.clear();
                heading(out, 0);
                if r.noisy {
                    warnings.push(format!(
                        "{}: repetitions disagree by more than {DISAGREEMENT}x (M instr/s: VM {:.1}-{:.1}, baseline \
                         {:.1}-{:.1}, floor {:.1}-{:.1}): the machine's speed moved during the run; no verdict \
                         (rerun, or raise -r)",
                        r.workload,
                        r.e2e_range[0] / 1e6,
                        r.e2e_range[1] / 1e6,
                        r.baseline_range[0] / 1e6,
                        r.baseline_range[1] / 1e6,
                        r.floor_range[0] / 1e6,
                        r.floor_range[1] / 1e6
                    ));
                }
                if json {
                    line!(out, "{}", json_line(&r, c));
                    continue;
                }
                let cpu = r.cpu_ns_per_instr.map_or(String::new(), |c| {
                    format!("{:>6.1} {:>6.1} {:>6.1}", c.caller, c.scheduler, c.workers)
                });
                let verdict = match (r.noisy, r.meets_target) {
                    (true, _) => "noisy",
                    (false, true) => "met",
                    (false, false) => "below",
                };
                line!(
                    out,
                    "{:<4} {:<15} {:>10.1} {:>14.0} {:>14.0} {:>7.2} {:>6.2} {:>8.2}  {:<7}  {}",
                    r.workload,
                    w.describe(),
                    r.push_ns_per_instr,
                    r.e2e_instr_per_s,
                    r.baseline_instr_per_s,
                    r.ratio,
                    r.floor_ratio,
                    r.of_floor,
                    verdict,
                    cpu
                );
            }
            Item::Ops(w) => {
                let r = ops::measure(w, n, reps, config, progress)?;
                let c = conditions();
                progress.clear();
                heading(out, 1);
                checked &= r.checked;
                if r.noisy {
                    warnings.push(format!(
                        "{}: repetitions disagree by more than {DISAGREEMENT}x ({:.0}-{:.0} ns/op)",
                        r.workload, r.ns_range[0], r.ns_range[1]
                    ));
                }
                if !r.checked {
                    warnings
                        .push(format!("{}: the result differs from the sequential reference", r.workload));
                }
                if json {
                    line!(out, "{}", json_line(&r, c));
                    continue;
                }
                line!(
                    out,
                    "{:<4} {:<17} {:>8} {:>10.1} {:>10.1} {:>10.1}-{:<10.1}  {}",
                    r.workload,
                    w.describe(),
                    r.ops,
                    r.ns_per_op,
                    r.push_ns_per_op,
                    r.ns_range[0],
                    r.ns_range[1],
                    r.path
                );
            }
            Item::Mlp(shape) => {
                let vm = VirtualMachine::new(config.clone())?;
                let r = mlp::measure(&vm, DeviceId::CPU, shape, shape.steps(n), reps, progress)?;
                let c = conditions();
                progress.clear();
                heading(out, 2);
                checked &= r.last_loss.is_finite();
                if r.noisy {
                    warnings.push(format!(
                        "mlp {}: repetitions disagree by more than {DISAGREEMENT}x ({:.1}-{:.1} us/step)",
                        shape.label(),
                        r.step_us_range[0],
                        r.step_us_range[1]
                    ));
                }
                if json {
                    line!(out, "{}", json_line(&r, c));
                    continue;
                }
                line!(
                    out,
                    "{:<16} {:>7} {:>12.1} {:>18.1} {:>10.1}-{:<10.1}",
                    shape.label(),
                    r.steps,
                    r.step_us,
                    r.step_us_loss_read,
                    r.step_us_range[0],
                    r.step_us_range[1]
                );
            }
        }
    }
    let load_end = load_before;
    let ran = competitors.len();
    drop(competitors);
    if !json {
        if header.is_some() && selection.0.iter().any(|i| matches!(i, Item::Pipeline(_))) {
            line!(
                out,
                "\nratio = e2e / baseline (a bare caller->forwarder->worker pipeline measured in the same run); \
                 floor = the same for the floor (the least work per instruction of any dependency-tracking \
                 runtime); of floor = e2e / floor, the verdict's figure: met when >= {FLOOR_TARGET} with push <= 100 \
                 ns/instr (docs/performance.md)"
            );
        }
        let beside = match ran {
            0 => "no busy loop ran beside the measurement (--busy 0)".to_string(),
            k => format!("{k} busy loop(s) (`{}`) ran beside the measurement", busy_loop_text()),
        };
        line!(
            out,
            "\ncompetition: {beside}; 1-minute load average {} at the start, {} at the end",
            load_text(load_start),
            load_text(load_end)
        );
        for w in &warnings {
            line!(out, "warning: {w}");
        }
    } else {
        // Warnings go to standard error, so that standard output stays JSON lines.
        for w in &warnings {
            let _ = writeln!(std::io::stderr(), "eagervm bench: warning: {w}");
        }
    }
    Ok(checked)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> std::result::Result<Selection, String> {
        Selection::parse(&s.split(',').map(String::from).collect::<Vec<_>>())
    }

    #[test]
    fn selections_name_numbers_ranges_and_the_mlp() {
        assert_eq!(
            parse("1,W3").unwrap().0,
            vec![Item::Pipeline(Workload::W1), Item::Pipeline(Workload::W3)]
        );
        assert_eq!(
            parse("5-7").unwrap().0,
            OpsWorkload::ALL[..3].iter().map(|&w| Item::Ops(w)).collect::<Vec<_>>()
        );
        assert_eq!(
            parse("mlp,MLP-large").unwrap().0,
            vec![Item::Mlp(MlpShape::SMALL), Item::Mlp(MlpShape::LARGE)]
        );
        assert_eq!(parse("all").unwrap(), Selection::all());
        assert_eq!(parse("all,1").unwrap(), Selection::all(), "each workload once");
        assert_eq!(Selection::all().0.len(), 11);
        for bad in ["0", "10", "w", "9-5", "3-12", "mlp-huge", ""] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }
}
