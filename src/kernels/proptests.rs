//! Property tests of the kernels against `reference`: random shapes (0-d, empty and size-1
//! dimensions), broadcasting pairs, views (permuted, stepped, offset, reversed, expanded
//! with stride 0), every dtype, special values (NaN, infinities, -0.0, extreme integers,
//! `bool` bytes other than 0 and 1). Each case runs `compute` directly on the views and
//! compares every element of the output view with the reference, and every storage element
//! outside it with what was there before.

use proptest::prelude::*;

use super::reference::{self as r, Arith, Ref, V};
use super::testing::{compute_raw, storage};
use crate::alloc::Storage;
use crate::ep::DeviceId;
use crate::kernels::*;
use crate::vm::{bf16, f16, Attrs, DType, OpKernel, OutSpecs, Scalar, TensorMeta};

/// How a view lies in its storage: a sub-grid of a contiguous block whose dimensions are
/// laid out in the order `perm` (outermost first), each stepped and started inside, some
/// reversed or expanded (stride 0), after `pad` elements.
#[derive(Debug, Clone)]
struct Layout {
    perm: Vec<usize>,
    steps: Vec<usize>,
    starts: Vec<usize>,
    flip: Vec<bool>,
    expand: Vec<bool>,
    pad: usize,
    tail: usize,
}

fn layout(rank: usize, expand: bool) -> impl Strategy<Value = Layout> {
    let flags = move |p: f64| prop::collection::vec(prop::bool::weighted(p), rank);
    (
        Just((0..rank).collect::<Vec<_>>()).prop_shuffle(),
        prop::collection::vec(prop_oneof![3 => Just(1usize), 1 => 2usize..4], rank),
        prop::collection::vec(0usize..3, rank),
        flags(0.15),
        flags(if expand { 0.2 } else { 0.0 }),
        0usize..4,
        0usize..3,
    )
        .prop_map(|(perm, steps, starts, flip, expand, pad, tail)| Layout {
            perm,
            steps,
            starts,
            flip,
            expand,
            pad,
            tail,
        })
}

/// A view of `shape` and `dtype` laid out as `l`, and the elements its storage needs.
fn view(shape: &[usize], dtype: DType, l: &Layout) -> (TensorMeta, usize) {
    let rank = shape.len();
    let mut strides = vec![0isize; rank];
    let mut offset = l.pad as isize;
    let mut block = 1usize;
    for &d in l.perm.iter().rev() {
        if l.expand[d] {
            continue;
        }
        let extent = shape[d].max(1) * l.steps[d] + l.starts[d];
        strides[d] = (block * l.steps[d]) as isize;
        offset += (l.starts[d] * block) as isize;
        block *= extent;
    }
    if !shape.contains(&0) {
        for d in 0..rank {
            if l.flip[d] && !l.expand[d] {
                offset += (shape[d] as isize - 1) * strides[d];
                strides[d] = -strides[d];
            }
        }
    }
    let meta = TensorMeta::new(shape, dtype, DeviceId::CPU).with_layout(shape, &strides, offset as usize);
    (meta, l.pad + block + l.tail)
}

/// A small xorshift generator: the values of a storage from one drawn seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// The bytes of a float value in `dtype`.
fn float_bytes(dtype: DType, v: f64) -> Vec<u8> {
    match dtype {
        DType::F16 => f16::from_f64(v).to_ne_bytes().to_vec(),
        DType::BF16 => bf16::from_f64(v).to_ne_bytes().to_vec(),
        DType::F32 => (v as f32).to_ne_bytes().to_vec(),
        _ => v.to_ne_bytes().to_vec(),
    }
}

/// `n` random elements of `dtype`: with `specials`, special values often; without, floats
/// of full mantissa and mixed sign and magnitude (so that a sum's order shows in its bits,
/// where one NaN or infinity would hide it).
fn random_bytes(dtype: DType, n: usize, seed: u64, specials: bool) -> Vec<u8> {
    let mut rng = Rng(seed | 1);
    let size = dtype.size();
    let mut out = Vec::with_capacity(n * size);
    for _ in 0..n {
        let x = rng.next();
        let pick = x % 16;
        let bits = rng.next();
        match dtype {
            DType::Bool => out.push(if pick < 13 { (bits & 1) as u8 } else { (bits % 255) as u8 + 1 }),
            DType::U8 | DType::I32 | DType::I64 => {
                let v: i64 = match pick {
                    0 => i64::MIN,
                    1 => i64::MAX,
                    2 => -1,
                    3 => 0,
                    4 => 1,
                    5..=10 => (bits % 21) as i64 - 10,
                    _ => bits as i64,
                };
                out.extend_from_slice(&v.to_ne_bytes()[..size]);
            }
            _ if !specials => {
                let unit = (bits >> 11) as f64 / (1u64 << 53) as f64;
                let v = (unit * 2.0 - 1.0) * 2f64.powi((x % 12) as i32 - 2);
                out.extend_from_slice(&float_bytes(dtype, v));
            }
            _ => {
                let v = match pick {
                    0 => f64::NAN,
                    1 => f64::INFINITY,
                    2 => f64::NEG_INFINITY,
                    3 => 0.0,
                    4 => -0.0,
                    5 => 1e-6 * ((bits % 7) as f64 - 3.0),
                    6 => 60000.0 * ((bits % 3) as f64 - 1.0),
                    7..=11 => (bits % 17) as f64 - 8.0,
                    _ => f64::NAN,
                };
                if pick >= 12 {
                    // Any bit pattern: subnormals, huge values, NaN payloads.
                    out.extend_from_slice(&bits.to_ne_bytes()[..size]);
                } else {
                    out.extend_from_slice(&float_bytes(dtype, v));
                }
            }
        }
    }
    out
}

/// A view with its own storage of random values.
struct Operand {
    meta: TensorMeta,
    data: Storage,
}

impl Operand {
    fn new(shape: &[usize], dtype: DType, l: &Layout, seed: u64) -> Self {
        Operand::with_values(shape, dtype, l, seed, true)
    }

    fn with_values(shape: &[usize], dtype: DType, l: &Layout, seed: u64, specials: bool) -> Self {
        let (meta, elems) = view(shape, dtype, l);
        Operand { meta, data: storage(&random_bytes(dtype, elems, seed, specials)) }
    }

    fn values(&self) -> Ref {
        r::read(&self.meta, &self.data)
    }
}

/// Check that `out` (in its storage) holds `want`, and that every storage element outside
/// the view still holds its bytes from `before`.
fn check_output(op: &str, out: &Operand, before: &[u8], want: &Ref) -> Result<(), TestCaseError> {
    let got = out.values();
    prop_assert_eq!(&got.shape, &want.shape, "{}", op);
    for (k, (g, w)) in got.vals.iter().zip(&want.vals).enumerate() {
        prop_assert!(g.same(*w), "{} element {} of {:?}: got {:?}, want {:?}", op, k, got.shape, g, w);
    }
    let size = out.meta.dtype.size();
    let n: usize = out.meta.shape.iter().product();
    let mut inside = vec![false; before.len() / size];
    for k in 0..n {
        inside[r::element_of(&out.meta, &r::unravel(&out.meta.shape, k))] = true;
    }
    let after = out.data.as_bytes();
    for (e, &ins) in inside.iter().enumerate() {
        if !ins {
            prop_assert_eq!(
                &after[e * size..(e + 1) * size],
                &before[e * size..(e + 1) * size],
                "{} wrote element {} outside its output",
                op,
                e
            );
        }
    }
    Ok(())
}

/// A shape of rank 0 to 4, dimensions 0 to 5 (0 rarely); now and then a matrix larger than
/// the tiles a plan walks transposed operands in.
fn shape() -> impl Strategy<Value = Vec<usize>> {
    prop_oneof![
        30 => prop::collection::vec(prop_oneof![1 => Just(0usize), 3 => Just(1usize), 6 => 2usize..6], 0..=4),
        1 => (65usize..140, 65usize..140).prop_map(|(a, b)| vec![a, b]),
    ]
}

/// A shape that broadcasts to `out`: leading dimensions dropped, others set to 1.
fn broadcast_of(out: Vec<usize>) -> impl Strategy<Value = Vec<usize>> {
    let rank = out.len();
    (0..=rank, prop::collection::vec(prop::bool::weighted(0.25), rank)).prop_map(move |(drop, ones)| {
        out.iter().zip(&ones).skip(drop).map(|(&d, &one)| if one { 1 } else { d }).collect()
    })
}

fn dtype() -> impl Strategy<Value = DType> {
    prop::sample::select(DType::ALL.to_vec())
}

fn scalar() -> impl Strategy<Value = Scalar> {
    prop_oneof![
        prop::sample::select(vec![0.0, -0.0, 2.5, -3.0, 1e10, f64::NAN, f64::INFINITY, 0.1, 300.7])
            .prop_map(Scalar::Float),
        prop::sample::select(vec![0i64, 1, -2, 3, 300, 1 << 40, i64::MIN, i64::MAX]).prop_map(Scalar::Int),
        any::<bool>().prop_map(Scalar::Bool),
    ]
}

/// An elementwise case: the output's shape, the inputs' shapes and every view's layout.
#[derive(Debug, Clone)]
struct Case {
    out: Vec<usize>,
    a: Vec<usize>,
    b: Vec<usize>,
    lo: Layout,
    la: Layout,
    lb: Layout,
    seed: u64,
}

fn case() -> impl Strategy<Value = Case> {
    shape()
        .prop_flat_map(|out| (Just(out.clone()), broadcast_of(out.clone()), broadcast_of(out)))
        .prop_flat_map(|(out, a, b)| {
            let (ro, ra, rb) = (out.len(), a.len(), b.len());
            (Just(out), Just(a), Just(b), layout(ro, false), layout(ra, true), layout(rb, true), any::<u64>())
        })
        .prop_map(|(out, a, b, lo, la, lb, seed)| Case { out, a, b, lo, la, lb, seed })
}

/// Run `kernel` on the case's inputs into its output view (of `out_dtype`), and check the
/// output against `want` computed from the inputs' values; a kernel that refuses the
/// dtype must say so in `infer` too.
fn check_case(
    kernel: &dyn OpKernel,
    attrs: Attrs,
    inputs: &[&Operand],
    out: &Operand,
    admitted: bool,
    want: impl FnOnce(&[Ref]) -> Ref,
) -> Result<(), TestCaseError> {
    let metas: Vec<&TensorMeta> = inputs.iter().map(|o| &o.meta).collect();
    let mut specs = OutSpecs::new();
    let inferred = kernel.infer(&metas, &[&out.meta], &attrs, &mut specs);
    let before = out.data.as_bytes().to_vec();
    let views: Vec<(&TensorMeta, &Storage)> = inputs.iter().map(|o| (&o.meta, &o.data)).collect();
    let result = compute_raw(kernel, attrs, &views, (&out.meta, &out.data));
    if !admitted {
        prop_assert!(inferred.is_err() && result.is_err(), "{} accepted {:?}", kernel.name(), metas);
        prop_assert_eq!(out.data.as_bytes(), &before[..]);
        return Ok(());
    }
    if let Err(e) = result {
        return Err(TestCaseError::fail(format!("{}: {e}", kernel.name())));
    }
    let vals: Vec<Ref> = inputs.iter().map(|o| o.values()).collect();
    check_output(kernel.name(), out, &before, &want(&vals))
}

/// The compute-type value of a scalar argument of an arithmetic op on `dtype`.
fn compute_scalar(s: Scalar, dtype: DType) -> V {
    let v = match s {
        Scalar::Float(f) => V::F(f),
        Scalar::Int(i) => V::I(i),
        Scalar::Bool(b) => V::B(b),
    };
    match dtype {
        DType::F16 | DType::BF16 => r::convert(v, DType::F32),
        d => r::convert(v, d),
    }
}

const BINARY: &[&str] =
    &["add", "sub", "mul", "div", "relu_grad", "eq", "ne", "lt", "le", "gt", "ge", "masked_fill"];

fn kernel(name: &str) -> &'static dyn OpKernel {
    *BUILTINS.iter().find(|k| k.name() == name).expect("a built-in op")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1500, ..ProptestConfig::default() })]

    #[test]
    fn binary_ops_match_the_reference(
        c in case(),
        op in prop::sample::select(BINARY.to_vec()),
        dtype in dtype(),
        s in scalar(),
    ) {
        let is_cmp = ["eq", "ne", "lt", "le", "gt", "ge"].contains(&op);
        let masked = op == "masked_fill";
        let b_dtype = if masked { DType::Bool } else { dtype };
        let out_dtype = if is_cmp { DType::Bool } else { dtype };
        let a = Operand::new(&c.a, dtype, &c.la, c.seed);
        let b = Operand::new(&c.b, b_dtype, &c.lb, c.seed.rotate_left(17));
        let out = Operand::new(&c.out, out_dtype, &c.lo, c.seed.rotate_left(33));
        let admitted = match op {
            "sub" | "relu_grad" => dtype != DType::Bool,
            "div" => dtype.is_floating(),
            _ => true,
        };
        // `masked_fill` keeps the input's shape: its input is the output's shape here.
        let a = if masked { Operand::new(&c.out, dtype, &c.lo, c.seed) } else { a };
        let shape = c.out.clone();
        check_case(kernel(op), Attrs::default().with_value(s), &[&a, &b], &out, admitted, |v| {
            let f = |x: V, y: V| match op {
                "add" => r::arith(Arith::Add, dtype, x, y),
                "sub" => r::arith(Arith::Sub, dtype, x, y),
                "mul" => r::arith(Arith::Mul, dtype, x, y),
                "div" => r::arith(Arith::Div, dtype, x, y),
                "relu_grad" => if y.f() > 0.0 { x } else { r::zero(dtype) },
                "masked_fill" => if y.b() { r::convert(compute_scalar_raw(s), dtype) } else { x },
                cmp => V::B(r::compare(cmp, x, y)),
            };
            r::zip(&shape, out_dtype, &v[0], &v[1], f)
        })?;
    }

    #[test]
    fn unary_ops_match_the_reference(
        c in case(),
        op in prop::sample::select(vec![
            "relu", "scale", "add_scalar", "rsub_scalar", "mul_scalar", "div_scalar", "rdiv_scalar",
            "eq_scalar", "ne_scalar", "lt_scalar", "le_scalar", "gt_scalar", "ge_scalar", "cast", "copy", "fill",
        ]),
        dtype in dtype(),
        to in dtype(),
        s in scalar(),
    ) {
        let is_cmp = op.ends_with("_scalar") && !["add_scalar", "rsub_scalar", "mul_scalar", "div_scalar", "rdiv_scalar"].contains(&op);
        let out_dtype = match op {
            "cast" => to,
            _ if is_cmp => DType::Bool,
            _ => dtype,
        };
        let a = Operand::new(&c.a, dtype, &c.la, c.seed);
        let out = Operand::new(&c.out, out_dtype, &c.lo, c.seed.rotate_left(33));
        let admitted = match op {
            "relu" | "rsub_scalar" => dtype != DType::Bool,
            "div_scalar" | "rdiv_scalar" => dtype.is_floating(),
            _ => true,
        };
        let attrs = Attrs::default().with_value(s).with_dtype(to);
        let inputs: Vec<&Operand> = if op == "fill" { vec![] } else { vec![&a] };
        let shape = c.out.clone();
        let sc = compute_scalar(s, dtype);
        check_case(kernel(op), attrs, &inputs, &out, admitted, |v| {
            if op == "fill" {
                let fill = r::convert(compute_scalar_raw(s), out_dtype);
                return Ref { dtype: out_dtype, shape: shape.clone(), vals: vec![fill; shape.iter().product()] };
            }
            let f = |x: V| match op {
                "relu" => if x.f() < 0.0 { r::zero(dtype) } else { x },
                "scale" | "mul_scalar" => r::arith(Arith::Mul, dtype, x, sc),
                "add_scalar" => r::arith(Arith::Add, dtype, x, sc),
                "rsub_scalar" => r::arith(Arith::Sub, dtype, sc, x),
                "div_scalar" => r::arith(Arith::Div, dtype, x, sc),
                "rdiv_scalar" => r::arith(Arith::Div, dtype, sc, x),
                "cast" => r::convert(x, to),
                "copy" => x,
                cmp => {
                    let cmp = cmp.trim_end_matches("_scalar");
                    let raw = compute_scalar_raw(s);
                    V::B(if dtype.is_floating() {
                        r::compare(cmp, x, r::convert(raw, dtype))
                    } else if let Scalar::Float(f) = s {
                        r::compare(cmp, V::F(x.f()), V::F(f))
                    } else {
                        r::compare(cmp, V::I(x.i()), V::I(raw.i()))
                    })
                }
            };
            r::map(&shape, out_dtype, &v[0], f)
        })?;
    }
}

/// A scalar as a reference value, unconverted.
fn compute_scalar_raw(s: Scalar) -> V {
    match s {
        Scalar::Float(f) => V::F(f),
        Scalar::Int(i) => V::I(i),
        Scalar::Bool(b) => V::B(b),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 500, ..ProptestConfig::default() })]

    /// The output exactly input 0 (and, half the time, input 1 too): the result the
    /// reference gives from the values before the call.
    #[test]
    fn in_place_equals_out_of_place(
        c in case(),
        op in prop::sample::select(vec!["add", "sub", "mul", "div", "relu_grad", "relu", "add_scalar", "scale", "masked_fill", "copy", "eq"]),
        dtype in prop::sample::select(vec![DType::F32, DType::F16, DType::I32, DType::U8, DType::F64, DType::BF16, DType::I64]),
        same_twice in any::<bool>(),
    ) {
        let binary = !["relu", "add_scalar", "scale", "copy"].contains(&op);
        let dtype = match op {
            "div" if !dtype.is_floating() => DType::F32,
            "eq" => DType::Bool,
            _ => dtype,
        };
        let x = Operand::new(&c.out, dtype, &c.lo, c.seed);
        let y_dtype = if op == "masked_fill" { DType::Bool } else { dtype };
        let y = Operand::new(&c.b, y_dtype, &c.lb, c.seed.rotate_left(7));
        let xv = x.values();
        let yv = if same_twice && y_dtype == dtype { xv.clone() } else { y.values() };
        let k = kernel(op);
        let attrs = Attrs::scalar(2.5);
        // The kernel's out-of-place result, into a fresh contiguous tensor.
        let fresh = Operand { meta: TensorMeta::new(&c.out, dtype, DeviceId::CPU), data: storage(&vec![0; x.values().vals.len() * dtype.size()]) };
        let second = if same_twice && y_dtype == dtype { (&x.meta, &x.data) } else { (&y.meta, &y.data) };
        let ins: Vec<(&TensorMeta, &Storage)> = if binary { vec![(&x.meta, &x.data), second] } else { vec![(&x.meta, &x.data)] };
        compute_raw(k, attrs, &ins, (&fresh.meta, &fresh.data)).map_err(TestCaseError::fail)?;
        let before = x.data.as_bytes().to_vec();
        compute_raw(k, attrs, &ins, (&x.meta, &x.data)).map_err(TestCaseError::fail)?;
        let sc = compute_scalar(Scalar::Float(2.5), dtype);
        let want = r::zip(&c.out, dtype, &xv, if binary { &yv } else { &xv }, |a, b| match op {
            "add" => r::arith(Arith::Add, dtype, a, b),
            "sub" => r::arith(Arith::Sub, dtype, a, b),
            "mul" => r::arith(Arith::Mul, dtype, a, b),
            "div" => r::arith(Arith::Div, dtype, a, b),
            "relu_grad" => if b.f() > 0.0 { a } else { r::zero(dtype) },
            "relu" => if a.f() < 0.0 { r::zero(dtype) } else { a },
            "add_scalar" => r::arith(Arith::Add, dtype, a, sc),
            "scale" => r::arith(Arith::Mul, dtype, a, sc),
            "masked_fill" => if b.b() { r::convert(V::F(2.5), dtype) } else { a },
            "copy" => a,
            _ => V::B(r::compare("eq", a, b)),
        });
        check_output(op, &x, &before, &want)?;
        check_output(op, &fresh, fresh.data.as_bytes(), &want)?;
    }

    /// `copy` between two views of one storage, overlapping in any way: the destination gets
    /// the source's values from before the call, and nothing else changes.
    #[test]
    fn copy_within_one_storage_reads_the_old_values(
        shape in shape(),
        dtype in dtype(),
        ls in layout(4, true),
        ld in layout(4, false),
        seed in any::<u64>(),
    ) {
        let rank = shape.len();
        let cut = |l: &Layout| {
            let perm: Vec<usize> = l.perm.iter().copied().filter(|&d| d < rank).collect();
            Layout { perm, steps: l.steps[..rank].to_vec(), starts: l.starts[..rank].to_vec(), flip: l.flip[..rank].to_vec(), expand: l.expand[..rank].to_vec(), pad: l.pad, tail: l.tail }
        };
        let (src, n1) = view(&shape, dtype, &cut(&ls));
        let (dst, n2) = view(&shape, dtype, &cut(&ld));
        let data = storage(&random_bytes(dtype, n1.max(n2), seed, true));
        let out = Operand { meta: dst.clone(), data };
        let old = r::read(&src, &out.data);
        let before = out.data.as_bytes().to_vec();
        compute_raw(&CopyKernel, Attrs::default(), &[(&src, &out.data)], (&dst, &out.data)).map_err(TestCaseError::fail)?;
        check_output("copy", &out, &before, &old)?;
    }

    #[test]
    fn reductions_match_the_reference(
        small in shape(),
        big in (prop::bool::weighted(0.2), 50usize..110, 40usize..90),
        l in layout(4, true),
        lo in layout(1, false),
        dtype in dtype(),
        rows in any::<bool>(),
        specials in prop::bool::weighted(0.1),
        seed in any::<u64>(),
    ) {
        let shape = if big.0 { vec![big.1, big.2] } else if rows { small.iter().copied().chain([2, 3]).take(2).collect() } else { small };
        let rank = shape.len();
        let l = Layout {
            perm: l.perm.iter().copied().filter(|&d| d < rank).collect(),
            steps: l.steps[..rank].to_vec(), starts: l.starts[..rank].to_vec(), flip: l.flip[..rank].to_vec(),
            expand: l.expand[..rank].to_vec(), pad: l.pad, tail: l.tail,
        };
        let x = Operand::with_values(&shape, dtype, &l, seed, specials);
        let sum_dtype = if dtype.is_floating() { dtype } else { DType::I64 };
        let xv = x.values();
        if rows && rank == 2 {
            let out = Operand::new(&shape[1..], sum_dtype, &lo, seed.rotate_left(9));
            let want = Ref { dtype: sum_dtype, shape: shape[1..].to_vec(), vals: r::sum_rows(&xv) };
            check_case(&SumRowsKernel, Attrs::default(), &[&x], &out, true, |_| want)?;
        } else {
            let out = Operand::new(&[], sum_dtype, &layout_0d(), seed.rotate_left(9));
            let want = Ref { dtype: sum_dtype, shape: vec![], vals: vec![r::sum(&xv)] };
            check_case(&SumKernel, Attrs::default(), &[&x], &out, true, |_| want)?;
        }
    }

    #[test]
    fn matmul_matches_the_reference(
        dims in (0usize..7, 0usize..7, 0usize..7),
        big in prop::bool::weighted(0.1),
        variant in 0usize..5,
        la in layout(2, true),
        lb in layout(2, true),
        lo in layout(2, false),
        dtype in dtype(),
        specials in prop::bool::weighted(0.1),
        seed in any::<u64>(),
    ) {
        let (m, k, n) = if big { (64, 64, 64) } else { dims };
        // Which operands are stored transposed, and the kernel and flags that read them so.
        let (k_op, attrs, ta, tb): (&dyn OpKernel, Attrs, bool, bool) = match variant {
            0 => (&MatmulKernel, Attrs::default(), false, false),
            1 => (&MatmulKernel, Attrs::transposed(true, false), true, false),
            2 => (&MatmulKernel, Attrs::transposed(false, true), false, true),
            3 => (&MatmulTnKernel, Attrs::default(), true, false),
            _ => (&MatmulNtKernel, Attrs::default(), false, true),
        };
        let a = Operand::with_values(&if ta { [k, m] } else { [m, k] }, dtype, &la, seed, specials);
        let b = Operand::with_values(&if tb { [n, k] } else { [k, n] }, dtype, &lb, seed.rotate_left(5), specials);
        let out = Operand::new(&[m, n], dtype, &lo, seed.rotate_left(11));
        let admitted = dtype != DType::Bool;
        check_case(k_op, attrs, &[&a, &b], &out, admitted, |v| {
            let av = if ta { r::transpose(&v[0]) } else { v[0].clone() };
            let bv = if tb { r::transpose(&v[1]) } else { v[1].clone() };
            r::matmul(&av, &bv)
        })?;
    }
}

/// The layout of a 0-d output: a lone element after some padding.
fn layout_0d() -> Layout {
    Layout { perm: vec![], steps: vec![], starts: vec![], flip: vec![], expand: vec![], pad: 1, tail: 1 }
}

// ---- The pointwise math ops: their loops over random layouts, against plain references
// of the ops that are exact (the floating math is checked against NumPy in Python).

/// The row-major position in `from` (broadcast to `idx`'s shape) of index `idx`.
fn flat_of(from: &[usize], idx: &[usize]) -> usize {
    let skip = idx.len() - from.len();
    from.iter().zip(&idx[skip..]).fold(0, |flat, (&d, &i)| flat * d + if d == 1 { 0 } else { i })
}

/// NaN-propagating maximum (`max`) or minimum of two values of one dtype.
fn extreme(a: V, b: V, max: bool) -> V {
    match (a, b) {
        (V::F(x), _) if x.is_nan() => a,
        (_, V::F(y)) if y.is_nan() => b,
        // Equal values (`-0.0` and `0.0` too) give the first.
        (V::F(x), V::F(y)) => {
            if (max && x >= y) || (!max && x <= y) {
                a
            } else {
                b
            }
        }
        (V::B(x), V::B(y)) => V::B(if max { x | y } else { x & y }),
        _ => {
            if (max && a.i() >= b.i()) || (!max && a.i() <= b.i()) {
                a
            } else {
                b
            }
        }
    }
}

/// An exact integer op of the pointwise family, in `i128`, wrapped to `dtype`; `None` for
/// a division by zero.
fn int_op(op: &str, dtype: DType, a: i64, b: i64) -> Option<i64> {
    let (x, y) = (i128::from(a), i128::from(b));
    let q = |x: i128, y: i128| {
        let (q, r) = (x / y, x % y);
        if r != 0 && ((r < 0) != (y < 0)) {
            q - 1
        } else {
            q
        }
    };
    let v = match op {
        "pow" if b < 0 => match a {
            1 => 1,
            -1 => 1 - 2 * (b & 1) as i128,
            _ => 0,
        },
        "pow" => {
            let (mut base, mut e, mut acc) = (a, b as u64, 1i64);
            while e > 0 {
                if e & 1 == 1 {
                    acc = acc.wrapping_mul(base);
                }
                base = base.wrapping_mul(base);
                e >>= 1;
            }
            i128::from(acc)
        }
        _ if b == 0 => return None,
        "div_floor" => q(x, y),
        "div_trunc" => x / y,
        "remainder" => x - y * q(x, y),
        "fmod" => x % y,
        other => unreachable!("{other}"),
    };
    Some(r::wrap(v as i64, dtype))
}

const POINTWISE_BINARY: &[&str] = &[
    "maximum",
    "minimum",
    "logical_and",
    "logical_or",
    "logical_xor",
    "pow",
    "div_floor",
    "div_trunc",
    "remainder",
    "fmod",
];

proptest! {
    #![proptest_config(ProptestConfig { cases: 800, ..ProptestConfig::default() })]

    #[test]
    fn pointwise_binary_ops_match_the_reference(
        c in case(),
        op in prop::sample::select(POINTWISE_BINARY.to_vec()),
        dtype in dtype(),
    ) {
        let logical = op.starts_with("logical");
        let arith = !logical && !op.ends_with("imum");
        // The floating forms of `pow` and the divisions are NumPy's to check (Python).
        prop_assume!(!(arith && dtype.is_floating()));
        let out_dtype = if logical { DType::Bool } else { dtype };
        let a = Operand::new(&c.a, dtype, &c.la, c.seed);
        let b = Operand::new(&c.b, dtype, &c.lb, c.seed.rotate_left(17));
        let out = Operand::new(&c.out, out_dtype, &c.lo, c.seed.rotate_left(33));
        let admitted = !(arith && dtype == DType::Bool);
        let n: usize = c.out.iter().product();
        if admitted && op != "pow" && arith && n > 0 && b.values().vals.iter().any(|v| v.i() == 0) {
            let views = [(&a.meta, &a.data), (&b.meta, &b.data)];
            let err = compute_raw(kernel(op), Attrs::default(), &views, (&out.meta, &out.data));
            prop_assert!(err.unwrap_err().contains("integer division by zero"), "{}", op);
            return Ok(());
        }
        check_case(kernel(op), Attrs::default(), &[&a, &b], &out, admitted, |v| {
            r::zip(&c.out, out_dtype, &v[0], &v[1], |x, y| match op {
                "maximum" => extreme(x, y, true),
                "minimum" => extreme(x, y, false),
                "logical_and" => V::B(x.b() && y.b()),
                "logical_or" => V::B(x.b() || y.b()),
                "logical_xor" => V::B(x.b() != y.b()),
                _ => V::I(int_op(op, dtype, x.i(), y.i()).expect("no zero divisor")),
            })
        })?;
    }

    #[test]
    fn where_and_clamp_match_the_reference(
        c in case(),
        clamp in any::<bool>(),
        dtype in dtype(),
    ) {
        // Three inputs: shapes a, b and a again (each its own storage and values).
        let first = if clamp { dtype } else { DType::Bool };
        let x = Operand::new(&c.a, first, &c.la, c.seed);
        let y = Operand::new(&c.b, dtype, &c.lb, c.seed.rotate_left(7));
        let z = Operand::new(&c.a, dtype, &c.la, c.seed.rotate_left(21));
        let out = Operand::new(&c.out, dtype, &c.lo, c.seed.rotate_left(40));
        let (k, admitted): (&dyn OpKernel, bool) =
            if clamp { (&ClampKernel, dtype != DType::Bool) } else { (&WhereKernel, true) };
        check_case(k, Attrs::default(), &[&x, &y, &z], &out, admitted, |v| {
            let n: usize = c.out.iter().product();
            let vals = (0..n)
                .map(|i| {
                    let idx = r::unravel(&c.out, i);
                    let at = |t: &Ref| t.vals[flat_of(&t.shape, &idx)];
                    let (p, q, s) = (at(&v[0]), at(&v[1]), at(&v[2]));
                    if clamp {
                        extreme(extreme(p, q, true), s, false)
                    } else if p.b() {
                        q
                    } else {
                        s
                    }
                })
                .collect();
            Ref { dtype, shape: c.out.clone(), vals }
        })?;
    }

    #[test]
    fn tril_and_triu_match_the_reference(
        c in case(),
        upper in any::<bool>(),
        k in -3i64..4,
        dtype in dtype(),
    ) {
        prop_assume!(c.out.len() >= 2);
        let x = Operand::new(&c.out, dtype, &c.lo, c.seed);
        let out = Operand::new(&c.out, dtype, &c.lo, c.seed.rotate_left(13));
        let attrs = Attrs::default().with_params(&[k], &[]).unwrap();
        let kern: &dyn OpKernel = if upper { &TriuKernel } else { &TrilKernel };
        let rank = c.out.len();
        check_case(kern, attrs, &[&x], &out, true, |v| {
            let vals = v[0]
                .vals
                .iter()
                .enumerate()
                .map(|(i, &e)| {
                    let idx = r::unravel(&c.out, i);
                    let d = idx[rank - 1] as i64 - idx[rank - 2] as i64;
                    if (upper && d >= k) || (!upper && d <= k) { e } else { r::zero(dtype) }
                })
                .collect();
            Ref { dtype, shape: c.out.clone(), vals }
        })?;
    }
}
