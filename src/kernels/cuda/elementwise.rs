//! The elementwise ops on CUDA ([`super::ops::ELEMENTWISE`]): each call picks the generated kernel
//! for its dtypes, converts the scalar on the host, and launches it over the operands as
//! they lie (any strides, offsets, broadcast inputs), in place where the output is an input.
//!
//! # The scalar
//!
//! - `fill`, `masked_fill`: converted to the output's dtype as a cast converts it
//!   (`vm::write_element`: an `Int` exactly, wrapping to a narrower integer; a `Float`
//!   truncated toward zero and saturated for an integer dtype, rounded to nearest even for
//!   a float dtype; nonzero is `true`); the kernel stores those bits.
//! - Arithmetic with a scalar: converted to the compute type of the tensor's dtype (`f32`
//!   for `f16`, `bf16` and `f32`, as PyTorch's `opmath`; `f64`), or, for an integer dtype,
//!   to the dtype as `fill` converts it.
//! - Comparison with a scalar: a float tensor compares with the scalar rounded to its
//!   dtype; an integral tensor compares exactly in `i64` with an `Int` or `Bool` scalar,
//!   and in `f64` with a `Float` scalar (its values converted to `f64`).
//! - `pow_scalar`'s exponent, `lerp_scalar`'s weight, the `value` of `addcmul` and
//!   `addcdiv` and the bounds of `clamp_scalar` (its parameter list): as arithmetic with a
//!   scalar, the CPU kernels' `compute_scalar`.

use super::infer;
use super::launch::{device_operand, launch_ew, launch_ew3, must_stage, stage, Dev};
use super::on_stream;
use super::ops::{symbol, Kind, MathFn, NumFn, Op, ScalarDomain, Tern};

/// Why `round` with `decimals` is refused on CUDA.
pub(super) fn round_decimals(decimals: i64) -> String {
    format!("round with decimals={decimals} has no CUDA kernel yet: round on the CPU, or scale, round and scale back")
}
use crate::vm::{
    read_element, write_element, Attrs, DType, KernelCtx, OpKernel, OutSpecs, Scalar, TensorMeta,
};

/// `v` converted to `d` as `cast` converts it, as the 64 bits a kernel stores (the element's
/// bytes, zero-extended).
pub fn dtype_bits(d: DType, v: Scalar) -> u64 {
    let mut b = Vec::with_capacity(8);
    write_element(d, v, &mut b);
    match *b.as_slice() {
        [x] => u64::from(x),
        [x, y] => u64::from(u16::from_ne_bytes([x, y])),
        [x, y, z, w] => u64::from(u32::from_ne_bytes([x, y, z, w])),
        _ => b.try_into().map(u64::from_ne_bytes).unwrap_or(0),
    }
}

/// `v` converted to `d` and read back as a value (what a kernel computes with).
fn as_dtype(d: DType, v: Scalar) -> Scalar {
    let mut bytes = Vec::with_capacity(8);
    write_element(d, v, &mut bytes);
    read_element(d, &bytes, 0).unwrap_or(v)
}

/// The scalar's bits for the arithmetic kernels of dtype `d` (see the module docs).
pub(super) fn arith_bits(d: DType, v: Scalar) -> u64 {
    match d {
        // As the CPU's scalar (`kernels::dtype`): an `Int` rounded to `f32` once, not
        // through `f64`.
        DType::F16 | DType::BF16 | DType::F32 => {
            let f = match v {
                Scalar::Int(i) => i as f32,
                _ => v.as_f64() as f32,
            };
            u64::from(f.to_bits())
        }
        DType::F64 => v.as_f64().to_bits(),
        _ => as_dtype(d, v).as_i64() as u64,
    }
}

/// The scalar's bits for a comparison of a `d` tensor in `domain`.
fn compare_bits(d: DType, v: Scalar, domain: ScalarDomain) -> u64 {
    match domain {
        ScalarDomain::Own if d == DType::F64 => v.as_f64().to_bits(),
        // Rounded to the dtype, then exact in f32.
        ScalarDomain::Own => u64::from((as_dtype(d, v).as_f64() as f32).to_bits()),
        ScalarDomain::Int => v.as_i64() as u64,
        ScalarDomain::Double => v.as_f64().to_bits(),
    }
}

/// The scalars of a `clamp_scalar` call on a `d` tensor: the bounds' bits in the compute
/// type (as `arith_bits`; 0 where absent) and the flags (bit 0: a minimum, bit 1: a
/// maximum), from the parameter list `kernels::ternary` reads: integers `[has_min,
/// has_max]`, then one scalar per bound given.
pub fn clamp_scalars(d: DType, attrs: &Attrs) -> Result<[u64; 3], String> {
    let p = attrs.params();
    let (has_min, has_max) = (p.int_or(0, 0) != 0, p.int_or(1, 0) != 0);
    let mut given = p.scalars().iter().copied();
    let mut bound = |has: bool, what: &str| -> Result<u64, String> {
        if !has {
            return Ok(0);
        }
        let v = given.next().ok_or_else(|| format!("clamp_scalar: the parameter list lacks {what}"))?;
        Ok(arith_bits(d, v))
    };
    let (lo, hi) = (bound(has_min, "min")?, bound(has_max, "max")?);
    if !has_min && !has_max {
        return Err("clamp_scalar: at least one of min and max must be given".into());
    }
    Ok([lo, hi, u64::from(has_min) | u64::from(has_max) << 1])
}

impl Op {
    /// The kernel symbol and the scalar's 64 bits of a call on inputs of dtypes `inputs`
    /// writing an output of `out`, with the scalar `value`; an error naming the operand
    /// whose dtype no kernel takes (a caller may have skipped inference).
    pub fn kernel(&self, inputs: &[DType], out: DType, value: Scalar) -> Result<(String, u64), String> {
        let arity = self.kind.arity();
        if inputs.len() != arity {
            let s = if arity == 1 { "" } else { "s" };
            return Err(format!("expected {arity} input{s}, got {}", inputs.len()));
        }
        let own = ScalarDomain::Own;
        // The dtype the kernel computes on: `where`'s values (input 1), else input 0's.
        let first = usize::from(self.kind == Kind::Where);
        let input = inputs.get(first).copied().unwrap_or(out);
        let want_out = match self.kind {
            Kind::Compare(_) | Kind::CompareScalar(_) | Kind::Predicate(_) | Kind::Logical(_) => DType::Bool,
            Kind::Cast | Kind::Fill => out,
            _ => input,
        };
        if out != want_out {
            return Err(format!("output 0 is {out} but `{}` of {input} gives {want_out}", self.name));
        }
        for (i, &d) in inputs.iter().enumerate().filter(|&(i, _)| i != first) {
            // The mask of `masked_fill` (input 1) and the condition of `where` (input 0).
            let want = match (self.kind, i) {
                (Kind::MaskedFill, 1) | (Kind::Where, 0) => DType::Bool,
                _ => input,
            };
            if d != want {
                return Err(format!("input {i} is {d} but `{}` needs {want} there", self.name));
            }
        }
        if !self.kind.takes(input) {
            return Err(format!("`{}` {}; input 0 is {input}", self.name, self.kind.dtype_rule()));
        }
        Ok(match self.kind {
            Kind::Fill | Kind::MaskedFill => (symbol(self.kind, input, out, own), dtype_bits(out, value)),
            Kind::Cast if input == out => (format!("copy_{}", out.size()), 0),
            Kind::Cast => (symbol(self.kind, input, out, own), 0),
            Kind::Scalar(..)
            | Kind::PowScalar
            | Kind::LerpScalar
            | Kind::Ternary(Tern::Addcmul | Tern::Addcdiv) => {
                (symbol(self.kind, input, out, own), arith_bits(input, value))
            }
            Kind::CompareScalar(_) => {
                let domain = ScalarDomain::of(input, value);
                (symbol(self.kind, input, out, domain), compare_bits(input, value, domain))
            }
            _ => (symbol(self.kind, input, out, own), 0),
        })
    }
}

impl OpKernel for Op {
    fn name(&self) -> &'static str {
        self.name
    }

    fn dtypes(&self) -> &'static [DType] {
        self.kind.dtypes()
    }

    fn infer(
        &self,
        inputs: &[&TensorMeta],
        given: &[&TensorMeta],
        attrs: &Attrs,
        out: &mut OutSpecs,
    ) -> Result<(), String> {
        infer::elementwise(self.name, self.kind, inputs, given, attrs, out)
    }

    fn strided(&self) -> bool {
        true
    }

    fn in_place(&self) -> bool {
        true
    }

    fn pointwise(&self) -> bool {
        // As the CPU kernels: every kind but `fill`, which has no inputs.
        !matches!(self.kind, Kind::Fill)
    }

    fn compute(&self, ctx: &mut KernelCtx<'_, '_>) -> Result<(), String> {
        let out = ctx.outputs.first().ok_or("missing output 0")?;
        let dtypes: Vec<DType> = ctx.inputs.iter().map(|t| t.meta.dtype).collect();
        let (mut sym, bits) = self.kernel(&dtypes, out.meta.dtype, ctx.attrs.value())?;
        match (self.kind, ctx.attrs.params().int_or(0, 0)) {
            (_, 0) => {}
            (Kind::Math(MathFn::Gelu), _) => {
                sym = symbol(Kind::Math(MathFn::GeluTanh), dtypes[0], dtypes[0], ScalarDomain::Own)
            }
            (Kind::Num(NumFn::Round), d) => return Err(round_decimals(d)),
            _ => {}
        }
        let three = matches!(self.kind, Kind::Where | Kind::Ternary(_) | Kind::ClampScalar);
        let scalars = match self.kind {
            Kind::ClampScalar => clamp_scalars(dtypes[0], &ctx.attrs)?,
            _ => [bits, 0, 0],
        };
        let arity = dtypes.len();
        let inputs = ctx.inputs;
        on_stream(self.name, |s| {
            let o = device_operand(s, "output 0", out.meta, out.data)?;
            let mut ins: Vec<Dev<'_>> = Vec::with_capacity(arity);
            for (i, t) in inputs.iter().enumerate() {
                let d = device_operand(s, &format!("input {i}"), t.meta, t.data)?;
                ins.push(if must_stage(&d, &o) { stage(s, self.name, &d)? } else { d });
            }
            let refs: Vec<&Dev<'_>> = ins.iter().collect();
            if three {
                launch_ew3(s, self.name, &sym, &o, &refs, scalars)
            } else {
                launch_ew(s, self.name, &sym, &o, &refs, bits)
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vm::{bf16, f16};

    #[test]
    fn fill_bits_are_the_cast_of_the_scalar() {
        assert_eq!(dtype_bits(DType::F32, Scalar::Float(1.5)), u64::from(1.5f32.to_bits()));
        assert_eq!(dtype_bits(DType::F16, Scalar::Int(3)), u64::from(f16::from_f64(3.0).to_bits()));
        assert_eq!(dtype_bits(DType::BF16, Scalar::Float(-2.0)), u64::from(bf16::from_f64(-2.0).to_bits()));
        assert_eq!(dtype_bits(DType::U8, Scalar::Int(300)), 44);
        assert_eq!(dtype_bits(DType::U8, Scalar::Float(300.0)), 255);
        assert_eq!(dtype_bits(DType::I32, Scalar::Int(-1)), 0xFFFF_FFFF);
        assert_eq!(dtype_bits(DType::I64, Scalar::Int(i64::MIN)), i64::MIN as u64);
        assert_eq!(dtype_bits(DType::Bool, Scalar::Float(f64::NAN)), 1);
        assert_eq!(dtype_bits(DType::F64, Scalar::Int(1 << 60)), ((1u64 << 60) as f64).to_bits());
    }

    #[test]
    fn arithmetic_and_comparison_scalars() {
        // Floats: the compute type's value; f16 is not rounded to f16 first.
        assert_eq!(arith_bits(DType::F16, Scalar::Float(0.1)), u64::from(0.1f32.to_bits()));
        assert_eq!(arith_bits(DType::F64, Scalar::Float(0.1)), 0.1f64.to_bits());
        // An integer rounds to f32 once, as on the CPU: 2^60 + 2^36 + 1 is above the f32
        // midpoint 2^60 + 2^36, which the f64 step would land on (and round to even, 2^60).
        let i = (1i64 << 60) + (1 << 36) + 1;
        assert_eq!(arith_bits(DType::F32, Scalar::Int(i)), u64::from((i as f32).to_bits()));
        assert_ne!((i as f32).to_bits(), ((i as f64) as f32).to_bits());
        // Integers: converted to the dtype, sign-extended to 64 bits.
        assert_eq!(arith_bits(DType::I32, Scalar::Int(1 << 32 | 5)), 5);
        assert_eq!(arith_bits(DType::I32, Scalar::Int(-3)), -3i64 as u64);
        assert_eq!(arith_bits(DType::U8, Scalar::Float(-7.9)), 0);
        assert_eq!(arith_bits(DType::I64, Scalar::Float(2.9)), 2);
        // Comparisons: f16 against the scalar rounded to f16.
        let h = f16::from_f64(0.1).to_f32();
        assert_eq!(compare_bits(DType::F16, Scalar::Float(0.1), ScalarDomain::Own), u64::from(h.to_bits()));
        assert_eq!(compare_bits(DType::U8, Scalar::Int(300), ScalarDomain::Int), 300);
        assert_eq!(compare_bits(DType::I32, Scalar::Float(2.5), ScalarDomain::Double), 2.5f64.to_bits());
        assert_eq!(compare_bits(DType::Bool, Scalar::Bool(true), ScalarDomain::Int), 1);
    }

    #[test]
    fn kernels_are_picked_by_dtype_and_checked() {
        use crate::kernels::cuda::ELEMENTWISE;
        use DType::*;
        let op = |name: &str| ELEMENTWISE.iter().find(|o| o.name == name).unwrap();
        let none = Scalar::Float(0.0);
        assert_eq!(op("add").kernel(&[F16, F16], F16, none), Ok(("add_f16".into(), 0)));
        assert_eq!(op("add_bias").kernel(&[Bool, Bool], Bool, none), Ok(("add_bool".into(), 0)));
        assert_eq!(op("scale").kernel(&[I32], I32, Scalar::Float(2.9)), Ok(("mul_scalar_i32".into(), 2)));
        assert_eq!(op("cast").kernel(&[F32], F32, none), Ok(("copy_4".into(), 0)));
        assert_eq!(op("cast").kernel(&[BF16], U8, none), Ok(("cast_bf16_u8".into(), 0)));
        assert_eq!(op("fill").kernel(&[], F16, Scalar::Int(1)), Ok(("fill_2".into(), 0x3C00)));
        let half = Scalar::Float(0.5);
        assert_eq!(
            op("lt_scalar").kernel(&[U8], Bool, half),
            Ok(("lt_scalar_u8_d".into(), 0.5f64.to_bits()))
        );
        assert_eq!(op("lt_scalar").kernel(&[U8], Bool, Scalar::Int(7)), Ok(("lt_scalar_u8_i".into(), 7)));
        let refused = |name: &str, ins: &[DType], out: DType, says: &str| {
            let e = op(name).kernel(ins, out, none).unwrap_err();
            assert!(e.contains(says), "{name} on {ins:?}: {e}");
        };
        refused("sub", &[Bool, Bool], Bool, "not bool");
        refused("div", &[I64, I64], I64, "floating-point");
        refused("add", &[F32, F16], F32, "input 1 is f16");
        refused("eq", &[F32, F32], F32, "output 0 is f32");
        refused("masked_fill", &[F32, F32], F32, "needs bool");
        refused("relu", &[F32, F32], F32, "expected 1 input, got 2");
        // The ops of two and three inputs: `where` computes on its values' dtype.
        assert_eq!(op("where").kernel(&[Bool, F16, F16], F16, none), Ok(("where_f16".into(), 0)));
        assert_eq!(op("logical_or").kernel(&[I64, I64], Bool, none), Ok(("logical_or_i64".into(), 0)));
        assert_eq!(op("pow_scalar").kernel(&[I32], I32, Scalar::Int(3)), Ok(("pow_scalar_i32".into(), 3)));
        let two = u64::from(2.0f32.to_bits());
        assert_eq!(
            op("addcmul").kernel(&[BF16; 3], BF16, Scalar::Float(2.0)),
            Ok(("addcmul_bf16".into(), two))
        );
        assert_eq!(op("div_floor").kernel(&[U8, U8], U8, none), Ok(("div_floor_u8".into(), 0)));
        refused("where", &[F32, F32, F32], F32, "input 0 is f32 but `where` needs bool");
        refused("where", &[Bool, F32, F16], F32, "input 2 is f16 but `where` needs f32");
        refused("clamp", &[F32, F32, F64], F32, "input 2 is f64");
        refused("atan2", &[I32, I32], I32, "floating-point");
        refused("pow", &[Bool, Bool], Bool, "not bool");
        refused("logical_and", &[F32, F32], F32, "output 0 is f32");
    }

    #[test]
    fn clamp_scalar_bounds_follow_the_parameter_list() {
        let attrs = |ints: &[i64], scalars: &[Scalar]| Attrs::default().with_params(ints, scalars).unwrap();
        let both = attrs(&[1, 1], &[Scalar::Float(-1.5), Scalar::Int(2)]);
        let (lo, hi) = (u64::from((-1.5f32).to_bits()), u64::from(2.0f32.to_bits()));
        assert_eq!(clamp_scalars(DType::F16, &both), Ok([lo, hi, 3]));
        let max_only = attrs(&[0, 1], &[Scalar::Float(7.9)]);
        assert_eq!(clamp_scalars(DType::I32, &max_only), Ok([0, 7, 2]));
        let min_only = attrs(&[1, 0], &[Scalar::Int(-2)]);
        assert_eq!(clamp_scalars(DType::I64, &min_only), Ok([-2i64 as u64, 0, 1]));
        assert!(clamp_scalars(DType::F32, &attrs(&[0, 0], &[])).unwrap_err().contains("at least one"));
        assert!(clamp_scalars(DType::F32, &attrs(&[1, 1], &[Scalar::Int(1)]))
            .unwrap_err()
            .contains("lacks max"));
    }
}
