//! The live progress bar of a long trace operation: a thread of its own reads a
//! [`Progress`] ten times a second and draws what it finds with indicatif.
//!
//! The operation never calls the bar: it stores its counters (relaxed atomics, at most one
//! per line or instruction) and goes on, so that drawing costs it nothing, and the bar
//! moves while the operation is blocked (a host read, the final wait for the devices).
//!
//! Nothing appears for the first second ([`SHOW_AFTER`]), so short commands print only
//! their summary, and nothing appears at all where standard error is not a terminal:
//! indicatif's `ProgressDrawTarget::stderr()` draws only to a terminal, and the bar is the
//! only thing this module writes.

use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::trace::{Phase, Progress};

/// How long a command runs before its bar appears.
pub const SHOW_AFTER: Duration = Duration::from_secs(1);
/// How often the bar reads the counters and redraws.
pub const TICK: Duration = Duration::from_millis(100);

/// A progress bar drawn from a [`Progress`] by a thread of its own; dropping it stops the
/// thread and clears the bar.
pub struct ProgressView {
    /// Dropped to wake and stop the thread at once.
    quit: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl ProgressView {
    /// Start drawing `progress` on standard error (if it is a terminal), labelled with the
    /// file it works on.
    pub fn start(progress: Arc<Progress>, label: String) -> ProgressView {
        let (quit, rx) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("eagervm-progress".into())
            .spawn(move || draw(&progress, &label, &rx))
            .ok();
        ProgressView { quit: Some(quit), thread }
    }
}

impl Drop for ProgressView {
    fn drop(&mut self) {
        drop(self.quit.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn style(phase: Phase) -> ProgressStyle {
    let template = match phase {
        Phase::Parsing => {
            "{prefix} [{elapsed_precise}] {bar:30} {binary_bytes}/{binary_total_bytes} \
             ({binary_bytes_per_sec}, ETA {eta})"
        }
        _ => "{prefix} [{elapsed_precise}] {bar:30} {human_pos}/{human_len} {msg} ({per_sec}, ETA {eta})",
    };
    // Cannot fail: the templates are constants that indicatif accepts.
    ProgressStyle::with_template(template).expect("a valid template")
}

/// The thread's loop: every [`TICK`], until `quit` is dropped, draw the current phase. Each
/// phase's bar is made when the phase is first seen, hidden until [`SHOW_AFTER`], so that
/// its rate is measured from the phase's start.
fn draw(progress: &Progress, label: &str, quit: &mpsc::Receiver<()>) {
    let t0 = Instant::now();
    let mut bar: Option<(Phase, ProgressBar)> = None;
    let mut shown = false;
    // Woken by the tick, or ended when `quit` is dropped (or, never, sent to).
    while let Err(RecvTimeoutError::Timeout) = quit.recv_timeout(TICK) {
        let phase = progress.phase();
        if bar.as_ref().map(|b| b.0) != Some(phase) {
            if let Some((_, b)) = bar.take() {
                b.finish_and_clear();
            }
            if phase == Phase::Idle {
                continue;
            }
            let target = if shown { ProgressDrawTarget::stderr() } else { ProgressDrawTarget::hidden() };
            let b = ProgressBar::with_draw_target(Some(progress.total()), target);
            b.set_style(style(phase));
            b.set_prefix(format!("{} {label}", phase.name()));
            bar = Some((phase, b));
        }
        let Some((_, b)) = &bar else { continue };
        let in_flight = progress.in_flight();
        match phase {
            Phase::Finishing => b.set_message(format!("done, {in_flight} in flight")),
            Phase::Replaying | Phase::Reference if in_flight > 0 => {
                b.set_message(format!("instructions submitted, {in_flight} in flight"))
            }
            _ => b.set_message(phase.unit()),
        }
        b.set_length(progress.total());
        b.set_position(progress.done());
        if !shown && t0.elapsed() >= SHOW_AFTER {
            shown = true;
            b.set_draw_target(ProgressDrawTarget::stderr());
        }
    }
    if let Some((_, b)) = bar {
        b.finish_and_clear();
    }
}

/// Run `work` (a built-in program on `vm`) with a spinner on standard error, shown as
/// [`ProgressView`]'s bar is (after a second, on a terminal only): the instructions the
/// VM's streams have finished and have in flight, read from the flight recorder's
/// per-stream watermarks ([`VirtualMachine::flight_record`](crate::VirtualMachine::flight_record)),
/// and their rate. A program's length is not known before it ends, so there is no ETA.
pub fn with_program_spinner<T>(vm: &crate::VirtualMachine, label: &str, work: impl FnOnce() -> T) -> T {
    let (quit, rx) = mpsc::channel::<()>();
    std::thread::scope(|s| {
        s.spawn(move || spin(vm, label, &rx));
        let r = work();
        drop(quit);
        r
    })
}

fn spin(vm: &crate::VirtualMachine, label: &str, quit: &mpsc::Receiver<()>) {
    let t0 = Instant::now();
    let b = ProgressBar::with_draw_target(None, ProgressDrawTarget::hidden());
    // Cannot fail: a constant template that indicatif accepts.
    let style = ProgressStyle::with_template(
        "{spinner} run {prefix} [{elapsed_precise}] {human_pos} instructions done, {msg} ({per_sec})",
    )
    .expect("a valid template");
    b.set_style(style);
    b.set_prefix(label.to_string());
    let mut shown = false;
    while let Err(RecvTimeoutError::Timeout) = quit.recv_timeout(TICK) {
        let record = vm.flight_record();
        let done: u64 = record.streams.iter().map(|s| s.done).sum();
        let admitted: u64 = record.streams.iter().map(|s| s.admitted).sum();
        b.set_message(format!("{} in flight", admitted.saturating_sub(done)));
        b.set_position(done);
        if !shown && t0.elapsed() >= SHOW_AFTER {
            shown = true;
            b.set_draw_target(ProgressDrawTarget::stderr());
        }
    }
    b.finish_and_clear();
}
