//! Host values of every dtype, views of them, and what each op computes, written from the
//! rules of `docs/cuda.md` (the CPU kernels' rules) one element at a time: the reference
//! the GPU tests hold the CUDA kernels to, besides the CPU kernels themselves.

use eagervm::framework::{bf16, f16, Scalar};
use eagervm::prelude::*;
use eagervm::vm::{read_element, write_element};

/// Elements of one dtype, as their bytes (native-endian, `bool` as 0/1).
#[derive(Clone, Debug, PartialEq)]
pub struct Vals {
    pub dtype: DType,
    pub bytes: Vec<u8>,
}

impl Vals {
    /// The values `v`, converted to `dtype` as `fill` converts a scalar.
    pub fn of(dtype: DType, v: impl IntoIterator<Item = Scalar>) -> Vals {
        let mut bytes = Vec::new();
        for s in v {
            write_element(dtype, s, &mut bytes);
        }
        Vals { dtype, bytes }
    }

    pub fn len(&self) -> usize {
        self.bytes.len() / self.dtype.size()
    }

    pub fn get(&self, i: usize) -> Scalar {
        read_element(self.dtype, &self.bytes, i).expect("an element in range")
    }

    /// Element `i`'s bits (for NaN-blind comparison and messages).
    fn bits(&self, i: usize) -> u64 {
        let n = self.dtype.size();
        let mut b = [0u8; 8];
        b[..n].copy_from_slice(&self.bytes[i * n..(i + 1) * n]);
        u64::from_le_bytes(b)
    }

    /// A tensor of `shape` holding these values on `device`.
    pub fn tensor(&self, vm: &VirtualMachine, shape: &[usize], device: DeviceId) -> Tensor {
        fn make<T: eagervm::framework::Element>(
            vm: &VirtualMachine,
            v: &Vals,
            shape: &[usize],
            device: DeviceId,
        ) -> Tensor {
            vm.from_slice(&T::from_bytes(&v.bytes), shape, device).expect("from_slice")
        }
        match self.dtype {
            DType::Bool => make::<bool>(vm, self, shape, device),
            DType::U8 => make::<u8>(vm, self, shape, device),
            DType::I32 => make::<i32>(vm, self, shape, device),
            DType::I64 => make::<i64>(vm, self, shape, device),
            DType::F16 => make::<f16>(vm, self, shape, device),
            DType::BF16 => make::<bf16>(vm, self, shape, device),
            DType::F32 => make::<f32>(vm, self, shape, device),
            DType::F64 => make::<f64>(vm, self, shape, device),
        }
    }

    /// The values of `t` (waiting for it), or its error.
    pub fn read(t: &Tensor) -> Result<Vals> {
        fn get<T: eagervm::framework::Element>(t: &Tensor) -> Result<Vec<u8>> {
            t.to_vec::<T>().map(|v| T::to_bytes(&v))
        }
        let bytes = match t.dtype() {
            DType::Bool => get::<bool>(t),
            DType::U8 => get::<u8>(t),
            DType::I32 => get::<i32>(t),
            DType::I64 => get::<i64>(t),
            DType::F16 => get::<f16>(t),
            DType::BF16 => get::<bf16>(t),
            DType::F32 => get::<f32>(t),
            DType::F64 => get::<f64>(t),
        }?;
        Ok(Vals { dtype: t.dtype(), bytes })
    }

    /// The first element where `self` and `other` differ, bit for bit except that any two
    /// NaNs are equal (NaN payloads differ between CPUs and GPUs), as
    /// `(index, self's value, other's value)`.
    pub fn first_difference(&self, other: &Vals) -> Option<String> {
        if self.dtype != other.dtype || self.len() != other.len() {
            return Some(format!(
                "{} × {} against {} × {}",
                self.dtype,
                self.len(),
                other.dtype,
                other.len()
            ));
        }
        (0..self.len()).find_map(|i| {
            let (a, b) = (self.get(i), other.get(i));
            let both_nan = matches!((a, b), (Scalar::Float(x), Scalar::Float(y)) if x.is_nan() && y.is_nan());
            (self.bits(i) != other.bits(i) && !both_nan).then(|| format!("element {i}: {a} against {b}"))
        })
    }
}

/// `shape`'s element count.
pub fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// Row-major strides of `shape`.
pub fn contiguous(shape: &[usize]) -> Vec<isize> {
    let mut s = vec![1isize; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1].max(1) as isize;
    }
    s
}

/// The elements the layout `(shape, strides, offset)` names in `storage`, in row-major order.
pub fn gather(storage: &Vals, shape: &[usize], strides: &[isize], offset: usize) -> Vals {
    let n = storage.dtype.size();
    let mut bytes = Vec::with_capacity(numel(shape) * n);
    for flat in 0..numel(shape) {
        let (mut rest, mut at) = (flat, offset as isize);
        for d in (0..shape.len()).rev() {
            at += (rest % shape[d]) as isize * strides[d];
            rest /= shape[d];
        }
        let at = at as usize;
        bytes.extend_from_slice(&storage.bytes[at * n..(at + 1) * n]);
    }
    Vals { dtype: storage.dtype, bytes }
}

/// The element of an input of `shape` that element `flat` of an output of `out` reads
/// (broadcasting).
pub fn broadcast_index(out: &[usize], shape: &[usize], flat: usize) -> usize {
    let lead = out.len() - shape.len();
    let (mut rest, mut at, mut step) = (flat, 0, 1);
    for d in (0..out.len()).rev() {
        let i = rest % out[d];
        rest /= out[d];
        if d >= lead {
            let own = shape[d - lead];
            if own != 1 {
                at += i * step;
            }
            step *= own;
        }
    }
    at
}

/// The broadcast shape of two shapes.
pub fn broadcast(a: &[usize], b: &[usize]) -> Vec<usize> {
    let rank = a.len().max(b.len());
    let dim = |s: &[usize], d: usize| if d + s.len() < rank { 1 } else { s[d + s.len() - rank] };
    (0..rank).map(|d| dim(a, d).max(dim(b, d)) * usize::from(dim(a, d) != 0 && dim(b, d) != 0)).collect()
}

/// A value in the type a kernel computes `d` in.
#[derive(Clone, Copy, Debug)]
enum C {
    F(f32),
    D(f64),
    I(i64),
}

fn load(d: DType, s: Scalar) -> C {
    match d {
        DType::F16 | DType::BF16 | DType::F32 => C::F(s.as_f64() as f32),
        DType::F64 => C::D(s.as_f64()),
        _ => C::I(s.as_i64()),
    }
}

/// The compute value `c` stored as `d`: 16-bit floats rounded once to nearest even, the
/// integers wrapped, `bool` nonzero.
fn store(d: DType, c: C) -> Scalar {
    match (d, c) {
        (DType::F16, C::F(x)) => Scalar::Float(f16::from_f32(x).to_f64()),
        (DType::BF16, C::F(x)) => Scalar::Float(bf16::from_f32(x).to_f64()),
        (_, C::F(x)) => Scalar::Float(f64::from(x)),
        (_, C::D(x)) => Scalar::Float(x),
        (DType::Bool, C::I(x)) => Scalar::Bool(x != 0),
        (DType::U8, C::I(x)) => Scalar::Int(i64::from(x as u8)),
        (DType::I32, C::I(x)) => Scalar::Int(i64::from(x as i32)),
        (_, C::I(x)) => Scalar::Int(x),
    }
}

/// `x op y` in `d`'s compute type (`op` one of `+ - * /`), wrapping for integers, `or` and
/// `and` for `bool`.
fn arith(op: char, d: DType, x: C, y: C) -> C {
    match (x, y) {
        (C::F(a), C::F(b)) => C::F(match op {
            '+' => a + b,
            '-' => a - b,
            '*' => a * b,
            _ => a / b,
        }),
        (C::D(a), C::D(b)) => C::D(match op {
            '+' => a + b,
            '-' => a - b,
            '*' => a * b,
            _ => a / b,
        }),
        (C::I(a), C::I(b)) if d == DType::Bool => C::I(if op == '+' { a | b } else { a & b }),
        (C::I(a), C::I(b)) => C::I(match op {
            '+' => a.wrapping_add(b),
            '-' => a.wrapping_sub(b),
            _ => a.wrapping_mul(b),
        }),
        _ => unreachable!("mixed compute types"),
    }
}

fn cmp(op: &str, x: f64, y: f64) -> bool {
    match op {
        "eq" => x == y,
        "ne" => x != y,
        "lt" => x < y,
        "le" => x <= y,
        "gt" => x > y,
        _ => x >= y,
    }
}

fn cmp_i(op: &str, x: i64, y: i64) -> bool {
    match op {
        "eq" => x == y,
        "ne" => x != y,
        "lt" => x < y,
        "le" => x <= y,
        "gt" => x > y,
        _ => x >= y,
    }
}

/// `s` converted to `d` and read back.
pub fn as_dtype(d: DType, s: Scalar) -> Scalar {
    Vals::of(d, [s]).get(0)
}

/// The scalar of an arithmetic op on `d`, in the compute type.
fn scalar(d: DType, s: Scalar) -> C {
    match d {
        DType::F16 | DType::BF16 | DType::F32 => C::F(s.as_f64() as f32),
        DType::F64 => C::D(s.as_f64()),
        _ => C::I(as_dtype(d, s).as_i64()),
    }
}

/// `x` of dtype `from` converted to `to` as `cast` converts.
pub fn cast(from: DType, to: DType, x: Scalar) -> Scalar {
    let _ = from;
    match (to, x) {
        (DType::Bool, _) => Scalar::Bool(x.as_bool()),
        (DType::F16, _) => Scalar::Float(f16::from_f32(cast_f32(x)).to_f64()),
        (DType::BF16, _) => Scalar::Float(bf16::from_f32(cast_f32(x)).to_f64()),
        (DType::F32, _) => Scalar::Float(f64::from(cast_f32(x))),
        (DType::F64, _) => Scalar::Float(x.as_f64()),
        (DType::U8, Scalar::Float(v)) => Scalar::Int(i64::from(v as u8)),
        (DType::I32, Scalar::Float(v)) => Scalar::Int(i64::from(v as i32)),
        (DType::I64, Scalar::Float(v)) => Scalar::Int(v as i64),
        (DType::U8, _) => Scalar::Int(i64::from(x.as_i64() as u8)),
        (DType::I32, _) => Scalar::Int(i64::from(x.as_i64() as i32)),
        (DType::I64, _) => Scalar::Int(x.as_i64()),
    }
}

/// A value as `f32`: one rounding from an integer or an `f64` (PyTorch's conversion).
fn cast_f32(x: Scalar) -> f32 {
    match x {
        Scalar::Float(v) => v as f32,
        Scalar::Int(v) => v as f32,
        Scalar::Bool(b) => f32::from(u8::from(b)),
    }
}

/// The reference result of elementwise op `op` on `inputs` (values and shapes), with
/// `attrs`; `out` is the output's dtype and shape.
pub fn elementwise(op: &str, inputs: &[(&Vals, &[usize])], attrs: Attrs, out: (DType, &[usize])) -> Vals {
    let (od, oshape) = out;
    let s = attrs.value();
    let at = |k: usize, flat: usize| {
        let (v, shape) = inputs[k];
        v.get(broadcast_index(oshape, shape, flat))
    };
    let d = inputs.first().map_or(od, |(v, _)| v.dtype);
    let one = |flat: usize| -> Scalar {
        match op {
            "fill" => as_dtype(od, s),
            "cast" => cast(d, od, at(0, flat)),
            "masked_fill" => {
                if at(1, flat).as_bool() {
                    as_dtype(od, s)
                } else {
                    at(0, flat)
                }
            }
            "add" | "sub" | "mul" | "div" | "add_bias" => {
                let c = match op {
                    "sub" => '-',
                    "mul" => '*',
                    "div" => '/',
                    _ => '+',
                };
                store(d, arith(c, d, load(d, at(0, flat)), load(d, at(1, flat))))
            }
            "relu" => {
                let x = at(0, flat);
                let neg = match x {
                    Scalar::Float(v) => v < 0.0,
                    _ => x.as_i64() < 0,
                };
                if neg {
                    as_dtype(d, Scalar::Int(0))
                } else {
                    x
                }
            }
            "relu_grad" => {
                let (dy, x) = (at(0, flat), at(1, flat));
                let pos = match x {
                    Scalar::Float(v) => v > 0.0,
                    _ => x.as_i64() > 0,
                };
                if pos {
                    dy
                } else {
                    as_dtype(d, Scalar::Int(0))
                }
            }
            "scale" | "mul_scalar" | "add_scalar" | "rsub_scalar" | "div_scalar" | "rdiv_scalar" => {
                let (x, v) = (load(d, at(0, flat)), scalar(d, s));
                store(
                    d,
                    match op {
                        "add_scalar" => arith('+', d, x, v),
                        "rsub_scalar" => arith('-', d, v, x),
                        "div_scalar" => arith('/', d, x, v),
                        "rdiv_scalar" => arith('/', d, v, x),
                        _ => arith('*', d, x, v),
                    },
                )
            }
            _ if op.ends_with("_scalar") => {
                let c = &op[..2];
                let x = at(0, flat);
                Scalar::Bool(match (d.is_floating(), s) {
                    (true, _) => cmp(c, x.as_f64(), as_dtype(d, s).as_f64()),
                    (false, Scalar::Float(v)) => cmp(c, x.as_i64() as f64, v),
                    (false, _) => cmp_i(c, x.as_i64(), s.as_i64()),
                })
            }
            _ => {
                let (x, y) = (at(0, flat), at(1, flat));
                Scalar::Bool(if d.is_floating() {
                    cmp(op, x.as_f64(), y.as_f64())
                } else {
                    cmp_i(op, x.as_i64(), y.as_i64())
                })
            }
        }
    };
    Vals::of(od, (0..numel(oshape)).map(one))
}
