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
//! nearest even; to `f16` or `bf16` from `f64` or an integer it rounds to `f32` first and
//! then to the 16-bit type, as PyTorch converts (`c10::Half` and `c10::BFloat16` are made
//! from a `float`) and as the CUDA kernels do, so a value just off a midpoint of the 16-bit
//! type may round the other way than a single rounding would; float to integer truncates
//! toward zero and saturates, NaN giving 0 (Rust's `as`); integer to integer wraps; integer
//! to `f32` or `f64` rounds to nearest even, once; anything to `bool` is `!= 0` (NaN is
//! `true`); `bool` to a number is 0 or 1.

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
    /// [`as_compute`](Self::as_compute), writable.
    #[inline(always)]
    fn as_compute_mut(x: &mut [Self]) -> Option<&mut [Self::C]> {
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
            #[inline(always)]
            fn as_compute_mut(x: &mut [Self]) -> Option<&mut [$t]> {
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
    #[inline(always)]
    fn as_compute_mut(x: &mut [Self]) -> Option<&mut [f32]> {
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
    #[inline(always)]
    fn as_compute_mut(x: &mut [Self]) -> Option<&mut [f64]> {
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
                // Through `f32`, rounded there first (the conversion rule).
                $t::from_f32(f32::narrow(w))
            }
            #[inline(always)]
            fn compute_scalar(s: Scalar) -> f32 {
                f32::narrow(s.into())
            }
        }
    )*};
}
half_elem!(f16 => F16, bf16 => BF16);

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

    /// `f64` and `i64` values go to `f16` and `bf16` through a rounded `f32`: just off a
    /// midpoint of the 16-bit type, the `f32` step lands on the midpoint and the tie goes to
    /// even, as PyTorch's conversions (and the CUDA kernels) give.
    #[test]
    fn f64_and_i64_to_16_bit_floats_round_through_f32() {
        // 1 + 2^-11 is the midpoint between 1 and the next f16; a hair above it is that
        // midpoint in f32, and the tie goes to 1.0 (a single rounding would give 0x3C01).
        let x = 1.0 + 2f64.powi(-11) + 2f64.powi(-40);
        assert_eq!(f16::narrow(Wide::Float(x)), f16::ONE);
        assert_eq!(f16::narrow(Wide::Float(-x)), -f16::ONE);
        let y = 1.0 + 2f64.powi(-8) + 2f64.powi(-45);
        assert_eq!(bf16::narrow(Wide::Float(y)), bf16::ONE);
        // Where the f32 step is exact or not at a midpoint, the one rounding of f32 to the
        // 16-bit type decides.
        let z = 1.0 + 2f64.powi(-11) + 2f64.powi(-20);
        assert_eq!(f16::narrow(Wide::Float(z)), f16::from_bits(0x3C01));
        assert_eq!(f16::narrow(Wide::Float(65519.99)), f16::from_f32(65519.99));
        assert_eq!(f16::narrow(Wide::Float(65520.0)), f16::INFINITY);
        assert_eq!(bf16::narrow(Wide::Float(1e300)), bf16::INFINITY);
        assert_eq!(f16::narrow(Wide::Float(1e-300)).to_bits(), 0);
        assert!(f16::narrow(Wide::Float(f64::NAN)).is_nan());
        assert!(bf16::narrow(Wide::Float(f64::NAN)).is_nan());
        assert_eq!(f16::narrow(Wide::Float(f64::NEG_INFINITY)), f16::NEG_INFINITY);
        // 2^62 + 2^54 + 1 is 2^62 + 2^54 in f32, the midpoint between 2^62 and the next
        // bf16: the tie goes to 2^62.
        let i = (1i64 << 62) + (1 << 54) + 1;
        assert_eq!(bf16::narrow(Wide::Int(i)).to_f64(), 2f64.powi(62));
        assert_eq!(bf16::narrow(Wide::Int(-i)).to_f64(), -(2f64.powi(62)));
        assert_eq!(bf16::narrow(Wide::Int(i64::MIN)).to_f64(), -(2f64.powi(63)));
        assert_eq!(f16::narrow(Wide::Int(65519)).to_f64(), 65504.0);
        assert_eq!(f16::narrow(Wide::Int(65520)), f16::INFINITY);
        // Random full-mantissa values over the formats' ranges: the f32 step, then `half`'s
        // rounding of an f32.
        let mut s = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..20_000 {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let e = (s >> 58) as i32 - 32;
            let m = 1.0 + (s & ((1 << 52) - 1)) as f64 / (1u64 << 52) as f64;
            let x = if s & (1 << 57) != 0 { -m } else { m } * 2f64.powi(e);
            assert_eq!(f16::narrow(Wide::Float(x)).to_bits(), f16::from_f32(x as f32).to_bits(), "{x:e}");
            assert_eq!(bf16::narrow(Wide::Float(x)).to_bits(), bf16::from_f32(x as f32).to_bits(), "{x:e}");
            let i = s as i64;
            assert_eq!(bf16::narrow(Wide::Int(i)).to_bits(), bf16::from_f32(i as f32).to_bits(), "{i}");
        }
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
