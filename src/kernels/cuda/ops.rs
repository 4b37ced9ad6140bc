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

/// A floating-point function of one input (`Kind::Math`), as the CPU kernels compute it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MathFn {
    /// `e^x`.
    Exp,
    /// `2^x`.
    Exp2,
    /// The natural logarithm.
    Log,
    /// The base-2 logarithm.
    Log2,
    /// `log(1 + x)`.
    Log1p,
    /// `e^x - 1`.
    Expm1,
    /// The square root.
    Sqrt,
    /// `1 / sqrt(x)`.
    Rsqrt,
    /// `1 / x`.
    Reciprocal,
    /// Sine.
    Sin,
    /// Cosine.
    Cos,
    /// Hyperbolic tangent.
    Tanh,
    /// `1 / (1 + e^-x)`.
    Sigmoid,
    /// `x / (1 + e^-x)`.
    Silu,
    /// The error function.
    Erf,
    /// `x / 2 · (1 + erf(x / √2))`; with the `gelu` call's parameter set, [`MathFn::GeluTanh`].
    Gelu,
    /// `x / 2 · (1 + tanh(√(2/π) · (x + 0.044715 x³)))`.
    GeluTanh,
}

impl MathFn {
    /// The name in kernel symbols (the op's name, `gelu_tanh` for the tanh form).
    pub fn name(self) -> &'static str {
        match self {
            MathFn::Exp => "exp",
            MathFn::Exp2 => "exp2",
            MathFn::Log => "log",
            MathFn::Log2 => "log2",
            MathFn::Log1p => "log1p",
            MathFn::Expm1 => "expm1",
            MathFn::Sqrt => "sqrt",
            MathFn::Rsqrt => "rsqrt",
            MathFn::Reciprocal => "reciprocal",
            MathFn::Sin => "sin",
            MathFn::Cos => "cos",
            MathFn::Tanh => "tanh",
            MathFn::Sigmoid => "sigmoid",
            MathFn::Silu => "silu",
            MathFn::Erf => "erf",
            MathFn::Gelu => "gelu",
            MathFn::GeluTanh => "gelu_tanh",
        }
    }
}

/// A numeric function of one input (`Kind::Num`): integers as the CPU kernels treat them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NumFn {
    /// `-x` (integers wrap).
    Neg,
    /// `|x|` (integers wrap at the minimum).
    Abs,
    /// -1, 0 or 1 (0 for NaN).
    Sign,
    /// Toward -inf (integers as they are).
    Floor,
    /// Toward +inf (integers as they are).
    Ceil,
    /// To the nearest integer, halves to even (integers as they are).
    Round,
}

impl NumFn {
    /// The name in kernel symbols (the op's).
    pub fn name(self) -> &'static str {
        match self {
            NumFn::Neg => "neg",
            NumFn::Abs => "abs",
            NumFn::Sign => "sign",
            NumFn::Floor => "floor",
            NumFn::Ceil => "ceil",
            NumFn::Round => "round",
        }
    }
}

/// A test of one input of any dtype (`Kind::Predicate`); its result is `bool`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Pred {
    /// A NaN.
    IsNan,
    /// `+inf` or `-inf`.
    IsInf,
    /// Neither infinite nor NaN.
    IsFinite,
    /// Zero (`logical_not`).
    Zero,
}

impl Pred {
    /// The name in kernel symbols (the op's).
    pub fn name(self) -> &'static str {
        match self {
            Pred::IsNan => "isnan",
            Pred::IsInf => "isinf",
            Pred::IsFinite => "isfinite",
            Pred::Zero => "logical_not",
        }
    }
}

/// A function of two inputs of one dtype whose integer and floating forms differ
/// (`Kind::Math2`), as the CPU kernels compute it (`kernels::pointwise::Num`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Bin {
    /// `a ** b`: IEEE's `pow`; integers exactly by squaring, wrapping.
    Pow,
    /// `atan2(a, b)` (floating-point dtypes only).
    Atan2,
    /// `a / b` rounded toward minus infinity (Python's `//`).
    DivFloor,
    /// `a / b` rounded toward zero.
    DivTrunc,
    /// `a - b · floor(a / b)`, of the sign of `b` (Python's `%`).
    Remainder,
    /// `a - b · trunc(a / b)`, of the sign of `a` (C's `fmod`).
    Fmod,
}

impl Bin {
    /// The name in kernel symbols (the op's).
    pub fn name(self) -> &'static str {
        match self {
            Bin::Pow => "pow",
            Bin::Atan2 => "atan2",
            Bin::DivFloor => "div_floor",
            Bin::DivTrunc => "div_trunc",
            Bin::Remainder => "remainder",
            Bin::Fmod => "fmod",
        }
    }

    /// Whether the integer form divides (and so has a division by zero).
    pub fn divides(self) -> bool {
        matches!(self, Bin::DivFloor | Bin::DivTrunc | Bin::Remainder | Bin::Fmod)
    }
}

/// A logical function of two truth values (`Kind::Logical`); nonzero (NaN included) is true.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Logic {
    /// Both.
    And,
    /// Either.
    Or,
    /// Exactly one.
    Xor,
}

impl Logic {
    /// The name in kernel symbols (the op's).
    pub fn name(self) -> &'static str {
        match self {
            Logic::And => "logical_and",
            Logic::Or => "logical_or",
            Logic::Xor => "logical_xor",
        }
    }
}

/// An op of three inputs of one dtype, broadcast together (`Kind::Ternary`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Tern {
    /// `minimum(maximum(x, lo), hi)` (numeric).
    Clamp,
    /// PyTorch's `lerp(start, end, weight)` (floating).
    Lerp,
    /// `x + value · t1 · t2` with the scalar `value` (numeric; integers wrap).
    Addcmul,
    /// `x + value · t1 / t2` with the scalar `value` (floating).
    Addcdiv,
}

impl Tern {
    /// The name in kernel symbols (the op's).
    pub fn name(self) -> &'static str {
        match self {
            Tern::Clamp => "clamp",
            Tern::Lerp => "lerp",
            Tern::Addcmul => "addcmul",
            Tern::Addcdiv => "addcdiv",
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
    /// A floating-point function of one input.
    Math(MathFn),
    /// A numeric function of one input.
    Num(NumFn),
    /// A test of one input; a `bool` result.
    Predicate(Pred),
    /// Two inputs of one dtype, broadcast: the larger (`true`: `maximum`) or the smaller
    /// (`minimum`), a NaN of either propagating.
    Extreme(bool),
    /// Two inputs of one dtype, broadcast: a function whose integer form differs.
    Math2(Bin),
    /// Two inputs of one dtype (any), broadcast; a `bool` result.
    Logical(Logic),
    /// One input to the power of the scalar (in the compute type).
    PowScalar,
    /// Inputs `(cond, x, y)`, `cond` `bool`, `x` and `y` of one dtype, broadcast together:
    /// `x` where `cond` is set, else `y`.
    Where,
    /// Three inputs of one dtype, broadcast together.
    Ternary(Tern),
    /// Inputs `(start, end)` of one floating dtype, broadcast, with the scalar weight.
    LerpScalar,
    /// One input between the bounds of the parameter list (`kernels::ternary`'s
    /// `clamp_scalar`: either may be absent).
    ClampScalar,
}

impl Kind {
    /// Number of tensor inputs.
    pub fn arity(self) -> usize {
        match self {
            Kind::Fill => 0,
            Kind::Cast | Kind::Relu | Kind::Scalar(..) | Kind::CompareScalar(_) => 1,
            Kind::Math(_) | Kind::Num(_) | Kind::Predicate(_) => 1,
            Kind::Binary(_) | Kind::AddBias | Kind::ReluGrad | Kind::Compare(_) | Kind::MaskedFill => 2,
            Kind::Extreme(_) | Kind::Math2(_) | Kind::Logical(_) | Kind::LerpScalar => 2,
            Kind::PowScalar | Kind::ClampScalar => 1,
            Kind::Where | Kind::Ternary(_) => 3,
        }
    }

    /// Whether the op takes inputs of dtype `d` (the output's for `Fill`).
    pub fn takes(self, d: DType) -> bool {
        match self {
            Kind::Fill | Kind::Cast | Kind::MaskedFill | Kind::Compare(_) | Kind::CompareScalar(_) => true,
            Kind::Predicate(_) | Kind::Extreme(_) | Kind::Logical(_) | Kind::Where => true,
            Kind::Math(_) | Kind::Math2(Bin::Atan2) | Kind::LerpScalar => d.is_floating(),
            Kind::Ternary(Tern::Lerp | Tern::Addcdiv) => d.is_floating(),
            Kind::Math2(_) | Kind::PowScalar | Kind::ClampScalar => d != DType::Bool,
            Kind::Ternary(Tern::Clamp | Tern::Addcmul) => d != DType::Bool,
            Kind::Num(_) => d != DType::Bool,
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
            Kind::Binary(Arith::Div) | Kind::Scalar(Arith::Div, _) | Kind::Math(_) => {
                "takes floating-point inputs (cast integers first)"
            }
            Kind::Math2(Bin::Atan2) | Kind::LerpScalar | Kind::Ternary(Tern::Lerp | Tern::Addcdiv) => {
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
    Op { name: "exp", kind: Kind::Math(MathFn::Exp) },
    Op { name: "exp2", kind: Kind::Math(MathFn::Exp2) },
    Op { name: "log", kind: Kind::Math(MathFn::Log) },
    Op { name: "log2", kind: Kind::Math(MathFn::Log2) },
    Op { name: "log1p", kind: Kind::Math(MathFn::Log1p) },
    Op { name: "expm1", kind: Kind::Math(MathFn::Expm1) },
    Op { name: "sqrt", kind: Kind::Math(MathFn::Sqrt) },
    Op { name: "rsqrt", kind: Kind::Math(MathFn::Rsqrt) },
    Op { name: "reciprocal", kind: Kind::Math(MathFn::Reciprocal) },
    Op { name: "sin", kind: Kind::Math(MathFn::Sin) },
    Op { name: "cos", kind: Kind::Math(MathFn::Cos) },
    Op { name: "tanh", kind: Kind::Math(MathFn::Tanh) },
    Op { name: "sigmoid", kind: Kind::Math(MathFn::Sigmoid) },
    Op { name: "silu", kind: Kind::Math(MathFn::Silu) },
    Op { name: "erf", kind: Kind::Math(MathFn::Erf) },
    // The tanh form (the call's parameter 0 set) is `MathFn::GeluTanh`'s kernel.
    Op { name: "gelu", kind: Kind::Math(MathFn::Gelu) },
    Op { name: "neg", kind: Kind::Num(NumFn::Neg) },
    Op { name: "abs", kind: Kind::Num(NumFn::Abs) },
    Op { name: "sign", kind: Kind::Num(NumFn::Sign) },
    Op { name: "floor", kind: Kind::Num(NumFn::Floor) },
    Op { name: "ceil", kind: Kind::Num(NumFn::Ceil) },
    Op { name: "round", kind: Kind::Num(NumFn::Round) },
    Op { name: "isnan", kind: Kind::Predicate(Pred::IsNan) },
    Op { name: "isinf", kind: Kind::Predicate(Pred::IsInf) },
    Op { name: "isfinite", kind: Kind::Predicate(Pred::IsFinite) },
    Op { name: "logical_not", kind: Kind::Predicate(Pred::Zero) },
    Op { name: "maximum", kind: Kind::Extreme(true) },
    Op { name: "minimum", kind: Kind::Extreme(false) },
    Op { name: "pow", kind: Kind::Math2(Bin::Pow) },
    Op { name: "pow_scalar", kind: Kind::PowScalar },
    Op { name: "atan2", kind: Kind::Math2(Bin::Atan2) },
    Op { name: "div_floor", kind: Kind::Math2(Bin::DivFloor) },
    Op { name: "div_trunc", kind: Kind::Math2(Bin::DivTrunc) },
    Op { name: "remainder", kind: Kind::Math2(Bin::Remainder) },
    Op { name: "fmod", kind: Kind::Math2(Bin::Fmod) },
    Op { name: "logical_and", kind: Kind::Logical(Logic::And) },
    Op { name: "logical_or", kind: Kind::Logical(Logic::Or) },
    Op { name: "logical_xor", kind: Kind::Logical(Logic::Xor) },
    Op { name: "where", kind: Kind::Where },
    Op { name: "clamp", kind: Kind::Ternary(Tern::Clamp) },
    Op { name: "clamp_scalar", kind: Kind::ClampScalar },
    Op { name: "lerp", kind: Kind::Ternary(Tern::Lerp) },
    Op { name: "lerp_scalar", kind: Kind::LerpScalar },
    Op { name: "addcmul", kind: Kind::Ternary(Tern::Addcmul) },
    Op { name: "addcdiv", kind: Kind::Ternary(Tern::Addcdiv) },
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
        Kind::Math(f) => format!("{}_{input}", f.name()),
        Kind::Num(f) => format!("{}_{input}", f.name()),
        Kind::Predicate(p) => format!("{}_{input}", p.name()),
        Kind::Extreme(max) => format!("{}_{input}", if max { "maximum" } else { "minimum" }),
        Kind::Math2(b) => format!("{}_{input}", b.name()),
        Kind::Logical(l) => format!("{}_{input}", l.name()),
        Kind::PowScalar => format!("pow_scalar_{input}"),
        Kind::Where => format!("where_{input}"),
        Kind::Ternary(t) => format!("{}_{input}", t.name()),
        Kind::LerpScalar => format!("lerp_scalar_{input}"),
        Kind::ClampScalar => format!("clamp_scalar_{input}"),
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
