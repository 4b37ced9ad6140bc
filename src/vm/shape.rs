//! The one size check of a tensor: shape, then element count, then bytes, in checked
//! arithmetic, against the VM's cap on one tensor's bytes
//! ([`Config::max_tensor_bytes`](crate::vm::Config::max_tensor_bytes)).
//!
//! Every place that accepts a shape for a tensor calls [`check`]: `VirtualMachine::empty`
//! and `from_slice`, the builder for every output a call would create (the outputs a call
//! is given are compared with those, so they pass it too), the eager front end, and the
//! trace validator for every `tensor` declaration and call output. They therefore accept
//! exactly the same shapes, and refuse the others with the same [`Error::TooLarge`], before
//! anything runs. A tensor that exists has passed it, which is what lets kernels, the
//! allocators and [`TensorMeta::numel`](super::TensorMeta::numel) multiply its dimensions
//! without checks of their own.
//!
//! # The rule
//!
//! A shape of dtype `T` is accepted when
//! 1. the product of its nonzero dimensions and `T`'s size fits in a `usize`: then every
//!    product of some of its dimensions that code computes (the element count, a row
//!    length, `m * n`, a byte offset) fits as well, whether or not another dimension is
//!    zero; and
//! 2. its size in bytes (zero if a dimension is zero) is at most the cap.
//!
//! A shape with a zero dimension has no elements, so only the first rule can refuse it:
//! `[0, 2^62]` of `f32` is accepted, `[0, 2^62, 4]` is not.
//!
//! The check runs once per distinct call signature: the builder caches a signature only
//! after its outputs passed, and a cached call makes outputs of the same shapes.

use crate::vm::DType;
use crate::vm::{Error, Result};

/// The size in bytes of a tensor of `shape` and `dtype`, if it passes the rule of the module
/// docs under the cap `limit`; otherwise [`Error::TooLarge`], whose `at` is `at()` (where
/// the tensor was asked for, as its message shows it: `` `empty` on cpu:0 ``).
///
/// ```
/// use eagervm::framework::{shape, DType};
/// assert_eq!(shape::check(&[2, 3], DType::F32, 1 << 20, || "here".into()).unwrap(), 24);
/// assert_eq!(shape::check(&[0, 1 << 40], DType::I64, 1, || "here".into()).unwrap(), 0);
/// let err = shape::check(&[1 << 32, 1 << 32], DType::F32, u64::MAX, || "here".into()).unwrap_err();
/// assert!(matches!(err, eagervm::Error::TooLarge { bytes: None, .. }), "{err}");
/// ```
#[inline]
pub fn check(shape: &[usize], dtype: DType, limit: u64, at: impl FnOnce() -> String) -> Result<usize> {
    let mut product = Some(dtype.size());
    let mut empty = false;
    for &d in shape {
        if d == 0 {
            empty = true;
        } else {
            product = product.and_then(|p| p.checked_mul(d));
        }
    }
    let bytes = product.map(|p| if empty { 0 } else { p });
    match bytes {
        Some(b) if b as u64 <= limit => Ok(b),
        _ => Err(too_large(at(), shape, dtype, bytes.map(|b| b as u64), limit)),
    }
}

#[cold]
fn too_large(at: String, shape: &[usize], dtype: DType, bytes: Option<u64>, limit: u64) -> Error {
    Error::TooLarge { at, shape: shape.to_vec(), dtype, bytes, limit }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(shape: &[usize], dtype: DType, limit: u64) -> Result<usize> {
        check(shape, dtype, limit, || "t".into())
    }

    #[test]
    fn counts_bytes_and_applies_the_cap() {
        assert_eq!(bytes(&[], DType::F32, 4).unwrap(), 4, "a scalar has one element");
        assert_eq!(bytes(&[2, 3], DType::I64, 48).unwrap(), 48, "the cap itself is allowed");
        match bytes(&[2, 3], DType::I64, 47) {
            Err(Error::TooLarge { at, shape, dtype, bytes: Some(48), limit: 47 }) => {
                assert_eq!((at.as_str(), shape.as_slice(), dtype), ("t", &[2, 3][..], DType::I64));
            }
            other => panic!("{other:?}"),
        }
        assert!(bytes(&[], DType::F32, 3).is_err(), "one element over a cap smaller than it");
        assert_eq!(bytes(&[0], DType::F32, 0).unwrap(), 0, "nothing to hold, whatever the cap");
    }

    #[test]
    fn overflow_is_refused_not_wrapped() {
        // 2^64 elements: `product()` wraps this to zero.
        let e = bytes(&[1 << 32, 1 << 32], DType::F32, u64::MAX).unwrap_err();
        assert!(matches!(e, Error::TooLarge { bytes: None, .. }), "{e:?}");
        // The element count fits, the bytes do not.
        let e = bytes(&[1 << 62], DType::F32, u64::MAX).unwrap_err();
        assert!(matches!(e, Error::TooLarge { bytes: None, .. }), "{e:?}");
        assert_eq!(bytes(&[1 << 61], DType::F32, u64::MAX).unwrap(), 1 << 63);
        // A zero dimension empties the tensor, but the other dimensions must still multiply.
        assert_eq!(bytes(&[0, 1 << 61], DType::F32, 1).unwrap(), 0);
        assert_eq!(bytes(&[1 << 61, 0], DType::F32, 1).unwrap(), 0);
        assert!(bytes(&[0, 1 << 61, 2], DType::F32, 1).is_err());
        assert!(bytes(&[usize::MAX], DType::F32, u64::MAX).is_err());
        assert!(bytes(&[usize::MAX, 0], DType::F32, u64::MAX).is_err());
    }

    #[test]
    fn the_message_says_what_where_and_why() {
        let e = check(&[1_000_000_000_000], DType::F32, 1 << 30, || "`empty` on cpu:0".into()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "`empty` on cpu:0: f32[1000000000000] is too large: 4000000000000 bytes, over the limit of \
             1073741824 bytes on one tensor (Config::max_tensor_bytes, EAGERVM_MAX_TENSOR_BYTES)"
        );
        let e = check(&[1 << 63, 2], DType::F32, 8, || "output 0 of `matmul` on cpu:0".into()).unwrap_err();
        let text = e.to_string();
        assert!(text.starts_with("output 0 of `matmul` on cpu:0: f32[9223372036854775808, 2]"), "{text}");
        assert!(text.contains("overflows 64 bits"), "{text}");
    }
}
