//! Launching the generated kernels: device operands checked against their storages,
//! device temporaries, inputs staged out of the way of an output, and the one launch of
//! every elementwise kernel.
//!
//! # Temporaries
//!
//! A temporary is a block of the device's caching allocator, taken during the launch on
//! the launching stream and dropped before the launch returns, after the kernels that use
//! it are enqueued. The allocator files a block freed during a launch under that stream
//! (`ep::memory::caching`, "Stream order"), so only later work of the same stream can get
//! it back, and that work runs after the kernels that used it. No synchronisation is needed.

use std::borrow::Cow;
use std::sync::Arc;

use cudarc::driver::{LaunchConfig, PushKernelArg};

use super::layout::{broadcast_strides, Layout, Layout4};
use super::source::THREADS;
use crate::alloc::Storage;
use crate::ep::cuda::CudaEpStream;
use crate::ep::memory::{DeviceBuffer, DeviceMemory};
use crate::ep::{EpError, Stream};
use crate::vm::{DType, TensorMeta};

/// The most blocks an elementwise launch uses; the kernels loop over the rest (grid stride).
const MAX_BLOCKS: usize = 4096;

/// The launch shape for `n` elements: one thread each, in at most 4096 blocks of 256.
pub fn launch_config(n: usize) -> LaunchConfig {
    let blocks = n.div_ceil(THREADS as usize).clamp(1, MAX_BLOCKS) as u32;
    LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 }
}

/// The device address of `s`'s fault record (`ep::fault`), which the kernels that check
/// their data take: a `const void*` argument, written on bad data. 0 (no record) for a
/// stream without one.
pub fn fault_record(s: &CudaEpStream) -> u64 {
    s.faults().map_or(0, |r| r.device_addr())
}

/// An operand in this device's memory: its layout, where its storage starts, and the
/// temporary that holds it when it was staged (kept alive until the launch is enqueued).
pub struct Dev<'a> {
    /// Shape, strides, offset (elements, from `base`) and dtype.
    pub meta: Cow<'a, TensorMeta>,
    /// The device address of the storage's first byte.
    pub base: u64,
    _temp: Option<DeviceBuffer>,
}

impl Dev<'_> {
    /// The device address of the operand's element `[0, 0, ...]`.
    pub fn addr(&self) -> u64 {
        self.base + (self.meta.offset * self.meta.dtype.size()) as u64
    }

    /// The bytes the operand may touch, as device addresses `lo..hi`; `None` when empty.
    fn bytes(&self) -> Option<std::ops::Range<u64>> {
        let size = self.meta.dtype.size() as u64;
        self.meta.span().map(|r| self.base + r.start as u64 * size..self.base + r.end as u64 * size)
    }

    /// Whether the operand is contiguous (row-major from its offset).
    pub fn is_contiguous(&self) -> bool {
        self.meta.is_contiguous()
    }
}

/// Operand `what` (`meta` over `data`) as a device operand of the device `s` runs on:
/// an error naming it when its storage is not in that device's memory or its layout
/// reaches outside the storage.
pub fn device_operand<'a>(
    s: &CudaEpStream,
    what: &str,
    meta: &'a TensorMeta,
    data: &Storage,
) -> Result<Dev<'a>, String> {
    let b = data
        .device_buffer()
        .ok_or_else(|| format!("{what} ({}) is not in CUDA device memory", meta.describe()))?;
    if b.device() != s.shared.id {
        return Err(format!(
            "{what} is on {} but the kernel runs on {}: copies between two CUDA devices are not supported",
            b.device(),
            s.shared.id
        ));
    }
    meta.check_layout(b.len() / meta.dtype.size())
        .map_err(|e| format!("{what} ({}): {e}", meta.describe()))?;
    Ok(Dev { meta: Cow::Borrowed(meta), base: b.addr(), _temp: None })
}

/// A device temporary of `bytes` bytes on the device of `s`, for work enqueued on `s`
/// during this launch (see the module docs); an error starting with `out of memory` when
/// the device has no room (docs/errors.md, "Writing kernels").
pub fn temp(s: &CudaEpStream, bytes: usize) -> Result<DeviceBuffer, String> {
    let memory: Arc<dyn DeviceMemory> = s.shared.clone();
    DeviceBuffer::new(&memory, bytes.max(1)).map_err(|e| match e {
        EpError::OutOfMemory { detail, .. } => {
            format!("out of memory: no device temporary of {bytes} bytes ({detail})")
        }
        e => format!("device temporary of {bytes} bytes: {e}"),
    })
}

/// A contiguous device temporary of `shape` and `dtype`.
pub fn contiguous_temp(s: &CudaEpStream, shape: &[usize], dtype: DType) -> Result<Dev<'static>, String> {
    let meta = TensorMeta::new(shape, dtype, s.shared.id);
    let buf = temp(s, meta.bytes())?;
    Ok(Dev { meta: Cow::Owned(meta), base: buf.addr(), _temp: Some(buf) })
}

/// Whether `input` must be read from a copy before a kernel writes `out`: the two share
/// bytes without being the same elements of the same size (an in-place op reads and
/// writes each element in one thread, which is safe; any other overlap is not).
pub fn must_stage(input: &Dev<'_>, out: &Dev<'_>) -> bool {
    let (Some(a), Some(b)) = (input.bytes(), out.bytes()) else { return false };
    if a.end <= b.start || b.end <= a.start {
        return false;
    }
    let (i, o) = (&*input.meta, &*out.meta);
    let same = input.base == out.base
        && i.dtype.size() == o.dtype.size()
        && i.offset == o.offset
        && i.shape == o.shape
        && i.strides == o.strides;
    !same
}

/// A contiguous copy of `d` in a device temporary (row-major order of its index).
pub fn stage(s: &CudaEpStream, op: &'static str, d: &Dev<'_>) -> Result<Dev<'static>, String> {
    let t = contiguous_temp(s, &d.meta.shape, d.meta.dtype)?;
    copy_elements(s, op, &t, d)?;
    Ok(t)
}

/// Copy the elements of `src` into those of `dst` (one dtype; `src` broadcast to `dst`'s
/// shape), element by element, with the `copy_<size>` kernel.
pub fn copy_elements(s: &CudaEpStream, op: &'static str, dst: &Dev<'_>, src: &Dev<'_>) -> Result<(), String> {
    let sym = format!("copy_{}", dst.meta.dtype.size());
    launch_ew(s, op, &sym, dst, &[src], 0)
}

/// Launch elementwise kernel `sym` (of op `op`): the output `out` and `inputs` (each
/// broadcast to the output's shape), with the scalar bits `bits` (see `source`, "Kernels").
pub fn launch_ew(
    s: &CudaEpStream,
    op: &'static str,
    sym: &str,
    out: &Dev<'_>,
    inputs: &[&Dev<'_>],
    bits: u64,
) -> Result<(), String> {
    let shape = &out.meta.shape;
    let n = out.meta.numel();
    let mut strides: Vec<Vec<isize>> = vec![out.meta.strides.to_vec()];
    for (i, d) in inputs.iter().enumerate() {
        strides.push(broadcast_strides(&format!("input {i}"), &d.meta, shape)?);
    }
    if n == 0 {
        return Ok(());
    }
    let lists: Vec<&[isize]> = strides.iter().map(Vec::as_slice).collect();
    let layout = Layout::plan(shape, &lists)?;
    let f = super::function(s, sym)?;
    let (o, a, b) =
        (out.addr(), inputs.first().map_or(0, |d| d.addr()), inputs.get(1).map_or(0, |d| d.addr()));
    s.set_label(op);
    let mut l = s.cuda_stream().launch_builder(&f);
    l.arg(&o).arg(&a).arg(&b).arg(&bits).arg(&layout);
    // SAFETY: every elementwise kernel takes (out*, const a*, const b*, u64, Layout)
    // (`source::PRELUDE`, macro `EW`), matching these arguments, and reads at most `inputs`
    // operands; `Layout` is the C struct (`layout::Layout`). Every operand's layout was
    // checked against its storage (`device_operand`) or is a temporary made for it, and its
    // broadcast strides name only its own elements, so every offset the kernel computes is
    // inside a live block of this device; the blocks stay alive until the instruction
    // retires (storages) or the work on this stream is past them (temporaries, see the
    // module docs). An input that shares bytes with the output is the same elements of the
    // same size (each thread reads its element before writing it) or was staged.
    unsafe { l.launch(launch_config(n)) }.map(|_| ()).map_err(|e| format!("launching {sym}: {e}"))
}

/// Launch kernel `sym` of three inputs (`source`'s `EW3`; of op `op`): the output `out` and
/// up to three `inputs` (each broadcast to the output's shape), with the scalars
/// `[s, t, f]`.
pub fn launch_ew3(
    s: &CudaEpStream,
    op: &'static str,
    sym: &str,
    out: &Dev<'_>,
    inputs: &[&Dev<'_>],
    scalars: [u64; 3],
) -> Result<(), String> {
    let shape = &out.meta.shape;
    let n = out.meta.numel();
    let mut strides: Vec<Vec<isize>> = vec![out.meta.strides.to_vec()];
    for (i, d) in inputs.iter().enumerate() {
        strides.push(broadcast_strides(&format!("input {i}"), &d.meta, shape)?);
    }
    if n == 0 {
        return Ok(());
    }
    let lists: Vec<&[isize]> = strides.iter().map(Vec::as_slice).collect();
    let layout = Layout4::plan(shape, &lists)?;
    let f = super::function(s, sym)?;
    let addr = |i: usize| inputs.get(i).map_or(0, |d| d.addr());
    let (o, a, b, c) = (out.addr(), addr(0), addr(1), addr(2));
    let [x, y, z] = scalars;
    s.set_label(op);
    let mut l = s.cuda_stream().launch_builder(&f);
    l.arg(&o).arg(&a).arg(&b).arg(&c).arg(&x).arg(&y).arg(&z).arg(&layout);
    // SAFETY: every `EW3` kernel takes (out*, const a*, const b*, const c*, u64, u64, u64,
    // Layout4) (`source::PRELUDE`), matching these arguments, and reads at most `inputs`
    // operands; `Layout4` is the C struct (`layout::Layout4`). As in `launch_ew`: every
    // operand's layout was checked against its storage or is a temporary made for it, its
    // broadcast strides name only its own elements, and an input that shares bytes with
    // the output is the same elements of the same size or was staged.
    unsafe { l.launch(launch_config(n)) }.map(|_| ()).map_err(|e| format!("launching {sym}: {e}"))
}
