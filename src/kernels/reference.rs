//! A reference for the kernels' tests: every op written the plain way, over the logical
//! values of tensors (row-major `Vec`s of `V`), with the index arithmetic spelled out and
//! the rounding done by a separate implementation of round-to-nearest-even.

use crate::alloc::Storage;
use crate::vm::{bf16, f16, read_element, DType, Scalar, TensorMeta};

/// One value: a boolean, an integer (`u8`, `i32`, `i64`, exact) or a float (any float
/// dtype's value, exact in `f64`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum V {
    B(bool),
    I(i64),
    F(f64),
}

impl V {
    pub(crate) fn f(self) -> f64 {
        match self {
            V::B(b) => f64::from(u8::from(b)),
            V::I(i) => i as f64,
            V::F(f) => f,
        }
    }

    pub(crate) fn i(self) -> i64 {
        match self {
            V::B(b) => i64::from(b),
            V::I(i) => i,
            V::F(f) => f as i64,
        }
    }

    pub(crate) fn b(self) -> bool {
        match self {
            V::B(b) => b,
            V::I(i) => i != 0,
            V::F(f) => f != 0.0,
        }
    }

    /// Equal as test results: floats bit for bit (the sign of zero too), any NaN to any NaN.
    pub(crate) fn same(self, other: V) -> bool {
        match (self, other) {
            (V::F(a), V::F(b)) => a.to_bits() == b.to_bits() || a.is_nan() && b.is_nan(),
            (a, b) => a == b,
        }
    }
}

/// A tensor's logical values, row-major.
#[derive(Debug, Clone)]
pub(crate) struct Ref {
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub vals: Vec<V>,
}

/// The index of flat position `flat` of `shape`, row-major.
pub(crate) fn unravel(shape: &[usize], mut flat: usize) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        idx[d] = flat % shape[d];
        flat /= shape[d];
    }
    idx
}

/// The storage element of index `idx` of a view.
pub(crate) fn element_of(meta: &TensorMeta, idx: &[usize]) -> usize {
    let off =
        meta.offset as isize + idx.iter().zip(&meta.strides).map(|(&i, &s)| i as isize * s).sum::<isize>();
    usize::try_from(off).expect("a view inside its storage")
}

/// The flat position in `from` (a shape that broadcasts to `idx`'s) of output index `idx`.
fn broadcast_flat(from: &[usize], idx: &[usize]) -> usize {
    let skip = idx.len() - from.len();
    from.iter().zip(&idx[skip..]).fold(0, |flat, (&d, &i)| flat * d + if d == 1 { 0 } else { i })
}

fn decode(dtype: DType, s: Scalar) -> V {
    match (dtype, s) {
        (DType::Bool, Scalar::Bool(b)) => V::B(b),
        (_, Scalar::Int(i)) => V::I(i),
        (_, Scalar::Float(f)) => V::F(f),
        (_, Scalar::Bool(b)) => V::B(b),
    }
}

/// The logical values of a view, read element by element from its storage.
pub(crate) fn read(meta: &TensorMeta, data: &Storage) -> Ref {
    let n: usize = meta.shape.iter().product();
    let vals = (0..n)
        .map(|k| {
            let e = element_of(meta, &unravel(&meta.shape, k));
            decode(meta.dtype, read_element(meta.dtype, data.as_bytes(), e).expect("an element inside"))
        })
        .collect();
    Ref { dtype: meta.dtype, shape: meta.shape.to_vec(), vals }
}

/// `x` rounded to nearest, ties to even, in a binary format of `p` significant bits,
/// smallest normal exponent `emin` and largest finite value `max` (overflow to infinity).
fn round_format(x: f64, p: i32, emin: i32, max: f64) -> f64 {
    if x == 0.0 || !x.is_finite() {
        return x;
    }
    let e = (x.abs().log2().floor() as i32).max(emin);
    // log2 may be off by one near powers of two: settle the exponent exactly.
    let e = if 2f64.powi(e) > x.abs() { (e - 1).max(emin) } else { e };
    let e = if e < 1023 && 2f64.powi(e + 1) <= x.abs() { e + 1 } else { e };
    let q = e - (p - 1);
    let scaled = x.abs() * 2f64.powi(-q); // a power-of-two scaling: exact
    let y = scaled.round_ties_even() * 2f64.powi(q);
    if y > max {
        f64::INFINITY.copysign(x)
    } else {
        y.copysign(x)
    }
}

const F16_MAX: f64 = 65504.0;
const BF16_MAX: f64 = 3.3895313892515355e38;

/// A value converted to `to` by the conversion rule (`docs/ops.md`).
pub(crate) fn convert(v: V, to: DType) -> V {
    match to {
        DType::Bool => V::B(v.b()),
        DType::U8 | DType::I32 | DType::I64 => V::I(match v {
            V::F(f) => match to {
                DType::U8 => i64::from(f as u8),
                DType::I32 => i64::from(f as i32),
                _ => f as i64,
            },
            _ => wrap(v.i(), to),
        }),
        // To `f16` and `bf16` through a rounded `f32`, as PyTorch converts.
        DType::F16 | DType::BF16 => V::F(match v {
            V::F(f) => round_float(f64::from(f as f32), to),
            V::I(i) => round_float(f64::from(i as f32), to),
            V::B(b) => f64::from(u8::from(b)),
        }),
        _ => V::F(match v {
            V::F(f) => round_float(f, to),
            V::I(i) => match to {
                DType::F32 => f64::from(i as f32),
                _ => i as f64,
            },
            V::B(b) => f64::from(u8::from(b)),
        }),
    }
}

/// `f` rounded once to the float dtype `to`.
pub(crate) fn round_float(f: f64, to: DType) -> f64 {
    match to {
        DType::F16 => round_format(f, 11, -14, F16_MAX),
        DType::BF16 => round_format(f, 8, -126, BF16_MAX),
        DType::F32 => f64::from(f as f32),
        _ => f,
    }
}

/// An integer wrapped to the integer dtype `to`.
pub(crate) fn wrap(i: i64, to: DType) -> i64 {
    match to {
        DType::U8 => i64::from(i as u8),
        DType::I32 => i64::from(i as i32),
        _ => i,
    }
}

/// A binary arithmetic op, as the kernels name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Arith {
    Add,
    Sub,
    Mul,
    Div,
}

/// `a op b` for values of `dtype`: integers wrap, `bool` adds as `or` and multiplies as
/// `and`, `f32`, `f16` and `bf16` compute in `f32` and round once, `f64` in `f64`.
pub(crate) fn arith(op: Arith, dtype: DType, a: V, b: V) -> V {
    match dtype {
        DType::Bool => V::B(match op {
            Arith::Add => a.b() | b.b(),
            Arith::Mul => a.b() & b.b(),
            _ => panic!("{op:?} of bools"),
        }),
        DType::U8 | DType::I32 | DType::I64 => {
            let (x, y) = (a.i(), b.i());
            V::I(wrap(
                match op {
                    Arith::Add => x.wrapping_add(y),
                    Arith::Sub => x.wrapping_sub(y),
                    Arith::Mul => x.wrapping_mul(y),
                    Arith::Div => panic!("div of integers"),
                },
                dtype,
            ))
        }
        DType::F64 => {
            let (x, y) = (a.f(), b.f());
            V::F(match op {
                Arith::Add => x + y,
                Arith::Sub => x - y,
                Arith::Mul => x * y,
                Arith::Div => x / y,
            })
        }
        _ => {
            let (x, y) = (a.f() as f32, b.f() as f32);
            let r = match op {
                Arith::Add => x + y,
                Arith::Sub => x - y,
                Arith::Mul => x * y,
                Arith::Div => x / y,
            };
            V::F(round_float(f64::from(r), dtype))
        }
    }
}

/// The zero of `dtype`.
pub(crate) fn zero(dtype: DType) -> V {
    match dtype {
        DType::Bool => V::B(false),
        d if d.is_floating() => V::F(0.0),
        _ => V::I(0),
    }
}

/// Whether `a < b`, `a == b` etc. as `cmp` names it, for values of one kind.
pub(crate) fn compare(cmp: &str, a: V, b: V) -> bool {
    let o = match (a, b) {
        (V::F(_), _) | (_, V::F(_)) => a.f().partial_cmp(&b.f()),
        _ => a.i().partial_cmp(&b.i()),
    };
    use std::cmp::Ordering::*;
    match cmp {
        "eq" => o == Some(Equal),
        "ne" => o != Some(Equal),
        "lt" => o == Some(Less),
        "le" => matches!(o, Some(Less | Equal)),
        "gt" => o == Some(Greater),
        "ge" => matches!(o, Some(Greater | Equal)),
        _ => panic!("no comparison {cmp}"),
    }
}

/// `f(a, b)` elementwise over the broadcast shape `out`, with explicit index arithmetic.
pub(crate) fn zip(out: &[usize], dtype: DType, a: &Ref, b: &Ref, f: impl Fn(V, V) -> V) -> Ref {
    let n: usize = out.iter().product();
    let vals = (0..n)
        .map(|k| {
            let idx = unravel(out, k);
            f(a.vals[broadcast_flat(&a.shape, &idx)], b.vals[broadcast_flat(&b.shape, &idx)])
        })
        .collect();
    Ref { dtype, shape: out.to_vec(), vals }
}

/// `f(a)` elementwise, `a` broadcast to `out`.
pub(crate) fn map(out: &[usize], dtype: DType, a: &Ref, f: impl Fn(V) -> V) -> Ref {
    zip(out, dtype, a, a, |x, _| f(x))
}

/// The sum of `vals` of a float dtype in the kernels' documented order, in `f32` (for
/// `f16`, `bf16`, `f32`) or `f64`, as `f64`.
pub(crate) fn float_sum(dtype: DType, vals: &[V]) -> f64 {
    fn order<T: Copy + std::ops::Add<Output = T>>(x: &[T], zero: T) -> T {
        if x.len() <= 4096 {
            return x.iter().fold(zero, |a, &v| a + v);
        }
        let mut p = [zero; 32];
        let whole = x.len() / 32 * 32;
        for (i, &v) in x[..whole].iter().enumerate() {
            p[i % 32] = p[i % 32] + v;
        }
        for w in [16, 8, 4, 2, 1] {
            for j in 0..w {
                p[j] = p[j] + p[j + w];
            }
        }
        x[whole..].iter().fold(p[0], |t, &v| t + v)
    }
    if dtype == DType::F64 {
        order(&vals.iter().map(|v| v.f()).collect::<Vec<_>>(), 0.0)
    } else {
        f64::from(order(&vals.iter().map(|v| v.f() as f32).collect::<Vec<_>>(), 0.0f32))
    }
}

/// `sum`'s result for `a`.
pub(crate) fn sum(a: &Ref) -> V {
    if a.dtype.is_floating() {
        V::F(round_float(float_sum(a.dtype, &a.vals), a.dtype))
    } else {
        V::I(a.vals.iter().fold(0i64, |t, v| t.wrapping_add(v.i())))
    }
}

/// `sum_rows`'s result for `a: [n, k]`: each column in increasing row order.
pub(crate) fn sum_rows(a: &Ref) -> Vec<V> {
    let (n, k) = (a.shape[0], a.shape[1]);
    (0..k)
        .map(|j| {
            let col: Vec<V> = (0..n).map(|i| a.vals[i * k + j]).collect();
            if a.dtype.is_floating() {
                // Fewer than 4097 rows in the tests: the sequential order.
                assert!(n <= 4096);
                V::F(round_float(float_sum(a.dtype, &col), a.dtype))
            } else {
                V::I(col.iter().fold(0i64, |t, v| t.wrapping_add(v.i())))
            }
        })
        .collect()
}

/// `a · b` for `a: [m, k]`, `b: [k, n]` (logical), each element adding its products in
/// increasing `p` from zero in the compute type, rounded once (integers wrap).
pub(crate) fn matmul(a: &Ref, b: &Ref) -> Ref {
    let (m, k, n) = (a.shape[0], a.shape[1], b.shape[1]);
    let dtype = a.dtype;
    let vals = (0..m * n)
        .map(|e| {
            let (i, j) = (e / n, e % n);
            let (x, y) = (|p: usize| a.vals[i * k + p], |p: usize| b.vals[p * n + j]);
            match dtype {
                DType::F64 => V::F((0..k).fold(0.0, |s, p| s + x(p).f() * y(p).f())),
                d if d.is_floating() => {
                    let s = (0..k).fold(0.0f32, |s, p| s + x(p).f() as f32 * y(p).f() as f32);
                    V::F(round_float(f64::from(s), d))
                }
                d => V::I(wrap((0..k).fold(0i64, |s, p| s.wrapping_add(x(p).i().wrapping_mul(y(p).i()))), d)),
            }
        })
        .collect();
    Ref { dtype, shape: vec![m, n], vals }
}

/// The transpose of a 2-D reference.
pub(crate) fn transpose(a: &Ref) -> Ref {
    let (r, c) = (a.shape[0], a.shape[1]);
    let vals = (0..r * c).map(|e| a.vals[(e % r) * c + e / r]).collect();
    Ref { dtype: a.dtype, shape: vec![c, r], vals }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference's rounding against `half` on values where `half` rounds once (from
    /// `f32`), and against known values.
    #[test]
    fn rounding_agrees_with_half_from_f32() {
        let mut s = 0x2545_F491_4F6C_DD1Du64;
        for _ in 0..100_000 {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let x = f32::from_bits(s as u32);
            if x.is_nan() {
                continue;
            }
            assert_eq!(round_float(f64::from(x), DType::F16), f16::from_f32(x).to_f64(), "{x:e}");
            assert_eq!(round_float(f64::from(x), DType::BF16), bf16::from_f32(x).to_f64(), "{x:e}");
        }
        // Through f32: 2^62 + 2^54 + 1 is the bf16 midpoint 2^62 + 2^54 there, a tie to even.
        let i = V::I((1 << 62) + (1 << 54) + 1);
        assert_eq!(convert(i, DType::BF16), V::F(2f64.powi(62)));
        assert_eq!(convert(V::I(65520), DType::F16), V::F(f64::INFINITY));
        assert_eq!(convert(V::I(-65519), DType::F16), V::F(-65504.0));
        assert_eq!(convert(V::F(1.0 + 2f64.powi(-11) + 2f64.powi(-40)), DType::F16), V::F(1.0));
    }
}
