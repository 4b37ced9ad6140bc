//! The dtype of a call's result, as PyTorch's `torch.result_type` works it out.
//!
//! Operands rank in three tiers: tensors with dimensions, 0-d tensors, and scalars (Rust or
//! Python numbers). Within a tier dtypes promote ([`promote_types`]); a lower tier decides
//! the result only when its category is higher (a float scalar makes an integer tensor's
//! result floating, but `f16_tensor * 2.5` stays `f16`, and `i32_tensor + 2**40` stays
//! `i32`). A float scalar counts as the default float dtype, `f32`; an integer scalar as
//! `i64`; a boolean as `bool`.

use crate::framework::{promote_types, DType, Scalar};

/// The default floating dtype, which Python floats and `arange(0.5, ..)` take.
pub const DEFAULT_FLOAT: DType = DType::F32;

/// One operand of a call, as promotion sees it.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Operand {
    /// A tensor of `rank` dimensions.
    Tensor { dtype: DType, rank: usize },
    /// A scalar.
    Scalar(Scalar),
}

/// The dtype a scalar takes part in promotion as.
pub(crate) fn scalar_dtype(s: Scalar) -> DType {
    match s {
        Scalar::Float(_) => DEFAULT_FLOAT,
        Scalar::Int(_) => DType::I64,
        Scalar::Bool(_) => DType::Bool,
    }
}

fn join(a: Option<DType>, b: DType) -> Option<DType> {
    Some(match a {
        None => b,
        Some(a) => promote_types(a, b),
    })
}

/// c10's `combine_categories`: the higher tier's dtype, unless the lower tier is of a
/// higher category (or the higher is `bool`), when they promote.
fn combine(higher: Option<DType>, lower: Option<DType>) -> Option<DType> {
    match (higher, lower) {
        (None, l) => l,
        (h, None) => h,
        (Some(h), Some(l)) => {
            if h.is_floating() {
                Some(h)
            } else if h == DType::Bool || l.is_floating() {
                Some(promote_types(h, l))
            } else {
                Some(h)
            }
        }
    }
}

/// The result dtype of a call on `operands` (`torch.result_type`); `None` for no operands.
pub(crate) fn result_type(operands: &[Operand]) -> Option<DType> {
    let (mut dim, mut zero, mut wrapped) = (None, None, None);
    for o in operands {
        match *o {
            Operand::Tensor { dtype, rank: 0 } => zero = join(zero, dtype),
            Operand::Tensor { dtype, .. } => dim = join(dim, dtype),
            Operand::Scalar(s) => wrapped = join(wrapped, scalar_dtype(s)),
        }
    }
    combine(dim, combine(zero, wrapped))
}

/// Whether a result of `from` may be written into a tensor of `to` (PyTorch's `canCast`):
/// not a floating result into an integer tensor, nor a non-boolean one into a boolean.
pub(crate) fn can_cast(from: DType, to: DType) -> bool {
    from.category() <= to.category()
}

#[cfg(test)]
mod tests {
    use super::*;
    use DType::*;

    fn t(dtype: DType, rank: usize) -> Operand {
        Operand::Tensor { dtype, rank }
    }

    /// Cases from PyTorch's documentation of `torch.result_type` and type promotion.
    #[test]
    fn result_types_follow_pytorch() {
        let f = Operand::Scalar(Scalar::Float(2.5));
        let i = Operand::Scalar(Scalar::Int(1 << 40));
        let b = Operand::Scalar(Scalar::Bool(true));
        assert_eq!(result_type(&[t(I32, 1), i]), Some(I32));
        assert_eq!(result_type(&[t(I32, 1), f]), Some(F32));
        assert_eq!(result_type(&[t(F16, 1), f]), Some(F16));
        assert_eq!(result_type(&[t(Bool, 1), i]), Some(I64));
        assert_eq!(result_type(&[t(Bool, 1), b]), Some(Bool));
        assert_eq!(
            result_type(&[t(U8, 2), t(I64, 0)]),
            Some(U8),
            "a 0-d tensor does not promote a dimensioned one"
        );
        assert_eq!(result_type(&[t(I32, 2), t(F64, 0)]), Some(F64), "unless of a higher category");
        assert_eq!(result_type(&[t(F32, 1), t(F64, 1)]), Some(F64));
        assert_eq!(result_type(&[t(I64, 0), f]), Some(F32));
        assert_eq!(result_type(&[t(U8, 1), t(I32, 1)]), Some(I32));
        assert_eq!(result_type(&[f, i]), Some(F32));
        assert_eq!(result_type(&[]), None);
    }

    #[test]
    fn casts_follow_pytorch_can_cast() {
        assert!(can_cast(I64, F16));
        assert!(can_cast(Bool, I32));
        assert!(can_cast(F64, F16));
        assert!(!can_cast(F32, I64));
        assert!(!can_cast(I32, Bool));
        assert!(!can_cast(F32, Bool));
    }
}
