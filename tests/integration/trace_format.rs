//! The trace parser and validator on bad input: every problem is reported with its line and
//! column, all of them at once, and no input makes them panic.

use eagervm::trace::{self, parse_str, Diagnostic, ValidateOptions};
use proptest::prelude::*;

const VALID: &str = include_str!("../../instructions/demo.trace");

fn problems(text: &str, resync: bool) -> Vec<Diagnostic> {
    let (t, mut d) = parse_str("t.trace", text);
    if d.is_empty() {
        if let Err(trace::TraceError::Invalid { diagnostics }) =
            trace::validate(&t, &ValidateOptions { resync, ..Default::default() })
        {
            d = diagnostics;
        }
    }
    d
}

/// (line, column, a word the message must contain) for each problem, in order.
fn assert_problems(text: &str, want: &[(u32, u32, &str)]) {
    let d = problems(text, false);
    let got: Vec<(u32, u32)> = d.iter().map(|d| (d.line, d.col)).collect();
    let exp: Vec<(u32, u32)> = want.iter().map(|w| (w.0, w.1)).collect();
    assert_eq!(got, exp, "{d:#?}");
    for (d, w) in d.iter().zip(want) {
        assert!(d.message.contains(w.2), "`{}` should mention `{}`", d.message, w.2);
    }
}

const HEAD: &str = "eagervm-trace 1\ndevice cpu:0\ndevice mock:0\nstream s0 cpu:0 compute\nstream s1 mock:0 compute\nstream s2 mock:0 h2d\n";

/// A copy with no operands once made the validator index an empty list (found by the
/// mutation test below); it is an operand error like any other.
#[test]
fn a_copy_without_operands_is_an_operand_error() {
    assert_problems(&format!("{HEAD}call s0 copy\n"), &[(7, 9, "copy")]);
}

#[test]
fn the_shipped_demo_trace_is_valid() {
    assert!(problems(VALID, false).is_empty());
}

#[test]
fn every_semantic_problem_is_reported_with_line_and_column() {
    let text = format!(
        "{HEAD}\
         tensor t0 f32[2,3] cpu:0\n\
         tensor t1 f32[2,3] mock:0\n\
         call s1 frobnicate in=t1 out=t1\n\
         call s1 relu in=t9 out=t1\n\
         tensor t2 f32[3,3] mock:0\n\
         call s1 relu in=t1 out=t2\n\
         call s1 add in=t0,t1 out=t2\n\
         wait s1 e5\n\
         release s1 t1\n\
         call s1 copy in=t1 out=t2\n\
         stream s3 mock:7 compute\n\
         tensor t0 i64[] cpu:0\n\
         access s1 read t2\n"
    );
    assert_problems(
        &text,
        &[
            (9, 9, "unknown op `frobnicate`"),
            (10, 17, "t9 is not declared"),
            (12, 24, "produces f32[2, 3]"),
            (13, 16, "t0 is on cpu:0"),
            (14, 9, "waited on before it is recorded"),
            (16, 17, "after its release at line 15"),
            (17, 1, "mock:7 is not declared"),
            (18, 8, "declared twice"),
            (19, 8, "host accesses run on the host stream"),
        ],
    );
}

#[test]
fn a_call_with_more_inputs_than_an_instruction_holds_is_reported() {
    let ins = vec!["t0"; 256].join(",");
    let text = format!("{HEAD}tensor t0 f32[] cpu:0\ntensor t1 f32[] cpu:0\ncall s0 noop in={ins} out=t1\n");
    assert_problems(&text, &[(9, 9, "at most 255")]);
    let ins = vec!["t0"; 255].join(",");
    let text = format!("{HEAD}tensor t0 f32[] cpu:0\ntensor t1 f32[] cpu:0\ncall s0 noop in={ins} out=t1\n");
    assert!(problems(&text, false).iter().all(|d| !d.message.contains("at most")));
}

#[test]
fn cross_stream_uses_need_synchronisation() {
    let text = format!(
        "{HEAD}\
         tensor t0 f32[2] cpu:0\n\
         tensor t1 f32[2] mock:0\n\
         access s0 write t0 f32 1 2\n\
         call s2 copy in=t0 out=t1\n\
         tensor t2 f32[2] mock:0\n\
         call s1 relu in=t1 out=t2\n"
    );
    assert_problems(&text, &[(12, 17, "no synchronisation (expected `record s2 eN t1` then `wait s1 eN`")]);
    assert!(problems(&text, true).is_empty(), "with --resync the builder derives the sync");
    let synced = text.replace("call s1 relu", "record s2 e0 t1\nwait s1 e0\ncall s1 relu");
    assert!(problems(&synced, false).is_empty(), "{:?}", problems(&synced, false));
    // A wait on another device's event, or on the stream's own, is refused.
    let own = text.replace("call s1 relu", "record s2 e0 t1\nwait s2 e0\ncall s1 relu");
    assert_eq!(problems(&own, false).len(), 2);
}

#[test]
fn syntax_problems_on_many_lines_are_all_reported() {
    let text = "eagervm-trace 1\ndevice gpu:0\nstream s0\ntensor t0 f32[2,x] cpu:0\ncall s0 add in=t0 out=t1 scalar=abc\naccess s0 write t0 f32 1 zz\nexpect t0 fnv1a64=0x12\nrecord s0 \"unterminated\n";
    let d = problems(text, false);
    let lines: Vec<u32> = d.iter().map(|d| d.line).collect();
    assert_eq!(lines, [2, 3, 4, 5, 6, 7, 8], "{d:#?}");
    for d in &d {
        assert!(d.col >= 1);
        assert!(d.to_string().starts_with(&format!("t.trace:{}:{}: ", d.line, d.col)));
    }
}

#[test]
fn load_reports_files_and_encodings() {
    let e = trace::load(std::path::Path::new("/nonexistent/x.trace")).unwrap_err();
    assert!(e.to_string().contains("/nonexistent/x.trace"), "{e}");
    let p = std::env::temp_dir().join(format!("eagervm-bad-utf8-{}.trace", std::process::id()));
    std::fs::write(&p, b"eagervm-trace 1\ndevice cpu:0\n\xff\xfe\n").unwrap();
    match trace::load(&p).unwrap_err() {
        trace::TraceError::Invalid { diagnostics } => {
            assert_eq!((diagnostics[0].line, diagnostics[0].col), (3, 1))
        }
        e => panic!("{e}"),
    }
    std::fs::remove_file(&p).ok();
}

/// A mutation of the valid trace's lines.
#[derive(Debug, Clone)]
enum Mutation {
    Delete(usize),
    Duplicate(usize),
    Swap(usize, usize),
    Byte(usize, u8),
    Insert(usize, String),
}

fn mutate(text: &str, muts: &[Mutation]) -> Vec<u8> {
    let mut lines: Vec<Vec<u8>> = text.lines().map(|l| l.as_bytes().to_vec()).collect();
    for m in muts {
        let n = lines.len().max(1);
        match m {
            Mutation::Delete(i) if !lines.is_empty() => {
                lines.remove(i % n);
            }
            Mutation::Duplicate(i) if !lines.is_empty() => {
                let l = lines[i % n].clone();
                lines.insert(i % n, l);
            }
            Mutation::Swap(a, b) if !lines.is_empty() => lines.swap(a % n, b % n),
            Mutation::Byte(at, b) => {
                let mut all = lines.join(&b'\n');
                if !all.is_empty() {
                    let i = at % all.len();
                    all[i] = *b;
                }
                lines = all.split(|&c| c == b'\n').map(|l| l.to_vec()).collect();
            }
            Mutation::Insert(i, s) => lines.insert(i % (lines.len() + 1), s.as_bytes().to_vec()),
            _ => {}
        }
    }
    lines.join(&b'\n')
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        any::<usize>().prop_map(Mutation::Delete),
        any::<usize>().prop_map(Mutation::Duplicate),
        (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Mutation::Swap(a, b)),
        (any::<usize>(), any::<u8>()).prop_map(|(a, b)| Mutation::Byte(a, b)),
        (any::<usize>(), "[a-z0-9 =,.\"\\[\\]:#-]{0,30}").prop_map(|(a, s)| Mutation::Insert(a, s)),
    ]
}

/// Parse and validate; every problem must name a line of the input (or the line after it).
fn check_located(bytes: &[u8]) {
    let text = String::from_utf8_lossy(bytes);
    let n_lines = text.split('\n').count() as u32;
    let d = problems(&text, false);
    for d in &d {
        assert!(d.line >= 1 && d.line <= n_lines + 1, "{d} (input has {n_lines} lines)");
        assert!(d.col >= 1, "{d}");
    }
    let (t, pd) = parse_str("t.trace", &text);
    if pd.is_empty() && trace::validate(&t, &ValidateOptions { resync: true, ..Default::default() }).is_ok() {
        trace::analyze(&t).expect("a valid trace analyses");
    }
}

proptest! {
    #![proptest_config(crate::common::proptest_config(600))]

    #[test]
    fn mutated_traces_never_panic_and_errors_carry_a_line(muts in prop::collection::vec(mutation(), 1..6)) {
        check_located(&mutate(VALID, &muts));
    }

    #[test]
    fn mutated_traces_that_validate_replay_without_panicking(muts in prop::collection::vec(mutation(), 1..3)) {
        let text = String::from_utf8_lossy(&mutate(VALID, &muts)).into_owned();
        let (t, d) = parse_str("t.trace", &text);
        for resync in [false, true] {
            if d.is_empty() && trace::validate(&t, &ValidateOptions { resync, ..Default::default() }).is_ok() {
                let opts = trace::ReplayOptions { resync, ..Default::default() };
                // Ok, or an error that names a place: never a panic or a hang.
                if let Err(e) = trace::replay(&t, &opts) {
                    prop_assert!(e.to_string().starts_with("t.trace:"), "{}", e);
                }
            }
        }
    }

    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..400)) {
        check_located(&bytes);
        let mut with_header = b"eagervm-trace 1\n".to_vec();
        with_header.extend_from_slice(&bytes);
        check_located(&with_header);
    }

    #[test]
    fn random_statements_never_panic(lines in prop::collection::vec("(device|stream|tensor|call|record|wait|barrier|release|access|expect) [a-z0-9 =,.\"\\[\\]:]{0,40}", 0..20)) {
        let text = format!("eagervm-trace 1\n{}", lines.join("\n"));
        check_located(text.as_bytes());
    }
}

#[test]
fn an_after_synchronises_a_cross_stream_use_and_names_its_last_use() {
    let head = HEAD.replace("eagervm-trace 1", "eagervm-trace 2");
    let text = format!(
        "{head}\
         tensor t0 f32[2] cpu:0\n\
         tensor t1 f32[2] mock:0\n\
         access s0 write t0 f32 1 2\n\
         call s2 copy in=t0 out=t1\n\
         tensor t2 f32[2] mock:0\n\
         call s1 relu in=t1 out=t2\n"
    );
    assert_problems(&text, &[(12, 17, "or `after s1 s2 t1`, before this")]);
    let ordered = text.replace("call s1 relu", "after s1 s2 t1\ncall s1 relu");
    assert!(problems(&ordered, false).is_empty(), "{:?}", problems(&ordered, false));
    // From a device to the host, as well; and it is spent by the use it synchronises.
    let host = format!("{ordered}tensor t3 f32[2] cpu:0\ncall s0 copy in=t2 out=t3\n");
    assert_problems(&host, &[(15, 17, "expected `record s1 eN t2`, or `after s0 s1 t2`")]);
    let host = host.replace("call s0 copy", "after s0 s1 t2\ncall s0 copy");
    assert!(problems(&host, false).is_empty(), "{:?}", problems(&host, false));
    let again = format!("{host}call s2 copy in=t0 out=t1\n");
    assert_problems(&again, &[(17, 24, "t1 was last used on s1 and is used on s2")]);
    // An `after` must name the stream of the tensor's last use, and two streams.
    let wrong = text.replace(
        "call s1 relu",
        "after s1 s0 t1\nafter s1 s2 t2\nafter s1 s1 t1\nafter s9 s2 t1\ncall s1 relu",
    );
    assert_problems(
        &wrong,
        &[
            (12, 13, "t1 was last used on s2, not on s0"),
            (13, 13, "t2 has not been used yet"),
            (14, 1, "both are s1"),
            (15, 7, "stream s9 is not declared"),
            (16, 17, "no synchronisation"),
        ],
    );
    // Version 1 has no `after`.
    let v1 = ordered.replace("eagervm-trace 2", "eagervm-trace 1");
    assert_problems(&v1, &[(12, 1, "version 2")]);
}
