//! The elementwise ops of the CUDA backend: one line of [`ELEMENTWISE`] per op, what each computes
//! ([`Kind`]), the dtypes it takes ([`Kind::takes`]) and the name of the generated kernel
//! that runs it for a dtype ([`symbol`]).
//!
//! The source generator (`source`), the shape rules (`infer`) and the launches
//! (`elementwise`) all read this one table, so that a dtype an op accepts always has a
//! compiled kernel (a unit test checks every pair).

use crate::vm::{DType, Scalar};

/// A binary arithmetic operation, tensor with tensor or tensor with scalar.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Arith {
    /// `a + b` (wrapping for integers, `or` for `bool`).
    Add,
    /// `a - b` (wrapping for integers; not for `bool`).
    Sub,
    /// `a * b` (wrapping for integers, `and` for `bool`).
    Mul,
    /// `a / b` (floating-point dtypes only).
    Div,
}

/// A comparison; its result is `bool`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Cmp {
    /// `==`.
    Eq,
    /// `!=`.
    Ne,
    /// `<`.
    Lt,
    /// `<=`.
    Le,
    /// `>`.
    Gt,
    /// `>=`.
    Ge,
}

impl Cmp {
    /// Every comparison.
    pub const ALL: [Cmp; 6] = [Cmp::Eq, Cmp::Ne, Cmp::Lt, Cmp::Le, Cmp::Gt, Cmp::Ge];

    /// The C operator.
    pub fn op(self) -> &'static str {
        match self {
            Cmp::Eq => "==",
            Cmp::Ne => "!=",
            Cmp::Lt => "<",
            Cmp::Le => "<=",
            Cmp::Gt => ">",
            Cmp::Ge => ">=",
        }
    }

    /// The short name (`eq`, `ne`, ...), the op's name for tensors.
    pub fn name(self) -> &'static str {
        match self {
            Cmp::Eq => "eq",
            Cmp::Ne => "ne",
            Cmp::Lt => "lt",
            Cmp::Le => "le",
            Cmp::Gt => "gt",
            Cmp::Ge => "ge",
        }
    }
}

/// Where the scalar of a tensor–scalar op stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Side {
    /// `x op s`.
    Right,
    /// `s op x` (`rsub_scalar`, `rdiv_scalar`).
    Left,
}

/// What an elementwise op computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// No inputs: every element of the given output set to the scalar, converted to its dtype.
    Fill,
    /// One input converted to `attrs.dtype()`.
    Cast,
    /// Two inputs of one dtype, broadcast against each other.
    Binary(Arith),
    /// `x: [n, k]` plus `b: [k]` broadcast over the rows.
    AddBias,
    /// `max(x, 0)`; NaN and `-0.0` pass through.
    Relu,
    /// Inputs `(dy, x)`: `dy` where `x > 0`, else 0.
    ReluGrad,
    /// One input with the scalar.
    Scalar(Arith, Side),
    /// Two inputs of one dtype, broadcast; a `bool` result.
    Compare(Cmp),
    /// One input against the scalar; a `bool` result.
    CompareScalar(Cmp),
    /// Inputs `(x, mask)`: the scalar where the `bool` mask (broadcast to `x`) is set, else `x`.
    MaskedFill,
}

impl Kind {
    /// Number of tensor inputs.
    pub fn arity(self) -> usize {
        match self {
            Kind::Fill => 0,
            Kind::Cast | Kind::Relu | Kind::Scalar(..) | Kind::CompareScalar(_) => 1,
            Kind::Binary(_) | Kind::AddBias | Kind::ReluGrad | Kind::Compare(_) | Kind::MaskedFill => 2,
        }
    }

    /// Whether the op takes inputs of dtype `d` (the output's for `Fill`).
    pub fn takes(self, d: DType) -> bool {
        match self {
            Kind::Fill | Kind::Cast | Kind::MaskedFill | Kind::Compare(_) | Kind::CompareScalar(_) => true,
            Kind::Binary(Arith::Add | Arith::Mul) | Kind::AddBias => true,
            Kind::Binary(Arith::Sub) | Kind::Relu | Kind::ReluGrad => d != DType::Bool,
            Kind::Scalar(Arith::Add | Arith::Sub | Arith::Mul, _) => d != DType::Bool,
            Kind::Binary(Arith::Div) | Kind::Scalar(Arith::Div, _) => d.is_floating(),
        }
    }

    /// The dtypes [`takes`](Self::takes) admits, in `DType::ALL`'s order.
    pub fn dtypes(self) -> &'static [DType] {
        let groups =
            [crate::kernels::Dtypes::All, crate::kernels::Dtypes::Numeric, crate::kernels::Dtypes::Floating];
        groups
            .into_iter()
            .map(|g| g.list())
            .find(|l| DType::ALL.iter().all(|&d| l.contains(&d) == self.takes(d)))
            .unwrap_or(&[])
    }

    /// What the op requires of its inputs' dtype, for the message that refuses another.
    pub fn dtype_rule(self) -> &'static str {
        match self {
            Kind::Binary(Arith::Div) | Kind::Scalar(Arith::Div, _) => {
                "takes floating-point inputs (cast integers first)"
            }
            _ => "takes numeric inputs, not bool",
        }
    }
}

/// One elementwise op: its name and what it computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Op {
    /// The op's name.
    pub name: &'static str,
    /// What it computes.
    pub kind: Kind,
}

/// The elementwise ops of the CUDA backend, one line each.
pub static ELEMENTWISE: &[Op] = &[
    Op { name: "fill", kind: Kind::Fill },
    Op { name: "cast", kind: Kind::Cast },
    Op { name: "add", kind: Kind::Binary(Arith::Add) },
    Op { name: "sub", kind: Kind::Binary(Arith::Sub) },
    Op { name: "mul", kind: Kind::Binary(Arith::Mul) },
    Op { name: "div", kind: Kind::Binary(Arith::Div) },
    Op { name: "add_bias", kind: Kind::AddBias },
    Op { name: "relu", kind: Kind::Relu },
    Op { name: "relu_grad", kind: Kind::ReluGrad },
    // `scale` is `mul_scalar` under its older name (the traces and programs use it).
    Op { name: "scale", kind: Kind::Scalar(Arith::Mul, Side::Right) },
    Op { name: "add_scalar", kind: Kind::Scalar(Arith::Add, Side::Right) },
    Op { name: "rsub_scalar", kind: Kind::Scalar(Arith::Sub, Side::Left) },
    Op { name: "mul_scalar", kind: Kind::Scalar(Arith::Mul, Side::Right) },
    Op { name: "div_scalar", kind: Kind::Scalar(Arith::Div, Side::Right) },
    Op { name: "rdiv_scalar", kind: Kind::Scalar(Arith::Div, Side::Left) },
    Op { name: "eq", kind: Kind::Compare(Cmp::Eq) },
    Op { name: "ne", kind: Kind::Compare(Cmp::Ne) },
    Op { name: "lt", kind: Kind::Compare(Cmp::Lt) },
    Op { name: "le", kind: Kind::Compare(Cmp::Le) },
    Op { name: "gt", kind: Kind::Compare(Cmp::Gt) },
    Op { name: "ge", kind: Kind::Compare(Cmp::Ge) },
    Op { name: "eq_scalar", kind: Kind::CompareScalar(Cmp::Eq) },
    Op { name: "ne_scalar", kind: Kind::CompareScalar(Cmp::Ne) },
    Op { name: "lt_scalar", kind: Kind::CompareScalar(Cmp::Lt) },
    Op { name: "le_scalar", kind: Kind::CompareScalar(Cmp::Le) },
    Op { name: "gt_scalar", kind: Kind::CompareScalar(Cmp::Gt) },
    Op { name: "ge_scalar", kind: Kind::CompareScalar(Cmp::Ge) },
    Op { name: "masked_fill", kind: Kind::MaskedFill },
];

/// How an integral tensor is compared with a scalar: exactly in `i64` for an integer (or
/// `bool`) scalar, in `f64` for a float scalar (the tensor's values converted, as PyTorch
/// compares an integer tensor with a Python float).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScalarDomain {
    /// In the tensor's compute type (floating-point tensors; the scalar rounded to the dtype).
    Own,
    /// In `i64`.
    Int,
    /// In `f64`.
    Double,
}

impl ScalarDomain {
    /// The domain of a comparison of a `d` tensor with `s`.
    pub fn of(d: DType, s: Scalar) -> ScalarDomain {
        match (d.is_floating(), s) {
            (true, _) => ScalarDomain::Own,
            (false, Scalar::Float(_)) => ScalarDomain::Double,
            (false, _) => ScalarDomain::Int,
        }
    }

    /// The domains the kernels of `d` are compiled for.
    pub fn compiled(d: DType) -> &'static [ScalarDomain] {
        if d.is_floating() {
            &[ScalarDomain::Own]
        } else {
            &[ScalarDomain::Int, ScalarDomain::Double]
        }
    }

    fn suffix(self) -> &'static str {
        match self {
            ScalarDomain::Own => "",
            ScalarDomain::Int => "_i",
            ScalarDomain::Double => "_d",
        }
    }
}

/// The element types of the element-size kernels (`fill`, `masked_fill`, `copy`): the
/// value is moved as bits.
pub fn bits_type(size: usize) -> &'static str {
    match size {
        1 => "u8",
        2 => "u16",
        4 => "u32",
        _ => "u64",
    }
}

/// The symbol of the kernel that computes `kind` on inputs of `input` into outputs of
/// `output`, comparing with a scalar in `domain` (comparisons with a scalar only).
///
/// `fill` and `masked_fill` move the scalar's bits, so they have one kernel per element
/// size (`fill_4`); `cast` one per pair (`cast_f32_f16`); the others one per input dtype
/// (`add_bf16`, `lt_scalar_i32_d`). `scale` and `mul_scalar` share `mul_scalar_*`.
pub fn symbol(kind: Kind, input: DType, output: DType, domain: ScalarDomain) -> String {
    match kind {
        Kind::Fill => format!("fill_{}", output.size()),
        Kind::MaskedFill => format!("masked_fill_{}", output.size()),
        Kind::Cast => format!("cast_{input}_{output}"),
        Kind::Binary(a) => format!("{}_{input}", arith_name(a)),
        // `add` with the bias broadcast.
        Kind::AddBias => format!("add_{input}"),
        Kind::Relu => format!("relu_{input}"),
        Kind::ReluGrad => format!("relu_grad_{input}"),
        Kind::Scalar(a, side) => {
            let r = if side == Side::Left { "r" } else { "" };
            format!("{r}{}_scalar_{input}", arith_name(a))
        }
        Kind::Compare(c) => format!("{}_{input}", c.name()),
        Kind::CompareScalar(c) => format!("{}_scalar_{input}{}", c.name(), domain.suffix()),
    }
}

/// The name of `a` in kernel symbols.
pub fn arith_name(a: Arith) -> &'static str {
    match a {
        Arith::Add => "add",
        Arith::Sub => "sub",
        Arith::Mul => "mul",
        Arith::Div => "div",
    }
}

/// The dtype `sum` and `sum_rows` give for inputs of `d`: `i64` for `bool` and the
/// integers (as PyTorch's `sum`), `d` itself for the floating-point dtypes.
pub fn sum_dtype(d: DType) -> DType {
    if d.is_floating() {
        d
    } else {
        DType::I64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_distinct_and_arities_fit() {
        let mut names: Vec<&str> = ELEMENTWISE.iter().map(|o| o.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), ELEMENTWISE.len());
        for op in ELEMENTWISE {
            if let Kind::Compare(c) | Kind::CompareScalar(c) = op.kind {
                assert!(op.name.starts_with(c.name()), "{}", op.name);
            }
        }
        assert_eq!(Kind::MaskedFill.arity(), 2);
        assert_eq!(Kind::Fill.arity(), 0);
    }

    #[test]
    fn dtype_rules() {
        assert!(Kind::Binary(Arith::Add).takes(DType::Bool));
        assert!(!Kind::Binary(Arith::Sub).takes(DType::Bool));
        assert!(!Kind::Binary(Arith::Div).takes(DType::I64));
        assert!(Kind::Scalar(Arith::Div, Side::Left).takes(DType::BF16));
        assert!(!Kind::Relu.takes(DType::Bool));
        assert_eq!(sum_dtype(DType::U8), DType::I64);
        assert_eq!(sum_dtype(DType::F16), DType::F16);
        assert_eq!(ScalarDomain::of(DType::I32, Scalar::Float(0.5)), ScalarDomain::Double);
        assert_eq!(ScalarDomain::of(DType::Bool, Scalar::Bool(true)), ScalarDomain::Int);
        assert_eq!(ScalarDomain::of(DType::F16, Scalar::Int(3)), ScalarDomain::Own);
    }

    #[test]
    fn symbols() {
        let own = ScalarDomain::Own;
        assert_eq!(symbol(Kind::Fill, DType::F32, DType::F16, own), "fill_2");
        assert_eq!(symbol(Kind::Cast, DType::F64, DType::Bool, own), "cast_f64_bool");
        assert_eq!(symbol(Kind::AddBias, DType::I32, DType::I32, own), "add_i32");
        assert_eq!(symbol(Kind::Scalar(Arith::Sub, Side::Left), DType::U8, DType::U8, own), "rsub_scalar_u8");
        let lt = Kind::CompareScalar(Cmp::Lt);
        assert_eq!(symbol(lt, DType::I64, DType::Bool, ScalarDomain::Double), "lt_scalar_i64_d");
    }
}
