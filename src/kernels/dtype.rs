//! Element types as the kernels see them: how each dtype's elements are stored, the type
//! they are computed in, the arithmetic on it, the conversion rule shared by `cast`, `fill`
//! and the scalar arguments, and the macro that runs one generic body for each dtype of a
//! group.
//!
//! | dtype | stored as | computed in |
//! | --- | --- | --- |
//! | `bool` | [`Bool8`] (a byte; any nonzero byte reads as `true`) | `bool` |
//! | `u8`, `i32`, `i64` | itself | itself, wrapping |
//! | `f16`, `bf16` | [`half::f16`], [`half::bf16`] | `f32`, rounded once to nearest even on store |
//! | `f32`, `f64` | itself | itself |
//!
//! **The conversion rule** ([`Elem::narrow`] of [`Elem::widen`]): float to float rounds to
//! nearest even, once (`f64` to `f16` or `bf16` directly, not through a rounded `f32`);
//! float to integer truncates toward zero and saturates, NaN giving 0 (Rust's `as`); integer
//! to integer wraps; integer to float rounds to nearest even; anything to `bool` is `!= 0`
//! (NaN is `true`); `bool` to a number is 0 or 1.

use crate::vm::{bf16, f16, DType, Scalar};

/// A `bool` element as stored: one byte. Kernels read any nonzero byte as `true` (a byte
/// other than 0 or 1 is not a valid Rust `bool`, and a storage may hold one: an imported
/// buffer) and write 0 or 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(transparent)]
pub(crate) struct Bool8(pub u8);

impl Bool8 {
    /// The stored form of `b`.
    #[inline(always)]
    pub(crate) const fn of(b: bool) -> Self {
        Bool8(b as u8)
    }
}

/// A value of any dtype, widened without loss: what conversions go through.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Wide {
    /// A boolean.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A float (every `f16`, `bf16` and `f32` is exact in `f64`).
    Float(f64),
}

impl From<Scalar> for Wide {
    #[inline]
    fn from(s: Scalar) -> Self {
        match s {
            Scalar::Bool(b) => Wide::Bool(b),
            Scalar::Int(i) => Wide::Int(i),
            Scalar::Float(f) => Wide::Float(f),
        }
    }
}

/// Addition and multiplication: wrapping for integers, IEEE for floats, `or` and `and` for
/// `bool` (as PyTorch's `+` and `*` of bool tensors).
pub(crate) trait Ring: Copy + PartialOrd {
    /// The additive identity (`false` for `bool`).
    const ZERO: Self;
    /// `self + other`.
    fn add(self, other: Self) -> Self;
    /// `self * other`.
    fn mul(self, other: Self) -> Self;
}

/// Subtraction too: every numeric compute type (not `bool`).
pub(crate) trait Arith: Ring {
    /// `self - other`.
    fn sub(self, other: Self) -> Self;
}

/// True division: the floating compute types.
pub(crate) trait Float: Arith {
    /// `self / other`.
    fn div(self, other: Self) -> Self;
}

impl Ring for bool {
    const ZERO: Self = false;
    #[inline(always)]
    fn add(self, other: Self) -> Self {
        self | other
    }
    #[inline(always)]
    fn mul(self, other: Self) -> Self {
        self & other
    }
}

macro_rules! int_arith {
    ($($t:ty),*) => {$(
        impl Ring for $t {
            const ZERO: Self = 0;
            #[inline(always)]
            fn add(self, other: Self) -> Self {
                self.wrapping_add(other)
            }
            #[inline(always)]
            fn mul(self, other: Self) -> Self {
                self.wrapping_mul(other)
            }
        }
        impl Arith for $t {
            #[inline(always)]
            fn sub(self, other: Self) -> Self {
                self.wrapping_sub(other)
            }
        }
    )*};
}
int_arith!(u8, i32, i64);

macro_rules! float_arith {
    ($($t:ty),*) => {$(
        impl Ring for $t {
            const ZERO: Self = 0.0;
            #[inline(always)]
            fn add(self, other: Self) -> Self {
                self + other
            }
            #[inline(always)]
            fn mul(self, other: Self) -> Self {
                self * other
            }
        }
        impl Arith for $t {
            #[inline(always)]
            fn sub(self, other: Self) -> Self {
                self - other
            }
        }
        impl Float for $t {
            #[inline(always)]
            fn div(self, other: Self) -> Self {
                self / other
            }
        }
    )*};
}
float_arith!(f32, f64);

/// A stored element type of one dtype.
///
/// # Safety
/// Implementors are plain old data of the dtype's size with alignment at most 8, valid for
/// every bit pattern, so that any storage's bytes may be read as `Self`.
pub(crate) unsafe trait Elem: Copy + Send + Sync + 'static {
    /// The dtype.
    const DTYPE: DType;
    /// The type values are computed in ([`DType::compute_type`]; `bool` for `bool`).
    type C: Copy + PartialOrd;
    /// The value in the compute type (exact).
    fn load(self) -> Self::C;
    /// A computed value stored (rounded once to nearest even for `f16` and `bf16`).
    fn store(c: Self::C) -> Self;
    /// The value widened without loss.
    fn widen(self) -> Wide;
    /// `w` converted by the module's conversion rule.
    fn narrow(w: Wide) -> Self;
    /// A scalar argument of an arithmetic op in the compute type: converted by the
    /// conversion rule to the compute type (so an `Int` scalar is exact for an integer
    /// dtype, and an `f16` tensor's scalar is rounded to `f32`, not to `f16`).
    fn compute_scalar(s: Scalar) -> Self::C;
    /// The values as their compute type without a conversion, where the two are one type.
    #[inline(always)]
    fn as_compute(x: &[Self]) -> Option<&[Self::C]> {
        let _ = x;
        None
    }
}

// SAFETY: `Bool8` is one byte, alignment 1, valid for every bit pattern.
unsafe impl Elem for Bool8 {
    const DTYPE: DType = DType::Bool;
    type C = bool;
    #[inline(always)]
    fn load(self) -> bool {
        self.0 != 0
    }
    #[inline(always)]
    fn store(c: bool) -> Self {
        Bool8::of(c)
    }
    #[inline(always)]
    fn widen(self) -> Wide {
        Wide::Bool(self.0 != 0)
    }
    #[inline(always)]
    fn narrow(w: Wide) -> Self {
        Bool8::of(match w {
            Wide::Bool(b) => b,
            Wide::Int(i) => i != 0,
            Wide::Float(f) => f != 0.0,
        })
    }
    #[inline(always)]
    fn compute_scalar(s: Scalar) -> bool {
        Self::narrow(s.into()).load()
    }
}

macro_rules! int_elem {
    ($($t:ty => $d:ident),*) => {$(
        // SAFETY: a primitive integer: plain old data, alignment at most 8, every bit
        // pattern valid.
        unsafe impl Elem for $t {
            const DTYPE: DType = DType::$d;
            type C = $t;
            #[inline(always)]
            fn load(self) -> $t {
                self
            }
            #[inline(always)]
            fn store(c: $t) -> Self {
                c
            }
            #[inline(always)]
            fn widen(self) -> Wide {
                Wide::Int(self as i64)
            }
            #[inline(always)]
            fn narrow(w: Wide) -> Self {
                match w {
                    Wide::Bool(b) => b as $t,
                    Wide::Int(i) => i as $t,
                    Wide::Float(f) => f as $t,
                }
            }
            #[inline(always)]
            fn compute_scalar(s: Scalar) -> $t {
                Self::narrow(s.into())
            }
            #[inline(always)]
            fn as_compute(x: &[Self]) -> Option<&[$t]> {
                Some(x)
            }
        }
    )*};
}
int_elem!(u8 => U8, i32 => I32, i64 => I64);

// SAFETY: `f32` is plain old data of alignment 4; every bit pattern is a valid `f32`.
unsafe impl Elem for f32 {
    const DTYPE: DType = DType::F32;
    type C = f32;
    #[inline(always)]
    fn load(self) -> f32 {
        self
    }
    #[inline(always)]
    fn store(c: f32) -> Self {
        c
    }
    #[inline(always)]
    fn widen(self) -> Wide {
        Wide::Float(f64::from(self))
    }
    #[inline(always)]
    fn narrow(w: Wide) -> Self {
        match w {
            Wide::Bool(b) => f32::from(u8::from(b)),
            Wide::Int(i) => i as f32,
            Wide::Float(f) => f as f32,
        }
    }
    #[inline(always)]
    fn compute_scalar(s: Scalar) -> f32 {
        Self::narrow(s.into())
    }
    #[inline(always)]
    fn as_compute(x: &[Self]) -> Option<&[f32]> {
        Some(x)
    }
}

// SAFETY: `f64` is plain old data of alignment 8; every bit pattern is a valid `f64`.
unsafe impl Elem for f64 {
    const DTYPE: DType = DType::F64;
    type C = f64;
    #[inline(always)]
    fn load(self) -> f64 {
        self
    }
    #[inline(always)]
    fn store(c: f64) -> Self {
        c
    }
    #[inline(always)]
    fn widen(self) -> Wide {
        Wide::Float(self)
    }
    #[inline(always)]
    fn narrow(w: Wide) -> Self {
        match w {
            Wide::Bool(b) => f64::from(u8::from(b)),
            Wide::Int(i) => i as f64,
            Wide::Float(f) => f,
        }
    }
    #[inline(always)]
    fn compute_scalar(s: Scalar) -> f64 {
        Self::narrow(s.into())
    }
    #[inline(always)]
    fn as_compute(x: &[Self]) -> Option<&[f64]> {
        Some(x)
    }
}

macro_rules! half_elem {
    ($($t:ident => $d:ident),*) => {$(
        // SAFETY: a 16-bit float: plain old data of alignment 2, every bit pattern valid.
        unsafe impl Elem for $t {
            const DTYPE: DType = DType::$d;
            type C = f32;
            #[inline(always)]
            fn load(self) -> f32 {
                self.to_f32()
            }
            #[inline(always)]
            fn store(c: f32) -> Self {
                $t::from_f32(c)
            }
            #[inline(always)]
            fn widen(self) -> Wide {
                Wide::Float(self.to_f64())
            }
            #[inline(always)]
            fn narrow(w: Wide) -> Self {
                // Through `f32` rounded to odd: exact where the value is an `f32`, and where
                // it is not, its last bit keeps the rounding direction, so that the one
                // rounding to nearest even below is the correct one (`half`'s own `from_f64`
                // rounds twice).
                $t::from_f32(match w {
                    Wide::Bool(b) => f32::from(u8::from(b)),
                    Wide::Int(i) => i64_to_f32_odd(i),
                    Wide::Float(f) => f64_to_f32_odd(f),
                })
            }
            #[inline(always)]
            fn compute_scalar(s: Scalar) -> f32 {
                f32::narrow(s.into())
            }
        }
    )*};
}
half_elem!(f16 => F16, bf16 => BF16);

/// `x` rounded to an `f32` toward zero, with the last bit set if that was inexact ("round
/// to odd"). Rounding that to a format of at most 22 significant bits to nearest even gives
/// the same as rounding `x` itself once.
pub(crate) fn f64_to_f32_odd(x: f64) -> f32 {
    let r = x as f32;
    if x.is_nan() || f64::from(r) == x {
        return r;
    }
    if r.to_bits() & 1 == 1 {
        return r;
    }
    // `r` is even and inexact: its neighbour on the other side of `x` (one unit of the last
    // place, toward `x` in magnitude) is odd. `r` rounded away from zero when it is larger in
    // magnitude; an overflow to infinity steps back to the largest finite `f32`.
    let away = f64::from(r).abs() > x.abs();
    f32::from_bits(if away { r.to_bits() - 1 } else { r.to_bits() + 1 })
}

/// `x` rounded to an `f32` toward zero with the last bit set if inexact, as
/// [`f64_to_f32_odd`].
pub(crate) fn i64_to_f32_odd(x: i64) -> f32 {
    let a = x.unsigned_abs();
    if a < 1 << 24 {
        return x as f32;
    }
    let shift = 64 - a.leading_zeros() - 24;
    let sticky = u64::from(a & ((1u64 << shift) - 1) != 0);
    // At most 24 significant bits: exact in `f32`, as is the power of two.
    let m = ((a >> shift) | sticky) as f32 * f32::from_bits((127 + shift) << 23);
    if x < 0 {
        -m
    } else {
        m
    }
}

/// The stored type of each dtype, by the `DType` variant's name.
macro_rules! elem_of {
    (Bool) => {
        $crate::kernels::dtype::Bool8
    };
    (U8) => {
        u8
    };
    (I32) => {
        i32
    };
    (I64) => {
        i64
    };
    (F16) => {
        $crate::vm::f16
    };
    (BF16) => {
        $crate::vm::bf16
    };
    (F32) => {
        f32
    };
    (F64) => {
        f64
    };
}
pub(crate) use elem_of;

/// A value as an `i64`: integers as they are, `bool` as 0 or 1 (floats truncated).
#[inline(always)]
pub(crate) fn int_of<T: Elem>(x: T) -> i64 {
    match x.widen() {
        Wide::Bool(b) => i64::from(b),
        Wide::Int(i) => i,
        Wide::Float(f) => f as i64,
    }
}

/// A value as an `f64`: exact but for an `i64` beyond 2^53, rounded to nearest.
#[inline(always)]
pub(crate) fn float_of<T: Elem>(x: T) -> f64 {
    match x.widen() {
        Wide::Bool(b) => f64::from(u8::from(b)),
        Wide::Int(i) => i as f64,
        Wide::Float(f) => f,
    }
}

/// The additive identity of `T`'s compute type.
#[inline(always)]
pub(crate) fn zero<T: Elem>() -> T::C
where
    T::C: Ring,
{
    <T::C as Ring>::ZERO
}

/// The `Dtypes` of a [`dispatch`] group's name.
macro_rules! group {
    (all) => {
        $crate::kernels::Dtypes::All
    };
    (numeric) => {
        $crate::kernels::Dtypes::Numeric
    };
    (floating) => {
        $crate::kernels::Dtypes::Floating
    };
}
pub(crate) use group;

/// Run `$body` with `$T` bound to the stored type of `$dtype` if the dtype is in `$group`
/// (`all`, `numeric`: all but `bool`, `floating`, `integral`: `bool` and the integers), else
/// evaluate `$else`. The body is compiled once per dtype of the group.
macro_rules! dispatch {
    ($dtype:expr, all, $T:ident => $body:expr, $else:expr) => {
        $crate::kernels::dtype::dispatch!(@ $dtype, [Bool U8 I32 I64 F16 BF16 F32 F64], $T => $body, $else)
    };
    ($dtype:expr, numeric, $T:ident => $body:expr, $else:expr) => {
        $crate::kernels::dtype::dispatch!(@ $dtype, [U8 I32 I64 F16 BF16 F32 F64], $T => $body, $else)
    };
    ($dtype:expr, floating, $T:ident => $body:expr, $else:expr) => {
        $crate::kernels::dtype::dispatch!(@ $dtype, [F16 BF16 F32 F64], $T => $body, $else)
    };
    ($dtype:expr, integral, $T:ident => $body:expr, $else:expr) => {
        $crate::kernels::dtype::dispatch!(@ $dtype, [Bool U8 I32 I64], $T => $body, $else)
    };
    (@ $dtype:expr, [$($d:ident)+], $T:ident => $body:expr, $else:expr) => {
        match $dtype {
            $(
                $crate::vm::DType::$d => {
                    type $T = $crate::kernels::dtype::elem_of!($d);
                    $body
                }
            )+
            #[allow(unreachable_patterns)]
            _ => $else,
        }
    };
}
pub(crate) use dispatch;

#[cfg(test)]
mod tests {
    use super::*;

    /// Every finite non-negative value of a 16-bit format, ascending, with its bits.
    fn table<T: Elem<C = f32>>(from_bits: impl Fn(u16) -> T, max_bits: u16) -> Vec<(f64, u16)> {
        (0..=max_bits).map(|b| (f64::from(from_bits(b).load()), b)).collect()
    }

    /// The nearest value of the format of `values` to `x`, ties to even, found by search:
    /// the reference the conversions are checked against.
    fn nearest(values: &[(f64, u16)], x: f64) -> f64 {
        if x.is_nan() {
            return f64::NAN;
        }
        let max = values[values.len() - 1].0;
        let below_max = values[values.len() - 2].0;
        let a = x.abs();
        // Past the largest value by at least half a unit: infinity (IEEE's overflow rule).
        if a >= max + (max - below_max) / 2.0 {
            return f64::INFINITY.copysign(x);
        }
        let i = values.partition_point(|v| v.0 <= a);
        let (Some(&lo), Some(&hi)) = (values.get(i - 1), values.get(i)) else {
            // Above the largest value by less than half a unit.
            return max.copysign(x);
        };
        if lo.0 == a {
            return a.copysign(x);
        }
        let mid = (lo.0 + hi.0) / 2.0; // exact: one more bit than the format
        let pick = if a < mid || (a == mid && lo.1 % 2 == 0) { lo.0 } else { hi.0 };
        pick.copysign(x)
    }

    struct Tables {
        f16: Vec<(f64, u16)>,
        bf16: Vec<(f64, u16)>,
    }

    impl Tables {
        fn new() -> Self {
            Tables { f16: table(f16::from_bits, 0x7BFF), bf16: table(bf16::from_bits, 0x7F7F) }
        }

        fn check_f16(&self, x: f64) {
            let want = nearest(&self.f16, x);
            let got = f16::narrow(Wide::Float(x)).to_f64();
            assert!(got == want || got.is_nan() && want.is_nan(), "f16 of {x:e}: {got:e}, want {want:e}");
        }

        fn check_bf16(&self, x: f64) {
            let want = nearest(&self.bf16, x);
            let got = bf16::narrow(Wide::Float(x)).to_f64();
            assert!(got == want || got.is_nan() && want.is_nan(), "bf16 of {x:e}: {got:e}, want {want:e}");
        }
    }

    /// Values just off the midpoints between neighbours, where rounding twice (through a
    /// rounded `f32`, or dropping low bits first) goes the wrong way.
    #[test]
    fn f64_to_16_bit_floats_round_once() {
        // 1 + 2^-11 is the midpoint between 1 and the next f16; a hair above it rounds up.
        let x = 1.0 + 2f64.powi(-11) + 2f64.powi(-40);
        assert_eq!(f16::narrow(Wide::Float(x)), f16::from_bits(0x3C01));
        // Rounded through f32 it would be the tie, and tie to even gives 1.0.
        assert_eq!(f16::from_f32(x as f32), f16::ONE);
        let y = 1.0 + 2f64.powi(-8) + 2f64.powi(-45);
        assert_eq!(bf16::narrow(Wide::Float(y)), bf16::from_bits(0x3F81));
        let t = Tables::new();
        for x in [y, -y, x, -x, 0.0, -0.0, 65504.0, 65519.99, 65520.0, 1e-8, 6e-8, 3e-8, 1e300, -1e-300] {
            t.check_f16(x);
            t.check_bf16(x);
        }
        assert!(f16::narrow(Wide::Float(f64::NAN)).is_nan());
        assert!(bf16::narrow(Wide::Float(f64::NAN)).is_nan());
        assert_eq!(f16::narrow(Wide::Float(f64::NEG_INFINITY)), f16::NEG_INFINITY);
        // Random full-mantissa values over the formats' ranges.
        let mut s = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..20_000 {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let e = (s >> 58) as i32 - 32; // exponents -32..31
            let m = 1.0 + (s & ((1 << 52) - 1)) as f64 / (1u64 << 52) as f64;
            let x = if s & (1 << 57) != 0 { -m } else { m } * 2f64.powi(e);
            t.check_f16(x);
            t.check_bf16(x);
            t.check_bf16(x * 2f64.powi(96));
            t.check_bf16(x * 2f64.powi(-110));
        }
    }

    #[test]
    fn i64_to_16_bit_floats_round_once() {
        // Midpoint between 2^62 and the next bf16 (2^62 + 2^55), plus one: rounds up. An
        // `f64` drops the one, and ties to even would give 2^62.
        let x = (1i64 << 62) + (1 << 54) + 1;
        assert_eq!(bf16::narrow(Wide::Int(x)).to_f64(), 2f64.powi(62) + 2f64.powi(55));
        assert_eq!(bf16::narrow(Wide::Int(-x)).to_f64(), -(2f64.powi(62) + 2f64.powi(55)));
        assert_eq!(bf16::narrow(Wide::Int(i64::MIN)).to_f64(), -(2f64.powi(63)));
        assert_eq!(f16::narrow(Wide::Int(65519)).to_f64(), 65504.0);
        assert_eq!(f16::narrow(Wide::Int(65520)), f16::INFINITY);
        // Exact where the value has at most 24 significant bits, odd otherwise.
        for v in [0i64, 1, -1, 257, 2049, 4097, 1 << 40, (1 << 24) + 1, -(1 << 24) - 3, i64::MAX, i64::MIN] {
            let r = i64_to_f32_odd(v);
            let exact = (v as f32) as i128 == i128::from(v);
            assert_eq!(r as i128 == i128::from(v), exact, "{v}");
            assert!(exact || r.to_bits() & 1 == 1, "{v}");
        }
    }

    #[test]
    fn round_to_odd_sets_the_last_bit_when_inexact() {
        assert_eq!(f64_to_f32_odd(1.0), 1.0);
        let x = 1.0 + 2f64.powi(-30);
        let r = f64_to_f32_odd(x);
        assert_eq!(r.to_bits(), 1.0f32.to_bits() | 1);
        assert_eq!(f64_to_f32_odd(-x).to_bits(), (-1.0f32).to_bits() | 1);
        assert_eq!(f64_to_f32_odd(1e300), f32::MAX);
        assert_eq!(f64_to_f32_odd(f64::INFINITY), f32::INFINITY);
        assert_eq!(f64_to_f32_odd(1e-300).to_bits(), 1);
        assert_eq!(i64_to_f32_odd((1 << 24) + 1).to_bits(), 16_777_216f32.to_bits() | 1);
    }

    #[test]
    fn conversions_follow_the_rule() {
        assert_eq!(i32::narrow(Wide::Float(-2.9)), -2);
        assert_eq!(u8::narrow(Wide::Float(-2.9)), 0);
        assert_eq!(u8::narrow(Wide::Float(300.0)), 255);
        assert_eq!(i64::narrow(Wide::Float(f64::NAN)), 0);
        assert_eq!(u8::narrow(Wide::Int(257)), 1);
        assert_eq!(i32::narrow(Wide::Int(1 << 32)), 0);
        assert_eq!(Bool8::narrow(Wide::Float(f64::NAN)), Bool8(1));
        assert_eq!(Bool8::narrow(Wide::Float(-0.0)), Bool8(0));
        assert_eq!(Bool8(7).widen(), Wide::Bool(true));
        assert_eq!(f32::narrow(Wide::Bool(true)), 1.0);
        assert_eq!(i64::narrow(Wide::Int(i64::MIN)), i64::MIN);
        assert_eq!(f16::compute_scalar(Scalar::Float(0.1)), 0.1f32);
        assert_eq!(i64::compute_scalar(Scalar::Int((1 << 62) + 1)), (1 << 62) + 1);
    }
}
