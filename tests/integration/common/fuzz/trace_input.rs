//! Inputs of the trace targets: the shipped traces of `instructions/` (the corpus), mutated
//! with knowledge of the format, and random bytes.
//!
//! A structure-aware mutation works on a trace's lines and tokens: it drops, duplicates,
//! swaps or moves lines, splices in a line of another trace, replaces a number with one of
//! the values that break arithmetic (0, -1, 2^31, 2^32, 2^63, `u64::MAX`, 2^64, NaN, ...),
//! replaces a token with another dtype, device, stream type, op name, keyword, reference
//! or attribute, truncates the text, or changes bytes. Most mutants are refused by the
//! parser or the validator, which is the point of most of them; the rest replay.
//!
//! A trace written from scratch declares its tensors with a few small shapes, so that
//! calls fit together; one in five declares one tensor over the cap on one tensor's bytes
//! instead (or at its edge), which the validator must refuse.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use proptest::prelude::*;

/// A shipped trace.
#[derive(Debug)]
pub struct Seed {
    /// The file name (`mlp.trace`).
    pub name: String,
    /// Its text.
    pub text: String,
    /// Its sidecar (`mlp.trace.bin`), if it has one.
    pub sidecar: Option<PathBuf>,
}

/// `instructions/`, where the corpus and its sidecars are.
pub fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("instructions")
}

/// Every `instructions/*.trace`, sorted by name (loaded once).
pub fn seeds() -> &'static [Seed] {
    static SEEDS: OnceLock<Vec<Seed>> = OnceLock::new();
    SEEDS.get_or_init(|| {
        let dir = corpus_dir();
        let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
            .expect("instructions/ exists")
            .map(|e| e.expect("a directory entry").path())
            .filter(|p| p.extension().is_some_and(|e| e == "trace"))
            .collect();
        paths.sort();
        paths
            .into_iter()
            .map(|p| {
                let text = std::fs::read_to_string(&p).expect("a shipped trace is UTF-8 text");
                let side = p.with_extension("trace.bin");
                Seed {
                    name: p.file_name().expect("a file").to_string_lossy().into_owned(),
                    text,
                    sidecar: side.is_file().then_some(side),
                }
            })
            .collect()
    })
}

/// Numbers that break arithmetic, as a trace would spell them.
pub const NUMBERS: &[&str] = &[
    "0",
    "1",
    "-1",
    "2",
    "3",
    "255",
    "256",
    "4096",
    "65535",
    "65536",
    "1048576",
    "2147483648",
    "4294967295",
    "4294967296",
    "9223372036854775807",
    "9223372036854775808",
    "18446744073709551615",
    "18446744073709551616",
    "340282366920938463463374607431768211456",
    "NaN",
    "nan",
    "inf",
    "-inf",
    "-0",
    "1e40",
    "1e-45",
    "0x7fc00001",
    "0xffffffff",
];

/// Tokens that may stand in for any token of a line.
pub const WORDS: &[&str] = &[
    // keywords
    "device",
    "stream",
    "tensor",
    "call",
    "record",
    "wait",
    "barrier",
    "release",
    "access",
    "expect",
    "error",
    "read",
    "write",
    "kernel",
    "panic",
    "eagervm-trace",
    // types
    "f32",
    "i64",
    "f64",
    "f32[]",
    "i64[]",
    "f32[0]",
    "f32[2,2]",
    "f32[4294967296,4294967296]",
    "f32[18446744073709551615]",
    "i64[9223372036854775808,2]",
    "f32[2,",
    "f32[,]",
    // devices
    "cpu:0",
    "cpu:1",
    "cpu:65535",
    "mock:0",
    "mock:1",
    "mock:15",
    "mock:16",
    "mock:65535",
    "mock:65536",
    "cuda:0",
    "cuda:1",
    "gpu:0",
    "cpu",
    "mock:-1",
    // stream types
    "compute",
    "h2d",
    "d2h",
    "sideways",
    // ops
    "add",
    "add_bias",
    "copy",
    "fail",
    "fill",
    "matmul",
    "matmul_nt",
    "matmul_tn",
    "mul",
    "noop",
    "relu",
    "relu_grad",
    "scale",
    "sub",
    "sum",
    "sum_rows",
    "frobnicate",
    "add.x",
    "_",
    // references
    "s0",
    "s1",
    "s2",
    "s3",
    "s9",
    "s4294967295",
    "s4294967296",
    "t0",
    "t1",
    "t2",
    "t3",
    "t4294967295",
    "e0",
    "e1",
    "e2",
    "e4294967295",
    "t",
    "s",
    "e",
    "x0",
    // attributes
    "in=",
    "out=",
    "in=t0",
    "in=t0,t0",
    "in=t0,t1,t2",
    "out=t0,t1",
    "in=,",
    "scalar=NaN",
    "scalar=inf",
    "scalar=1e308",
    "scalar=-0",
    "scalar=",
    "fnv1a64=0x0000000000000000",
    "fnv1a64=0x12",
    "offset=18446744073709551615",
    "offset=0",
    "bytes=0",
    "bytes=18446744073709551615",
    "file=\"/nonexistent/x.bin\"",
    "file=\"\"",
    "file=\"mlp.trace.bin\"",
    "op=fail",
    "message=\"x\"",
    // odd text
    "\"",
    "\"\\u{110000}\"",
    "\"\\q\"",
    "#",
    "=",
    "",
    "\u{0}",
    "é",
];

/// One structure-aware change to a trace's text. Indices are taken modulo what they index.
#[derive(Debug, Clone)]
pub enum Mutation {
    /// Drop a line.
    Delete(usize),
    /// Duplicate a line in place.
    Duplicate(usize),
    /// Swap two lines.
    Swap(usize, usize),
    /// Move a line elsewhere.
    Move(usize, usize),
    /// Insert a line of another shipped trace (`seed`, `line`) at `at`.
    Splice { seed: usize, line: usize, at: usize },
    /// Replace the `nth` run of digits on a line with `NUMBERS[value]`.
    Number { line: usize, nth: usize, value: usize },
    /// Replace the `nth` whitespace-separated token of a line with `WORDS[word]`.
    Word { line: usize, nth: usize, word: usize },
    /// Append `WORDS[word]` to a line.
    Append { line: usize, word: usize },
    /// Cut the text at a byte offset.
    Truncate(usize),
    /// Overwrite one byte.
    Byte { at: usize, byte: u8 },
    /// Insert bytes.
    Insert { at: usize, bytes: Vec<u8> },
}

/// A trace target's input.
#[derive(Debug, Clone)]
pub enum TraceInput {
    /// A shipped trace (by its index in [`seeds`]), mutated.
    Mutant { seed: usize, mutations: Vec<Mutation> },
    /// A trace written from scratch ([`Generated`]).
    Generated(Generated),
    /// Random bytes, after a valid header line or on their own.
    Bytes { header: bool, bytes: Vec<u8> },
}

impl TraceInput {
    /// The seed's name, if the input comes from one.
    pub fn seed(&self) -> Option<&'static Seed> {
        match self {
            TraceInput::Mutant { seed, .. } => Some(&seeds()[seed % seeds().len()]),
            TraceInput::Bytes { .. } | TraceInput::Generated(_) => None,
        }
    }

    /// The bytes of the file this input stands for.
    pub fn render(&self) -> Vec<u8> {
        match self {
            TraceInput::Bytes { header, bytes } => {
                let mut out = if *header { b"eagervm-trace 1\n".to_vec() } else { Vec::new() };
                out.extend_from_slice(bytes);
                out
            }
            TraceInput::Mutant { seed, mutations } => {
                let all = seeds();
                let text = &all[seed % all.len()].text;
                mutate(text, mutations)
            }
            TraceInput::Generated(g) => g.render().into_bytes(),
        }
    }
}

/// The devices of a generated trace.
const DEVICES: [&str; 3] = ["cpu:0", "mock:0", "mock:1"];

/// The streams of a generated trace: name, device (index into [`DEVICES`]), type.
const STREAMS: [(&str, usize, &str); 7] = [
    ("s0", 0, "compute"),
    ("s1", 1, "compute"),
    ("s2", 1, "h2d"),
    ("s3", 1, "d2h"),
    ("s4", 2, "compute"),
    ("s5", 2, "h2d"),
    ("s6", 2, "d2h"),
];

/// The shapes of a generated trace's tensors: mostly one, so that calls fit together.
const SHAPES: [&[usize]; 10] =
    [&[2, 2], &[2, 2], &[2, 2], &[2, 2], &[2], &[], &[3, 2], &[2, 3], &[0], &[64, 2]];

/// Shapes of a generated trace's tensor over the cap on one tensor's bytes (64 MiB in the
/// fuzz cases), or at its edge: 128 MiB as `f32`, one `f32` over the cap, 2^64 elements,
/// and two with a zero dimension whose other dimensions overflow (`[0, 2^61]` only as
/// `i64`: as `f32` it is accepted, and holds nothing).
const BIG_SHAPES: [&[usize]; 5] =
    [&[1 << 24, 2], &[(1 << 24) + 1], &[1 << 32, 1 << 32], &[0, 1 << 62], &[0, 1 << 61]];

/// The ops of a generated trace: every registered op, `copy` twice (copies between
/// devices are what most traces are made of).
fn gen_ops() -> Vec<&'static str> {
    let mut ops = eagervm::framework::OpRegistry::with_builtins().names();
    ops.push("copy");
    ops
}

/// Scalars of a generated trace.
const SCALARS: [&str; 9] = ["0", "1", "-1", "0.5", "NaN", "inf", "-inf", "1e308", "-0"];

/// A statement of a generated trace. Indices pick from the tables above, tensors from
/// those on the stream's device where that is what fits (so that many calls validate).
#[derive(Debug, Clone)]
pub enum GenStmt {
    /// `call`.
    Call { op: usize, stream: usize, ins: Vec<usize>, outs: Vec<usize>, scalar: usize },
    /// `record`.
    Record { stream: usize, event: usize, tensors: Vec<usize> },
    /// `wait`.
    Wait { stream: usize, event: usize },
    /// `barrier s0`.
    Barrier,
    /// `release`.
    Release { stream: usize, tensor: usize },
    /// `access s0 read` or `wait`.
    Read { tensor: usize, wait: bool },
    /// `access s0 write` of inline values.
    Write { tensor: usize, value: i32 },
    /// `expect tN` (with a checksum that rarely matches).
    Expect { tensor: usize },
    /// `expect error kernel op=fail ...`.
    ExpectError { scalar: usize },
}

/// A trace written from scratch: the three devices and seven streams, some tensors, then
/// random statements over them.
#[derive(Debug, Clone)]
pub struct Generated {
    /// Per tensor: shape (index into the shapes), whether it is `i64`, device.
    pub tensors: Vec<(usize, bool, usize)>,
    /// One tensor (index) declared with a shape of [`BIG_SHAPES`] (index) instead.
    pub big: Option<(usize, usize)>,
    /// The statements after the declarations.
    pub stmts: Vec<GenStmt>,
}

impl Generated {
    fn render(&self) -> String {
        let mut out = String::from("eagervm-trace 1\n");
        for d in DEVICES {
            out += &format!("device {d}\n");
        }
        for (s, d, ty) in STREAMS {
            out += &format!("stream {s} {} {ty}\n", DEVICES[d]);
        }
        let big =
            self.big.map(|(t, shape)| (t % self.tensors.len().max(1), BIG_SHAPES[shape % BIG_SHAPES.len()]));
        let tensors: Vec<(&[usize], &str, usize)> = self
            .tensors
            .iter()
            .enumerate()
            .map(|(i, &(shape, i64, dev))| {
                let shape = match big {
                    Some((t, big)) if t == i => big,
                    _ => SHAPES[shape % SHAPES.len()],
                };
                (shape, if i64 { "i64" } else { "f32" }, dev % 3)
            })
            .collect();
        for (i, (shape, dtype, dev)) in tensors.iter().enumerate() {
            let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
            out += &format!("tensor t{i} {dtype}[{}] {}\n", dims.join(","), DEVICES[*dev]);
        }
        let on = |dev: usize| -> Vec<usize> {
            let v: Vec<usize> = (0..tensors.len()).filter(|&i| tensors[i].2 == dev).collect();
            if v.is_empty() {
                (0..tensors.len()).collect()
            } else {
                v
            }
        };
        let pick = |pool: &[usize], k: usize| pool.get(k % pool.len().max(1)).map_or(0, |&t| t);
        let list = |pool: &[usize], ks: &[usize]| -> String {
            ks.iter().map(|&k| format!("t{}", pick(pool, k))).collect::<Vec<_>>().join(",")
        };
        let all: Vec<usize> = (0..tensors.len().max(1)).collect();
        // Events are numbered as they are recorded; a wait picks one recorded before it.
        let mut recorded: Vec<usize> = Vec::new();
        for st in &self.stmts {
            let line = match st {
                GenStmt::Call { op, stream, ins, outs, scalar } => {
                    let (s, dev, _) = STREAMS[stream % STREAMS.len()];
                    let ops = gen_ops();
                    let op = ops[op % ops.len()];
                    let here = on(dev);
                    let from = if op == "copy" { &all } else { &here };
                    let mut l = format!("call {s} {op}");
                    // As many inputs as the op takes, mostly (a wrong count is refused).
                    let arity = match op {
                        "fill" => 0,
                        "copy" | "relu" | "scale" | "sum" | "sum_rows" => 1,
                        "noop" | "fail" | "panic" => ins.len(),
                        _ => 2,
                    };
                    let n = if scalar % 8 == 7 { ins.len() } else { arity };
                    let ins: Vec<usize> =
                        (0..n).map(|k| pick(from, ins.get(k).copied().unwrap_or(k))).collect();
                    // Outputs other than the inputs, where there are any: aliasing is refused.
                    let free: Vec<usize> = here.iter().copied().filter(|t| !ins.contains(t)).collect();
                    let free = if free.is_empty() { &here } else { &free };
                    if !ins.is_empty() {
                        l += &format!(" in={}", list(&ins, &(0..ins.len()).collect::<Vec<_>>()));
                    }
                    if !outs.is_empty() {
                        l += &format!(" out={}", list(free, outs));
                    }
                    l + &format!(" scalar={}", SCALARS[scalar % SCALARS.len()])
                }
                GenStmt::Record { stream, event: _, tensors } => {
                    let (s, dev, _) = STREAMS[stream % STREAMS.len()];
                    let ts: Vec<String> =
                        tensors.iter().map(|&k| format!("t{}", pick(&on(dev), k))).collect();
                    recorded.push(recorded.len());
                    format!("record {s} e{} {}", recorded.len() - 1, ts.join(" "))
                }
                GenStmt::Wait { stream, event } => match recorded.get(event % recorded.len().max(1)) {
                    Some(e) => format!("wait {} e{e}", STREAMS[stream % STREAMS.len()].0),
                    None => continue,
                },
                GenStmt::Barrier => "barrier s0".into(),
                GenStmt::Release { stream, tensor } => {
                    let (s, dev, _) = STREAMS[stream % STREAMS.len()];
                    format!("release {s} t{}", pick(&on(dev), *tensor))
                }
                GenStmt::Read { tensor, wait } => {
                    format!("access s0 {} t{}", if *wait { "wait" } else { "read" }, pick(&on(0), *tensor))
                }
                GenStmt::Write { tensor, value } => {
                    let t = pick(&on(0), *tensor);
                    let (shape, dtype) = tensors.get(t).map_or((&[][..], "f32"), |x| (x.0, x.1));
                    // A few values for a tensor of more elements than that (one of
                    // `BIG_SHAPES`), which the trace cannot hold anyway.
                    let n = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d)).filter(|&n| n <= 4096);
                    let n = n.unwrap_or(1);
                    let values: Vec<String> = (0..n).map(|i| (value + i as i32).to_string()).collect();
                    format!("access s0 write t{t} {dtype} {}", values.join(" "))
                }
                GenStmt::Expect { tensor } => {
                    format!("expect t{} fnv1a64=0x{:016x}", pick(&all, *tensor), tensor)
                }
                GenStmt::ExpectError { scalar } => {
                    format!(
                        "expect error kernel op=fail message=\"fail op: {}\"",
                        SCALARS[scalar % SCALARS.len()]
                    )
                }
            };
            out += &line;
            out.push('\n');
        }
        out
    }
}

fn gen_stmt() -> impl Strategy<Value = GenStmt> {
    let i = || any::<usize>();
    let few = || prop::collection::vec(any::<usize>(), 0..3);
    prop_oneof![
        12 => (i(), i(), few(), prop::collection::vec(any::<usize>(), 1..2), i())
            .prop_map(|(op, stream, ins, outs, scalar)| GenStmt::Call { op, stream, ins, outs, scalar }),
        2 => (i(), i(), few(), i())
            .prop_map(|(op, stream, ins, scalar)| GenStmt::Call { op, stream, ins, outs: vec![], scalar }),
        3 => (i(), 0..4usize, few())
            .prop_map(|(stream, event, tensors)| GenStmt::Record { stream, event, tensors }),
        3 => (i(), 0..4usize).prop_map(|(stream, event)| GenStmt::Wait { stream, event }),
        1 => Just(GenStmt::Barrier),
        1 => (i(), i()).prop_map(|(stream, tensor)| GenStmt::Release { stream, tensor }),
        3 => (i(), any::<bool>()).prop_map(|(tensor, wait)| GenStmt::Read { tensor, wait }),
        3 => (i(), -3i32..100).prop_map(|(tensor, value)| GenStmt::Write { tensor, value }),
        1 => i().prop_map(|tensor| GenStmt::Expect { tensor }),
        1 => i().prop_map(|scalar| GenStmt::ExpectError { scalar }),
    ]
}

fn generated() -> impl Strategy<Value = Generated> {
    let tensor = (any::<usize>(), prop::bool::weighted(0.2), 0..3usize);
    let big = prop::option::weighted(0.2, (any::<usize>(), 0..BIG_SHAPES.len()));
    (prop::collection::vec(tensor, 1..10), big, prop::collection::vec(gen_stmt(), 0..16))
        .prop_map(|(tensors, big, stmts)| Generated { tensors, big, stmts })
}

/// Apply `mutations` to `text`: line and token changes first, in order, then byte changes.
pub fn mutate(text: &str, mutations: &[Mutation]) -> Vec<u8> {
    let mut lines: Vec<String> = text.split('\n').map(str::to_string).collect();
    for m in mutations {
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
            Mutation::Move(a, b) if !lines.is_empty() => {
                let l = lines.remove(a % n);
                let at = b % (lines.len() + 1);
                lines.insert(at, l);
            }
            Mutation::Splice { seed, line, at } => {
                let all = seeds();
                let other: Vec<&str> = all[seed % all.len()].text.split('\n').collect();
                let l = other[line % other.len()].to_string();
                lines.insert(at % (lines.len() + 1), l);
            }
            Mutation::Number { line, nth, value } if !lines.is_empty() => {
                let l = &mut lines[line % n];
                let runs = digit_runs(l);
                if !runs.is_empty() {
                    let (a, b) = runs[nth % runs.len()];
                    l.replace_range(a..b, NUMBERS[value % NUMBERS.len()]);
                }
            }
            Mutation::Word { line, nth, word } if !lines.is_empty() => {
                let l = &mut lines[line % n];
                let mut toks: Vec<&str> = l.split(' ').collect();
                let k = nth % toks.len();
                toks[k] = WORDS[word % WORDS.len()];
                *l = toks.join(" ");
            }
            Mutation::Append { line, word } if !lines.is_empty() => {
                let l = &mut lines[line % n];
                l.push(' ');
                l.push_str(WORDS[word % WORDS.len()]);
            }
            _ => {}
        }
    }
    let mut bytes = lines.join("\n").into_bytes();
    for m in mutations {
        match m {
            Mutation::Truncate(at) => bytes.truncate(at % (bytes.len() + 1)),
            Mutation::Byte { at, byte } if !bytes.is_empty() => {
                let i = at % bytes.len();
                bytes[i] = *byte;
            }
            Mutation::Insert { at, bytes: b } => {
                let i = at % (bytes.len() + 1);
                bytes.splice(i..i, b.iter().copied());
            }
            _ => {}
        }
    }
    bytes
}

/// The byte ranges of the runs of ASCII digits in `s`.
fn digit_runs(s: &str) -> Vec<(usize, usize)> {
    let b = s.as_bytes();
    let mut runs = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i].is_ascii_digit() {
            let start = i;
            while i < b.len() && b[i].is_ascii_digit() {
                i += 1;
            }
            runs.push((start, i));
        } else {
            i += 1;
        }
    }
    runs
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let i = || any::<usize>();
    prop_oneof![
        3 => i().prop_map(Mutation::Delete),
        2 => i().prop_map(Mutation::Duplicate),
        2 => (i(), i()).prop_map(|(a, b)| Mutation::Swap(a, b)),
        2 => (i(), i()).prop_map(|(a, b)| Mutation::Move(a, b)),
        2 => (i(), i(), i()).prop_map(|(seed, line, at)| Mutation::Splice { seed, line, at }),
        6 => (i(), i(), i()).prop_map(|(line, nth, value)| Mutation::Number { line, nth, value }),
        5 => (i(), i(), i()).prop_map(|(line, nth, word)| Mutation::Word { line, nth, word }),
        1 => (i(), i()).prop_map(|(line, word)| Mutation::Append { line, word }),
        1 => i().prop_map(Mutation::Truncate),
        2 => (i(), any::<u8>()).prop_map(|(at, byte)| Mutation::Byte { at, byte }),
        1 => (i(), prop::collection::vec(any::<u8>(), 1..16))
            .prop_map(|(at, bytes)| Mutation::Insert { at, bytes }),
    ]
}

/// Inputs of the trace target: mutants of the corpus (a few unchanged, so that whole
/// traces replay in every run), traces written from scratch, and random bytes.
pub fn trace_input() -> impl Strategy<Value = TraceInput> {
    prop_oneof![
        8 => (any::<usize>(), prop::collection::vec(mutation(), 0..5))
            .prop_map(|(seed, mutations)| TraceInput::Mutant { seed, mutations }),
        6 => generated().prop_map(TraceInput::Generated),
        1 => (any::<bool>(), prop::collection::vec(any::<u8>(), 0..300))
            .prop_map(|(header, bytes)| TraceInput::Bytes { header, bytes }),
    ]
}

/// One change to a sidecar's bytes.
#[derive(Debug, Clone)]
pub enum BinMutation {
    /// Overwrite one byte.
    Byte { at: usize, byte: u8 },
    /// Cut the file at an offset.
    Truncate(usize),
    /// Append bytes.
    Extend(Vec<u8>),
    /// Replace the whole file.
    Replace(Vec<u8>),
}

/// A sidecar target's input: a shipped trace with a sidecar, its sidecar's bytes changed,
/// and perhaps one `offset=`/`bytes=`/`fnv1a64=` field of one of its `file=` lines.
#[derive(Debug, Clone)]
pub struct SidecarInput {
    /// Index among the shipped traces that have a sidecar.
    pub seed: usize,
    /// Changes to the sidecar's bytes.
    pub bin: Vec<BinMutation>,
    /// A field of the `nth` `file=` line, and its new value (`NUMBERS` index).
    pub field: Option<(usize, usize, usize)>,
}

pub fn sidecar_input() -> impl Strategy<Value = SidecarInput> {
    let bin = prop_oneof![
        4 => (any::<usize>(), any::<u8>()).prop_map(|(at, byte)| BinMutation::Byte { at, byte }),
        1 => any::<usize>().prop_map(BinMutation::Truncate),
        1 => prop::collection::vec(any::<u8>(), 1..64).prop_map(BinMutation::Extend),
        1 => prop::collection::vec(any::<u8>(), 0..64).prop_map(BinMutation::Replace),
    ];
    let field = prop::option::weighted(0.4, (any::<usize>(), 0..3usize, any::<usize>()));
    (any::<usize>(), prop::collection::vec(bin, 0..3), field).prop_map(|(seed, bin, field)| SidecarInput {
        seed,
        bin,
        field,
    })
}

/// Apply `muts` to a sidecar's bytes.
pub fn mutate_bin(mut bytes: Vec<u8>, muts: &[BinMutation]) -> Vec<u8> {
    for m in muts {
        match m {
            BinMutation::Byte { at, byte } if !bytes.is_empty() => {
                let i = at % bytes.len();
                bytes[i] = *byte;
            }
            BinMutation::Truncate(at) => bytes.truncate(at % (bytes.len() + 1)),
            BinMutation::Extend(b) => bytes.extend_from_slice(b),
            BinMutation::Replace(b) => bytes = b.clone(),
            _ => {}
        }
    }
    bytes
}
