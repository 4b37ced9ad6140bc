//! Inputs of the builder target: random sequences of public-API calls.
//!
//! The calls are those of a program: `VirtualMachine::empty`, `from_slice`, `op`, `stream`,
//! `run` with `call`, `call_multi`, `call_into`, `write` and `flush` (and, while the builder
//! is open, reads, waits, syncs and drops), `Tensor::to_vec` and `wait`, `sync`, and the
//! eager `Context`/`Array` API on two contexts. Their arguments are drawn to be valid often
//! enough that work runs, and wrong in every way a caller can get them wrong: shapes from
//! small to overflowing (and long thin matrices whose products are over the cap on one
//! tensor), both dtypes, devices the VM has (`cpu:0`, `mock:0`, `mock:1`) and ones it has
//! not, every stream type and stream ids of another VM, every registered op and unknown
//! names, any scalar, data of the wrong length, up to 256 inputs.

use eagervm::ep::{DeviceId, StreamType};
use eagervm::framework::DType;
use eagervm::vm::ThreadTopology;
use proptest::prelude::*;

use super::harness::Knobs;

/// Every op registered in a VM, by name.
pub fn ops() -> Vec<&'static str> {
    eagervm::framework::OpRegistry::with_builtins().names()
}

/// Names no op is registered under.
pub const UNKNOWN_OPS: &[&str] = &["", "frobnicate", "ADD", "add ", "matmul\0", "é", "sum_rows_"];

/// A device, present in the case's VM or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dev {
    /// `cpu:0`.
    Cpu,
    /// `mock:0`.
    Mock0,
    /// `mock:1`.
    Mock1,
    /// `mock:2`: absent (the VM has two mock devices).
    Mock2,
    /// `mock:65535`: absent.
    MockMax,
    /// `cuda:0`: absent (the VM asks for no CUDA device).
    Cuda0,
}

impl Dev {
    /// The device id.
    pub fn id(self) -> DeviceId {
        match self {
            Dev::Cpu => DeviceId::CPU,
            Dev::Mock0 => DeviceId::mock(0),
            Dev::Mock1 => DeviceId::mock(1),
            Dev::Mock2 => DeviceId::mock(2),
            Dev::MockMax => DeviceId::mock(u16::MAX),
            Dev::Cuda0 => DeviceId::cuda(0),
        }
    }

    /// Whether the case's VM has it.
    pub fn present(self) -> bool {
        matches!(self, Dev::Cpu | Dev::Mock0 | Dev::Mock1)
    }
}

/// A stream: by device and type, or the `n`th stream id of another VM that this one lacks.
#[derive(Debug, Clone, Copy)]
pub enum Strm {
    /// `vm.stream(device, type)`.
    On(Dev, StreamType),
    /// A stream id from another VM with more streams.
    Foreign(usize),
}

/// How many elements of data a write or `from_slice` gives.
#[derive(Debug, Clone, Copy)]
pub enum Len {
    /// As many as the tensor has.
    Exact,
    /// That many plus this (at least 0).
    Off(i8),
    /// This many.
    Fixed(usize),
}

/// The inputs of a call: indices into the case's tensors (or arrays).
#[derive(Debug, Clone)]
pub enum Ins {
    /// These.
    Few(Vec<usize>),
    /// One tensor `n` times (around the 255-input limit).
    Many { t: usize, n: usize },
}

/// A builder call, inside one `vm.run`.
#[derive(Debug, Clone)]
pub enum Call {
    /// `b.call(op, inputs, scalar, stream)`.
    Single { op: &'static str, ins: Ins, scalar: f64, stream: Strm },
    /// `b.call_multi(...)`.
    Multi { op: &'static str, ins: Ins, scalar: f64, stream: Strm },
    /// `b.call_into(op, inputs, outputs, scalar, stream)`.
    Into { op: &'static str, ins: Ins, outs: Vec<usize>, scalar: f64, stream: Strm },
    /// `b.write(tensor, data)` with data of `dtype`.
    Write { t: usize, dtype: DType, len: Len, value: f64 },
    /// `b.flush()`.
    Flush,
    /// A call outside the builder, made while it is open.
    Side(Side),
}

/// Calls that wait or drop, made outside a builder or while one is open.
#[derive(Debug, Clone)]
pub enum Side {
    /// `t.to_vec::<dtype>()`.
    ToVec { t: usize, dtype: DType },
    /// `t.wait()`.
    Wait { t: usize },
    /// `vm.sync()`.
    Sync,
    /// Drop the case's handle of a tensor.
    Drop { t: usize },
}

/// The unary methods of `Array`.
#[derive(Debug, Clone, Copy)]
pub enum Unary {
    /// `scale(scalar)`.
    Scale,
    /// `relu()`.
    Relu,
    /// `sum()`.
    Sum,
    /// `sum_rows()`.
    SumRows,
}

/// The binary methods of `Array`.
#[derive(Debug, Clone, Copy)]
pub enum Binary {
    /// `add`.
    Add,
    /// `sub`.
    Sub,
    /// `mul`.
    Mul,
    /// `relu_grad`.
    ReluGrad,
    /// `matmul`.
    Matmul,
    /// `matmul_tn`.
    MatmulTn,
    /// `matmul_nt`.
    MatmulNt,
    /// `add_bias`.
    AddBias,
}

/// A call of the eager front end. `cx` picks one of the case's two contexts; `a`, `b`
/// index its arrays, `t` its tensors.
#[derive(Debug, Clone)]
pub enum Eager {
    /// `cx.full(shape, value, dtype, device)`.
    Full { cx: usize, shape: Vec<usize>, dtype: DType, dev: Dev, value: f64 },
    /// `cx.from_slice(data, shape, device)`.
    FromSlice { cx: usize, shape: Vec<usize>, dtype: DType, dev: Dev, len: Len, value: f64 },
    /// A unary method.
    Unary { a: usize, op: Unary, scalar: f64 },
    /// A binary method.
    Binary { a: usize, b: usize, op: Binary },
    /// `a.to(device)`.
    To { a: usize, dev: Dev },
    /// `cx.call(op, inputs, scalar, given, device)`.
    Call {
        cx: usize,
        op: &'static str,
        ins: Vec<usize>,
        given: Vec<(Vec<usize>, DType)>,
        dev: Dev,
        scalar: f64,
    },
    /// `a.to_vec::<dtype>()`.
    ToVec { a: usize, dtype: DType },
    /// `a.item::<dtype>()`.
    Item { a: usize, dtype: DType },
    /// `a.wait()`.
    Wait { a: usize },
    /// `a.release()`.
    Release { a: usize },
    /// `cx.flush()`.
    Flush { cx: usize },
    /// `cx.sync()`.
    Sync { cx: usize },
    /// `cx.wrap(tensor)`.
    Wrap { cx: usize, t: usize },
    /// `a.tensor()`, kept among the case's tensors.
    Tensor { a: usize },
    /// Drop the case's handle of an array.
    Drop { a: usize },
}

/// One step of a builder case.
#[derive(Debug, Clone)]
pub enum Act {
    /// `vm.empty(shape, dtype, device)`.
    Empty { shape: Vec<usize>, dtype: DType, dev: Dev },
    /// `vm.from_slice(data, shape, device)`.
    FromSlice { shape: Vec<usize>, dtype: DType, dev: Dev, len: Len, value: f64 },
    /// One `vm.run` with these calls.
    Run(Vec<Call>),
    /// A call outside any builder.
    Side(Side),
    /// `vm.op(name)`.
    Op(&'static str),
    /// `vm.stream(device, type)`.
    Stream(Dev, StreamType),
    /// A call of the eager front end.
    Eager(Eager),
}

/// A builder case: the VM's knobs, the contexts' flush interval, and the steps.
#[derive(Debug, Clone)]
pub struct BuilderInput {
    /// The VM's knobs.
    pub knobs: Knobs,
    /// `ContextOptions::flush_every` of both contexts.
    pub flush_every: usize,
    /// The steps.
    pub acts: Vec<Act>,
}

fn dev() -> impl Strategy<Value = Dev> {
    prop_oneof![
        4 => Just(Dev::Cpu),
        3 => Just(Dev::Mock0),
        2 => Just(Dev::Mock1),
        1 => prop::sample::select(vec![Dev::Mock2, Dev::MockMax, Dev::Cuda0]),
    ]
}

fn stream_type() -> impl Strategy<Value = StreamType> {
    prop::sample::select(StreamType::ALL.to_vec())
}

fn strm() -> impl Strategy<Value = Strm> {
    prop_oneof![
        12 => (dev(), stream_type()).prop_map(|(d, t)| Strm::On(d, t)),
        6 => dev().prop_map(|d| Strm::On(d, StreamType::Compute)),
        1 => any::<usize>().prop_map(Strm::Foreign),
    ]
}

fn dtype() -> impl Strategy<Value = DType> {
    prop_oneof![3 => Just(DType::F32), 1 => Just(DType::I64)]
}

/// Dimension sizes: mostly small; sometimes large (up to a few million); sometimes beyond
/// any memory, or chosen so that products of them wrap (`0xAAAA_AAAA_AAAA_AAAB` is the
/// inverse of 3 modulo 2^64: `[3, that]` has a product of 1 in wrapping arithmetic).
fn dim() -> impl Strategy<Value = usize> {
    prop_oneof![
        24 => 0usize..=4,
        2 => 5usize..=64,
        1 => prop::sample::select(vec![1usize << 12, 1 << 16, 1 << 20, 3 << 20]),
        1 => prop::sample::select(vec![
            1usize << 31,
            1 << 32,
            1 << 40,
            1 << 62,
            1 << 63,
            usize::MAX,
            usize::MAX / 3,
            0xAAAA_AAAA_AAAA_AAAB,
        ]),
    ]
}

/// Shapes: mostly from a small set that makes calls fit together, else random; and long
/// thin matrices, small themselves, whose products are just over the fuzz cases' cap on
/// one tensor (`[4097, 1] x [1, 4097]`: 4097^2 `f32`s are 32 772 bytes over 64 MiB).
fn shape() -> impl Strategy<Value = Vec<usize>> {
    let common: Vec<Vec<usize>> =
        vec![vec![], vec![1], vec![2], vec![3], vec![2, 2], vec![2, 3], vec![3, 2], vec![4]];
    prop_oneof![
        12 => prop::sample::select(common),
        6 => prop::collection::vec(dim(), 0..=3),
        2 => prop::collection::vec(dim(), 4..=8),
        1 => prop::sample::select(vec![vec![4097, 1], vec![1, 4097]]),
    ]
}

fn scalar() -> impl Strategy<Value = f64> {
    prop_oneof![
        4 => prop::sample::select(vec![0.0, 1.0, -1.0, 0.5, 2.0, -0.0, 7.0]),
        1 => prop::sample::select(vec![
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::MAX,
            f64::MIN_POSITIVE,
            1e300,
            i64::MAX as f64,
            i64::MIN as f64,
            u64::MAX as f64,
        ]),
        1 => any::<f64>(),
    ]
}

fn op() -> impl Strategy<Value = &'static str> {
    prop_oneof![12 => prop::sample::select(ops()), 1 => prop::sample::select(UNKNOWN_OPS)]
}

fn len() -> impl Strategy<Value = Len> {
    prop_oneof![
        8 => Just(Len::Exact),
        2 => (-2i8..=2).prop_map(Len::Off),
        1 => (0usize..8).prop_map(Len::Fixed),
    ]
}

fn idx() -> impl Strategy<Value = usize> {
    any::<usize>()
}

fn ins() -> impl Strategy<Value = Ins> {
    prop_oneof![
        20 => prop::collection::vec(idx(), 0..=3).prop_map(Ins::Few),
        2 => prop::collection::vec(idx(), 4..=20).prop_map(Ins::Few),
        1 => (idx(), prop::sample::select(vec![254usize, 255, 256, 300]))
            .prop_map(|(t, n)| Ins::Many { t, n }),
    ]
}

fn side() -> impl Strategy<Value = Side> {
    prop_oneof![
        4 => (idx(), dtype()).prop_map(|(t, dtype)| Side::ToVec { t, dtype }),
        2 => idx().prop_map(|t| Side::Wait { t }),
        1 => Just(Side::Sync),
        2 => idx().prop_map(|t| Side::Drop { t }),
    ]
}

fn call() -> impl Strategy<Value = Call> {
    prop_oneof![
        6 => (op(), ins(), scalar(), strm())
            .prop_map(|(op, ins, scalar, stream)| Call::Single { op, ins, scalar, stream }),
        2 => (op(), ins(), scalar(), strm())
            .prop_map(|(op, ins, scalar, stream)| Call::Multi { op, ins, scalar, stream }),
        5 => (op(), ins(), prop::collection::vec(idx(), 0..=2), scalar(), strm())
            .prop_map(|(op, ins, outs, scalar, stream)| Call::Into { op, ins, outs, scalar, stream }),
        3 => (idx(), dtype(), len(), scalar())
            .prop_map(|(t, dtype, len, value)| Call::Write { t, dtype, len, value }),
        1 => Just(Call::Flush),
        1 => side().prop_map(Call::Side),
    ]
}

fn eager() -> impl Strategy<Value = Eager> {
    let unary = prop::sample::select(vec![Unary::Scale, Unary::Relu, Unary::Sum, Unary::SumRows]);
    let binary = prop::sample::select(vec![
        Binary::Add,
        Binary::Sub,
        Binary::Mul,
        Binary::ReluGrad,
        Binary::Matmul,
        Binary::MatmulTn,
        Binary::MatmulNt,
        Binary::AddBias,
    ]);
    let given = prop::collection::vec((shape(), dtype()), 0..=2);
    prop_oneof![
        4 => (0..2usize, shape(), dtype(), dev(), scalar())
            .prop_map(|(cx, shape, dtype, dev, value)| Eager::Full { cx, shape, dtype, dev, value }),
        3 => (0..2usize, shape(), dtype(), dev(), len(), scalar())
            .prop_map(|(cx, shape, dtype, dev, len, value)| {
                Eager::FromSlice { cx, shape, dtype, dev, len, value }
            }),
        4 => (idx(), unary, scalar()).prop_map(|(a, op, scalar)| Eager::Unary { a, op, scalar }),
        5 => (idx(), idx(), binary).prop_map(|(a, b, op)| Eager::Binary { a, b, op }),
        2 => (idx(), dev()).prop_map(|(a, dev)| Eager::To { a, dev }),
        2 => (0..2usize, op(), prop::collection::vec(idx(), 0..=3), given, dev(), scalar())
            .prop_map(|(cx, op, ins, given, dev, scalar)| Eager::Call { cx, op, ins, given, dev, scalar }),
        2 => (idx(), dtype()).prop_map(|(a, dtype)| Eager::ToVec { a, dtype }),
        1 => (idx(), dtype()).prop_map(|(a, dtype)| Eager::Item { a, dtype }),
        1 => idx().prop_map(|a| Eager::Wait { a }),
        1 => idx().prop_map(|a| Eager::Release { a }),
        1 => (0..2usize).prop_map(|cx| Eager::Flush { cx }),
        1 => (0..2usize).prop_map(|cx| Eager::Sync { cx }),
        1 => (0..2usize, idx()).prop_map(|(cx, t)| Eager::Wrap { cx, t }),
        1 => idx().prop_map(|a| Eager::Tensor { a }),
        1 => idx().prop_map(|a| Eager::Drop { a }),
    ]
}

fn act() -> impl Strategy<Value = Act> {
    prop_oneof![
        4 => (shape(), dtype(), dev()).prop_map(|(shape, dtype, dev)| Act::Empty { shape, dtype, dev }),
        3 => (shape(), dtype(), dev(), len(), scalar())
            .prop_map(|(shape, dtype, dev, len, value)| Act::FromSlice { shape, dtype, dev, len, value }),
        8 => prop::collection::vec(call(), 1..8).prop_map(Act::Run),
        3 => side().prop_map(Act::Side),
        1 => op().prop_map(Act::Op),
        1 => (dev(), stream_type()).prop_map(|(d, t)| Act::Stream(d, t)),
        8 => eager().prop_map(Act::Eager),
    ]
}

fn knobs() -> impl Strategy<Value = Knobs> {
    let threads = prop::sample::select(vec![
        ThreadTopology::PerStream,
        ThreadTopology::PerDevice,
        ThreadTopology::Single,
    ]);
    (
        threads,
        prop::bool::weighted(0.15),
        prop::sample::select(vec![1usize, 2, 3, 16, 1024]),
        prop::sample::select(vec![8usize, 64, 1 << 16]),
    )
        .prop_map(|(threads, synchronous, batch_size, high_water)| Knobs {
            threads,
            synchronous,
            batch_size,
            high_water,
        })
}

/// Inputs of the builder target.
pub fn builder_input() -> impl Strategy<Value = BuilderInput> {
    (knobs(), prop::sample::select(vec![1usize, 3, 128]), prop::collection::vec(act(), 1..=40))
        .prop_map(|(knobs, flush_every, acts)| BuilderInput { knobs, flush_every, acts })
}
