//! Element types: the eight dtypes a tensor may hold, their Rust element types, and
//! PyTorch's promotion of two dtypes.
//!
//! | dtype | Rust type | bytes | category |
//! | --- | --- | --- | --- |
//! | `bool` | `bool` (stored as one byte, 0 or 1) | 1 | boolean |
//! | `u8` | `u8` | 1 | integer |
//! | `i32` | `i32` | 4 | integer |
//! | `i64` | `i64` | 8 | integer |
//! | `f16` | [`half::f16`] | 2 | floating |
//! | `bf16` | [`half::bf16`] | 2 | floating |
//! | `f32` | `f32` | 4 | floating |
//! | `f64` | `f64` | 8 | floating |
//!
//! [`promote_types`] is `torch.promote_types`: the smallest dtype both convert to without
//! leaving their category (boolean < integer < floating), with `f16` and `bf16` meeting at
//! `f32` and `u8` and a signed integer at the wider signed one. The front ends work out a
//! call's result type from it (`eager::promote`), where Python scalars and 0-d tensors
//! take part as PyTorch's `result_type` says.

use std::collections::TryReserveError;
use std::fmt;

pub use half::{bf16, f16};

/// A scalar argument of an op call: a float, an integer (exact over all of `i64`) or a
/// boolean, as a Python number or `True` is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scalar {
    /// A floating-point value.
    Float(f64),
    /// An integer.
    Int(i64),
    /// A boolean.
    Bool(bool),
}

impl Scalar {
    /// The value as an `f64` (an integer rounded to nearest; `true` is 1).
    pub fn as_f64(self) -> f64 {
        match self {
            Scalar::Float(v) => v,
            Scalar::Int(v) => v as f64,
            Scalar::Bool(b) => f64::from(u8::from(b)),
        }
    }

    /// The value as an `i64` (a float truncated toward zero, saturating, NaN as 0, as Rust's
    /// `as` casts; `true` is 1).
    pub fn as_i64(self) -> i64 {
        match self {
            Scalar::Float(v) => v as i64,
            Scalar::Int(v) => v,
            Scalar::Bool(b) => i64::from(b),
        }
    }

    /// The value as a boolean: nonzero is `true` (NaN too, as in C and PyTorch).
    pub fn as_bool(self) -> bool {
        match self {
            Scalar::Float(v) => v != 0.0,
            Scalar::Int(v) => v != 0,
            Scalar::Bool(b) => b,
        }
    }

    /// Whether the value is a float (PyTorch's category of a Python `float`).
    pub fn is_float(self) -> bool {
        matches!(self, Scalar::Float(_))
    }
}

impl std::fmt::Display for Scalar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Scalar::Float(v) => write!(f, "{v}"),
            Scalar::Int(v) => write!(f, "{v}"),
            Scalar::Bool(b) => write!(f, "{b}"),
        }
    }
}

impl From<f64> for Scalar {
    fn from(v: f64) -> Self {
        Scalar::Float(v)
    }
}

impl From<i64> for Scalar {
    fn from(v: i64) -> Self {
        Scalar::Int(v)
    }
}

impl From<bool> for Scalar {
    fn from(v: bool) -> Self {
        Scalar::Bool(v)
    }
}

/// Element type of a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum DType {
    /// Boolean, one byte holding 0 or 1.
    Bool,
    /// 8-bit unsigned integer.
    U8,
    /// 32-bit signed integer.
    I32,
    /// 64-bit signed integer.
    I64,
    /// IEEE 754 half precision.
    F16,
    /// bfloat16: `f32`'s exponent with 8 bits of mantissa.
    BF16,
    /// 32-bit float.
    F32,
    /// 64-bit float.
    F64,
}

/// A dtype's category, in the order promotion respects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Category {
    /// `bool`.
    Bool,
    /// `u8`, `i32`, `i64`.
    Integer,
    /// `f16`, `bf16`, `f32`, `f64`.
    Floating,
}

impl DType {
    /// Every dtype, in declaration order.
    pub const ALL: [DType; 8] =
        [DType::Bool, DType::U8, DType::I32, DType::I64, DType::F16, DType::BF16, DType::F32, DType::F64];

    /// Bytes per element.
    #[inline]
    pub const fn size(self) -> usize {
        match self {
            DType::Bool | DType::U8 => 1,
            DType::F16 | DType::BF16 => 2,
            DType::I32 | DType::F32 => 4,
            DType::I64 | DType::F64 => 8,
        }
    }

    /// Name used in messages and traces (`f32`, `bf16`, `bool`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            DType::Bool => "bool",
            DType::U8 => "u8",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F32 => "f32",
            DType::F64 => "f64",
        }
    }

    /// PyTorch's name (`float32`, `bfloat16`, `bool`, `uint8`, ...), which NumPy's names
    /// match where NumPy has the type.
    pub const fn torch_name(self) -> &'static str {
        match self {
            DType::Bool => "bool",
            DType::U8 => "uint8",
            DType::I32 => "int32",
            DType::I64 => "int64",
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::F32 => "float32",
            DType::F64 => "float64",
        }
    }

    /// The dtype called `name`: the short names of [`name`](Self::name) or PyTorch's of
    /// [`torch_name`](Self::torch_name), and PyTorch's aliases (`float`, `double`, `half`,
    /// `int`, `long`).
    pub fn from_name(name: &str) -> Option<DType> {
        Some(match name {
            "bool" => DType::Bool,
            "u8" | "uint8" => DType::U8,
            "i32" | "int32" | "int" => DType::I32,
            "i64" | "int64" | "long" => DType::I64,
            "f16" | "float16" | "half" => DType::F16,
            "bf16" | "bfloat16" => DType::BF16,
            "f32" | "float32" | "float" => DType::F32,
            "f64" | "float64" | "double" => DType::F64,
            _ => return None,
        })
    }

    /// The dtype's category.
    #[inline]
    pub const fn category(self) -> Category {
        match self {
            DType::Bool => Category::Bool,
            DType::U8 | DType::I32 | DType::I64 => Category::Integer,
            DType::F16 | DType::BF16 | DType::F32 | DType::F64 => Category::Floating,
        }
    }

    /// Whether the dtype is one of the floating types.
    #[inline]
    pub const fn is_floating(self) -> bool {
        matches!(self.category(), Category::Floating)
    }

    /// Whether the dtype is `bool` or an integer type.
    #[inline]
    pub const fn is_integral(self) -> bool {
        !self.is_floating()
    }

    /// The type a kernel computes `self`'s values in: `f32` for `f16` and `bf16` (each
    /// result is rounded once, to nearest even, when it is stored), the dtype itself
    /// otherwise. PyTorch's CPU kernels do the same (`at::opmath_type`).
    #[inline]
    pub const fn compute_type(self) -> DType {
        match self {
            DType::F16 | DType::BF16 => DType::F32,
            d => d,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// `torch.promote_types(a, b)`: the dtype of a result computed from values of `a` and `b`.
///
/// ```
/// use eagervm::framework::{promote_types, DType};
/// assert_eq!(promote_types(DType::I64, DType::F16), DType::F16);
/// assert_eq!(promote_types(DType::F16, DType::BF16), DType::F32);
/// assert_eq!(promote_types(DType::U8, DType::I32), DType::I32);
/// assert_eq!(promote_types(DType::Bool, DType::U8), DType::U8);
/// ```
pub const fn promote_types(a: DType, b: DType) -> DType {
    use DType::*;
    if a as u8 == b as u8 {
        return a;
    }
    match (a.category(), b.category()) {
        (Category::Bool, _) => b,
        (_, Category::Bool) => a,
        (Category::Integer, Category::Floating) => b,
        (Category::Floating, Category::Integer) => a,
        (Category::Integer, Category::Integer) => {
            // u8 < i32 < i64, and u8 with a signed type is the signed one: the declaration
            // order already ranks them.
            if (a as u8) > (b as u8) {
                a
            } else {
                b
            }
        }
        (Category::Floating, Category::Floating) => match (a, b) {
            (F16, BF16) | (BF16, F16) => F32,
            _ => {
                if (a as u8) > (b as u8) {
                    a
                } else {
                    b
                }
            }
        },
    }
}

/// A Rust element type that maps to a [`DType`].
///
/// Values cross between Rust and a tensor's storage as native-endian bytes; `bool` is one
/// byte, 0 or 1 (any other byte reads as `true`).
pub trait Element: Copy + Send + Sync + 'static + fmt::Debug + PartialEq {
    /// The matching dtype.
    const DTYPE: DType;
    /// Decode native-endian bytes.
    fn from_bytes(bytes: &[u8]) -> Vec<Self>;
    /// Encode to native-endian bytes.
    fn to_bytes(values: &[Self]) -> Vec<u8>;
    /// [`Element::from_bytes`], or the error of a refused allocation instead of the global
    /// allocator's abort: for buffers whose size a program chooses.
    fn try_from_bytes(bytes: &[u8]) -> Result<Vec<Self>, TryReserveError>;
    /// [`Element::to_bytes`], or the error of a refused allocation.
    fn try_to_bytes(values: &[Self]) -> Result<Vec<u8>, TryReserveError>;
    /// The first element of native-endian `bytes`, `None` if they hold less than one: what a
    /// read of one element (`item`) decodes, without a vector.
    fn first_of(bytes: &[u8]) -> Option<Self> {
        Self::from_bytes(bytes).first().copied()
    }
}

/// A vector with room for exactly `n` elements, or the error of a refused allocation.
fn with_room<T>(n: usize) -> Result<Vec<T>, TryReserveError> {
    let mut v = Vec::new();
    v.try_reserve_exact(n)?;
    Ok(v)
}

macro_rules! element {
    ($t:ty, $d:expr, $n:expr) => {
        impl Element for $t {
            const DTYPE: DType = $d;
            fn from_bytes(bytes: &[u8]) -> Vec<Self> {
                bytes
                    .chunks_exact($n)
                    .map(|c| <$t>::from_ne_bytes(c.try_into().expect("a whole element")))
                    .collect()
            }
            fn to_bytes(values: &[Self]) -> Vec<u8> {
                values.iter().flat_map(|v| v.to_ne_bytes()).collect()
            }
            fn try_from_bytes(bytes: &[u8]) -> Result<Vec<Self>, TryReserveError> {
                let mut v = with_room(bytes.len() / $n)?;
                v.extend(
                    bytes
                        .chunks_exact($n)
                        .map(|c| <$t>::from_ne_bytes(c.try_into().expect("a whole element"))),
                );
                Ok(v)
            }
            fn try_to_bytes(values: &[Self]) -> Result<Vec<u8>, TryReserveError> {
                let mut v = with_room(std::mem::size_of_val(values))?;
                v.extend(values.iter().flat_map(|x| x.to_ne_bytes()));
                Ok(v)
            }
            fn first_of(bytes: &[u8]) -> Option<Self> {
                Some(<$t>::from_ne_bytes(bytes.get(..$n)?.try_into().expect("a whole element")))
            }
        }
    };
}

element!(f32, DType::F32, 4);
element!(f64, DType::F64, 8);
element!(f16, DType::F16, 2);
element!(bf16, DType::BF16, 2);
element!(i32, DType::I32, 4);
element!(i64, DType::I64, 8);
element!(u8, DType::U8, 1);

impl Element for bool {
    const DTYPE: DType = DType::Bool;
    fn from_bytes(bytes: &[u8]) -> Vec<Self> {
        bytes.iter().map(|&b| b != 0).collect()
    }
    fn to_bytes(values: &[Self]) -> Vec<u8> {
        values.iter().map(|&b| u8::from(b)).collect()
    }
    fn try_from_bytes(bytes: &[u8]) -> Result<Vec<Self>, TryReserveError> {
        let mut v = with_room(bytes.len())?;
        v.extend(bytes.iter().map(|&b| b != 0));
        Ok(v)
    }
    fn try_to_bytes(values: &[Self]) -> Result<Vec<u8>, TryReserveError> {
        let mut v = with_room(values.len())?;
        v.extend(values.iter().map(|&b| u8::from(b)));
        Ok(v)
    }
    fn first_of(bytes: &[u8]) -> Option<Self> {
        bytes.first().map(|&b| b != 0)
    }
}

/// Element `i` of `bytes` (native-endian elements of `dtype`) as a [`Scalar`]: floats
/// widened to `f64` (exactly), integers to `i64`, booleans as they are. `None` past the end.
pub fn read_element(dtype: DType, bytes: &[u8], i: usize) -> Option<Scalar> {
    let n = dtype.size();
    let b = bytes.get(i.checked_mul(n)?..i.checked_mul(n)? + n)?;
    Some(match dtype {
        DType::Bool => Scalar::Bool(b[0] != 0),
        DType::U8 => Scalar::Int(i64::from(b[0])),
        DType::I32 => Scalar::Int(i64::from(i32::from_ne_bytes(b.try_into().ok()?))),
        DType::I64 => Scalar::Int(i64::from_ne_bytes(b.try_into().ok()?)),
        DType::F16 => Scalar::Float(f64::from(f16::from_ne_bytes(b.try_into().ok()?))),
        DType::BF16 => Scalar::Float(f64::from(bf16::from_ne_bytes(b.try_into().ok()?))),
        DType::F32 => Scalar::Float(f64::from(f32::from_ne_bytes(b.try_into().ok()?))),
        DType::F64 => Scalar::Float(f64::from_ne_bytes(b.try_into().ok()?)),
    })
}

/// Append `v` converted to `dtype` as native-endian bytes, as a cast converts it: floats
/// round to nearest (even), to `f16` and `bf16` through a rounded `f32` (as PyTorch), an
/// integer to `f32` directly; a float to an integer truncates toward zero and saturates (NaN
/// is 0), an integer wraps to a narrower one, anything nonzero is `true`.
pub fn write_element(dtype: DType, v: Scalar, out: &mut Vec<u8>) {
    let as_f32 = |v: Scalar| match v {
        Scalar::Float(f) => f as f32,
        Scalar::Int(i) => i as f32,
        Scalar::Bool(b) => f32::from(u8::from(b)),
    };
    match dtype {
        DType::Bool => out.push(u8::from(v.as_bool())),
        DType::U8 => out.push(match v {
            Scalar::Float(f) => f as u8,
            _ => v.as_i64() as u8,
        }),
        DType::I32 => out.extend_from_slice(
            &(match v {
                Scalar::Float(f) => f as i32,
                _ => v.as_i64() as i32,
            })
            .to_ne_bytes(),
        ),
        DType::I64 => out.extend_from_slice(&v.as_i64().to_ne_bytes()),
        DType::F16 => out.extend_from_slice(&f16::from_f32(as_f32(v)).to_ne_bytes()),
        DType::BF16 => out.extend_from_slice(&bf16::from_f32(as_f32(v)).to_ne_bytes()),
        DType::F32 => out.extend_from_slice(&as_f32(v).to_ne_bytes()),
        DType::F64 => out.extend_from_slice(&v.as_f64().to_ne_bytes()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `first_of` decodes what `from_bytes` decodes first, for every element type, and
    /// refuses fewer bytes than one element.
    #[test]
    fn the_first_element_of_bytes_is_the_first_decoded() {
        fn check<T: Element>(values: &[T]) {
            let bytes = T::to_bytes(values);
            assert_eq!(T::first_of(&bytes), Some(values[0]));
            assert_eq!(T::first_of(&bytes), T::from_bytes(&bytes).first().copied());
            assert_eq!(T::first_of(&bytes[..T::DTYPE.size() - 1]), None, "{}", T::DTYPE);
        }
        check(&[-1.5f32, 2.0]);
        check(&[f64::MIN_POSITIVE, 3.0]);
        check(&[f16::from_f32(0.333), f16::ONE]);
        check(&[bf16::from_f32(-7.25), bf16::ONE]);
        check(&[i32::MIN, 1]);
        check(&[i64::MAX, -1]);
        check(&[255u8, 0]);
        check(&[true, false]);
        assert_eq!(bool::first_of(&[2]), Some(true), "any byte other than 0 reads as true");
    }

    #[test]
    fn sizes_and_names_round_trip() {
        for d in DType::ALL {
            assert_eq!(DType::from_name(d.name()), Some(d));
            assert_eq!(DType::from_name(d.torch_name()), Some(d));
        }
        assert_eq!(DType::BF16.size(), 2);
        assert_eq!(DType::from_name("complex64"), None);
    }

    /// The table of `torch.promote_types` over the eight dtypes (PyTorch 2.x), row by row.
    #[test]
    fn promotion_matches_torch() {
        use DType::*;
        let order = [Bool, U8, I32, I64, F16, BF16, F32, F64];
        let table = [
            [Bool, U8, I32, I64, F16, BF16, F32, F64],
            [U8, U8, I32, I64, F16, BF16, F32, F64],
            [I32, I32, I32, I64, F16, BF16, F32, F64],
            [I64, I64, I64, I64, F16, BF16, F32, F64],
            [F16, F16, F16, F16, F16, F32, F32, F64],
            [BF16, BF16, BF16, BF16, F32, BF16, F32, F64],
            [F32, F32, F32, F32, F32, F32, F32, F64],
            [F64, F64, F64, F64, F64, F64, F64, F64],
        ];
        for (i, a) in order.iter().enumerate() {
            for (j, b) in order.iter().enumerate() {
                assert_eq!(promote_types(*a, *b), table[i][j], "{a} with {b}");
            }
        }
    }

    #[test]
    fn encodings_round_trip() {
        let f = [f16::from_f32(1.5), f16::NAN, f16::INFINITY];
        let b = f16::to_bytes(&f);
        assert_eq!(f16::try_from_bytes(&b).unwrap()[0], f[0]);
        assert!(f16::from_bytes(&b)[1].is_nan());
        let bools = [true, false, true];
        assert_eq!(bool::to_bytes(&bools), vec![1, 0, 1]);
        assert_eq!(bool::from_bytes(&[0, 1, 7]), vec![false, true, true]);
        let i = [i64::MIN, -1, 0, 7];
        assert_eq!(i64::try_from_bytes(&i64::to_bytes(&i)).unwrap(), i.to_vec());
        // A trailing partial element is ignored.
        assert_eq!(f32::try_from_bytes(&f32::to_bytes(&[1.5, 2.0])[..7]).unwrap(), vec![1.5]);
    }
}
