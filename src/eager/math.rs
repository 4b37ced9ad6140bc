//! Arithmetic, comparisons, products and reductions of [`Array`]s: PyTorch's names and
//! rules, in three forms where PyTorch has them (`a.add(b)` makes a new array,
//! `a.add_into(b, out)` writes `out`, `a.add_(b)` writes `a` in place, through a view into
//! the storage it shares).
//!
//! The other operand is an array or a scalar ([`Rhs`]). Arrays broadcast (NumPy's rules);
//! the result's dtype is PyTorch's `result_type` (`eager::promote`): operands of another
//! dtype are converted first (the `cast` op), true division of integers gives floats, and a
//! comparison gives `bool`. An in-place form keeps its array's dtype and shape: a result
//! that cannot be cast to it (a float into an integer array) or that broadcasts to a larger
//! shape is refused, as PyTorch refuses it.

use super::promote::{can_cast, result_type, Operand, DEFAULT_FLOAT};
use super::Array;
use crate::framework::{Attrs, DType, Op, Scalar};
use crate::vm::{Error, Result};

/// The other operand of an elementwise op: an array, or a scalar (`2.0`, `3`, `true`).
#[derive(Debug, Clone, Copy)]
pub enum Rhs<'a> {
    /// An array (broadcast against the first operand).
    Array(&'a Array),
    /// A number.
    Scalar(Scalar),
}

impl<'a> From<&'a Array> for Rhs<'a> {
    fn from(a: &'a Array) -> Self {
        Rhs::Array(a)
    }
}

impl<'a> From<&'a mut Array> for Rhs<'a> {
    fn from(a: &'a mut Array) -> Self {
        Rhs::Array(a)
    }
}

macro_rules! scalar_rhs {
    ($($t:ty => $k:ident as $c:ty),*) => {$(
        impl From<$t> for Rhs<'_> {
            fn from(v: $t) -> Self {
                Rhs::Scalar(Scalar::$k(v as $c))
            }
        }
    )*};
}
scalar_rhs!(f64 => Float as f64, f32 => Float as f64, i64 => Int as i64, i32 => Int as i64, u8 => Int as i64, usize => Int as i64);

impl From<bool> for Rhs<'_> {
    fn from(v: bool) -> Self {
        Rhs::Scalar(Scalar::Bool(v))
    }
}

impl From<Scalar> for Rhs<'_> {
    fn from(v: Scalar) -> Self {
        Rhs::Scalar(v)
    }
}

/// A binary elementwise op (the front ends' operators and methods name theirs with it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Bin {
    Add,
    Sub,
    Mul,
    Div,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl Bin {
    /// The method's name (`add`), for messages.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Bin::Add => "add",
            Bin::Sub => "sub",
            Bin::Mul => "mul",
            Bin::Div => "div",
            Bin::Eq => "eq",
            Bin::Ne => "ne",
            Bin::Lt => "lt",
            Bin::Le => "le",
            Bin::Gt => "gt",
            Bin::Ge => "ge",
        }
    }

    /// The in-place form's name (`add_`), for errors: a constant, so that an accepted
    /// in-place call allocates no string.
    pub(crate) fn name_in_place(self) -> &'static str {
        match self {
            Bin::Add => "add_",
            Bin::Sub => "sub_",
            Bin::Mul => "mul_",
            Bin::Div => "div_",
            Bin::Eq => "eq_",
            Bin::Ne => "ne_",
            Bin::Lt => "lt_",
            Bin::Le => "le_",
            Bin::Gt => "gt_",
            Bin::Ge => "ge_",
        }
    }

    fn compares(self) -> bool {
        matches!(self, Bin::Eq | Bin::Ne | Bin::Lt | Bin::Le | Bin::Gt | Bin::Ge)
    }

    /// The comparison with its operands swapped (`s < x` is `x > s`).
    fn swapped(self) -> Bin {
        match self {
            Bin::Lt => Bin::Gt,
            Bin::Le => Bin::Ge,
            Bin::Gt => Bin::Lt,
            Bin::Ge => Bin::Le,
            b => b,
        }
    }
}

impl Array {
    fn bin_op(&self, b: Bin) -> Op {
        let o = self.cx.ops();
        match b {
            Bin::Add => o.add,
            Bin::Sub => o.sub,
            Bin::Mul => o.mul,
            Bin::Div => o.div,
            Bin::Eq => o.eq,
            Bin::Ne => o.ne,
            Bin::Lt => o.lt,
            Bin::Le => o.le,
            Bin::Gt => o.gt,
            Bin::Ge => o.ge,
        }
    }

    /// The dtype `b` computes `self` and `rhs` in: PyTorch's result type, made floating for
    /// a true division.
    pub(super) fn compute_dtype(&self, b: Bin, rhs: Rhs<'_>) -> DType {
        // A number never promotes a floating array (PyTorch's categories): the common
        // call (`x * 0.5`) needs no table.
        if matches!(rhs, Rhs::Scalar(_)) && self.dtype().is_floating() {
            return self.dtype();
        }
        let other = match rhs {
            Rhs::Array(a) => Operand::Tensor { dtype: a.dtype(), rank: a.ndim() },
            Rhs::Scalar(s) => Operand::Scalar(s),
        };
        let dt = result_type(&[Operand::Tensor { dtype: self.dtype(), rank: self.ndim() }, other])
            .expect("two operands");
        if b == Bin::Div && !dt.is_floating() {
            DEFAULT_FLOAT
        } else {
            dt
        }
    }

    /// `self b rhs`, a new array.
    pub(crate) fn binary(&self, b: Bin, rhs: Rhs<'_>) -> Result<Array> {
        // The common call, two arrays of one dtype that `b` computes in: no conversion.
        if let Rhs::Array(o) = rhs {
            if o.dtype() == self.dtype() && (b != Bin::Div || self.dtype().is_floating()) {
                return self.call(self.bin_op(b), &[self, o], Attrs::default());
            }
        }
        let dt = self.compute_dtype(b, rhs);
        match rhs {
            Rhs::Array(o) => {
                let (x, y) = (self.to_dtype(dt)?, o.to_dtype(dt)?);
                x.call(self.bin_op(b), &[&x, &y], Attrs::default())
            }
            Rhs::Scalar(s) if b.compares() => {
                // A scalar comparison is made in the array's own dtype by the kernel (a float
                // scalar against integers in double precision): no conversion of the array.
                if self.dtype() == DType::Bool && !matches!(s, Scalar::Bool(_)) {
                    let x = self.to_dtype(dt)?;
                    x.call(self.scalar_op(b), &[&x], Attrs::of(s))
                } else {
                    self.call(self.scalar_op(b), &[self], Attrs::of(s))
                }
            }
            Rhs::Scalar(s) => {
                let s = scalar_in(s, dt);
                let (op, s) = match b {
                    Bin::Sub => (self.cx.ops().add_scalar, negate(s, dt)?),
                    _ => (self.scalar_op(b), s),
                };
                // The array itself where it is of the computing dtype (the common call):
                // a converted handle of the same array would cost two counted references.
                if dt == self.dtype() {
                    self.call(op, &[self], Attrs::of(s))
                } else {
                    let x = self.to_dtype(dt)?;
                    x.call(op, &[&x], Attrs::of(s))
                }
            }
        }
    }

    /// The op of `b` with a scalar operand (`sub` is `add_scalar` of the negation).
    fn scalar_op(&self, b: Bin) -> Op {
        let o = self.cx.ops();
        match b {
            Bin::Add | Bin::Sub => o.add_scalar,
            Bin::Mul => o.mul_scalar,
            Bin::Div => o.div_scalar,
            Bin::Eq => o.eq_scalar,
            Bin::Ne => o.ne_scalar,
            Bin::Lt => o.lt_scalar,
            Bin::Le => o.le_scalar,
            Bin::Gt => o.gt_scalar,
            Bin::Ge => o.ge_scalar,
        }
    }

    /// `scalar b self`, a new array (Python's reflected operators: `2 - x`, `1 / x`).
    pub(crate) fn binary_reflected(&self, b: Bin, s: Scalar) -> Result<Array> {
        if b.compares() {
            return self.binary(b.swapped(), Rhs::Scalar(s));
        }
        let dt = self.compute_dtype(b, Rhs::Scalar(s));
        let s = scalar_in(s, dt);
        let o = self.cx.ops();
        let op = match b {
            Bin::Add => o.add_scalar,
            Bin::Mul => o.mul_scalar,
            Bin::Sub => o.rsub_scalar,
            Bin::Div => o.rdiv_scalar,
            _ => unreachable!("comparisons are swapped above"),
        };
        // As in `binary`: the array itself where no conversion is needed.
        if dt == self.dtype() {
            self.call(op, &[self], Attrs::of(s))
        } else {
            let x = self.to_dtype(dt)?;
            x.call(op, &[&x], Attrs::of(s))
        }
    }

    /// `self b= rhs`: the result written into this array (module docs).
    pub(crate) fn binary_(&mut self, b: Bin, rhs: Rhs<'_>) -> Result<&mut Self> {
        let name = b.name_in_place();
        let dt = self.compute_dtype(b, rhs);
        if !can_cast(dt, self.dtype()) {
            return Err(Error::InvalidOperands {
                op: name.into(),
                detail: format!("the result type {dt} cannot be cast to the array's dtype {}", self.dtype()),
            });
        }
        if let Rhs::Array(o) = rhs {
            let shape = super::layout::broadcast_shapes(name, self.shape(), o.shape())?;
            if shape.as_slice() != self.shape() {
                return Err(Error::InvalidOperands {
                    op: name.into(),
                    detail: format!(
                        "the array's shape {:?} does not match the broadcast shape {:?}",
                        self.shape(),
                        &shape[..]
                    ),
                });
            }
        }
        if dt != self.dtype() {
            let r = self.binary(b, rhs)?;
            return self.copy_(&r);
        }
        match rhs {
            Rhs::Array(o) => {
                let y = o.to_dtype(dt)?;
                self.call_into(self.bin_op(b), &[self, &y], self, Attrs::default())?
            }
            Rhs::Scalar(s) => {
                let s = scalar_in(s, dt);
                let (op, s) = match b {
                    Bin::Sub => (self.cx.ops().add_scalar, negate(s, dt)?),
                    _ => (self.scalar_op(b), s),
                };
                self.call_into(op, &[self], self, Attrs::of(s))?
            }
        }
        Ok(self)
    }

    /// `self b rhs` written into `out` (PyTorch's `out=`): the result converted to `out`'s
    /// dtype where it may be; `out` must have the broadcast shape.
    fn binary_into(&self, b: Bin, rhs: Rhs<'_>, out: &mut Array) -> Result<()> {
        let dt = self.compute_dtype(b, rhs);
        let result_dt = if b.compares() { DType::Bool } else { dt };
        match rhs {
            Rhs::Array(o) if result_dt == out.dtype() && !b.compares() => {
                let (x, y) = (self.to_dtype(dt)?, o.to_dtype(dt)?);
                x.call_into(self.bin_op(b), &[&x, &y], out, Attrs::default())
            }
            _ => {
                if !can_cast(result_dt, out.dtype()) {
                    return Err(Error::InvalidOperands {
                        op: b.name().into(),
                        detail: format!(
                            "the result type {result_dt} cannot be cast to out's dtype {}",
                            out.dtype()
                        ),
                    });
                }
                let r = self.binary(b, rhs)?;
                if r.shape() != out.shape() {
                    return Err(Error::OutputMismatch {
                        op: b.name().into(),
                        index: 0,
                        expected: format!("{}{:?}", out.dtype(), r.shape()),
                        found: format!("{}{:?}", out.dtype(), out.shape()),
                    });
                }
                out.copy_(&r).map(|_| ())
            }
        }
    }

    /// Elementwise `self + other` (an array, broadcast, or a scalar).
    pub fn add<'a>(&self, other: impl Into<Rhs<'a>>) -> Result<Array> {
        self.binary(Bin::Add, other.into())
    }
    /// Elementwise `self - other`.
    pub fn sub<'a>(&self, other: impl Into<Rhs<'a>>) -> Result<Array> {
        self.binary(Bin::Sub, other.into())
    }
    /// Elementwise `self * other`.
    pub fn mul<'a>(&self, other: impl Into<Rhs<'a>>) -> Result<Array> {
        self.binary(Bin::Mul, other.into())
    }
    /// Elementwise true division `self / other` (integers divide as floats).
    pub fn div<'a>(&self, other: impl Into<Rhs<'a>>) -> Result<Array> {
        self.binary(Bin::Div, other.into())
    }
    /// `scalar - self` (Python's `2 - x`).
    pub fn rsub(&self, scalar: impl Into<Scalar>) -> Result<Array> {
        self.binary_reflected(Bin::Sub, scalar.into())
    }
    /// `scalar / self` (Python's `1 / x`).
    pub fn rdiv(&self, scalar: impl Into<Scalar>) -> Result<Array> {
        self.binary_reflected(Bin::Div, scalar.into())
    }
    /// `-self` (refused for `bool`, as PyTorch refuses it: use `logical_not`).
    pub fn neg(&self) -> Result<Array> {
        if self.dtype() == DType::Bool {
            return Err(Error::InvalidOperands {
                op: "neg".into(),
                detail: "negation of a bool tensor is not supported; use logical_not".into(),
            });
        }
        let minus_one = if self.dtype().is_floating() { Scalar::Float(-1.0) } else { Scalar::Int(-1) };
        self.call(self.cx.ops().mul_scalar, &[self], Attrs::of(minus_one))
    }

    /// `self == other` elementwise, as a `bool` array.
    pub fn eq<'a>(&self, other: impl Into<Rhs<'a>>) -> Result<Array> {
        self.binary(Bin::Eq, other.into())
    }
    /// `self != other` elementwise.
    pub fn ne<'a>(&self, other: impl Into<Rhs<'a>>) -> Result<Array> {
        self.binary(Bin::Ne, other.into())
    }
    /// `self < other` elementwise.
    pub fn lt<'a>(&self, other: impl Into<Rhs<'a>>) -> Result<Array> {
        self.binary(Bin::Lt, other.into())
    }
    /// `self <= other` elementwise.
    pub fn le<'a>(&self, other: impl Into<Rhs<'a>>) -> Result<Array> {
        self.binary(Bin::Le, other.into())
    }
    /// `self > other` elementwise.
    pub fn gt<'a>(&self, other: impl Into<Rhs<'a>>) -> Result<Array> {
        self.binary(Bin::Gt, other.into())
    }
    /// `self >= other` elementwise.
    pub fn ge<'a>(&self, other: impl Into<Rhs<'a>>) -> Result<Array> {
        self.binary(Bin::Ge, other.into())
    }

    /// [`add`](Self::add) in place.
    pub fn add_<'a>(&mut self, other: impl Into<Rhs<'a>>) -> Result<&mut Self> {
        self.binary_(Bin::Add, other.into())
    }
    /// [`sub`](Self::sub) in place.
    pub fn sub_<'a>(&mut self, other: impl Into<Rhs<'a>>) -> Result<&mut Self> {
        self.binary_(Bin::Sub, other.into())
    }
    /// [`mul`](Self::mul) in place.
    pub fn mul_<'a>(&mut self, other: impl Into<Rhs<'a>>) -> Result<&mut Self> {
        self.binary_(Bin::Mul, other.into())
    }
    /// [`div`](Self::div) in place (refused for an integer array: the result is floating).
    pub fn div_<'a>(&mut self, other: impl Into<Rhs<'a>>) -> Result<&mut Self> {
        self.binary_(Bin::Div, other.into())
    }

    /// [`add`](Self::add) written into `out`, which must have the broadcast shape and a
    /// dtype the result may be cast to (PyTorch's `out=`); `out` may be an input.
    pub fn add_into<'a>(&self, other: impl Into<Rhs<'a>>, out: &mut Array) -> Result<()> {
        self.binary_into(Bin::Add, other.into(), out)
    }
    /// [`sub`](Self::sub) written into `out`.
    pub fn sub_into<'a>(&self, other: impl Into<Rhs<'a>>, out: &mut Array) -> Result<()> {
        self.binary_into(Bin::Sub, other.into(), out)
    }
    /// [`mul`](Self::mul) written into `out`.
    pub fn mul_into<'a>(&self, other: impl Into<Rhs<'a>>, out: &mut Array) -> Result<()> {
        self.binary_into(Bin::Mul, other.into(), out)
    }
    /// [`div`](Self::div) written into `out`.
    pub fn div_into<'a>(&self, other: impl Into<Rhs<'a>>, out: &mut Array) -> Result<()> {
        self.binary_into(Bin::Div, other.into(), out)
    }

    /// `self * factor` (the factor converted to the array's dtype: truncated toward zero for
    /// integers; PyTorch's `mul` by a scalar, kept under its traces' name).
    pub fn scale(&self, factor: f64) -> Result<Array> {
        self.call(self.cx.ops().scale, &[self], Attrs::scalar(factor))
    }
    /// [`scale`](Self::scale) written into `out`.
    pub fn scale_into(&self, factor: f64, out: &mut Array) -> Result<()> {
        self.call_into(self.cx.ops().scale, &[self], out, Attrs::scalar(factor))
    }
    /// [`scale`](Self::scale) in place.
    pub fn scale_(&mut self, factor: f64) -> Result<&mut Self> {
        self.call_into(self.cx.ops().scale, &[self], self, Attrs::scalar(factor))?;
        Ok(self)
    }

    /// `max(self, 0)` elementwise (NaN stays NaN).
    pub fn relu(&self) -> Result<Array> {
        self.call(self.cx.ops().relu, &[self], Attrs::default())
    }
    /// [`relu`](Self::relu) written into `out`.
    pub fn relu_into(&self, out: &mut Array) -> Result<()> {
        self.call_into(self.cx.ops().relu, &[self], out, Attrs::default())
    }
    /// [`relu`](Self::relu) in place.
    pub fn relu_(&mut self) -> Result<&mut Self> {
        self.call_into(self.cx.ops().relu, &[self], self, Attrs::default())?;
        Ok(self)
    }

    /// The gradient of `relu` at `self` given the gradient `dy` of its output: `dy` where
    /// `self > 0`, 0 elsewhere.
    pub fn relu_grad(&self, dy: &Array) -> Result<Array> {
        // The kernel takes (dy, x).
        self.call(self.cx.ops().relu_grad, &[dy, self], Attrs::default())
    }

    /// `self[i][j] + bias[j]`: a `[k]` bias added to every row of a `[n, k]` array.
    pub fn add_bias(&self, bias: &Array) -> Result<Array> {
        self.call(self.cx.ops().add_bias, &[self, bias], Attrs::default())
    }
    /// [`add_bias`](Self::add_bias) in place (a broadcasting [`add_`](Self::add_)).
    pub fn add_bias_(&mut self, bias: &Array) -> Result<&mut Self> {
        self.add_(bias)
    }
    /// [`add_bias`](Self::add_bias) written into `out`.
    pub fn add_bias_into(&self, bias: &Array, out: &mut Array) -> Result<()> {
        self.call_into(self.cx.ops().add_bias, &[self, bias], out, Attrs::default())
    }

    /// Overwrite this array with `src`, broadcast to its shape, converted to its dtype and
    /// copied from `src`'s device, after every earlier use of it (PyTorch's `copy_`).
    pub fn copy_(&mut self, src: &Array) -> Result<&mut Self> {
        let mut s = src.clone();
        if s.shape() != self.shape() {
            s = s.broadcast_to(self.shape()).map_err(|e| match e {
                Error::InvalidOperands { detail, .. } => {
                    Error::InvalidOperands { op: "copy_".into(), detail }
                }
                e => e,
            })?;
        }
        if s.device() != self.device() {
            s = s.to(self.device())?;
        }
        if s.dtype() != self.dtype() {
            s = s.to_dtype(self.dtype())?;
        }
        self.call_into(self.cx.ops().copy, &[&s], self, Attrs::default())?;
        Ok(self)
    }

    /// Overwrite this array with `value` (an array of the same shape, dtype and device;
    /// [`copy_`](Self::copy_) converts and broadcasts).
    pub fn assign(&mut self, value: &Array) -> Result<()> {
        self.copy_(value).map(|_| ())
    }

    /// Every element set to `value`, converted to the array's dtype (PyTorch's `fill_`).
    pub fn fill_(&mut self, value: impl Into<Scalar>) -> Result<&mut Self> {
        self.call_into(self.cx.ops().fill, &[], self, Attrs::of(value.into()))?;
        Ok(self)
    }

    /// Every element set to 0.
    pub fn zero_(&mut self) -> Result<&mut Self> {
        self.fill_(Scalar::Int(0))
    }

    /// This array where `mask` (a `bool` array broadcast to its shape) is false, `value`
    /// where it is true.
    pub fn masked_fill(&self, mask: &Array, value: impl Into<Scalar>) -> Result<Array> {
        self.call(self.cx.ops().masked_fill, &[self, mask], Attrs::of(value.into()))
    }

    /// [`masked_fill`](Self::masked_fill) in place.
    pub fn masked_fill_(&mut self, mask: &Array, value: impl Into<Scalar>) -> Result<&mut Self> {
        self.call_into(self.cx.ops().masked_fill, &[self, mask], self, Attrs::of(value.into()))?;
        Ok(self)
    }

    /// [`matmul`](Self::matmul) written into `out`.
    pub fn matmul_into(&self, other: &Array, out: &mut Array) -> Result<()> {
        self.call_into(self.cx.ops().matmul, &[self, other], out, Attrs::default())
    }
    /// `selfᵀ @ other`: `[k, m] x [k, n] -> [m, n]` (a weight gradient, `xᵀ dy`).
    pub fn matmul_tn(&self, other: &Array) -> Result<Array> {
        self.matmul_t(other, true, false)
    }
    /// `self @ otherᵀ`: `[m, k] x [n, k] -> [m, n]` (an input gradient, `dy Wᵀ`).
    pub fn matmul_nt(&self, other: &Array) -> Result<Array> {
        self.matmul_t(other, false, true)
    }

    /// `self @ other` with the transpose flags given: `aᵀ b` with `transpose_a`, `a bᵀ` with
    /// `transpose_b` (not both: `Error::InvalidOperands`).
    pub fn matmul_t(&self, other: &Array, transpose_a: bool, transpose_b: bool) -> Result<Array> {
        let attrs = Attrs::transposed(transpose_a, transpose_b);
        if self.dtype() == other.dtype() {
            return self.call(self.cx.ops().matmul, &[self, other], attrs);
        }
        let dt = self.compute_dtype(Bin::Mul, Rhs::Array(other));
        let (x, y) = (self.to_dtype(dt)?, other.to_dtype(dt)?);
        x.call(self.cx.ops().matmul, &[&x, &y], attrs)
    }

    /// The sum of all elements, as a 0-d array (`i64` for `bool` and integer arrays).
    pub fn sum(&self) -> Result<Array> {
        self.call(self.cx.ops().sum, &[self], Attrs::default())
    }

    /// The sum over the rows of a `[n, k]` array: `[k]` column sums (a bias gradient).
    pub fn sum_rows(&self) -> Result<Array> {
        self.call(self.cx.ops().sum_rows, &[self], Attrs::default())
    }
}

/// `s` as the scalar a kernel computing in `dt` takes: a float for a floating dtype, an
/// integer (a float truncated toward zero) for an integer one, a boolean for `bool`.
fn scalar_in(s: Scalar, dt: DType) -> Scalar {
    if dt.is_floating() {
        Scalar::Float(s.as_f64())
    } else if dt == DType::Bool {
        Scalar::Bool(s.as_bool())
    } else {
        Scalar::Int(s.as_i64())
    }
}

/// `-s` for a subtraction computed in `dt` (refused for `bool`, as PyTorch refuses it).
fn negate(s: Scalar, dt: DType) -> Result<Scalar> {
    match s {
        Scalar::Float(v) => Ok(Scalar::Float(-v)),
        Scalar::Int(v) => Ok(Scalar::Int(v.wrapping_neg())),
        Scalar::Bool(_) => Err(Error::InvalidOperands {
            op: "sub".into(),
            detail: format!(
                "subtraction of {dt} values is not supported; use logical_xor or ~ for bool tensors"
            ),
        }),
    }
}
