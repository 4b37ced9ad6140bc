//! Fuzz targets, on stable Rust: proptest generates and mutates the inputs, and shrinks a
//! failing one. `docs/testing.md` ("Fuzzing") says how to run long campaigns and how a
//! failure becomes a regression.
//!
//! - **trace**: bytes in, through what `eagervm validate`, `analyze` and `replay` call:
//!   `trace::load` (for bytes that are not UTF-8) or `parse_str`, writing the trace back
//!   out (it must read back the same), `validate` (as recorded and for `--resync`),
//!   `analyze`, then `replay` as recorded and with synchronisation derived anew on the
//!   CPU. Every problem must name a place within the input, every failure must be a typed
//!   error, and two replays of one trace must read the same values. A trace that declares
//!   a tensor over the cap on one tensor's bytes must fail validation with the size
//!   check's diagnostic at that declaration, and so is never replayed. The inputs are the
//!   shipped traces of `instructions/`, mutated with knowledge of the format, traces
//!   written from scratch, and random bytes (`common/fuzz/trace_input.rs`).
//! - **sidecar**: a shipped trace whose binary sidecar has been changed (bytes flipped,
//!   cut short, extended, replaced) and perhaps one of its `offset=`, `bytes=`, `fnv1a64=`
//!   fields. A replay must succeed when every slice the trace reads is intact and the
//!   fields are the recorded ones, and must fail with a typed error when a slice is not.
//! - **builder**: random sequences of public-API calls on one VM and two eager contexts
//!   (`common/fuzz/builder_input.rs`, `builder_case.rs`): every call returns `Ok` or a
//!   typed error, one that asks for a tensor over the cap is refused with `TooLarge`, and
//!   the VM keeps working.
//!
//! In every target a panic on any thread, or a case that does not finish within its time
//! bound, fails the target with the input (`common/fuzz/harness.rs`).

use eagervm::trace::{
    self, parse_str, Data, DeviceMap, Diagnostic, ReplayOptions, ReplayReport, Stmt, TraceError,
    ValidateOptions,
};
use proptest::test_runner::{TestCaseError, TestRunner};

use crate::common::fuzz::{builder_case, builder_input, harness, trace_input};
use harness::{bounded, cases, oversized, proptest_config, setup, temp_path, Knobs, Stats, TENSOR_CAP};
use trace_input::{corpus_dir, mutate_bin, seeds, NUMBERS};

/// A file removed when dropped.
struct TempFile(std::path::PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Checks that a problem's place is within an input of `lines` lines (or just past it).
struct Place {
    lines: u32,
}

impl Place {
    fn check(&self, d: &Diagnostic) -> Result<(), String> {
        if d.line == 0 || d.line > self.lines + 1 || d.col == 0 {
            return Err(format!("a problem placed outside the input ({} lines): {d}", self.lines));
        }
        Ok(())
    }

    fn check_all(&self, r: &Result<(), TraceError>) -> Result<(), String> {
        match r {
            Ok(()) => Ok(()),
            Err(TraceError::Invalid { diagnostics }) => diagnostics.iter().try_for_each(|d| self.check(d)),
            Err(e) => Err(format!("validate returned `{e}`, not a list of problems")),
        }
    }

    /// A replay's outcome: a typed error at a place in the input, and no defect among the
    /// failures it saw (`builder_case::defect`).
    fn check_replay(&self, r: &Result<ReplayReport, TraceError>) -> Result<(), String> {
        let report = match r {
            Ok(report) => report,
            Err(TraceError::Vm { at, error }) => {
                self.check(at)?;
                return builder_case::defect(error).map_or(Ok(()), |d| Err(format!("replay: {d}")));
            }
            Err(TraceError::Invalid { diagnostics }) => {
                return diagnostics.iter().try_for_each(|d| self.check(d));
            }
            Err(
                TraceError::Mismatch { at, .. }
                | TraceError::OutOfTolerance { at, .. }
                | TraceError::MissingFailure { at, .. },
            ) => return self.check(at),
            Err(TraceError::Io { .. } | TraceError::DeviceUnavailable { .. }) => return Ok(()),
            Err(e) => return Err(format!("replay returned `{e}`")),
        };
        let failures = report.failures.iter().map(|f| &f.1);
        let reads = report.reads.iter().filter_map(|r| r.result.as_ref().err());
        match failures.chain(reads).find_map(builder_case::defect) {
            Some(d) => Err(format!("replay: {d}")),
            None => Ok(()),
        }
    }
}

/// The `tensor` declarations of `t` over the cap ([`oversized`]): each one's line, and the
/// diagnostic the validator must give there (`TooLarge`'s text, naming the tensor).
fn too_large_declarations(t: &trace::Trace) -> Vec<(u32, String)> {
    t.lines
        .iter()
        .filter_map(|l| match &l.stmt {
            Stmt::Tensor { id, dtype, shape, .. } => {
                let o = oversized(shape, *dtype)?;
                Some((l.pos.line, o.error(format!("tensor t{}", id.id)).to_string()))
            }
            _ => None,
        })
        .collect()
}

/// `validate`'s answer `r` (`how`: as recorded, or for `--resync`) to a trace that
/// declares the tensors `over` the cap: invalid if there are any, with the size check's
/// diagnostic at each, and no such diagnostic at a declaration within the cap.
fn refused_as_too_large(over: &[(u32, String)], r: &Result<(), TraceError>, how: &str) -> Result<(), String> {
    let diagnostics = match r {
        Err(TraceError::Invalid { diagnostics }) => &diagnostics[..],
        _ if over.is_empty() => &[],
        _ => {
            return Err(format!(
                "`validate` {how} gave {r:?} for a trace that declares a tensor over the cap of \
                 {TENSOR_CAP} bytes (line {}: {})",
                over[0].0, over[0].1
            ))
        }
    };
    if let Some((line, m)) =
        over.iter().find(|(line, m)| !diagnostics.iter().any(|d| d.line == *line && d.message == *m))
    {
        return Err(format!("`validate` {how}: no diagnostic `{m}` at line {line}, but {diagnostics:?}"));
    }
    // The size check's diagnostic of a declaration: `tensor tN: f32[...] is too large: ...`.
    let of_declaration = |m: &str| m.starts_with("tensor t") && m.contains(" is too large: ");
    match diagnostics
        .iter()
        .find(|d| of_declaration(&d.message) && !over.iter().any(|(l, m)| *l == d.line && *m == d.message))
    {
        Some(d) => Err(format!("`validate` {how} refused as too large a tensor within the cap: {d}")),
        None => Ok(()),
    }
}

/// The trace target's case (module docs).
fn trace_case(bytes: Vec<u8>, stats: &'static Stats) -> Result<(), String> {
    Stats::bump(&stats.cases);
    let place = Place { lines: bytes.split(|&b| b == b'\n').count() as u32 };
    let text = match String::from_utf8(bytes) {
        Ok(t) => t,
        Err(e) => {
            // The command line reads files with `trace::load`, which must report bytes that
            // are not UTF-8 as a problem at a place.
            let file = TempFile(temp_path("trace"));
            std::fs::write(&file.0, e.as_bytes()).map_err(|e| format!("writing a temporary file: {e}"))?;
            Stats::bump(&stats.refused);
            return match trace::load(&file.0) {
                Err(TraceError::Invalid { diagnostics }) => {
                    diagnostics.iter().try_for_each(|d| place.check(d))
                }
                other => Err(format!("`load` of bytes that are not UTF-8 gave {other:?}")),
            };
        }
    };
    let (mut t, problems) = parse_str("fuzz.trace", &text);
    problems.iter().try_for_each(|d| place.check(d))?;
    if !problems.is_empty() {
        Stats::bump(&stats.refused);
        return Ok(());
    }
    let written = t.to_text();
    let (again, problems) = parse_str("written.trace", &written);
    if !problems.is_empty() || again.to_text() != written {
        return Err(format!(
            "the trace as written does not read back the same: {problems:?}\n\
             written:\n{written}\nread back:\n{}",
            again.to_text()
        ));
    }
    t.dir = corpus_dir();
    let strict = trace::validate(&t, &ValidateOptions { resync: false, max_tensor_bytes: TENSOR_CAP });
    let loose = trace::validate(&t, &ValidateOptions { resync: true, max_tensor_bytes: TENSOR_CAP });
    place.check_all(&strict)?;
    place.check_all(&loose)?;
    let over = too_large_declarations(&t);
    refused_as_too_large(&over, &strict, "as recorded")?;
    refused_as_too_large(&over, &loose, "for --resync")?;
    if !over.is_empty() {
        // Refused by validation, so never replayed (below).
        Stats::bump(&stats.too_large);
    }
    match (&strict, &loose) {
        (Ok(()), Err(e)) => return Err(format!("valid as recorded, but not for --resync: {e}")),
        (_, Err(_)) => {
            Stats::bump(&stats.refused);
            return Ok(());
        }
        _ => Stats::bump(&stats.accepted),
    }
    let a = trace::analyze(&t).map_err(|e| format!("`analyze` of a trace valid for --resync: {e}"))?;
    if a.critical_path > a.instructions || a.instructions != t.instructions() as u64 {
        return Err(format!("`analyze`: {} instructions, critical path {}", a.instructions, a.critical_path));
    }
    let config = setup(Knobs::default());
    let on_cpu =
        ReplayOptions { resync: true, device: DeviceMap::Cpu, config: config.clone(), ..Default::default() };
    let on_cpu = trace::replay(&t, &on_cpu);
    place.check_replay(&on_cpu)?;
    if strict.is_ok() {
        let recorded = trace::replay(&t, &ReplayOptions { config, ..Default::default() });
        place.check_replay(&recorded)?;
        if let (Ok(a), Ok(b)) = (&recorded, &on_cpu) {
            same_reads(a, b)?;
        }
    }
    Stats::bump(&stats.ran);
    Ok(())
}

/// Two replays of one trace read the same values (and fail the same reads).
fn same_reads(recorded: &ReplayReport, on_cpu: &ReplayReport) -> Result<(), String> {
    if recorded.reads.len() != on_cpu.reads.len() {
        return Err(format!("{} reads as recorded, {} on the cpu", recorded.reads.len(), on_cpu.reads.len()));
    }
    for (a, b) in recorded.reads.iter().zip(&on_cpu.reads) {
        let same = match (&a.result, &b.result) {
            (Ok(x), Ok(y)) => x == y,
            (Err(_), Err(_)) => true,
            _ => false,
        };
        if !same {
            return Err(format!(
                "line {}: tensor t{} reads {:?} as recorded, {:?} replayed on the cpu with --resync",
                a.line, a.tensor, a.result, b.result
            ));
        }
    }
    Ok(())
}

/// The sidecar target's case (module docs).
fn sidecar_case(input: trace_input::SidecarInput, stats: &'static Stats) -> Result<(), String> {
    Stats::bump(&stats.cases);
    let with: Vec<&trace_input::Seed> = seeds().iter().filter(|s| s.sidecar.is_some()).collect();
    let seed = with[input.seed % with.len()];
    let side = seed.sidecar.as_ref().expect("filtered on it");
    let original = std::fs::read(side).map_err(|e| format!("{}: {e}", side.display()))?;
    let file = TempFile(temp_path("bin"));
    std::fs::write(&file.0, mutate_bin(original, &input.bin))
        .map_err(|e| format!("a temporary file: {e}"))?;
    let name = side.file_name().expect("a file").to_string_lossy();
    let (from, to) = (format!("file=\"{name}\""), format!("file=\"{}\"", file.0.display()));
    let uses = seed.text.matches(&from).count();
    let mut nth = 0;
    let lines: Vec<String> = seed
        .text
        .split('\n')
        .map(|line| {
            let mut l = line.replace(&from, &to);
            if l.contains(&to) {
                if let Some((which, field, value)) = input.field {
                    if which % uses.max(1) == nth {
                        l = change_field(&l, field, value);
                    }
                }
                nth += 1;
            }
            l
        })
        .collect();
    let text = lines.join("\n");
    let place = Place { lines: lines.len() as u32 };
    let (mut t, problems) = parse_str("fuzz.trace", &text);
    problems.iter().try_for_each(|d| place.check(d))?;
    if !problems.is_empty() {
        Stats::bump(&stats.refused);
        return Ok(());
    }
    t.dir = corpus_dir();
    let intact = slices_intact(&t, &file.0);
    let valid = trace::validate(&t, &ValidateOptions { resync: false, max_tensor_bytes: TENSOR_CAP });
    place.check_all(&valid)?;
    let over = too_large_declarations(&t);
    refused_as_too_large(&over, &valid, "as recorded")?;
    if !over.is_empty() {
        Stats::bump(&stats.too_large);
    }
    let config = setup(Knobs::default());
    let outcome = match valid {
        Err(_) => None,
        Ok(()) => {
            let r = trace::replay(&t, &ReplayOptions { config, ..Default::default() });
            place.check_replay(&r)?;
            Stats::bump(&stats.ran);
            Some(r)
        }
    };
    match (intact, input.field, outcome) {
        (true, None, None) => Err(format!("every slice is intact, yet the trace does not validate: {:?}", {
            trace::validate(
                &t,
                &ValidateOptions { max_tensor_bytes: TENSOR_CAP, ..ValidateOptions::default() },
            )
        })),
        (true, None, Some(Err(e))) => Err(format!("every slice is intact, yet the replay fails: {e}")),
        (false, _, Some(Ok(_))) => {
            Err("a replay read a changed slice of the sidecar without an error".into())
        }
        (_, _, outcome) => {
            Stats::bump(if outcome.as_ref().is_some_and(|r| r.is_ok()) {
                &stats.accepted
            } else {
                &stats.refused
            });
            Ok(())
        }
    }
}

/// `line` (a `file=` access) with its `offset=`, `bytes=` or `fnv1a64=` field (`field` 0,
/// 1, 2) set to a value drawn from `value`.
fn change_field(line: &str, field: usize, value: usize) -> String {
    let key = ["offset=", "bytes=", "fnv1a64="][field % 3];
    let new = match field % 3 {
        2 => format!("0x{:016x}", (value as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)),
        _ => NUMBERS[value % NUMBERS.len()].to_string(),
    };
    line.split(' ')
        .map(|tok| if tok.starts_with(key) { format!("{key}{new}") } else { tok.to_string() })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Whether every sidecar slice `t` reads from `bin` is there and has its stated checksum.
fn slices_intact(t: &trace::Trace, bin: &std::path::Path) -> bool {
    let Ok(bytes) = std::fs::read(bin) else { return false };
    t.lines.iter().all(|l| match &l.stmt {
        Stmt::Access {
            kind: trace::AccessKind::Write(Data::File { offset, bytes: n, checksum, .. }),
            ..
        } => {
            let slice = usize::try_from(*offset)
                .ok()
                .and_then(|o| Some(o..o.checked_add(usize::try_from(*n).ok()?)?));
            slice.and_then(|s| bytes.get(s)).is_some_and(|s| trace::checksum(s) == *checksum)
        }
        _ => true,
    })
}

/// Run `target` on `default_cases` inputs of `strategy` (or as many as the environment
/// says); print its counters; fail with the (shrunk) input if a case fails. Returns the
/// number of cases asked for.
fn fuzz<S: proptest::strategy::Strategy>(
    name: &'static str,
    test_name: &'static str,
    default_cases: u32,
    strategy: S,
    stats: &'static Stats,
    target: fn(S::Value, &'static Stats) -> Result<(), String>,
) -> u32
where
    S::Value: Send + 'static,
{
    let n = cases(default_cases);
    let mut runner = TestRunner::new(proptest_config(n, file!(), test_name));
    let result = runner.run(&strategy, |input| match bounded(stats, move || target(input, stats)) {
        Ok(_) => Ok(()),
        Err(e) => Err(TestCaseError::fail(e)),
    });
    eprintln!("{}", stats.line(name));
    if let Err(e) = result {
        // Unwound without the panic hook, which would charge it to a case of another target.
        eprintln!("{name} target: {e}");
        std::panic::resume_unwind(Box::new(format!("{name} target failed")));
    }
    n
}

/// Whether a run of `n` cases exercised what the target is for: it reached the replay or
/// the values (`ran`) and met refusals. A target that stopped doing so would pass without
/// testing anything; with fewer cases than this either may not happen by chance.
fn exercised(n: u32, stats: &Stats) -> bool {
    n < 100 || Stats::get(&stats.ran) > 0 && Stats::get(&stats.refused) > 0
}

/// Whether a run of `n` cases met a tensor over the cap that the VM (or the validator)
/// refused as too large, as [`exercised`] asks of the other counters. The sidecar target
/// changes no shapes, so only the trace and builder targets are held to it.
fn met_too_large(n: u32, stats: &Stats) -> bool {
    n < 100 || Stats::get(&stats.too_large) > 0
}

#[test]
fn trace_target() {
    static STATS: Stats = Stats::new();
    let n = fuzz(
        "trace",
        concat!(module_path!(), "::trace_target"),
        2000,
        trace_input::trace_input(),
        &STATS,
        |input, stats| trace_case(input.render(), stats),
    );
    assert!(exercised(n, &STATS) && met_too_large(n, &STATS), "{}", STATS.line("trace"));
}

#[test]
fn sidecar_target() {
    static STATS: Stats = Stats::new();
    let n = fuzz(
        "sidecar",
        concat!(module_path!(), "::sidecar_target"),
        128,
        trace_input::sidecar_input(),
        &STATS,
        sidecar_case,
    );
    assert!(exercised(n, &STATS), "{}", STATS.line("sidecar"));
}

#[test]
fn builder_target() {
    static STATS: Stats = Stats::new();
    let n = fuzz(
        "builder",
        concat!(module_path!(), "::builder_target"),
        2500,
        builder_input::builder_input(),
        &STATS,
        |input, stats| builder_case::run(&input, stats),
    );
    assert!(
        exercised(n, &STATS) && met_too_large(n, &STATS) && Stats::get(&STATS.accepted) > 0,
        "{}",
        STATS.line("builder")
    );
}

/// The harness itself: a panic on a thread other than the case's, and a case that does not
/// finish in time, fail the case (without them every target would pass vacuously on those
/// defects).
mod harness_checks {
    use std::time::Duration;

    use super::harness::{bounded, bounded_within, Stats};

    #[test]
    fn a_panic_on_another_thread_fails_the_case() {
        static STATS: Stats = Stats::new();
        let r = bounded(&STATS, || {
            let _ = std::thread::Builder::new()
                .name("eagervm-worker-x".into())
                .spawn(|| panic!("a planted panic"))
                .map(|h| h.join());
            Ok(())
        });
        let e = r.expect_err("the planted panic is seen");
        assert!(e.contains("eagervm-worker-x") && e.contains("a planted panic"), "{e}");
        // The `panic` op's own panic is the expected one.
        let r = bounded(&STATS, || {
            let _ = std::thread::spawn(|| panic!("panic op: 7")).join();
            Ok(())
        });
        assert_eq!(r, Ok(Some(())));
    }

    #[test]
    fn a_case_past_its_deadline_fails_and_the_target_stops() {
        static STATS: Stats = Stats::new();
        let r = bounded_within(&STATS, Duration::from_millis(50), || {
            std::thread::sleep(Duration::from_millis(500));
            Ok(())
        });
        assert!(r.expect_err("a hang is reported").contains("did not finish"));
        assert_eq!(bounded(&STATS, || Ok(1)), Ok(None), "later cases pass at once");
    }
}

/// Defects the targets found, each kept as a plain test (their inputs are also in
/// `fuzz.proptest-regressions`, which every run replays first).
mod regressions {
    use eagervm::ep::mock::MockConfig;
    use eagervm::prelude::*;

    fn vm() -> VirtualMachine {
        VirtualMachine::new(Config::default().with_mock_devices(1, MockConfig::default())).expect("a VM")
    }

    /// `call_into` with no outputs for an op that makes one was accepted (the output count
    /// was compared only when outputs were given, and a signature cached by `call` let it
    /// through), and the kernel then failed at run time with "missing output 0".
    #[test]
    fn call_into_with_fewer_outputs_than_the_op_makes_is_refused() {
        let vm = vm();
        let relu = vm.op("relu").expect("relu");
        for dev in [DeviceId::CPU, DeviceId::mock(0)] {
            let s = vm.compute_stream(dev).expect("a stream");
            let x = vm.from_slice(&[1.0f32, -1.0], &[2], dev).expect("x");
            // First with the signature never checked, then with it cached by `call`.
            for _ in 0..2 {
                let r = vm.run(|b| b.call_into(relu, &[&x], &[], Attrs::default(), s));
                assert!(matches!(r, Err(Error::InvalidOperands { .. })), "{dev}: {r:?}");
                let y = vm.run(|b| b.call(relu, &[&x], Attrs::default(), s)).expect("relu");
                assert_eq!(y.to_vec::<f32>(), Ok(vec![1.0, 0.0]));
            }
        }
        assert_eq!(vm.sync(), Ok(()), "a refused call emits nothing that could fail");
    }
}

mod regressions_trace {
    use eagervm::trace::{self, parse_str, TraceError, ValidateOptions};

    /// A sidecar slice whose offset plus length passes `u64::MAX` was refused with a
    /// message computed in wrapping arithmetic ("the slice ends at 15"; an overflow panic
    /// in a debug build).
    #[test]
    fn a_sidecar_slice_past_u64_max_is_refused_with_its_true_extent() {
        let text = "eagervm-trace 1\ndevice cpu:0\nstream s0 cpu:0 compute\ntensor t0 f32[4] cpu:0\n\
                    access s0 write t0 file=\"branches.trace.bin\" offset=18446744073709551615 bytes=16 \
                    fnv1a64=0x0000000000000000\n";
        let (mut t, problems) = parse_str("t.trace", text);
        assert!(problems.is_empty(), "{problems:?}");
        t.dir = super::corpus_dir();
        let Err(TraceError::Invalid { diagnostics }) = trace::validate(
            &t,
            &ValidateOptions { max_tensor_bytes: super::TENSOR_CAP, ..ValidateOptions::default() },
        ) else {
            panic!("a slice beyond the file validates");
        };
        let m = &diagnostics[0].message;
        assert!(m.contains("of 16 bytes at offset 18446744073709551615"), "{m}");
        assert_eq!((diagnostics[0].line, diagnostics[0].col), (5, 17));
    }
}
