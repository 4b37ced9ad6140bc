//! Traces of programs with views (version 3 of the format): recorded, they declare each view
//! with its owner and layout, and replay bit for bit, as recorded and with the
//! synchronisation derived again, on the devices recorded and on the CPU; the validator
//! checks views against their storages, naming line and column.

use eagervm::ep::mock::MockConfig;
use eagervm::framework::{bf16, f16, Element};
use eagervm::prelude::*;
use eagervm::trace::{self, DeviceMap, Recorder, ReplayOptions, TraceError, ValidateOptions};
use proptest::prelude::*;

fn temp(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("eagervm-trace-views-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir.join(name)
}

fn fast_mock() -> MockConfig {
    MockConfig { launch_delay: std::time::Duration::ZERO, ..MockConfig::default() }
}

fn vm() -> VirtualMachine {
    VirtualMachine::new(Config::default().with_mock_devices(1, fast_mock())).unwrap()
}

/// Replay the trace at `path` as recorded, resynchronised on the recorded devices, and
/// resynchronised on cpu:0: every replay checks the `outputs` expected checksums, and reads
/// what the program read (`reads`), byte for byte.
fn replays_bit_for_bit(path: &std::path::Path, outputs: usize, reads: &[Vec<u8>]) -> String {
    let text = std::fs::read_to_string(path).expect("the trace was written");
    let t = trace::load(path).unwrap_or_else(|e| panic!("{e}\n{text}"));
    trace::validate(&t, &Default::default()).unwrap_or_else(|e| panic!("{e}\n{text}"));
    for (resync, device) in
        [(false, DeviceMap::AsRecorded), (true, DeviceMap::AsRecorded), (true, DeviceMap::Cpu)]
    {
        let config = Config { mock: fast_mock(), ..Config::default() };
        let opts = ReplayOptions { resync, device, config, ..Default::default() };
        let r =
            trace::replay(&t, &opts).unwrap_or_else(|e| panic!("replay {resync} {device:?}: {e}\n{text}"));
        assert_eq!(r.checked, outputs, "replay {resync} {device:?}\n{text}");
        let got: Vec<Vec<u8>> =
            r.reads.iter().map(|x| x.result.clone().unwrap_or_else(|e| panic!("{e}\n{text}"))).collect();
        assert_eq!(got, reads, "replay {resync} {device:?}\n{text}");
    }
    text
}

/// 24 values of each dtype, NaNs with payloads, infinities and signed zeros among the floats.
fn values<T: Element>(f: impl Fn(usize) -> T) -> Vec<T> {
    (0..24).map(f).collect()
}

/// Views of a `[4, 6]` tensor of `vals` on `dev`: a transpose, a block, a column, a 0-d view
/// and a flattening; copies out of and into them (in place within one storage too), reads
/// of them, and releases of views before and after their owner's handle. Float and integer
/// dtypes also go through kernels over contiguous operands (`scale`, `add`, `relu`, `fill`),
/// which the builder gives contiguous copies. Returns the tensors whose checksums the trace
/// states, and appends what the program read to `reads`.
fn views_of<T: Element>(
    vm: &VirtualMachine,
    dev: DeviceId,
    vals: &[T],
    reads: &mut Vec<Vec<u8>>,
) -> Vec<Tensor> {
    let s = vm.compute_stream(dev).unwrap();
    let op = |n: &str| vm.op(n).unwrap();
    let numeric = matches!(T::DTYPE, DType::F32 | DType::I64);
    let x = vm.from_slice(vals, &[4, 6], dev).unwrap();
    let xt = x.view_layout(&[6, 4], &[1, 6], 0).unwrap();
    let block_t = x.view_layout(&[3, 2], &[1, 6], 7).unwrap();
    let col5 = x.view_layout(&[4], &[6], 5).unwrap();
    let col0 = x.view_layout(&[4], &[6], 0).unwrap();
    let point = x.view_layout(&[], &[], 23).unwrap();
    let flat = x.view_layout(&[24], &[1], 0).unwrap();
    assert!(flat.is_whole() && !xt.is_whole());
    let z = vm.empty(&[4, 6], T::DTYPE, dev).unwrap();
    let zb = z.view_layout(&[3, 2], &[1, 6], 8).unwrap();
    let (y, q) = vm
        .run(|b| -> eagervm::Result<_> {
            let y = b.call(op("copy"), &[&xt], Attrs::default(), s)?;
            // Into a strided view of another storage, whose first write allocates it whole.
            b.call_into(op("copy"), &[&block_t], &[&zb], Attrs::default(), s)?;
            // Within one storage: column 5 into column 0.
            b.call_into(op("copy"), &[&col5], &[&col0], Attrs::default(), s)?;
            let q = b.call(op("copy"), &[&point], Attrs::default(), s)?;
            Ok((y, q))
        })
        .unwrap();
    let mut outs = vec![y.clone(), q];
    if numeric {
        let one = if T::DTYPE == DType::I64 { Attrs::integer(-3) } else { Attrs::scalar(1.5) };
        let w = vm
            .run(|b| -> eagervm::Result<_> {
                let sc = b.call(op("scale"), &[&block_t], Attrs::scalar(2.0), s)?;
                let w = b.call(op("add"), &[&xt, &y], Attrs::default(), s)?;
                // Writes through views by kernels over contiguous operands: a temporary, then
                // a copy into the view.
                b.call_into(op("relu"), &[&sc], &[&zb], Attrs::default(), s)?;
                b.call_into(op("fill"), &[], &[&col5], one, s)?;
                Ok(w)
            })
            .unwrap();
        outs.push(w);
    }
    reads.push(T::to_bytes(&block_t.to_vec::<T>().unwrap()));
    reads.push(T::to_bytes(&flat.to_vec::<T>().unwrap()));
    // The owner's handle goes first: its storage stays for its views, and its `Release`
    // follows theirs.
    drop((x, xt, block_t, point));
    reads.push(T::to_bytes(&col0.to_vec::<T>().unwrap()));
    drop(zb);
    let pair = vm.from_slice(&vals[..6], &[6], dev).unwrap();
    let odd = pair.view_layout(&[3], &[2], 1).unwrap();
    outs.push(vm.run(|b| b.call(op("copy"), &[&odd], Attrs::default(), s)).unwrap());
    drop(pair);
    drop(odd);
    outs.extend([z, col0, flat, col5]);
    outs
}

/// Record the program of every dtype on `dev`, then replay it bit for bit.
fn record_every_dtype(dev: DeviceId, name: &str) -> String {
    let vm = vm();
    let path = temp(name);
    let rec = Recorder::start(&vm, &path).unwrap();
    let mut reads = Vec::new();
    let mut outs = Vec::new();
    outs.extend(views_of(&vm, dev, &values(|i| i % 3 == 0), &mut reads));
    outs.extend(views_of(&vm, dev, &values(|i| (i * 37) as u8), &mut reads));
    outs.extend(views_of(&vm, dev, &values(|i| i as i32 * -123_457 + 7), &mut reads));
    outs.extend(views_of(&vm, dev, &values(|i| i as i64 * 1_000_000_000_007 - 5), &mut reads));
    let specials = [f32::NAN, f32::from_bits(0x7fc0_0123), f32::INFINITY, -0.0, f32::NEG_INFINITY];
    let float = |i: usize| specials.get(i % 7).copied().unwrap_or(i as f32 * 0.375 - 3.1);
    outs.extend(views_of(&vm, dev, &values(|i| f16::from_f32(float(i))), &mut reads));
    outs.extend(views_of(&vm, dev, &values(|i| bf16::from_f32(float(i))), &mut reads));
    outs.extend(views_of(&vm, dev, &values(float), &mut reads));
    outs.extend(views_of(&vm, dev, &values(|i| float(i) as f64 / 3.0), &mut reads));
    let summary = rec.finish(&vm, &outs.iter().collect::<Vec<_>>(), None).unwrap();
    assert_eq!(summary.expects, outs.len());
    let text = replays_bit_for_bit(&path, outs.len(), &reads);
    assert!(text.starts_with("eagervm-trace 5\n"), "{text}");
    for d in DType::ALL {
        assert!(text.contains(&format!(" {d}[4,6] {}\n", trace::TraceDevice::of(dev))), "{d}\n{text}");
        assert!(text.contains(&format!(" {d}[3,2] strides=1,6 offset=7\n")), "{d}\n{text}");
    }
    assert!(text.contains(" f32[] strides= offset=23\n"), "{text}");
    assert!(text.contains(" int=-3"), "{text}");
    // Written back from what was read, the trace is the same text.
    assert_eq!(trace::load(&path).unwrap().to_text(), text);
    text
}

#[test]
fn views_of_every_dtype_replay_bit_for_bit_on_the_cpu() {
    let text = record_every_dtype(DeviceId::CPU, "views-cpu.trace");
    views_released_before_their_owners(&text);
}

/// In `text`, every `view` of 3 elements at stride 2 (the `odd` view of `views_of`) is
/// released before its owner, which is released too.
fn views_released_before_their_owners(text: &str) {
    let release = |t: &str| {
        let at = text.lines().position(|l| l.starts_with("release ") && l.ends_with(&format!(" {t}")));
        at.unwrap_or_else(|| panic!("no release of {t}\n{text}"))
    };
    let odd: Vec<&str> =
        text.lines().filter(|l| l.starts_with("view ") && l.contains("[3] strides=2 offset=1")).collect();
    assert_eq!(odd.len(), DType::ALL.len(), "{text}");
    for v in odd {
        let (view, owner) = (v.split(' ').nth(1).unwrap(), v.split(' ').nth(2).unwrap());
        assert!(release(view) < release(owner), "{v}\n{text}");
    }
}

#[test]
fn views_of_every_dtype_replay_bit_for_bit_on_the_mock_device() {
    let text = record_every_dtype(DeviceId::mock(0), "views-mock.trace");
    assert!(text.contains("] mock:0\n"), "{text}");
    views_released_before_their_owners(&text);
}

const HEAD: &str = "eagervm-trace 3\ndevice cpu:0\nstream s0 cpu:0 compute\ntensor t0 f32[2,3] cpu:0\n";

/// Every problem of `text` (syntax first, then validation) as (line, column, message).
fn problems(text: &str) -> Vec<(u32, u32, String)> {
    let (t, mut d) = trace::parse_str("v.trace", text);
    if d.is_empty() {
        match trace::validate(&t, &ValidateOptions::default()) {
            Ok(()) => {}
            Err(TraceError::Invalid { diagnostics }) => d = diagnostics,
            Err(e) => panic!("{e}"),
        }
    }
    d.into_iter().map(|d| (d.line, d.col, d.message)).collect()
}

/// `body` after [`HEAD`] has exactly one problem, at `line` and `col`, whose message says
/// `says`.
fn refused(body: &str, line: u32, col: u32, says: &str) {
    let p = problems(&format!("{HEAD}{body}"));
    assert_eq!(p.len(), 1, "{p:?}\n{body}");
    assert_eq!((p[0].0, p[0].1), (line, col), "{p:?}\n{body}");
    assert!(p[0].2.contains(says), "{p:?} lacks `{says}`");
}

#[test]
fn a_view_is_checked_against_its_storage() {
    let fine = "view t1 t0 f32[3,2] strides=1,3 offset=0\nview t2 t0 f32[] strides= offset=5\n\
                view t3 t0 f32[3] strides=-1 offset=2\ncall s0 fill out=t0 scalar=1.0\n\
                tensor t4 f32[3,2] cpu:0\ncall s0 copy in=t1 out=t4\nrelease s0 t1\nrelease s0 t2\n\
                release s0 t3\nrelease s0 t0\n";
    assert_eq!(problems(&format!("{HEAD}{fine}")), []);
    // Element 1 + 2 * 1 + 1 * 3 = 6 of 6.
    refused("view t1 t0 f32[3,2] strides=1,3 offset=1\n", 5, 12, "reaches outside a storage of 6 elements");
    refused("view t1 t0 f32[3,2] strides=1 offset=0\n", 5, 12, "1 strides for 2 dimensions");
    refused("view t1 t9 f32[2] strides=1 offset=0\n", 5, 9, "tensor t9 is not declared");
    refused(
        "view t1 t0 f32[3] strides=1 offset=0\nview t2 t1 f32[2] strides=1 offset=1\n",
        6,
        9,
        "itself a view (of t0)",
    );
    refused(
        "view t1 t0 i64[2] strides=1 offset=0\n",
        5,
        12,
        "view t1 is i64, but t0 (its storage's owner) is f32",
    );
    refused("view t0 t0 f32[2] strides=1 offset=0\n", 5, 6, "declared twice");
    refused("release s0 t0\nview t1 t0 f32[2] strides=1 offset=0\n", 6, 9, "used after its release");
}

/// A tensor that owns its storage in another order than row-major (the output of a
/// pointwise op over a transposed input) declares its strides; they must lay it out densely.
#[test]
fn a_tensor_with_strides_is_dense_and_replays_in_its_order() {
    let head = HEAD.replace("eagervm-trace 3", "eagervm-trace 5");
    let fine = "tensor t1 f32[2,3] cpu:0 strides=1,2
call s0 exp in=t0 out=t1
";
    assert_eq!(problems(&format!("{head}{fine}")), []);
    for strides in ["1,1", "1,3", "2,1", "-1,2", "1"] {
        let body = format!("tensor t1 f32[2,3] cpu:0 strides={strides}\n");
        let p = problems(&format!("{head}{body}"));
        assert_eq!(p.len(), 1, "{strides}: {p:?}");
        assert!(p[0].2.contains("do not lay out [2, 3] densely"), "{strides}: {p:?}");
    }
    // The live program: `exp` of a transposed view makes a transposed output, which the
    // trace declares with its strides and replays bit for bit, read in its logical order.
    let vm = vm();
    let path = temp("strided-owner.trace");
    let rec = Recorder::start(&vm, &path).unwrap();
    let x = vm.from_slice(&[0.5f32, -1.0, 2.0, 0.0, 3.5, -2.5], &[2, 3], DeviceId::CPU).unwrap();
    let xt = x.view_layout(&[3, 2], &[1, 3], 0).unwrap();
    let exp = vm.op("exp").unwrap();
    let y = vm.run(|b| b.call(exp, &[&xt], Attrs::default(), vm.compute_stream(DeviceId::CPU)?)).unwrap();
    assert_eq!(y.meta().strides.as_slice(), &[1, 3], "laid out like its input");
    let got: Vec<f32> = y.to_vec().unwrap();
    let want: Vec<f32> =
        [0.5f32, 0.0, -1.0, 3.5, 2.0, -2.5].iter().map(|v| eagervm::kernels::exp_f32(*v)).collect();
    assert_eq!(got, want);
    let summary = rec.finish(&vm, &[&y], None).unwrap();
    assert_eq!(summary.expects, 1);
    let read: Vec<u8> = got.iter().flat_map(|v| v.to_le_bytes()).collect();
    let text = replays_bit_for_bit(&path, 1, &[read]);
    assert!(text.contains("f32[3,2] cpu:0 strides=1,3\n"), "{text}");
}

/// The layout of a pointwise op's output follows its inputs on every call, whatever calls
/// of the same shapes came before (the inference cache knows shapes, not layouts).
#[test]
fn a_pointwise_layout_does_not_depend_on_earlier_calls() {
    let vm = vm();
    let s = vm.compute_stream(DeviceId::CPU).unwrap();
    let exp = vm.op("exp").unwrap();
    let add = vm.op("add").unwrap();
    let x = vm.from_slice(&[0.5f32, -1.0, 2.0, 0.0, 3.5, -2.5], &[2, 3], DeviceId::CPU).unwrap();
    let c = vm.from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2], DeviceId::CPU).unwrap();
    let xt = x.view_layout(&[3, 2], &[1, 3], 0).unwrap();
    let strides = |t: &Tensor| t.meta().strides.to_vec();
    for _ in 0..3 {
        let a = vm.run(|b| b.call(exp, &[&c], Attrs::default(), s)).unwrap();
        let t = vm.run(|b| b.call(exp, &[&xt], Attrs::default(), s)).unwrap();
        // An owner laid out like a transposed input: its own outputs follow it.
        let tt = vm.run(|b| b.call(exp, &[&t], Attrs::default(), s)).unwrap();
        let ct = vm.run(|b| b.call(add, &[&c, &t], Attrs::default(), s)).unwrap();
        let tc = vm.run(|b| b.call(add, &[&t, &c], Attrs::default(), s)).unwrap();
        assert_eq!(strides(&a), [2, 1]);
        assert_eq!(strides(&t), [1, 3]);
        assert_eq!(strides(&tt), [1, 3]);
        assert_eq!(strides(&ct), [2, 1], "the first input decides");
        assert_eq!(strides(&tc), [1, 3], "the first input decides");
        assert_eq!(ct.to_vec::<f32>().unwrap(), tc.to_vec::<f32>().unwrap());
    }
}

#[test]
fn views_follow_the_builders_rules_for_releases_accesses_and_calls() {
    let v = "view t1 t0 f32[3] strides=1 offset=1\ncall s0 fill out=t0 scalar=1.0\n";
    // The owner's release comes after every view's.
    refused(&format!("{v}release s0 t0\n"), 7, 12, "released while its view t1 (declared at line 5) is live");
    // Host accesses read or write whole storages.
    refused(&format!("{v}access s0 read t1\n"), 7, 16, "not its whole storage");
    refused(&format!("{v}access s0 write t1 f32 1 2 3\n"), 7, 17, "not its whole storage");
    assert_eq!(
        problems(&format!(
            "{HEAD}{v}access s0 wait t1\nview t2 t0 f32[6] strides=1 offset=0\naccess s0 read t2\n"
        )),
        []
    );
    // A kernel over contiguous operands (`noop`: every built-in kernel but the diagnostic
    // ones is strided) gets none of part of a storage.
    refused(&format!("{v}tensor t2 f32[3] cpu:0\ncall s0 noop in=t1 out=t2\n"), 8, 17, "whole storage");
    refused(&format!("{v}call s0 noop out=t1\n"), 7, 18, "whole storage");
    // An output overlapping an input other than element for element, or sharing its
    // storage with a kernel that does not work in place.
    let w = format!("{v}view t2 t0 f32[3] strides=1 offset=0\n");
    refused(&format!("{w}call s0 copy in=t2 out=t1\n"), 8, 24, "overlaps input t2");
    assert_eq!(
        problems(&format!("{HEAD}{v}call s0 copy in=t1 out=t1\n")),
        [],
        "in place, element for element"
    );
    let z = format!("{v}view t2 t0 f32[2] strides=1 offset=4\n");
    refused(&format!("{v}call s0 cast in=t0 out=t0 dtype=f32\n"), 7, 24, "both an input and an output");
    refused(
        &format!("{z}view t3 t0 f32[2] strides=1 offset=0\ncall s0 cast in=t2 out=t3 dtype=f32\n"),
        9,
        24,
        "shares its storage with input t2",
    );
    refused(&format!("{z}call s0 copy in=t1 out=t2,t0\n"), 8, 27, "shares its storage with output t2");
    refused(
        &format!("{v}view t2 t0 f32[3,2] strides=0,1 offset=0\ncall s0 copy in=t1 out=t2\n"),
        8,
        24,
        "more than once",
    );
}

#[test]
fn a_use_through_a_view_is_a_use_of_its_storage_for_synchronisation() {
    let head =
        "eagervm-trace 3\ndevice cpu:0\ndevice mock:0\nstream s0 cpu:0 compute\nstream s1 mock:0 compute\n\
                stream s2 mock:0 d2h\ntensor t0 f32[4] mock:0\nview t1 t0 f32[2] strides=1 offset=2\n\
                tensor t2 f32[2] mock:0\ncall s1 fill out=t2 scalar=2.0\ncall s1 copy in=t2 out=t1\n\
                tensor t3 f32[4] cpu:0\n";
    let p = problems(&format!("{head}call s2 copy in=t0 out=t3\n"));
    assert_eq!(p.len(), 1, "{p:?}");
    assert_eq!((p[0].0, p[0].1), (13, 17), "{p:?}");
    assert!(p[0].2.contains("tensor t0 was last used on s1"), "{p:?}");
    // A record of the view covers its storage.
    assert_eq!(problems(&format!("{head}record s1 e0 t1\nwait s2 e0\ncall s2 copy in=t0 out=t3\n")), []);
    let p = problems(&format!("{head}after s2 s1 t1\nrelease s2 t1\n"));
    assert_eq!(p, [], "`after` names the storage through the view");
}

#[test]
fn version_3_statements_are_refused_in_older_traces() {
    for (v, body, col, what) in [
        (2, "view t1 t0 f32[2] strides=1 offset=0\n", 1, "`view` needs version 3"),
        (2, "tensor t1 bf16[2] cpu:0\n", 11, "dtype `bf16`"),
        (1, "call s0 fill out=t0 int=3\n", 21, "`int=` needs version 3"),
        (2, "call s0 fill out=t0 bool=true\n", 21, "`bool=` needs version 3"),
        (2, "call s0 fill out=t0 dtype=f16\n", 21, "`dtype=` needs version 3"),
        (2, "tensor t1 u8[2] cpu:0\naccess s0 write t1 u8 1 2\n", 11, "dtype `u8`"),
    ] {
        let text = format!("{}{body}", HEAD.replace("eagervm-trace 3", &format!("eagervm-trace {v}")));
        let (_, d) = trace::parse_str("old.trace", &text);
        assert!(!d.is_empty() && d[0].line == 5 && d[0].col == col, "{d:?}\n{text}");
        assert!(d[0].message.contains(what) && d[0].message.contains(&format!("says version {v}")), "{d:?}");
        // The same statements in a version-3 trace are read.
        let (_, d) = trace::parse_str("new.trace", &format!("{HEAD}{body}"));
        assert!(d.is_empty(), "{d:?}");
    }
    // Inline data of a v3 dtype in a v2 trace is refused at the dtype.
    let text = format!("{}access s0 write t0 f16 1 2 3 4 5 6\n", HEAD.replace(" 3\n", " 2\n"));
    let (_, d) = trace::parse_str("old.trace", &text);
    assert_eq!((d[0].line, d[0].col), (5, 20), "{d:?}");
}

#[test]
fn views_round_trip_through_text() {
    let text = format!(
        "{HEAD}view t1 t0 f32[3,2] strides=1,3 offset=0\nview t2 t0 f32[] strides= offset=5\n\
         view t3 t0 f32[3] strides=-1 offset=2\ntensor t4 bf16[2] cpu:0\naccess s0 write t4 bf16 1.5 0x7fc1\n\
         tensor t5 bool[3] cpu:0\naccess s0 write t5 bool 1 0 1\ncall s0 fill out=t0 int=-7\n\
         call s0 fill out=t5 bool=true dtype=u8\nrelease s0 t3\n"
    );
    let (t, d) = trace::parse_str("r.trace", &text);
    assert!(d.is_empty(), "{d:?}");
    // Written back as the current version.
    assert_eq!(t.to_text(), text.replace("eagervm-trace 3", "eagervm-trace 5"));
    let (again, d) = trace::parse_str("r.trace", &t.to_text());
    assert!(d.is_empty());
    assert_eq!(again, t);
    match &t.lines[3].stmt {
        trace::Stmt::View { id, base, dtype, shape, strides, offset, type_col } => {
            assert_eq!((id.id, base.id, *dtype, *offset, *type_col), (1, 0, DType::F32, 0, 12));
            assert_eq!((&shape[..], &strides[..]), (&[3, 2][..], &[1, 3][..]));
        }
        other => panic!("{other:?}"),
    }
    let dtypes = t.dtypes();
    assert_eq!(
        dtypes.iter().map(|c| (c.dtype, c.tensors, c.views)).collect::<Vec<_>>(),
        [(DType::Bool, 1, 0), (DType::BF16, 1, 0), (DType::F32, 1, 3)]
    );
    // Malformed layouts name their column.
    for (bad, col, says) in [
        ("view t1 t0 f32[2] strides=1,x offset=0\n", 29, "stride `x`"),
        ("view t1 t0 f32[2] offset=0 strides=1\n", 19, "expected `strides=`"),
        ("view t1 t0 f32[2] strides=1 offset=-1\n", 29, "offset `-1`"),
        ("view t1 t0 f32[2] strides=1\n", 28, "`offset=`"),
    ] {
        let (_, d) = trace::parse_str("m.trace", &format!("{HEAD}{bad}"));
        assert_eq!(d.len(), 1, "{d:?}");
        assert_eq!((d[0].line, d[0].col), (5, col), "{d:?}");
        assert!(d[0].message.contains(says), "{d:?}");
    }
}

#[test]
fn the_analysis_orders_accesses_by_storage_and_names_views() {
    let text = "eagervm-trace 3\ndevice cpu:0\ndevice mock:0\nstream s0 cpu:0 compute\nstream s1 mock:0 compute\n\
                stream s2 mock:0 d2h\ntensor t0 f32[4] mock:0\nview t1 t0 f32[2] strides=1 offset=2\n\
                tensor t2 f32[2] mock:0\ncall s1 fill out=t2 scalar=2.0\ncall s1 copy in=t2 out=t1\n\
                tensor t3 f32[4] cpu:0\nrecord s1 e0 t1\nwait s2 e0\ncall s2 copy in=t0 out=t3\nrelease s1 t1\n";
    let a = trace::analyze(&trace::parse_str("a.trace", text).0).unwrap();
    // fill -> copy into the view -> record -> wait -> copy of the owner -> release of the
    // view: the write through the view orders the owner's read (an edge per storage), and
    // the view's release (a write of the storage) waits for that read.
    assert_eq!(a.critical_path, 6, "{a:?}");
    assert_eq!(a.dtypes.iter().map(|c| (c.tensors, c.views)).collect::<Vec<_>>(), [(3, 1)]);
    let full = a.full();
    assert!(full.nodes.iter().any(|n| n.single.as_deref() == Some("release t1 (view of t0)")), "{full:?}");
    let dot = full.dot(&Default::default()).text;
    assert!(dot.contains("t1 = view of t0 f32[2]"), "{dot}");
}

/// Layouts over a storage of 12 elements: shape, strides, and the largest offset that keeps
/// the layout inside.
const LAYOUTS: [(&[usize], &[isize], usize); 9] = [
    (&[12], &[1], 0),
    (&[3, 4], &[4, 1], 0),
    (&[4, 3], &[1, 4], 0),
    (&[4], &[1], 8),
    (&[2, 2], &[4, 1], 6),
    (&[3], &[4], 3),
    (&[], &[], 11),
    (&[2, 3], &[1, 4], 2),
    (&[6], &[2], 1),
];

/// One random program over four storages of 12 `f32`s (two on cpu:0, two on mock:0), from
/// `raw`: views of them (views of views among them), fills, copies between views (in place,
/// across storages and across devices), kernels over contiguous operands reading views,
/// reads, and drops of views and owners in any order. Recorded, then replayed bit for bit.
fn random_views(raw: &[(u8, u8, u8, u8)]) {
    let vm = vm();
    let path = temp("random-views.trace");
    let rec = Recorder::start(&vm, &path).unwrap();
    let (cpu, mock) = (DeviceId::CPU, DeviceId::mock(0));
    let op = |n: &str| vm.op(n).unwrap();
    let init = |k: usize| -> Vec<f32> { (0..12).map(|i| (k * 12 + i) as f32 * 0.5 - 9.0).collect() };
    let mut pool: Vec<Tensor> =
        (0..4).map(|k| vm.from_slice(&init(k), &[12], if k < 2 { cpu } else { mock }).unwrap()).collect();
    let mut reads = Vec::new();
    for &(what, a, b, c) in raw {
        let pick = |x: u8| &pool[x as usize % pool.len()];
        let t = pick(a).clone();
        let compute = vm.compute_stream(t.device()).unwrap();
        match what % 8 {
            0 => {
                // The layouts are of a storage of 12 (the tensors made by calls may have fewer).
                if t.storage_owner().unwrap().numel() == 12 {
                    let (shape, strides, max) = LAYOUTS[b as usize % LAYOUTS.len()];
                    pool.push(t.view_layout(shape, strides, c as usize % (max + 1)).unwrap());
                }
            }
            1 => vm
                .run(|bd| bd.call_into(op("fill"), &[], &[&t], Attrs::scalar(f64::from(c) - 100.0), compute))
                .unwrap(),
            2 | 7 => {
                // The next tensor of `t`'s shape from `b` on, `t` itself at the latest.
                let n = pool.len();
                let src = (0..n)
                    .map(|k| &pool[(b as usize + k) % n])
                    .find(|s| s.shape() == t.shape())
                    .unwrap()
                    .clone();
                let stream = match (src.device(), t.device()) {
                    (s, d) if s == d => compute,
                    (s, _) if s.is_host() => vm.stream(mock, StreamType::H2D).unwrap(),
                    _ => vm.stream(mock, StreamType::D2H).unwrap(),
                };
                // Overlapping other than element for element is refused, and nothing is emitted.
                let r = vm.run(|bd| bd.call_into(op("copy"), &[&src], &[&t], Attrs::default(), stream));
                assert!(r.is_ok() || matches!(r, Err(Error::Overlap { .. })), "{r:?}");
            }
            3 => {
                let (name, attrs) = if c % 2 == 0 {
                    ("relu", Attrs::default())
                } else {
                    ("scale", Attrs::scalar(f64::from(c) / 8.0))
                };
                pool.push(vm.run(|bd| bd.call(op(name), &[&t], attrs, compute)).unwrap());
            }
            4 => {
                let other = pick(b).clone();
                if other.shape() == t.shape() && other.device() == t.device() {
                    pool.push(
                        vm.run(|bd| bd.call(op("add"), &[&t, &other], Attrs::default(), compute)).unwrap(),
                    );
                }
            }
            5 => reads.push(f32::to_bytes(&t.to_vec::<f32>().unwrap())),
            _ => {
                if pool.len() > 1 {
                    pool.remove(a as usize % pool.len());
                }
            }
        }
    }
    let summary = rec.finish(&vm, &pool.iter().collect::<Vec<_>>(), None).unwrap();
    assert_eq!(summary.expects, pool.len());
    drop(pool);
    replays_bit_for_bit(&path, summary.expects, &reads);
}

proptest! {
    #![proptest_config(crate::common::proptest_config(48))]
    #[test]
    fn random_programs_with_views_replay_bit_for_bit(raw in prop::collection::vec(any::<(u8, u8, u8, u8)>(), 1..64)) {
        random_views(&raw);
    }
}

/// The program of `instructions/views.trace`: views of host tensors of three dtypes (a
/// transpose, a column, every other element, a diagonal, one element) copied out and
/// written through, the transposed copy taken through `mock:0`'s streams and back. Views
/// go to `copy` alone, which takes every layout, so that the trace does not depend on
/// which other kernels do.
fn shipped_views_program(vm: &VirtualMachine) -> eagervm::Result<Vec<Tensor>> {
    let (cpu, gpu) = (DeviceId::CPU, DeviceId::mock(0));
    let (s, g) = (vm.compute_stream(cpu)?, vm.compute_stream(gpu)?);
    let (h2d, d2h) = (vm.stream(gpu, StreamType::H2D)?, vm.stream(gpu, StreamType::D2H)?);
    let (copy, fill, relu, scale) = (vm.op("copy")?, vm.op("fill")?, vm.op("relu")?, vm.op("scale")?);
    let x = vm.from_slice(&[1.0f32, -2.0, 3.0, -4.0, 5.0, -6.0], &[2, 3], cpu)?;
    let xt = x.view_layout(&[3, 2], &[1, 3], 0)?;
    let col = x.view_layout(&[2], &[3], 2)?;
    let h = vm.from_slice(&[1.5f32, -2.0, f32::NAN, 3.0].map(bf16::from_f32), &[4], cpu)?;
    let odd = h.view_layout(&[2], &[2], 1)?;
    let first = h.view_layout(&[], &[], 0)?;
    let n = vm.from_slice(&[1i64, 2, 3, 4], &[2, 2], cpu)?;
    let diag = n.view_layout(&[2], &[3], 0)?;
    vm.run(|b| {
        let t = b.call(copy, &[&xt], Attrs::default(), s)?;
        let on_gpu = vm.empty(&[3, 2], DType::F32, gpu)?;
        b.call_into(copy, &[&t], &[&on_gpu], Attrs::default(), h2d)?;
        let r = b.call(relu, &[&on_gpu], Attrs::default(), g)?;
        let back = vm.empty(&[3, 2], DType::F32, cpu)?;
        b.call_into(copy, &[&r], &[&back], Attrs::default(), d2h)?;
        let c = vm.empty(&[2], DType::F32, cpu)?;
        b.call_into(fill, &[], &[&c], Attrs::scalar(-1.5), s)?;
        b.call_into(copy, &[&c], &[&col], Attrs::default(), s)?;
        let o = b.call(copy, &[&odd], Attrs::default(), s)?;
        let d = b.call(copy, &[&diag], Attrs::default(), s)?;
        let e = b.call(scale, &[&d], Attrs::scalar(3.0), s)?;
        let k = vm.empty(&[2], DType::I64, cpu)?;
        b.call_into(fill, &[], &[&k], Attrs::integer(-7), s)?;
        b.call_into(copy, &[&k], &[&diag], Attrs::default(), s)?;
        Ok(vec![back, o, e, x.clone(), n.clone(), first.clone()])
    })
}

/// `instructions/views.trace` is what the recorder writes for [`shipped_views_program`]
/// (`EAGERVM_WRITE_SHIPPED=1` writes it there).
#[test]
fn the_shipped_views_trace_is_what_the_recorder_writes() {
    let vm = vm();
    let path = temp("views.trace");
    let rec = Recorder::start(&vm, &path).unwrap();
    let outs = shipped_views_program(&vm).unwrap();
    let summary = rec.finish(&vm, &outs.iter().collect::<Vec<_>>(), None).unwrap();
    assert_eq!(summary.expects, outs.len(), "the view `first`, which no instruction used, too");
    let text = std::fs::read_to_string(&path).unwrap();
    let shipped = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("instructions/views.trace");
    if std::env::var_os("EAGERVM_WRITE_SHIPPED").is_some_and(|v| v == "1") {
        std::fs::write(&shipped, &text).unwrap();
    }
    assert_eq!(std::fs::read_to_string(&shipped).unwrap(), text);
    replays_bit_for_bit(&path, outs.len(), &[]);
}
