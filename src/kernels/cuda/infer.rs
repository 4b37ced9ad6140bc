//! Shape and dtype inference of the CUDA kernels: which calls they accept, and the
//! outputs those calls make.
//!
//! The rules are the ones the CPU kernels follow for the same op names (one dtype per call
//! of a tensor op, NumPy broadcasting, `bool` results of comparisons, `i64` sums of
//! integers); where the CPU kernels already accept a call, these rules give the same
//! outputs (a unit test of `kernels::cuda` compares them).
//!
//! | ops | inputs | output |
//! | --- | --- | --- |
//! | `fill` | none | the given output (any dtype) |
//! | `copy` | `x` | like `x`, or a given output of `x`'s dtype that `x` broadcasts to (the CPU kernel's rule) |
//! | `cast` | `x` | `x`'s shape, dtype `attrs.dtype()` |
//! | `add`, `sub`, `mul`, `div` | `a`, `b` of one dtype | the broadcast shape, that dtype |
//! | `add_bias` | `x: [n, k]`, `b: [k]` of one dtype | like `x` |
//! | `relu`, `scale`, `*_scalar` (arithmetic) | `x` | like `x` |
//! | `relu_grad` | `dy`, `x` of one dtype | the broadcast shape, that dtype |
//! | `eq`, `ne`, `lt`, `le`, `gt`, `ge` | `a`, `b` of one dtype | the broadcast shape, `bool` |
//! | `eq_scalar` ... `ge_scalar` | `x` | `x`'s shape, `bool` |
//! | `masked_fill` | `x`, a `bool` mask that broadcasts to `x` | like `x` |
//! | `sum` | `x` | `[]`, `i64` for `bool` and integers, else `x`'s dtype |
//! | `sum_rows` | `x: [n, k]` | `[k]`, dtype as `sum` |
//! | `matmul` (`_tn`, `_nt`) | 2-D `a`, `b` of one dtype, not `bool` | `[m, n]` |
//! | `pow` ... `addcdiv` (the pointwise ops of two and three inputs), the indexing ops | as the CPU kernel of the op ([`cpu_infer`]) | as the CPU kernel |
//!
//! `sub`, `relu`, `relu_grad` and the arithmetic scalar ops refuse `bool`; `div`,
//! `div_scalar` and `rdiv_scalar` take floating-point dtypes only.

use super::gemm::Product;
use super::layout::{broadcast_shapes, broadcast_strides};
use super::ops::{sum_dtype, Kind};
use crate::vm::{Attrs, DType, OutSpec, OutSpecs, TensorMeta};

/// Refuse a call with other than `n` inputs.
pub fn expect_inputs(inputs: &[&TensorMeta], n: usize) -> Result<(), String> {
    if inputs.len() == n {
        Ok(())
    } else {
        let s = if n == 1 { "" } else { "s" };
        Err(format!("expected {n} input{s}, got {}", inputs.len()))
    }
}

/// The dtype shared by all inputs (at least one), or an error naming the first that
/// differs from input 0.
pub fn common_dtype(inputs: &[&TensorMeta]) -> Result<DType, String> {
    let first = inputs.first().ok_or("expected at least one input, got none")?.dtype;
    match inputs.iter().position(|m| m.dtype != first) {
        None => Ok(first),
        Some(i) => Err(format!("input {i} is {} but input 0 is {first}", inputs[i].dtype)),
    }
}

fn spec(shape: &[usize], dtype: DType) -> OutSpec {
    OutSpec { shape: shape.iter().copied().collect(), dtype }
}

/// The outputs of elementwise op `name` of `kind`.
pub fn elementwise(
    name: &str,
    kind: Kind,
    inputs: &[&TensorMeta],
    given: &[&TensorMeta],
    attrs: &Attrs,
    out: &mut OutSpecs,
) -> Result<(), String> {
    if matches!(
        kind,
        Kind::Math2(_)
            | Kind::Logical(_)
            | Kind::PowScalar
            | Kind::Where
            | Kind::Ternary(_)
            | Kind::LerpScalar
            | Kind::ClampScalar
    ) {
        return cpu_infer(name, inputs, given, attrs, out);
    }
    expect_inputs(inputs, kind.arity())?;
    let refuse = |m: &TensorMeta| format!("`{name}` {}; input 0 is {}", kind.dtype_rule(), m.describe());
    match kind {
        Kind::Fill => match given {
            [o] => out.push(spec(&o.shape, o.dtype)),
            [] => return Err("the output must be given: its shape and dtype are the caller's".into()),
            _ => return Err(format!("writes one output, {} were given", given.len())),
        },
        Kind::Cast => {
            let to = attrs.dtype().ok_or("cast needs a dtype argument (the dtype to convert to)")?;
            out.push(spec(&inputs[0].shape, to));
        }
        Kind::Binary(_) | Kind::ReluGrad | Kind::Compare(_) | Kind::Extreme(_) => {
            let d = common_dtype(inputs)?;
            if !kind.takes(d) {
                return Err(refuse(inputs[0]));
            }
            let shape = broadcast_shapes(inputs[0], inputs[1])?;
            let d = if matches!(kind, Kind::Compare(_)) { DType::Bool } else { d };
            out.push(OutSpec { shape, dtype: d });
        }
        Kind::AddBias => {
            let d = common_dtype(inputs)?;
            let (x, b) = (inputs[0], inputs[1]);
            let &[_, k] = x.shape.as_slice() else {
                return Err(format!("input 0 is {}: expected a 2-D input [n, k]", x.describe()));
            };
            if b.shape.as_slice() != [k] {
                return Err(format!(
                    "input 0 is {} and input 1 is {}: the bias must be 1-D with {k} elements",
                    x.describe(),
                    b.describe()
                ));
            }
            out.push(spec(&x.shape, d));
        }
        Kind::Relu | Kind::Scalar(..) | Kind::Math(_) | Kind::Num(_) => {
            if !kind.takes(inputs[0].dtype) {
                return Err(refuse(inputs[0]));
            }
            if let (Kind::Num(super::ops::NumFn::Round), d @ 1..)
            | (Kind::Num(super::ops::NumFn::Round), d @ ..=-1) = (kind, attrs.params().int_or(0, 0))
            {
                return Err(super::elementwise::round_decimals(d));
            }
            out.push(spec(&inputs[0].shape, inputs[0].dtype));
        }
        Kind::CompareScalar(_) | Kind::Predicate(_) => out.push(spec(&inputs[0].shape, DType::Bool)),
        Kind::Math2(_)
        | Kind::Logical(_)
        | Kind::PowScalar
        | Kind::Where
        | Kind::Ternary(_)
        | Kind::LerpScalar
        | Kind::ClampScalar => return cpu_infer(name, inputs, given, attrs, out),
        Kind::MaskedFill => {
            let (x, mask) = (inputs[0], inputs[1]);
            if mask.dtype != DType::Bool {
                return Err(format!(
                    "input 1 (the mask) is {}: masked_fill takes a bool mask",
                    mask.describe()
                ));
            }
            broadcast_strides("input 1 (the mask)", mask, &x.shape)?;
            out.push(spec(&x.shape, x.dtype));
        }
    }
    Ok(())
}

/// The rule of the CPU kernel of op `name` (the ops whose CUDA kernels take exactly the
/// calls the CPU's take: the pointwise ops of `kernels::binary_math` and `kernels::ternary`).
pub fn cpu_infer(
    name: &str,
    inputs: &[&TensorMeta],
    given: &[&TensorMeta],
    attrs: &Attrs,
    out: &mut OutSpecs,
) -> Result<(), String> {
    let cpu = crate::kernels::BUILTINS
        .iter()
        .find(|k| k.name() == name)
        .ok_or_else(|| format!("`{name}` has no CPU kernel whose shape rule to follow"))?;
    cpu.infer(inputs, given, attrs, out)
}

/// `sum`: one input, a 0-d output.
pub fn sum(inputs: &[&TensorMeta], out: &mut OutSpecs) -> Result<(), String> {
    expect_inputs(inputs, 1)?;
    out.push(spec(&[], sum_dtype(inputs[0].dtype)));
    Ok(())
}

/// `sum_rows`: `[n, k]` to `[k]`.
pub fn sum_rows(inputs: &[&TensorMeta], out: &mut OutSpecs) -> Result<(), String> {
    expect_inputs(inputs, 1)?;
    let x = inputs[0];
    let &[_, k] = x.shape.as_slice() else {
        return Err(format!("input 0 is {}: expected a 2-D input [n, k]", x.describe()));
    };
    out.push(spec(&[k], sum_dtype(x.dtype)));
    Ok(())
}

/// The product `matmul`'s transpose flags ask for, or the fixed one of `matmul_tn` and
/// `matmul_nt`.
pub fn product(op: Product, attrs: &Attrs) -> Result<Product, String> {
    match (op, attrs.transpose_a, attrs.transpose_b) {
        (Product::Nn, false, false) => Ok(Product::Nn),
        (Product::Nn, true, false) => Ok(Product::Tn),
        (Product::Nn, false, true) => Ok(Product::Nt),
        (Product::Nn, true, true) => {
            Err("transpose_a and transpose_b both set: matmul computes a b, aᵀ b or \
                                          a bᵀ (for aᵀ bᵀ, compute (b a)ᵀ)"
                .into())
        }
        (p, _, _) => Ok(p),
    }
}

/// `matmul`, `matmul_tn`, `matmul_nt`: two matrices of one dtype (not `bool`).
pub fn matmul(op: Product, inputs: &[&TensorMeta], attrs: &Attrs, out: &mut OutSpecs) -> Result<(), String> {
    let product = product(op, attrs)?;
    expect_inputs(inputs, 2)?;
    let d = common_dtype(inputs)?;
    if d == DType::Bool {
        return Err(format!(
            "input 0 is {}: {} takes numeric matrices, not bool",
            inputs[0].describe(),
            op.op()
        ));
    }
    for (i, t) in inputs.iter().enumerate() {
        if t.shape.len() != 2 {
            return Err(format!("input {i} is {}: {} takes 2-D inputs", t.describe(), op.op()));
        }
    }
    let (m, n, _) = product.dims(&inputs[0].shape, &inputs[1].shape)?;
    out.push(spec(&[m, n], d));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ep::DeviceId;
    use crate::kernels::cuda::ops::{Arith, Cmp, Side};

    fn t(shape: &[usize], d: DType) -> TensorMeta {
        TensorMeta::new(shape, d, DeviceId::cuda(0))
    }

    fn infer(kind: Kind, inputs: &[&TensorMeta], attrs: Attrs) -> Result<OutSpec, String> {
        let mut out = OutSpecs::new();
        elementwise("op", kind, inputs, &[], &attrs, &mut out).map(|()| out[0].clone())
    }

    #[test]
    fn broadcasting_and_dtypes() {
        let (a, b) = (t(&[2, 1, 3], DType::I32), t(&[4, 1], DType::I32));
        let add = infer(Kind::Binary(Arith::Add), &[&a, &b], Attrs::default()).unwrap();
        assert_eq!((add.shape.as_slice(), add.dtype), (&[2, 4, 3][..], DType::I32));
        let lt = infer(Kind::Compare(Cmp::Lt), &[&a, &b], Attrs::default()).unwrap();
        assert_eq!(lt.dtype, DType::Bool);
        let f = t(&[4, 1], DType::F32);
        assert_eq!(
            infer(Kind::Binary(Arith::Add), &[&a, &f], Attrs::default()).unwrap_err(),
            "input 1 is f32 but input 0 is i32"
        );
        let e = infer(Kind::Binary(Arith::Div), &[&a, &b], Attrs::default()).unwrap_err();
        assert!(e.starts_with("`op` takes floating-point inputs"), "{e}");
        let bools = t(&[3], DType::Bool);
        assert!(infer(Kind::Binary(Arith::Sub), &[&bools, &bools], Attrs::default()).is_err());
        assert!(infer(Kind::Binary(Arith::Add), &[&bools, &bools], Attrs::default()).is_ok());
        assert!(infer(Kind::Scalar(Arith::Mul, Side::Right), &[&bools], Attrs::default()).is_err());
        assert!(infer(
            Kind::Binary(Arith::Add),
            &[&t(&[2], DType::F32), &t(&[3], DType::F32)],
            Attrs::default()
        )
        .is_err());
    }

    #[test]
    fn cast_fill_and_masked_fill() {
        let x = t(&[2, 3], DType::F16);
        let cast = infer(Kind::Cast, &[&x], Attrs::default().with_dtype(DType::I64)).unwrap();
        assert_eq!((cast.shape.as_slice(), cast.dtype), (&[2, 3][..], DType::I64));
        assert!(infer(Kind::Cast, &[&x], Attrs::default()).unwrap_err().contains("dtype argument"));
        let mut out = OutSpecs::new();
        elementwise("fill", Kind::Fill, &[], &[&x], &Attrs::scalar(1.0), &mut out).unwrap();
        assert_eq!(out[0].dtype, DType::F16);
        assert!(elementwise("fill", Kind::Fill, &[], &[], &Attrs::scalar(1.0), &mut out).is_err());
        let mask = t(&[3], DType::Bool);
        assert_eq!(infer(Kind::MaskedFill, &[&x, &mask], Attrs::default()).unwrap().dtype, DType::F16);
        // The mask broadcasts to x, not x to the mask.
        let big = t(&[4, 2, 3], DType::Bool);
        assert!(infer(Kind::MaskedFill, &[&x, &big], Attrs::default()).is_err());
        assert!(infer(Kind::MaskedFill, &[&x, &x], Attrs::default()).unwrap_err().contains("bool mask"));
    }

    #[test]
    fn reductions_and_products() {
        let mut out = OutSpecs::new();
        sum(&[&t(&[3, 4], DType::U8)], &mut out).unwrap();
        sum_rows(&[&t(&[3, 4], DType::BF16)], &mut out).unwrap();
        assert_eq!((out[0].shape.len(), out[0].dtype), (0, DType::I64));
        assert_eq!((out[1].shape.as_slice(), out[1].dtype), (&[4][..], DType::BF16));
        let (a, b) = (t(&[2, 3], DType::F16), t(&[2, 4], DType::F16));
        let mut out = OutSpecs::new();
        matmul(Product::Nn, &[&a, &b], &Attrs::transposed(true, false), &mut out).unwrap();
        assert_eq!(out[0].shape.as_slice(), &[3, 4]);
        assert!(matmul(Product::Nn, &[&a, &b], &Attrs::default(), &mut out).is_err());
        let bb = t(&[2, 2], DType::Bool);
        assert!(matmul(Product::Nn, &[&bb, &bb], &Attrs::default(), &mut out)
            .unwrap_err()
            .contains("not bool"));
        assert!(matmul(Product::Nn, &[&a, &a], &Attrs::transposed(true, true), &mut out).is_err());
    }
}
