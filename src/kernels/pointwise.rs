//! What the pointwise math kernels share (`unary_math`, `binary_math`, `ternary`,
//! `creation`): the math of each compute type ([`Real`] for `f32` and `f64`, [`Num`] for
//! every numeric compute type) and the loops the elementwise drivers of `kernels::loops` do
//! not cover: three inputs ([`zip3`]) and a row-major walk that knows the index of each
//! row ([`walk`], for `tril`, `triu` and `one_hot`).
//!
//! The math follows PyTorch's CPU kernels: the same formulas in the same compute type
//! (`f32` for `f16`, `bf16` and `f32`; `f64` for `f64`), the results of `f16` and `bf16`
//! rounded once on store; integers wrap. Integer division by zero (`div` with a rounding
//! mode, `remainder`, `fmod`) is an error of the kernel, as PyTorch raises
//! `ZeroDivisionError` on the CPU.

use smallvec::SmallVec;

use super::dtype::{Arith, Elem, Float};
use super::iter::{broadcasts_to, same_shape, share, Operand, Share, Staged};
use super::loops::{expect_count, input, output};
use crate::vm::KernelCtx;

/// The floating compute types, `f32` and `f64`: the functions of the math ops.
pub(crate) trait Real: Float + Copy {
    /// `v` in this type (rounded to nearest for `f32`).
    fn of(v: f64) -> Self;
    fn exp(self) -> Self;
    fn exp2(self) -> Self;
    fn ln(self) -> Self;
    fn log2(self) -> Self;
    fn ln_1p(self) -> Self;
    fn exp_m1(self) -> Self;
    fn sqrt(self) -> Self;
    fn sin(self) -> Self;
    fn cos(self) -> Self;
    fn tanh(self) -> Self;
    fn erf(self) -> Self;
    /// `1 - erf(self)`, without the cancellation of computing it so.
    fn erfc(self) -> Self;
    fn atan2(self, x: Self) -> Self;
    fn recip(self) -> Self;
}

macro_rules! real {
    ($t:ty, $exp:path, $erf:path, $erfc:path) => {
        impl Real for $t {
            #[inline(always)]
            fn of(v: f64) -> Self {
                v as $t
            }
            #[inline(always)]
            fn exp(self) -> Self {
                $exp(self)
            }
            #[inline(always)]
            fn exp2(self) -> Self {
                <$t>::exp2(self)
            }
            #[inline(always)]
            fn ln(self) -> Self {
                <$t>::ln(self)
            }
            #[inline(always)]
            fn log2(self) -> Self {
                <$t>::log2(self)
            }
            #[inline(always)]
            fn ln_1p(self) -> Self {
                <$t>::ln_1p(self)
            }
            #[inline(always)]
            fn exp_m1(self) -> Self {
                <$t>::exp_m1(self)
            }
            #[inline(always)]
            fn sqrt(self) -> Self {
                <$t>::sqrt(self)
            }
            #[inline(always)]
            fn sin(self) -> Self {
                <$t>::sin(self)
            }
            #[inline(always)]
            fn cos(self) -> Self {
                <$t>::cos(self)
            }
            #[inline(always)]
            fn tanh(self) -> Self {
                <$t>::tanh(self)
            }
            #[inline(always)]
            fn erf(self) -> Self {
                $erf(self)
            }
            #[inline(always)]
            fn erfc(self) -> Self {
                $erfc(self)
            }
            #[inline(always)]
            fn atan2(self, x: Self) -> Self {
                <$t>::atan2(self, x)
            }
            #[inline(always)]
            fn recip(self) -> Self {
                1.0 / self
            }
        }
    };
}
// `f32`'s `exp` is `kernels::vmath`'s, which vectorises (std's is a call per element).
real!(f32, super::vmath::exp_f32, libm::erff, libm::erfcf);
real!(f64, f64::exp, libm::erf, libm::erfc);

/// Every numeric compute type (`u8`, `i32`, `i64`, `f32`, `f64`): the ops whose integer
/// and floating forms differ.
pub(crate) trait Num: Arith + Copy {
    /// `-self` (integers wrap: `-i64::MIN` is `i64::MIN`, `-1u8` is 255, as PyTorch).
    fn neg(self) -> Self;
    /// `|self|` (integers wrap at the minimum; NaN stays NaN).
    fn abs(self) -> Self;
    /// -1, 0 or 1 (0 for a NaN and for `-0.0`, as PyTorch's `(0 < x) - (x < 0)`).
    fn sign(self) -> Self;
    /// Rounded toward minus infinity (integers as they are).
    fn floor(self) -> Self;
    /// Rounded toward plus infinity.
    fn ceil(self) -> Self;
    /// Rounded to the nearest integer, halves to even.
    fn round_even(self) -> Self;
    /// `self ** e`: IEEE's `pow` for floats; exact, wrapping, by squaring for integers,
    /// where a negative exponent gives `1` for a base of 1, `±1` for -1 and 0 otherwise
    /// (PyTorch's integer `pow`).
    fn pow(self, e: Self) -> Self;
    /// `self / d` rounded toward minus infinity (Python's `//`); `None` for an integer
    /// division by zero.
    fn div_floor(self, d: Self) -> Option<Self>;
    /// `self / d` rounded toward zero; `None` for an integer division by zero.
    fn div_trunc(self, d: Self) -> Option<Self>;
    /// `self - d * floor(self / d)`: the sign of `d` (Python's `%`).
    fn remainder(self, d: Self) -> Option<Self>;
    /// `self - d * trunc(self / d)`: the sign of `self` (C's `fmod`).
    fn fmod(self, d: Self) -> Option<Self>;
}

macro_rules! num_int {
    ($($t:ty),*) => {$(
        impl Num for $t {
            #[inline(always)]
            fn neg(self) -> Self {
                self.wrapping_neg()
            }
            #[inline(always)]
            #[allow(unused_comparisons)]
            fn abs(self) -> Self {
                if self < 0 { self.wrapping_neg() } else { self }
            }
            #[inline(always)]
            #[allow(unused_comparisons)]
            fn sign(self) -> Self {
                (0 < self) as $t - (self < 0) as $t
            }
            #[inline(always)]
            fn floor(self) -> Self {
                self
            }
            #[inline(always)]
            fn ceil(self) -> Self {
                self
            }
            #[inline(always)]
            fn round_even(self) -> Self {
                self
            }
            #[inline(always)]
            #[allow(unused_comparisons)]
            fn pow(self, e: Self) -> Self {
                if e < 0 {
                    // Only signed types get here.
                    return match self {
                        1 => 1,
                        _ if self == (0 as $t).wrapping_sub(1) => {
                            if e % 2 == 0 { 1 } else { self }
                        }
                        _ => 0,
                    };
                }
                let (mut base, mut e, mut acc) = (self, e, 1 as $t);
                while e > 0 {
                    if e & 1 == 1 {
                        acc = acc.wrapping_mul(base);
                    }
                    base = base.wrapping_mul(base);
                    e >>= 1;
                }
                acc
            }
            #[inline(always)]
            #[allow(unused_comparisons)]
            fn div_floor(self, d: Self) -> Option<Self> {
                if d == 0 {
                    return None;
                }
                let q = self.wrapping_div(d);
                let r = self.wrapping_rem(d);
                Some(if r != 0 && ((r < 0) != (d < 0)) { q.wrapping_sub(1) } else { q })
            }
            #[inline(always)]
            fn div_trunc(self, d: Self) -> Option<Self> {
                (d != 0).then(|| self.wrapping_div(d))
            }
            #[inline(always)]
            #[allow(unused_comparisons)]
            fn remainder(self, d: Self) -> Option<Self> {
                if d == 0 {
                    return None;
                }
                let r = self.wrapping_rem(d);
                Some(if r != 0 && ((r < 0) != (d < 0)) { r.wrapping_add(d) } else { r })
            }
            #[inline(always)]
            fn fmod(self, d: Self) -> Option<Self> {
                (d != 0).then(|| self.wrapping_rem(d))
            }
        }
    )*};
}
num_int!(u8, i32, i64);

macro_rules! num_float {
    ($($t:ty),*) => {$(
        impl Num for $t {
            #[inline(always)]
            fn neg(self) -> Self {
                -self
            }
            #[inline(always)]
            fn abs(self) -> Self {
                <$t>::abs(self)
            }
            #[inline(always)]
            fn sign(self) -> Self {
                ((0.0 < self) as u8 as $t) - ((self < 0.0) as u8 as $t)
            }
            #[inline(always)]
            fn floor(self) -> Self {
                <$t>::floor(self)
            }
            #[inline(always)]
            fn ceil(self) -> Self {
                <$t>::ceil(self)
            }
            #[inline(always)]
            fn round_even(self) -> Self {
                <$t>::round_ties_even(self)
            }
            #[inline(always)]
            fn pow(self, e: Self) -> Self {
                self.powf(e)
            }
            #[inline(always)]
            fn div_floor(self, d: Self) -> Option<Self> {
                // PyTorch's `div_floor_floating` (Python's float `//`): from the exact
                // remainder, so that the quotient is not off by one where `a / b` rounds up
                // to an integer.
                if d == 0.0 {
                    return Some(self / d);
                }
                let m = self % d;
                let mut q = (self - m) / d;
                if m != 0.0 && ((d < 0.0) != (m < 0.0)) {
                    q -= 1.0;
                }
                Some(if q != 0.0 {
                    let f = q.floor();
                    if q - f > 0.5 { f + 1.0 } else { f }
                } else {
                    (0.0 as $t).copysign(self / d)
                })
            }
            #[inline(always)]
            fn div_trunc(self, d: Self) -> Option<Self> {
                Some((self / d).trunc())
            }
            #[inline(always)]
            fn remainder(self, d: Self) -> Option<Self> {
                let m = self % d;
                Some(if m != 0.0 && ((d < 0.0) != (m < 0.0)) { m + d } else { m })
            }
            #[inline(always)]
            fn fmod(self, d: Self) -> Option<Self> {
                Some(self % d)
            }
        }
    )*};
}
num_float!(f32, f64);

/// The larger of two values; a NaN if either is one (PyTorch's `maximum`).
#[inline(always)]
pub(crate) fn maximum<C: PartialOrd + Copy>(a: C, b: C) -> C {
    #[allow(clippy::eq_op)]
    if a != a || (b == b && a >= b) {
        a
    } else {
        b
    }
}

/// The smaller of two values; a NaN if either is one (PyTorch's `minimum`).
#[inline(always)]
pub(crate) fn minimum<C: PartialOrd + Copy>(a: C, b: C) -> C {
    #[allow(clippy::eq_op)]
    if a != a || (b == b && a <= b) {
        a
    } else {
        b
    }
}

/// An operand's strides over `rank` dimensions of the output's shape `shape`, in elements:
/// aligned at the last dimension, 0 where it broadcasts (a missing dimension or one of 1).
pub(crate) fn strides_over(op: &Operand<'_>, shape: &[usize]) -> SmallVec<[isize; 6]> {
    let rank = shape.len();
    let mut s = SmallVec::from_elem(0isize, rank);
    for (j, (&d, &st)) in op.shape.iter().zip(op.strides).enumerate() {
        let at = rank + j - op.shape.len();
        if d != 1 {
            s[at] = st;
        }
    }
    s
}

/// Walk `shape` (at least one element) in row-major order of the index: `row(index,
/// starts, steps, len)` once per run of the last dimension, with `index` the run's index in
/// the other dimensions, `starts[k]` operand `k`'s element offset at the run's start and
/// `steps[k]` its stride along the run (`strides[k]`, in elements, over `shape`'s
/// dimensions). A 0-d shape is one run of one element.
pub(crate) fn walk<const N: usize>(
    shape: &[usize],
    strides: &[SmallVec<[isize; 6]>; N],
    mut row: impl FnMut(&[usize], [isize; N], [isize; N], usize),
) {
    let Some((&len, outer)) = shape.split_last() else {
        row(&[], [0; N], [0; N], 1);
        return;
    };
    let r = outer.len();
    let steps: [isize; N] = std::array::from_fn(|k| strides[k][r]);
    let mut index: SmallVec<[usize; 6]> = SmallVec::from_elem(0, r);
    let mut starts = [0isize; N];
    loop {
        row(&index, starts, steps, len);
        let mut d = r;
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            index[d] += 1;
            if index[d] < outer[d] {
                for k in 0..N {
                    starts[k] += strides[k][d];
                }
                break;
            }
            for k in 0..N {
                starts[k] -= strides[k][d] * (outer[d] as isize - 1);
            }
            index[d] = 0;
        }
    }
}

/// `out = f(a, b, c)` elementwise: inputs 0, 1 and 2 broadcast to output 0's shape. An
/// input that overlaps the output other than element for element is read from a copy
/// made first (`iter::Staged`).
#[inline(never)]
pub(crate) fn zip3<O: Elem, A: Elem, B: Elem, C: Elem>(
    ctx: &KernelCtx<'_, '_>,
    f: impl Fn(A, B, C) -> O,
) -> Result<(), String> {
    expect_count(ctx, 3)?;
    let (x, y, z, out) = (input(ctx, 0)?, input(ctx, 1)?, input(ctx, 2)?, output(ctx, 0)?);
    let o = Operand::output(out.meta, out.data, 0, O::DTYPE)?;
    let a = Operand::input(x.meta, x.data, 0, A::DTYPE)?;
    let b = Operand::input(y.meta, y.data, 1, B::DTYPE)?;
    let c = Operand::input(z.meta, z.data, 2, C::DTYPE)?;
    for (i, m) in [x.meta, y.meta, z.meta].into_iter().enumerate() {
        if !same_shape(&m.shape, o.shape) {
            broadcasts_to(i, m, o.shape)?;
        }
    }
    if o.numel == 0 {
        return Ok(());
    }
    let stage = |op: &Operand<'_>, data| {
        if share(op, data, &o, out.data) == Share::Overlap {
            Staged::new(op).map(Some)
        } else {
            Ok(None)
        }
    };
    let (ta, tb, tc) = (stage(&a, x.data)?, stage(&b, y.data)?, stage(&c, z.data)?);
    let a = ta.as_ref().map_or(a, Staged::operand);
    let b = tb.as_ref().map_or(b, Staged::operand);
    let c = tc.as_ref().map_or(c, Staged::operand);
    let (po, pa, pb, pc) =
        (o.first.cast::<O>(), a.first.cast::<A>(), b.first.cast::<B>(), c.first.cast::<C>());
    // Operands that are all contiguous and of the output's shape are walked as one run.
    let flat = [o.numel];
    let one = || SmallVec::from_slice(&[1isize]);
    let (shape, strides) =
        if o.contiguous && [&a, &b, &c].iter().all(|x| x.contiguous && same_shape(x.shape, o.shape)) {
            (&flat[..], [one(), one(), one(), one()])
        } else {
            let s = o.shape;
            (s, [strides_over(&o, s), strides_over(&a, s), strides_over(&b, s), strides_over(&c, s)])
        };
    walk(shape, &strides, |_, at, st, n| {
        for i in 0..n as isize {
            // SAFETY: every offset is that of an element of its operand's layout, which
            // was checked against its storage (`Operand`); an input that shares the
            // output's elements is exactly the output (each element read before it is
            // written) or was staged; the instruction holds the write access to the
            // output's storage.
            unsafe {
                let v = f(
                    pa.offset(at[1] + i * st[1]).read(),
                    pb.offset(at[2] + i * st[2]).read(),
                    pc.offset(at[3] + i * st[3]).read(),
                );
                po.offset(at[0] + i * st[0]).write(v);
            }
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_division_rounds_as_python() {
        for a in -7i64..=7 {
            for d in [-3i64, -2, -1, 1, 2, 3] {
                let (q, r) = (a.div_euclid(d), a.rem_euclid(d));
                // Python's floor division and modulo, from the Euclidean ones.
                let (fq, fr) = if r != 0 && d < 0 { (q - 1, r + d) } else { (q, r) };
                assert_eq!(Num::div_floor(a, d), Some(fq), "{a} // {d}");
                assert_eq!(Num::remainder(a, d), Some(fr), "{a} % {d}");
                assert_eq!(Num::div_trunc(a, d), Some(a / d));
                assert_eq!(Num::fmod(a, d), Some(a % d));
                assert_eq!(Num::div_floor(a as f64, d as f64), Some(fq as f64));
                assert_eq!(Num::remainder(a as f64, d as f64), Some(fr as f64));
            }
            assert_eq!(Num::div_floor(a, 0), None);
            assert_eq!(Num::remainder(a, 0), None);
        }
        assert_eq!(Num::div_floor(i64::MIN, -1), Some(i64::MIN));
        assert_eq!(Num::div_floor(1.0f64, 0.0), Some(f64::INFINITY));
        assert!(Num::div_floor(0.0f64, 0.0).unwrap().is_nan());
        assert_eq!(Num::div_floor(-0.0f64, 5.0).unwrap().to_bits(), (-0.0f64).to_bits());
    }

    #[test]
    fn integer_powers_are_exact() {
        assert_eq!(Num::pow(3i64, 39), 3i64.pow(39));
        assert_eq!(Num::pow(2i32, 31), i32::MIN);
        assert_eq!(Num::pow(-1i64, -3), -1);
        assert_eq!(Num::pow(-1i64, -4), 1);
        assert_eq!(Num::pow(1i64, -4), 1);
        assert_eq!(Num::pow(2i64, -1), 0);
        assert_eq!(Num::pow(0i64, 0), 1);
        assert_eq!(Num::pow(3u8, 5), 243u8);
    }

    #[test]
    fn maximum_and_minimum_propagate_nan() {
        assert!(maximum(f32::NAN, 1.0).is_nan());
        assert!(maximum(1.0, f32::NAN).is_nan());
        assert!(minimum(f64::NAN, 1.0).is_nan());
        assert!(minimum(1.0, f64::NAN).is_nan());
        assert_eq!(maximum(2, 3), 3);
        assert!(!minimum(true, false));
    }

    #[test]
    fn walk_visits_every_element_in_row_major_order() {
        let shape = [2usize, 3, 2];
        let s: SmallVec<[isize; 6]> = SmallVec::from_slice(&[6, 2, 1]);
        let t: SmallVec<[isize; 6]> = SmallVec::from_slice(&[1, 0, 2]);
        let mut seen = vec![];
        walk(&shape, &[s, t], |idx, at, st, n| {
            for i in 0..n as isize {
                seen.push((idx.to_vec(), at[0] + i * st[0], at[1] + i * st[1]));
            }
        });
        assert_eq!(seen.len(), 12);
        assert_eq!(seen.iter().map(|x| x.1).collect::<Vec<_>>(), (0..12).collect::<Vec<_>>());
        assert_eq!(seen[4], (vec![0, 2], 4, 0));
        assert_eq!(seen[7], (vec![1, 0], 7, 3));
        let mut one = 0;
        walk::<1>(&[], &[SmallVec::new()], |_, _, _, n| one += n);
        assert_eq!(one, 1);
    }
}
