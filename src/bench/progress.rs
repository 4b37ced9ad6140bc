//! Live progress of the benchmark's long phases.
//!
//! A run of `eagervm bench -n 10^12` takes hours; on a terminal each phase shows a bar with
//! its rate and an estimate of the time left, on standard error. When standard error is not
//! a terminal (a pipe, a file, CI) nothing is drawn, so `--json` output and logs stay clean.
//! The workloads report progress once per chunk of work (`super::CHUNK` instructions, or
//! one MLP step), never per instruction, so the bar costs nothing measurable.

use std::io::IsTerminal as _;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A progress bar on standard error if it is a terminal, or one that draws nothing.
#[derive(Debug, Clone)]
pub struct Progress {
    bar: ProgressBar,
}

impl Progress {
    /// A bar drawn on standard error when it is a terminal, hidden otherwise.
    pub fn stderr() -> Progress {
        let target = if std::io::stderr().is_terminal() {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        };
        let bar = ProgressBar::with_draw_target(None, target);
        let style = ProgressStyle::with_template(
            "{msg:<26} [{elapsed_precise}] {bar:30} {human_pos}/{human_len} {per_sec:>12} eta {eta}",
        )
        // Cannot fail: a constant template.
        .expect("a valid template");
        bar.set_style(style);
        Progress { bar }
    }

    /// A bar that never draws (library callers, tests).
    pub fn hidden() -> Progress {
        Progress { bar: ProgressBar::hidden() }
    }

    /// Start a phase of `total` units, named `what`.
    pub(crate) fn start(&self, what: String, total: u64) {
        self.bar.set_message(what);
        self.bar.set_length(total);
        self.bar.set_position(0);
        self.bar.reset_eta();
    }

    /// Rename the phase, keeping its count.
    pub(crate) fn phase(&self, what: String) {
        self.bar.set_message(what);
    }

    /// `n` more units done.
    pub(crate) fn advance(&self, n: u64) {
        self.bar.inc(n);
    }

    /// Remove the bar (before the phase's results are printed).
    pub fn clear(&self) {
        self.bar.finish_and_clear();
    }
}
