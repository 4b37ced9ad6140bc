//! The statements of a trace and how each one is written as a line.
//!
//! `docs/trace-format.md` has the grammar; this module is its data model. Every
//! statement carries the [`Pos`] of its first token, and every reference to a stream,
//! tensor or event carries its own column, so that a problem found later (by the
//! validator or during replay) can name exactly where it is.

use std::fmt::{self, Write as _};
use std::hash::Hasher;

use crate::ep::{DeviceId, DeviceType, StreamType};
use crate::framework::{Attrs, DType, Scalar};

/// The version this build writes (the number after `eagervm-trace`). It reads every version
/// from 1 to this one: version 2 added `after`, which a version-1 trace may not use; version
/// 3 added `view` declarations, the dtypes other than `f32` and `i64`, and the `int=`,
/// `bool=` and `dtype=` attributes, which a trace of an earlier version may not use; version
/// 4 added the parameter lists `ints=` and `scalars=`; version 5 added the `strides=` of a
/// `tensor` whose layout is not row-major (a pointwise op's output laid out like its inputs).
pub const VERSION: u32 = 5;

/// The first version with `strides=` on a `tensor` declaration.
pub(crate) const STRIDES_VERSION: u32 = 5;

/// The first version with the `ints=` and `scalars=` attributes (a call's parameter list).
pub(crate) const PARAMS_VERSION: u32 = 4;

/// The first version with the `after` statement.
pub(crate) const AFTER_VERSION: u32 = 2;

/// The first version with `view` declarations, every dtype, and the `int=`, `bool=` and
/// `dtype=` attributes.
pub(crate) const VIEW_VERSION: u32 = 3;

/// Whether a trace of `version` may name `dtype` (before version 3: `f32` and `i64` only).
pub(crate) fn dtype_in_version(dtype: DType, version: u32) -> bool {
    version >= VIEW_VERSION || matches!(dtype, DType::F32 | DType::I64)
}

/// The first word of every trace.
pub const MAGIC: &str = "eagervm-trace";

/// Access writes with at most this many elements are written inline; longer ones go to
/// the sidecar binary file.
pub const INLINE_LIMIT: usize = 64;

/// FNV-1a (64-bit) of `bytes`: the checksum of tensor data in traces.
pub fn checksum(bytes: &[u8]) -> u64 {
    let mut h = fnv::FnvHasher::default();
    h.write(bytes);
    h.finish()
}

/// A place in a trace file, 1-based.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Pos {
    /// Line number.
    pub line: u32,
    /// Column (in characters) of the token meant.
    pub col: u32,
}

/// A device as a trace names it. Traces may name device types this build cannot run
/// (`cuda`); replay maps them onto available ones or refuses with a typed error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TraceDevice {
    /// The device type.
    pub kind: DeviceKind,
    /// Index among devices of that type.
    pub index: u16,
}

/// Device types a trace may name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DeviceKind {
    /// The host.
    Cpu,
    /// The mock asynchronous device.
    Mock,
    /// A CUDA GPU.
    Cuda,
}

impl DeviceKind {
    /// The name in device strings.
    pub fn name(self) -> &'static str {
        match self {
            DeviceKind::Cpu => "cpu",
            DeviceKind::Mock => "mock",
            DeviceKind::Cuda => "cuda",
        }
    }

    /// Parse `cpu`, `mock` or `cuda`.
    pub fn parse(s: &str) -> Option<DeviceKind> {
        match s {
            "cpu" => Some(DeviceKind::Cpu),
            "mock" => Some(DeviceKind::Mock),
            "cuda" => Some(DeviceKind::Cuda),
            _ => None,
        }
    }
}

impl TraceDevice {
    /// The device as the VM names it (the same type and index).
    pub fn device_id(self) -> DeviceId {
        let ty = match self.kind {
            DeviceKind::Cpu => DeviceType::Cpu,
            DeviceKind::Mock => DeviceType::Mock,
            DeviceKind::Cuda => DeviceType::Cuda,
        };
        DeviceId { ty, index: self.index }
    }

    /// The trace's name of a VM device.
    pub fn of(d: DeviceId) -> Self {
        let kind = match d.ty {
            DeviceType::Cpu => DeviceKind::Cpu,
            DeviceType::Mock => DeviceKind::Mock,
            DeviceType::Cuda => DeviceKind::Cuda,
        };
        TraceDevice { kind, index: d.index }
    }

    /// Whether this is the host.
    pub fn is_host(self) -> bool {
        self.kind == DeviceKind::Cpu
    }

    /// Whether streams of this device run asynchronously and can wait for each other's
    /// events on the device (as the mock device and CUDA do).
    pub fn is_async(self) -> bool {
        !self.is_host()
    }
}

impl fmt::Display for TraceDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.kind.name(), self.index)
    }
}

/// A reference to a declared stream, tensor or event, with the column it appears at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ref {
    /// The number after the `s`, `t` or `e`.
    pub id: u32,
    /// Column of the reference.
    pub col: u32,
}

impl Ref {
    /// A reference with no position (for traces built in memory).
    pub fn new(id: u32) -> Self {
        Ref { id, col: 0 }
    }
}

/// The bytes an access writes.
#[derive(Debug, Clone, PartialEq)]
pub enum Data {
    /// Values written on the line itself, in the tensor's dtype.
    Inline(DType, Vec<u8>),
    /// A slice of the sidecar binary file (path relative to the trace's folder).
    File {
        /// The sidecar's path.
        path: String,
        /// Byte offset of the slice.
        offset: u64,
        /// Length of the slice in bytes.
        bytes: u64,
        /// FNV-1a of the slice, checked when it is read.
        checksum: u64,
    },
}

/// What a host `Access` does.
#[derive(Debug, Clone, PartialEq)]
pub enum AccessKind {
    /// Read the tensor's bytes back to the host.
    Read,
    /// Wait for the tensor and report its error state.
    Wait,
    /// Overwrite the tensor.
    Write(Data),
}

/// The kind of a run-time failure an `expect error` statement names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// A kernel returned an error.
    Kernel,
    /// A kernel panicked.
    Panic,
}

impl FailureKind {
    /// `kernel` or `panic`.
    pub fn name(self) -> &'static str {
        match self {
            FailureKind::Kernel => "kernel",
            FailureKind::Panic => "panic",
        }
    }
}

/// One statement: a declaration, an instruction or an expectation.
#[derive(Debug, Clone, PartialEq)]
pub enum Stmt {
    /// `device cpu:0`.
    Device(TraceDevice),
    /// `stream s1 mock:0 compute`.
    Stream {
        /// The stream's number.
        id: Ref,
        /// Its device.
        device: TraceDevice,
        /// Its type.
        ty: StreamType,
    },
    /// `comm pair mock mock:0,mock:1`: a communicator the calls of `op@pair` use, with its
    /// backend and its members in rank order.
    Comm {
        /// Its name.
        name: String,
        /// Its backend (`mock`, `mpi`, `nccl`).
        backend: String,
        /// Its local members' devices, in member order.
        members: Vec<TraceDevice>,
    },
    /// `tensor t3 f32[2,2] mock:0`, or `tensor t3 f32[2,2] mock:0 strides=1,2` for a
    /// tensor that owns its storage in another order than row-major.
    Tensor {
        /// The tensor's number.
        id: Ref,
        /// Element type.
        dtype: DType,
        /// Dimension sizes.
        shape: Vec<usize>,
        /// Where it lives.
        device: TraceDevice,
        /// Its strides, where they are not row-major: a dense layout, a permutation of the
        /// dimensions' row-major strides (`VirtualMachine::empty_strided`).
        strides: Option<Vec<isize>>,
    },
    /// `view t7 t3 f32[3,2] strides=1,3 offset=0`: tensor `t7` is a view of the storage
    /// of `t3` (a tensor declared before, not itself a view), of `t3`'s dtype and device,
    /// naming the elements `offset + i0 * strides[0] + ...` of that storage. Version 3.
    View {
        /// The view's number.
        id: Ref,
        /// The tensor that owns the storage.
        base: Ref,
        /// Element type (the owner's).
        dtype: DType,
        /// Dimension sizes.
        shape: Vec<usize>,
        /// Elements of the storage between neighbours along each dimension, one per
        /// dimension.
        strides: Vec<isize>,
        /// The storage element of index `[0, 0, ...]`.
        offset: usize,
        /// Column of the view's type (its layout follows it).
        type_col: u32,
    },
    /// `call s1 add in=t1,t2 out=t3 scalar=0.5`, `call s1 matmul in=t1,t2 out=t3
    /// transpose_a=true`: an `OpCall`.
    Call {
        /// The stream.
        stream: Ref,
        /// The op's name.
        op: String,
        /// Column of the op's name.
        op_col: u32,
        /// Tensors read.
        inputs: Vec<Ref>,
        /// Tensors written.
        outputs: Vec<Ref>,
        /// Its attributes (the scalar as `scalar=`, `int=` or `bool=`, `dtype=`,
        /// `transpose_a=`, `transpose_b=`; a missing one is its default).
        attrs: Attrs,
    },
    /// `record s2 e4 t3,t5`: a `RecordEvent` on the stream, reading the tensors.
    Record {
        /// The stream it is recorded on.
        stream: Ref,
        /// The event.
        event: Ref,
        /// Tensors the event covers.
        tensors: Vec<Ref>,
    },
    /// `wait s1 e4`: a `StreamWaitEvent`.
    Wait {
        /// The stream that waits.
        stream: Ref,
        /// The event waited for.
        event: Ref,
    },
    /// `after s1 s2 t3 t4`: the next uses of the tensors on the first stream are ordered
    /// after their last uses on the second by the VM's scheduler (its dependence rules), not
    /// by a `record`/`wait` of the trace. Not an instruction: a recorder writes it where the
    /// program's builders did not synchronise a cross-stream use in the order the scheduler
    /// admitted it (builders open at once), and a replay does nothing for it.
    After {
        /// The stream whose uses are ordered.
        stream: Ref,
        /// The stream of the tensors' last uses.
        source: Ref,
        /// The tensors.
        tensors: Vec<Ref>,
    },
    /// `barrier s0`: the `Barrier` of `vm.sync()`.
    Barrier {
        /// The barrier's stream.
        stream: Ref,
    },
    /// `release s1 t3`.
    Release {
        /// The stream (the tensor's last).
        stream: Ref,
        /// The tensor.
        tensor: Ref,
    },
    /// `access s0 read t3`, `access s0 wait t3`, `access s0 write t3 f32 1 2 3`.
    Access {
        /// The host stream.
        stream: Ref,
        /// The tensor.
        tensor: Ref,
        /// What the access does.
        kind: AccessKind,
    },
    /// `expect t5 fnv1a64=0x...`: the tensor's bytes after the last instruction.
    Expect {
        /// The tensor.
        tensor: Ref,
        /// FNV-1a of its bytes.
        checksum: u64,
    },
    /// `expect error kernel op=fail message="..."`: the run fails this way, on purpose.
    ExpectError {
        /// Kernel error or panic.
        kind: FailureKind,
        /// The op that fails.
        op: String,
        /// The kernel's message.
        message: String,
    },
}

/// A statement and where it starts.
#[derive(Debug, Clone, PartialEq)]
pub struct Line {
    /// Position of its first token.
    pub pos: Pos,
    /// The statement.
    pub stmt: Stmt,
}

impl Stmt {
    /// Whether this statement is an instruction (as opposed to a declaration or an
    /// expectation).
    pub fn is_instruction(&self) -> bool {
        matches!(
            self,
            Stmt::Call { .. }
                | Stmt::Record { .. }
                | Stmt::Wait { .. }
                | Stmt::Barrier { .. }
                | Stmt::Release { .. }
                | Stmt::Access { .. }
        )
    }

    /// The stream an instruction runs on (`None` for the statements that are not
    /// instructions, `after` included).
    pub fn stream(&self) -> Option<Ref> {
        match self {
            Stmt::Call { stream, .. }
            | Stmt::Record { stream, .. }
            | Stmt::Wait { stream, .. }
            | Stmt::Barrier { stream }
            | Stmt::Release { stream, .. }
            | Stmt::Access { stream, .. } => Some(*stream),
            _ => None,
        }
    }
}

fn list(out: &mut String, key: &str, refs: &[Ref], prefix: char) {
    if refs.is_empty() {
        return;
    }
    let _ = write!(out, " {key}=");
    for (i, r) in refs.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = write!(out, "{prefix}{}", r.id);
    }
}

/// Write `s` quoted, escaping `"`, `\` and control characters.
pub(crate) fn quote(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Write inline values of `dtype` from native-endian `bytes`: decimal numbers that parse
/// back to the same bits (floats in the shortest form that does, integers as they are,
/// booleans as 0 and 1); a NaN as its raw bits (`0x7fc00000` for an `f32`, as many hex
/// digits as the element has), so that its payload survives.
pub(crate) fn write_values(out: &mut String, dtype: DType, bytes: &[u8]) {
    let size = dtype.size();
    for (i, c) in bytes.chunks_exact(size).enumerate() {
        match crate::vm::read_element(dtype, bytes, i) {
            Some(Scalar::Float(v)) if v.is_nan() => {
                let mut bits = 0u64;
                for (k, b) in c.iter().enumerate() {
                    let shift = if cfg!(target_endian = "little") { 8 * k } else { 8 * (size - 1 - k) };
                    bits |= u64::from(*b) << shift;
                }
                let _ = write!(out, " 0x{bits:0width$x}", width = 2 * size);
            }
            Some(Scalar::Float(v)) => match dtype {
                // The shortest form of the element's own type: an f32 (or narrower, which
                // widens to f32 exactly) reads back from it to the same bits.
                DType::F64 => {
                    let _ = write!(out, " {v}");
                }
                _ => {
                    let _ = write!(out, " {}", v as f32);
                }
            },
            Some(Scalar::Int(v)) => {
                let _ = write!(out, " {v}");
            }
            Some(Scalar::Bool(b)) => {
                let _ = write!(out, " {}", u8::from(b));
            }
            None => {}
        }
    }
}

impl fmt::Display for Stmt {
    /// The statement as one line of a trace (without the newline).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = String::new();
        write_stmt(&mut s, self);
        f.write_str(&s)
    }
}

/// Append the statement's line (without the newline) to `out`.
pub fn write_stmt(out: &mut String, stmt: &Stmt) {
    let _ = match stmt {
        Stmt::Device(d) => write!(out, "device {d}"),
        Stmt::Stream { id, device, ty } => write!(out, "stream s{} {device} {}", id.id, ty.name()),
        Stmt::Comm { name, backend, members } => {
            let list: Vec<String> = members.iter().map(|d| d.to_string()).collect();
            write!(out, "comm {name} {backend} {}", list.join(","))
        }
        Stmt::Tensor { id, dtype, shape, device, strides } => {
            let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
            let _ = write!(out, "tensor t{} {dtype}[{}] {device}", id.id, dims.join(","));
            if let Some(strides) = strides {
                write_strides(out, strides);
            }
            Ok(())
        }
        Stmt::View { id, base, dtype, shape, strides, offset, .. } => {
            write_view(out, id.id, base.id, *dtype, shape, strides, *offset);
            Ok(())
        }
        Stmt::Call { stream, op, inputs, outputs, attrs, .. } => {
            let _ = write!(out, "call s{} {op}", stream.id);
            list(out, "in", inputs, 't');
            list(out, "out", outputs, 't');
            write_attrs(out, attrs);
            Ok(())
        }
        Stmt::Record { stream, event, tensors } => {
            let _ = write!(out, "record s{} e{}", stream.id, event.id);
            for t in tensors {
                let _ = write!(out, " t{}", t.id);
            }
            Ok(())
        }
        Stmt::Wait { stream, event } => write!(out, "wait s{} e{}", stream.id, event.id),
        Stmt::After { stream, source, tensors } => {
            let _ = write!(out, "after s{} s{}", stream.id, source.id);
            for t in tensors {
                let _ = write!(out, " t{}", t.id);
            }
            Ok(())
        }
        Stmt::Barrier { stream } => write!(out, "barrier s{}", stream.id),
        Stmt::Release { stream, tensor } => write!(out, "release s{} t{}", stream.id, tensor.id),
        Stmt::Access { stream, tensor, kind } => {
            let (s, t) = (stream.id, tensor.id);
            match kind {
                AccessKind::Read => write!(out, "access s{s} read t{t}"),
                AccessKind::Wait => write!(out, "access s{s} wait t{t}"),
                AccessKind::Write(Data::Inline(dtype, bytes)) => {
                    let _ = write!(out, "access s{s} write t{t} {dtype}");
                    write_values(out, *dtype, bytes);
                    Ok(())
                }
                AccessKind::Write(Data::File { path, offset, bytes, checksum }) => {
                    let _ = write!(out, "access s{s} write t{t} file=");
                    quote(out, path);
                    write!(out, " offset={offset} bytes={bytes} fnv1a64=0x{checksum:016x}")
                }
            }
        }
        Stmt::Expect { tensor, checksum } => write!(out, "expect t{} fnv1a64=0x{checksum:016x}", tensor.id),
        Stmt::ExpectError { kind, op, message } => {
            let _ = write!(out, "expect error {} op={op} message=", kind.name());
            quote(out, message);
            Ok(())
        }
    };
}

/// Append `view tN tM TYPE strides=.. offset=..` (the form `write_stmt` and the recorder
/// write).
pub(crate) fn write_view(
    out: &mut String,
    id: u32,
    base: u32,
    dtype: DType,
    shape: &[usize],
    strides: &[isize],
    offset: usize,
) {
    let _ = write!(out, "view t{id} t{base} {dtype}[");
    for (i, d) in shape.iter().enumerate() {
        let _ = write!(out, "{}{d}", if i == 0 { "" } else { "," });
    }
    out.push(']');
    write_strides(out, strides);
    let _ = write!(out, " offset={offset}");
}

/// ` strides=A,B,..`.
pub(crate) fn write_strides(out: &mut String, strides: &[isize]) {
    out.push_str(" strides=");
    for (i, s) in strides.iter().enumerate() {
        let _ = write!(out, "{}{s}", if i == 0 { "" } else { "," });
    }
}

/// How many tensors of one dtype a trace declares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DTypeCount {
    /// The dtype.
    pub dtype: DType,
    /// `tensor` declarations of it (tensors that own their storage).
    pub tensors: u64,
    /// `view` declarations of it.
    pub views: u64,
}

/// A whole trace: its statements in file order, and the file they came from.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Trace {
    /// The file name used in messages (`<memory>` for traces built in memory).
    pub file: String,
    /// The folder a sidecar path is relative to.
    pub dir: std::path::PathBuf,
    /// The statements.
    pub lines: Vec<Line>,
}

impl Trace {
    /// The trace as text, header first (statements numbered from line 2 on).
    pub fn to_text(&self) -> String {
        let mut out = format!("{MAGIC} {VERSION}\n");
        for l in &self.lines {
            write_stmt(&mut out, &l.stmt);
            out.push('\n');
        }
        out
    }

    /// Number of instruction statements.
    pub fn instructions(&self) -> usize {
        self.lines.iter().filter(|l| l.stmt.is_instruction()).count()
    }

    /// The tensors and views the trace declares, per dtype, in [`DType::ALL`]'s order
    /// (dtypes it declares none of left out).
    pub fn dtypes(&self) -> Vec<DTypeCount> {
        let mut counts: Vec<DTypeCount> =
            DType::ALL.iter().map(|&dtype| DTypeCount { dtype, tensors: 0, views: 0 }).collect();
        let at = |d: DType| DType::ALL.iter().position(|&x| x == d).unwrap_or(0);
        for l in &self.lines {
            match &l.stmt {
                Stmt::Tensor { dtype, .. } => counts[at(*dtype)].tensors += 1,
                Stmt::View { dtype, .. } => counts[at(*dtype)].views += 1,
                _ => {}
            }
        }
        counts.retain(|c| c.tensors + c.views > 0);
        counts
    }
}

/// Parse `f32[2,3]` / `i64[]` into a dtype and a shape.
pub(crate) fn parse_type(s: &str) -> Result<(DType, Vec<usize>), String> {
    let (d, rest) =
        s.split_once('[').ok_or_else(|| format!("expected a type like `f32[2,3]`, found `{s}`"))?;
    let dtype = parse_dtype(d)?;
    let dims = rest.strip_suffix(']').ok_or_else(|| format!("`{s}`: the shape must end with `]`"))?;
    let mut shape = Vec::new();
    if !dims.is_empty() {
        for p in dims.split(',') {
            shape.push(
                p.trim()
                    .parse::<usize>()
                    .map_err(|_| format!("`{s}`: dimension `{p}` is not a non-negative integer"))?,
            );
        }
    }
    Ok((dtype, shape))
}

/// Parse a dtype by its short name (`f32`, `bf16`, `bool`, ...: `DType::name`).
pub(crate) fn parse_dtype(s: &str) -> Result<DType, String> {
    DType::ALL.into_iter().find(|d| d.name() == s).ok_or_else(|| {
        let names: Vec<&str> = DType::ALL.iter().map(|d| d.name()).collect();
        format!("unknown dtype `{s}` (expected one of {})", names.join(", "))
    })
}

/// Parse `compute`, `h2d`, `d2h` or `collective`.
pub(crate) fn parse_stream_type(s: &str) -> Result<StreamType, String> {
    StreamType::ALL
        .into_iter()
        .find(|t| t.name() == s)
        .ok_or_else(|| format!("unknown stream type `{s}` (expected compute, h2d, d2h or collective)"))
}

/// Parse `cpu:0`, `mock:1`, `cuda:0`.
pub(crate) fn parse_device(s: &str) -> Result<TraceDevice, String> {
    let bad = || format!("expected a device like `cpu:0`, `mock:1` or `cuda:0`, found `{s}`");
    let (k, i) = s.split_once(':').ok_or_else(bad)?;
    let kind = DeviceKind::parse(k).ok_or_else(bad)?;
    let index = i.parse().map_err(|_| bad())?;
    Ok(TraceDevice { kind, index })
}

/// Append a call's attributes as the trace writes them: each one that is not its default,
/// as ` name=value` (`scalar=` in Rust's shortest round-trip form, so that reading it back
/// gives the same bits; `-0.0` is written, being other bits than the default).
pub(crate) fn write_attrs(out: &mut String, attrs: &Attrs) {
    let (transpose_a, transpose_b) = (attrs.transpose_a, attrs.transpose_b);
    match attrs.value() {
        Scalar::Float(scalar) => {
            if scalar != 0.0 || scalar.is_sign_negative() {
                let _ = write!(out, " scalar={scalar:?}");
            }
        }
        Scalar::Int(v) => {
            let _ = write!(out, " int={v}");
        }
        Scalar::Bool(b) => {
            let _ = write!(out, " bool={b}");
        }
    }
    if let Some(d) = attrs.dtype() {
        let _ = write!(out, " dtype={d}");
    }
    if transpose_a {
        out.push_str(" transpose_a=true");
    }
    if transpose_b {
        out.push_str(" transpose_b=true");
    }
    let params = attrs.params();
    if !params.is_empty() {
        let _ = write!(out, " {params}");
    }
}
