//! Running a builder case: every call returns `Ok` or a typed error, and the VM stays
//! usable.
//!
//! Each step of a [`BuilderInput`] is made on one VM (with two eager contexts on it). A
//! step's `Err` is fine as long as it is a refusal or a run-time error the call can have;
//! these are defects, and fail the case:
//! - `ShutDown` from a VM the case still holds (a VM thread died);
//! - `Panic` from an op other than `panic`, or `Kernel` from one other than `fail` (and
//!   than the integer divisions by zero and the indices out of range of `one_hot` and the
//!   indexing ops, errors of values): a kernel that panics or refuses at run time on a
//!   call the builder accepted;
//! - a read that returns another number of elements than the tensor has;
//! - a call that asks for a tensor over the cap on one tensor's bytes
//!   ([`TENSOR_CAP`], or a size that overflows: [`oversized`]) and is accepted, or is
//!   refused with another error than `TooLarge` as `docs/errors.md` words it where nothing
//!   else is wrong with it (a device, stream or released operand the VM checks first);
//! - `TooLarge` from a call that asks for no such tensor;
//! - (through the harness) any panic, on any thread, and any hang.
//!
//! After the last step the case flushes both contexts and syncs, then runs a known
//! computation on every device (and through a context) that must give the right values,
//! and a final sync that must succeed: whatever the steps did, the VM still works.

use eagervm::eager::{Array, Context, ContextOptions};
use eagervm::framework::{Attrs, DType, OutSpec, Tensor, TensorMeta};
use eagervm::prelude::*;
use std::collections::HashSet;
use std::sync::OnceLock;

use super::builder_input::{Act, Binary, BuilderInput, Call, Dev, Eager, Ins, Len, Side, Strm, Unary};
use super::harness::{oversized, setup, Oversized, Stats, TENSOR_CAP};

/// Tensors and arrays a case keeps at most (older ones are dropped first), which bounds
/// its memory.
const KEEP: usize = 24;

/// Stream ids that exist in a VM with more mock devices than the case's, and not in the
/// case's VM (two mock devices; its stream count is read off such a VM, since the stream
/// table grows with the stream types, e.g. the collective streams that come last).
fn foreign_streams() -> &'static [StreamId] {
    static IDS: OnceLock<Vec<StreamId>> = OnceLock::new();
    IDS.get_or_init(|| {
        let vm_of = |mock_devices| {
            let config = Config { synchronous: true, ..Config::default() }
                .with_mock_devices(mock_devices, eagervm::ep::mock::MockConfig::default());
            VirtualMachine::new(config).expect("a VM with mock devices starts")
        };
        let ours = vm_of(2).streams().len();
        vm_of(4).streams().into_iter().map(|s| s.0).filter(|s| s.index() >= ours).collect()
    })
}

/// What is wrong with `e`, if it is a defect (module docs).
pub fn defect(e: &Error) -> Option<String> {
    match e {
        Error::ShutDown => Some("the VM reports `ShutDown` while the case still holds it".into()),
        Error::Panic { op, .. } if op != "panic" => {
            Some(format!("a `{op}` kernel panicked on a call the builder accepted: {e}"))
        }
        // The errors of values, not of the call: an integer division by zero, a class index
        // outside `one_hot`'s range and an index out of range of the indexing ops fail
        // those kernels at run time (`docs/ops.md`), since the indices are data.
        Error::Kernel { op, message, .. }
            if (matches!(op.as_str(), "div_floor" | "div_trunc" | "remainder" | "fmod")
                && message.contains("integer division by zero"))
                || (op == "one_hot" && message.contains("is outside 0.."))
                || (matches!(
                    op.as_str(),
                    "index_select" | "gather" | "scatter" | "index_add" | "index" | "index_put"
                ) && message.contains("out of range")) =>
        {
            None
        }
        Error::Kernel { op, .. } if op != "fail" => {
            Some(format!("a `{op}` kernel refused at run time a call the builder accepted: {e}"))
        }
        Error::TooLarge { .. } => {
            Some(format!("refused as too large, though no tensor asked for is over the cap: {e}"))
        }
        Error::Failed { first, .. } => defect(first),
        _ => None,
    }
}

/// The output shape of a product `op` of operands of shapes `a` and `b`, if `op` is one and
/// its `infer` accepts the shapes (a kind of call whose output can be far larger than its
/// inputs; the other is [`sum_rows_over`]'s).
fn product_shape(op: &str, a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    match (op, a, b) {
        ("matmul", [m, k], [j, n]) | ("matmul_tn", [k, m], [j, n]) | ("matmul_nt", [m, k], [n, j])
            if k == j =>
        {
            Some(vec![*m, *n])
        }
        _ => None,
    }
}

/// NumPy's broadcast of shapes `a` and `b`, if they broadcast.
fn broadcast_shape(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let n = a.len().max(b.len());
    let dim = |s: &[usize], i: usize| if i + s.len() < n { 1 } else { s[i + s.len() - n] };
    (0..n)
        .map(|i| match (dim(a, i), dim(b, i)) {
            (x, y) if x == y || y == 1 => Some(x),
            (1, y) => Some(y),
            _ => None,
        })
        .collect()
}

/// The output of a two-input eager call of `op` on operands of these shapes and dtypes, if
/// it is over the cap (`None` also where `infer` refuses the operands: then no output is
/// asked for): a product, or an elementwise op whose operands broadcast to a larger shape
/// than either (`[n, 1] + [1, n]`). Mixed dtypes promote first (a cast of one operand, no
/// larger than it), as the eager front end does; calls by name are [`infer_over`]'s.
fn product_over(op: &str, a: (&[usize], DType), b: (&[usize], DType)) -> Option<Oversized> {
    let dtype = eagervm::vm::promote_types(a.1, b.1);
    match op {
        "add" | "sub" | "mul" | "relu_grad" => oversized(&broadcast_shape(a.0, b.0)?, dtype),
        "div" => {
            let out = if dtype.is_floating() { dtype } else { DType::F32 };
            oversized(&broadcast_shape(a.0, b.0)?, out)
        }
        "eq" | "ne" | "lt" | "le" | "gt" | "ge" => oversized(&broadcast_shape(a.0, b.0)?, DType::Bool),
        _ if a.1 == b.1 => product_shape(op, a.0, b.0).and_then(|s| oversized(&s, a.1)),
        _ => None,
    }
}

/// Each output of a call by name of `op` on inputs of these shapes and dtypes (no given
/// outputs, default attributes) whether it is over the cap, as the op's own CPU kernel
/// infers it; empty where `infer` refuses the inputs (then no output is asked for). The
/// builder and `Context::call` do not promote, so this is the call they check.
fn infer_over(vm: &VirtualMachine, op: &str, ins: &[(&[usize], DType)]) -> Vec<Option<Oversized>> {
    let Some(kernel) = vm.op(op).ok().and_then(|o| o.kernel(eagervm::ep::DeviceType::Cpu)) else {
        return Vec::new();
    };
    let metas: Vec<TensorMeta> = ins.iter().map(|&(s, d)| TensorMeta::new(s, d, DeviceId::CPU)).collect();
    let refs: Vec<&TensorMeta> = metas.iter().collect();
    let mut out = eagervm::framework::OutSpecs::new();
    match kernel.infer(&refs, &[], &Attrs::default(), &mut out) {
        Ok(()) => out.iter().map(|o| oversized(&o.shape, o.dtype)).collect(),
        Err(_) => Vec::new(),
    }
}

/// The output of `sum_rows` on an operand of shape `a`, if it is over the cap: `[n, k]`
/// gives `[k]`, far larger than its input where `n` is 0.
fn sum_rows_over(a: &[usize], dtype: DType) -> Option<Oversized> {
    match a {
        [_, k] => oversized(&[*k], dtype),
        _ => None,
    }
}

/// A call that asks for a tensor over the cap: the refusal it must get.
struct Over {
    /// `TooLarge`, worded as the VM must word it.
    error: Error,
    /// Whether every check the VM makes before its size check passes (the device, the
    /// stream, operands live, on the stream's device and not aliased, `infer`), so that
    /// `TooLarge` is the one answer allowed. Otherwise an earlier refusal may come first.
    sure: bool,
}

struct State<'a> {
    vm: &'a VirtualMachine,
    cxs: &'a [Context; 2],
    stats: &'static Stats,
    tensors: Vec<Tensor>,
    arrays: Vec<Array>,
    /// Ids of the tensors released (`Array::release`): a call on one is refused before the
    /// size check.
    released: HashSet<u64>,
}

type Step = Result<(), String>;

fn pick<T>(v: &[T], i: usize) -> Option<&T> {
    (!v.is_empty()).then(|| &v[i % v.len()])
}

fn keep<T>(v: &mut Vec<T>, x: T) {
    if v.len() >= KEEP {
        v.remove(0);
    }
    v.push(x);
}

/// `n` elements of `value` as `f32`s or `i64`s.
enum Data {
    F32(Vec<f32>),
    I64(Vec<i64>),
}

fn data(dtype: DType, n: usize, value: f64) -> Data {
    match dtype {
        DType::F32 => Data::F32(vec![value as f32; n]),
        DType::I64 => Data::I64(vec![value as i64; n]),
        other => unreachable!("the fuzz inputs draw f32 and i64 only, not {other}"),
    }
}

/// How many elements of data `len` asks for, for a tensor of `shape`. The data of a shape
/// beyond [`TENSOR_CAP`] (or whose element count overflows) is never made in full: one
/// element stands for it, and the call must be refused either way.
fn length(len: Len, shape: &[usize]) -> usize {
    let numel = shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .filter(|&n| (n as u64).saturating_mul(8) <= TENSOR_CAP)
        .unwrap_or(1);
    match len {
        Len::Exact => numel,
        Len::Off(d) => numel.saturating_add_signed(d as isize),
        Len::Fixed(n) => n,
    }
}

impl<'a> State<'a> {
    /// Count `r` and pass its value on; `Err` only for a defect.
    fn judge<T>(&self, r: eagervm::Result<T>) -> Result<Option<T>, String> {
        match r {
            Ok(v) => {
                Stats::bump(&self.stats.accepted);
                Ok(Some(v))
            }
            Err(e) => match defect(&e) {
                Some(d) => Err(d),
                None => {
                    Stats::bump(&self.stats.refused);
                    Ok(None)
                }
            },
        }
    }

    /// [`judge`](Self::judge) for a call that may ask for a tensor over the cap (`over`):
    /// then it must be refused, with `over.error` itself where `over.sure`.
    fn judge_size<T>(&self, r: eagervm::Result<T>, over: Option<Over>) -> Result<Option<T>, String> {
        let Some(over) = over else { return self.judge(r) };
        match r {
            Ok(_) => Err(format!(
                "accepted a tensor over the cap of {TENSOR_CAP} bytes; expected `{}`",
                over.error
            )),
            Err(e) if e == over.error => {
                Stats::bump(&self.stats.refused);
                Stats::bump(&self.stats.too_large);
                Ok(None)
            }
            Err(e @ Error::TooLarge { .. }) => Err(format!("refused as `{e}`; expected `{}`", over.error)),
            Err(e) if over.sure => Err(format!(
                "refused with `{e}`, though the one thing wrong with the call is a tensor over the \
                 cap; expected `{}`",
                over.error
            )),
            // A check the VM makes before its size check refused the call.
            Err(e) => self.judge(Err(e)),
        }
    }

    fn live(&self, id: u64) -> bool {
        !self.released.contains(&id)
    }

    fn device(&self, d: Dev) -> DeviceId {
        d.id()
    }

    fn stream(&self, s: Strm) -> Result<Option<StreamId>, String> {
        match s {
            Strm::On(d, ty) => self.judge(self.vm.stream(d.id(), ty)),
            Strm::Foreign(i) => Ok(pick(foreign_streams(), i).copied()),
        }
    }

    fn inputs(&self, ins: &Ins) -> Vec<&Tensor> {
        match ins {
            Ins::Few(v) => v.iter().filter_map(|&i| pick(&self.tensors, i)).collect(),
            Ins::Many { t, n } => pick(&self.tensors, *t).map_or(Vec::new(), |t| vec![t; *n]),
        }
    }

    /// A call of `op` on `ins` and `outs` (given outputs) on `stream`, if it is a product or
    /// `sum_rows` and its output is over the cap.
    fn product_call_over(&self, op: &str, ins: &[&Tensor], outs: &[&Tensor], stream: Strm) -> Option<Over> {
        // The output as the op's own `infer` gives it: a product, a broadcast, `sum_rows` of
        // an `[0, k]` matrix, an index of many elements can be far larger than the inputs.
        let metas: Vec<(&[usize], DType)> = ins.iter().map(|t| (t.shape(), t.dtype())).collect();
        let (i, o) =
            infer_over(self.vm, op, &metas).into_iter().enumerate().find_map(|(i, o)| Some((i, o?)))?;
        // The stream of another VM names no device here: the VM refuses it first.
        let dev = match stream {
            Strm::On(d, _) => Some(d.id()),
            Strm::Foreign(_) => None,
        };
        let operands = || ins.iter().chain(outs);
        let aliased =
            outs.iter().enumerate().any(|(i, o)| ins.iter().chain(&outs[..i]).any(|t| t.id() == o.id()));
        // The builder does not promote (the eager front end does): inputs of two dtypes are
        // refused by `infer` ("cast to one dtype first") before the size check.
        let one_dtype = ins.windows(2).all(|w| w[0].dtype() == w[1].dtype());
        let sure = dev.is_some_and(|d| operands().all(|t| t.device() == d))
            && operands().all(|t| self.live(t.id()))
            && one_dtype
            && !aliased;
        let on = dev.map_or_else(|| "a stream of another VM".to_string(), |d| d.to_string());
        Some(Over { error: o.error(format!("output {i} of `{op}` on {on}")), sure })
    }

    fn act(&mut self, act: &Act) -> Step {
        match act {
            Act::Empty { shape, dtype, dev } => {
                let id = self.device(*dev);
                let over = oversized(shape, *dtype)
                    .map(|o| Over { error: o.error(format!("`empty` on {id}")), sure: dev.present() });
                if let Some(t) = self.judge_size(self.vm.empty(shape, *dtype, id), over)? {
                    keep(&mut self.tensors, t);
                }
            }
            Act::FromSlice { shape, dtype, dev, len, value } => {
                let id = self.device(*dev);
                // The host tensor the data goes to first is checked before the device.
                let over = oversized(shape, *dtype)
                    .map(|o| Over { error: o.error(format!("`from_slice` on {id}")), sure: true });
                let n = length(*len, shape);
                let r = match data(*dtype, n, *value) {
                    Data::F32(v) => self.vm.from_slice(&v, shape, id),
                    Data::I64(v) => self.vm.from_slice(&v, shape, id),
                };
                if let Some(t) = self.judge_size(r, over)? {
                    keep(&mut self.tensors, t);
                }
            }
            Act::Run(calls) => {
                let vm = self.vm;
                vm.run(|b| -> Step {
                    for c in calls {
                        self.call(b, c)?;
                    }
                    Ok(())
                })?;
            }
            Act::Side(s) => self.side(s)?,
            Act::Op(name) => {
                self.judge(self.vm.op(name))?;
            }
            Act::Stream(d, ty) => {
                self.judge(self.vm.stream(d.id(), *ty))?;
            }
            Act::Eager(e) => self.eager(e)?,
        }
        Ok(())
    }

    fn call(&mut self, b: &mut InstructionsBuilder<'_>, c: &Call) -> Step {
        let (op, ins, scalar, stream) = match c {
            Call::Single { op, ins, scalar, stream } | Call::Multi { op, ins, scalar, stream } => {
                (op, ins, scalar, stream)
            }
            Call::Into { op, ins, scalar, stream, .. } => (op, ins, scalar, stream),
            Call::Write { t, dtype, len, value } => {
                let Some(t) = pick(&self.tensors, *t) else { return Ok(()) };
                let n = length(*len, t.shape());
                let r = match data(*dtype, n, *value) {
                    Data::F32(v) => b.write(t, &v),
                    Data::I64(v) => b.write(t, &v),
                };
                self.judge(r)?;
                return Ok(());
            }
            Call::Flush => {
                b.flush();
                return Ok(());
            }
            Call::Side(s) => return self.side(s),
        };
        let Some(op) = self.judge(self.vm.op(op))? else { return Ok(()) };
        let strm = *stream;
        let Some(stream) = self.stream(strm)? else { return Ok(()) };
        let attrs = Attrs::scalar(*scalar);
        let inputs = self.inputs(ins);
        let outputs: Vec<&Tensor> = match c {
            Call::Into { outs, .. } => outs.iter().filter_map(|&i| pick(&self.tensors, i)).collect(),
            _ => Vec::new(),
        };
        let over = self.product_call_over(op.name(), &inputs, &outputs, strm);
        match c {
            Call::Single { .. } => {
                let r = b.call(op, &inputs, attrs, stream);
                if let Some(t) = self.judge_size(r, over)? {
                    keep(&mut self.tensors, t);
                }
            }
            Call::Multi { .. } => {
                let r = b.call_multi(op, &inputs, attrs, stream);
                for t in self.judge_size(r, over)?.into_iter().flatten() {
                    keep(&mut self.tensors, t);
                }
            }
            Call::Into { .. } => {
                let r = b.call_into(op, &inputs, &outputs, attrs, stream);
                self.judge_size(r, over)?;
            }
            _ => unreachable!("handled above"),
        }
        Ok(())
    }

    fn side(&mut self, s: &Side) -> Step {
        match s {
            Side::ToVec { t, dtype } => {
                let Some(t) = pick(&self.tensors, *t) else { return Ok(()) };
                let n = match dtype {
                    DType::F32 => self.judge(t.to_vec::<f32>())?.map(|v| v.len()),
                    DType::I64 => self.judge(t.to_vec::<i64>())?.map(|v| v.len()),
                    other => unreachable!("the fuzz inputs draw f32 and i64 only, not {other}"),
                };
                if let Some(n) = n {
                    Stats::bump(&self.stats.ran);
                    if n != t.numel() {
                        return Err(format!("to_vec of {t:?} gave {n} elements, numel() is {}", t.numel()));
                    }
                }
            }
            Side::Wait { t } => {
                if let Some(t) = pick(&self.tensors, *t) {
                    self.judge(t.wait())?;
                }
            }
            Side::Sync => {
                self.judge(self.vm.sync())?;
            }
            Side::Drop { t } => {
                if !self.tensors.is_empty() {
                    let i = t % self.tensors.len();
                    self.tensors.remove(i);
                }
            }
        }
        Ok(())
    }

    fn array(&self, a: usize) -> Option<&Array> {
        pick(&self.arrays, a)
    }

    fn eager(&mut self, e: &Eager) -> Step {
        let cxs = self.cxs;
        let made = match e {
            Eager::Full { cx, shape, dtype, dev, value } => {
                let id = self.device(*dev);
                // A `fill` of the given output on the device's compute stream.
                let over = oversized(shape, *dtype).map(|o| Over {
                    error: o.error(format!("output 0 of `fill` on {id}")),
                    sure: dev.present(),
                });
                self.judge_size(cxs[cx % 2].full(shape, *value, *dtype, id), over)?
            }
            Eager::FromSlice { cx, shape, dtype, dev, len, value } => {
                let id = self.device(*dev);
                let over = oversized(shape, *dtype)
                    .map(|o| Over { error: o.error(format!("`from_slice` on {id}")), sure: true });
                let n = length(*len, shape);
                let cx = &cxs[cx % 2];
                let r = match data(*dtype, n, *value) {
                    Data::F32(v) => cx.from_slice(&v, shape, id),
                    Data::I64(v) => cx.from_slice(&v, shape, id),
                };
                self.judge_size(r, over)?
            }
            Eager::Unary { a, op, scalar } => {
                let Some(a) = self.array(*a) else { return Ok(()) };
                let over = match op {
                    Unary::SumRows => sum_rows_over(a.shape(), a.dtype()).map(|o| Over {
                        error: o.error(format!("output 0 of `sum_rows` on {}", a.device())),
                        sure: self.live(a.id()),
                    }),
                    _ => None,
                };
                let r = match op {
                    Unary::Scale => a.scale(*scalar),
                    Unary::Relu => a.relu(),
                    Unary::Sum => a.sum(),
                    Unary::SumRows => a.sum_rows(),
                };
                self.judge_size(r, over)?
            }
            Eager::Binary { a, b, op } => {
                let (Some(a), Some(b)) = (self.array(*a), self.array(*b)) else { return Ok(()) };
                let name = match op {
                    Binary::Matmul => "matmul",
                    Binary::MatmulTn => "matmul_tn",
                    Binary::MatmulNt => "matmul_nt",
                    Binary::Add => "add",
                    Binary::Sub => "sub",
                    Binary::Mul => "mul",
                    Binary::ReluGrad => "relu_grad",
                    Binary::AddBias => "",
                };
                // On the compute stream of `a`'s device (which the VM has).
                // The eager transposed products call `matmul` with its transpose flags.
                let called = if name.starts_with("matmul") { "matmul" } else { name };
                let over = product_over(name, (a.shape(), a.dtype()), (b.shape(), b.dtype())).map(|o| Over {
                    error: o.error(format!("output 0 of `{called}` on {}", a.device())),
                    sure: self.live(a.id()) && self.live(b.id()) && a.device() == b.device(),
                });
                let r = match op {
                    Binary::Add => a.add(b),
                    Binary::Sub => a.sub(b),
                    Binary::Mul => a.mul(b),
                    Binary::ReluGrad => a.relu_grad(b),
                    Binary::Matmul => a.matmul(b),
                    Binary::MatmulTn => a.matmul_tn(b),
                    Binary::MatmulNt => a.matmul_nt(b),
                    Binary::AddBias => a.add_bias(b),
                };
                self.judge_size(r, over)?
            }
            Eager::To { a, dev } => {
                let Some(a) = self.array(*a) else { return Ok(()) };
                self.judge(a.to(self.device(*dev)))?
            }
            Eager::Call { cx, op, ins, given, dev, scalar } => {
                let inputs: Vec<&Array> = ins.iter().filter_map(|&i| self.array(i)).collect();
                let id = self.device(*dev);
                // The outputs the call makes, as `infer` gives them: the given ones for the
                // ops that write what they are given, the product for a product, the row of
                // `sum_rows`, and for every other op outputs no larger than its inputs.
                let outs: Vec<Option<Oversized>> = match (*op, &inputs[..]) {
                    ("fill", []) if given.len() == 1 => given.iter().map(|(s, d)| oversized(s, *d)).collect(),
                    ("noop" | "fail" | "panic", _) => given.iter().map(|(s, d)| oversized(s, *d)).collect(),
                    (_, []) => Vec::new(),
                    (_, ins) => {
                        let metas: Vec<(&[usize], DType)> =
                            ins.iter().map(|a| (a.shape(), a.dtype())).collect();
                        infer_over(self.vm, op, &metas)
                    }
                };
                // The size check refuses the first output over the cap. A call by name does
                // not promote: inputs of two dtypes may be refused by `infer` first.
                let one_dtype = inputs.windows(2).all(|w| w[0].dtype() == w[1].dtype());
                let over = outs.into_iter().enumerate().find_map(|(i, o)| Some((i, o?))).map(|(i, o)| Over {
                    error: o.error(format!("output {i} of `{op}` on {id}")),
                    sure: dev.present()
                        && one_dtype
                        && inputs.iter().all(|a| self.live(a.id()) && a.device() == id),
                });
                let given: Vec<OutSpec> = given
                    .iter()
                    .map(|(s, d)| OutSpec { shape: s.iter().copied().collect(), dtype: *d })
                    .collect();
                let r = cxs[cx % 2].call(op, &inputs, Attrs::scalar(*scalar), &given, id);
                for a in self.judge_size(r, over)?.into_iter().flatten() {
                    keep(&mut self.arrays, a);
                }
                None
            }
            Eager::ToVec { a, dtype } => {
                let Some(a) = self.array(*a) else { return Ok(()) };
                let n = match dtype {
                    DType::F32 => self.judge(a.to_vec::<f32>())?.map(|v| v.len()),
                    DType::I64 => self.judge(a.to_vec::<i64>())?.map(|v| v.len()),
                    other => unreachable!("the fuzz inputs draw f32 and i64 only, not {other}"),
                };
                if let Some(n) = n {
                    Stats::bump(&self.stats.ran);
                    if n != a.numel() {
                        return Err(format!("to_vec of {a:?} gave {n} elements, numel() is {}", a.numel()));
                    }
                }
                None
            }
            Eager::Item { a, dtype } => {
                let Some(a) = self.array(*a) else { return Ok(()) };
                match dtype {
                    DType::F32 => self.judge(a.item::<f32>())?.map(|_| ()),
                    DType::I64 => self.judge(a.item::<i64>())?.map(|_| ()),
                    other => unreachable!("the fuzz inputs draw f32 and i64 only, not {other}"),
                };
                None
            }
            Eager::Wait { a } => {
                if let Some(a) = self.array(*a) {
                    self.judge(a.wait())?;
                }
                None
            }
            Eager::Release { a } => {
                if let Some((id, r)) = self.array(*a).map(|a| (a.id(), a.release())) {
                    if self.judge(r)?.is_some() {
                        self.released.insert(id);
                    }
                }
                None
            }
            Eager::Flush { cx } => {
                self.judge(cxs[cx % 2].flush())?;
                None
            }
            Eager::Sync { cx } => {
                self.judge(cxs[cx % 2].sync())?;
                None
            }
            Eager::Wrap { cx, t } => pick(&self.tensors, *t).map(|t| cxs[cx % 2].wrap(t.clone())),
            Eager::Tensor { a } => {
                let Some(a) = self.array(*a) else { return Ok(()) };
                if let Some(t) = self.judge(a.tensor())? {
                    let t = t.clone();
                    keep(&mut self.tensors, t);
                }
                None
            }
            Eager::Drop { a } => {
                if !self.arrays.is_empty() {
                    let i = a % self.arrays.len();
                    self.arrays.remove(i);
                }
                None
            }
        };
        if let Some(a) = made {
            keep(&mut self.arrays, a);
        }
        Ok(())
    }

    /// The end of every case (module docs).
    fn finish(&mut self) -> Step {
        for cx in self.cxs {
            self.judge(cx.flush())?;
        }
        self.judge(self.vm.sync())?;
        for dev in [DeviceId::CPU, DeviceId::mock(0), DeviceId::mock(1)] {
            let got = self
                .known_on(dev)
                .map_err(|e| format!("after the steps, a known computation on {dev}: {e}"))?;
            if got != [2.0, 0.0, 6.0] {
                return Err(format!("after the steps, 2 * relu([1, -2, 3]) on {dev} gave {got:?}"));
            }
        }
        let cx = &self.cxs[0];
        let x = cx.from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2], DeviceId::mock(1));
        let total = x
            .and_then(|x| x.matmul(&x)?.sum()?.to(DeviceId::CPU)?.item::<f32>())
            .map_err(|e| format!("after the steps, a known computation through a context: {e}"))?;
        if total != 54.0 {
            return Err(format!("after the steps, sum([[1, 2], [3, 4]]^2) gave {total}"));
        }
        self.vm.sync().map_err(|e| format!("after the steps, a sync after the known computations: {e}"))
    }

    fn known_on(&self, dev: DeviceId) -> eagervm::Result<Vec<f32>> {
        let (relu, scale) = (self.vm.op("relu")?, self.vm.op("scale")?);
        let s = self.vm.compute_stream(dev)?;
        let x = self.vm.from_slice(&[1.0f32, -2.0, 3.0], &[3], dev)?;
        let y = self.vm.run(|b| {
            let r = b.call(relu, &[&x], Attrs::default(), s)?;
            b.call(scale, &[&r], Attrs::scalar(2.0), s)
        })?;
        y.to_vec::<f32>()
    }
}

/// Run one builder case (module docs); `Err` says what went wrong.
pub fn run(input: &BuilderInput, stats: &'static Stats) -> Result<(), String> {
    Stats::bump(&stats.cases);
    let config = setup(input.knobs);
    let vm = VirtualMachine::new(config).map_err(|e| format!("VirtualMachine::new: {e}"))?;
    let opts = ContextOptions { flush_every: input.flush_every };
    let cxs = [Context::with_options(&vm, opts), Context::with_options(&vm, opts)];
    let mut s = State {
        vm: &vm,
        cxs: &cxs,
        stats,
        tensors: Vec::new(),
        arrays: Vec::new(),
        released: HashSet::new(),
    };
    for (i, act) in input.acts.iter().enumerate() {
        s.act(act).map_err(|e| format!("step {i} ({act:?}): {e}"))?;
    }
    s.finish()
}
