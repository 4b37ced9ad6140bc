//! `copy` on a CUDA stream: between host and device, within the device, or host to host;
//! any dtype, any layout on either side (a broadcast input too, and an input of a shape that
//! broadcasts to a given output's), in place.
//!
//! | from → to | how |
//! | --- | --- |
//! | device → device | `cuMemcpyDtoDAsync` when both sides are contiguous and apart; otherwise the `copy_<size>` kernel over both layouts, reading an input that overlaps the output from a contiguous temporary first (the same elements: nothing to do) |
//! | host → device | the host side's elements, gathered in index order on the host where not contiguous, go to the device through a pinned staging buffer (or straight from the host block when it is page-locked: a contiguous side of at least `alloc::pin::lock_min_bytes()`); a device side that is not contiguous receives them in a contiguous temporary, then the copy kernel scatters them |
//! | device → host | a device side that is not contiguous is gathered into a contiguous temporary by the copy kernel; the bytes come back through a pinned staging buffer and a host function copies (or scatters, for a host side that is not contiguous) them into place; a contiguous page-locked host side receives them directly |
//! | host → host | on the worker, at launch |
//!
//! Copies between two CUDA devices are refused with an error.

use cudarc::driver::sys;

use super::host::{gather, scatter};
use super::launch::{contiguous_temp, copy_elements, device_operand, must_stage, stage, Dev};
use super::on_stream;
use crate::alloc::Storage;
use crate::ep::cuda::CudaEpStream;
use crate::vm::{Attrs, DType, KernelCtx, OpKernel, OutSpecs, TensorMeta};

/// `copy` on a CUDA stream (see the module docs).
#[derive(Debug, Clone, Copy, Default)]
pub struct CudaCopy;

/// Whether a copy of `bytes` bytes may go straight between the device and `storage`'s host
/// block: large copies page-lock the block the first time (`alloc::pin`; the host allocator
/// undoes it when the block goes back to the system), and then need no staging buffer, no
/// host-side `memcpy` and no host function.
fn locked(s: &CudaEpStream, storage: &Storage, bytes: usize) -> bool {
    use crate::alloc::pin;
    let Some((addr, len)) = storage.host_block() else { return false };
    if bytes < pin::lock_min_bytes() {
        return false;
    }
    pin::lock_once(addr, len, || {
        let flags = sys::CU_MEMHOSTREGISTER_PORTABLE;
        // SAFETY: `[addr, addr + len)` is one live block of the host allocator, locked once
        // (the registry is checked under its lock) and unlocked before it is freed; the
        // context is current (this runs inside a launch on `s`).
        let r = unsafe { sys::cuMemHostRegister_v2(addr as *mut std::ffi::c_void, len, flags) };
        if r != sys::CUresult::CUDA_SUCCESS {
            tracing::debug!(error = ?r, len, "cannot page-lock a host block; copying through staging");
            return None;
        }
        let ctx = s.context().clone();
        Some(Box::new(move || {
            let r = ctx.bind_to_thread().and_then(|()| {
                // SAFETY: the block was registered above and is unregistered once, before
                // the host allocator frees it; no copy uses it any more (it was free).
                unsafe { sys::cuMemHostUnregister(addr as *mut std::ffi::c_void) }.result()
            });
            if let Err(e) = r {
                tracing::error!(error = %e, "cuMemHostUnregister failed");
            }
        }))
    })
}

/// The kernel error for a pinned staging buffer the driver refused. Out of memory is named
/// first (the message starts with `out of memory`; docs/errors.md, "Writing kernels"), so
/// that it reads as what it is whatever the driver's wording.
#[cold]
fn staging_error(bytes: usize, e: cudarc::driver::DriverError) -> String {
    if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
        format!("out of memory: no pinned staging buffer of {bytes} bytes ({e})")
    } else {
        format!("pinned staging buffer of {bytes} bytes: {e}")
    }
}

/// A host address that a host function writes after the stream gets there.
struct HostDst(*mut u8);
// SAFETY: the destination (host storage, or a pinned staging buffer) is written only by this
// copy's host function; the VM keeps it alive and untouched by anything else until the
// copy's instruction retires, which is after the event recorded behind the host function.
unsafe impl Send for HostDst {}

/// A host address that a host function reads after the stream gets there.
struct HostSrc(*const u8);
// SAFETY: the source storage is an input of the copy's instruction: the VM keeps it alive,
// and lets nothing write it, until that instruction retires, which is after the event
// recorded behind the host function that reads it.
unsafe impl Send for HostSrc {}

/// Check a host operand's layout against its storage.
fn host_operand(what: &str, meta: &TensorMeta, data: &Storage) -> Result<(), String> {
    if data.device_buffer().is_some() {
        return Err(format!("{what} is not in host memory"));
    }
    meta.check_layout(data.len() / meta.dtype.size())
        .map_err(|e| format!("{what} ({}): {e}", meta.describe()))
}

impl OpKernel for CudaCopy {
    fn name(&self) -> &'static str {
        "copy"
    }

    fn dtypes(&self) -> &'static [DType] {
        &DType::ALL
    }

    fn cross_device(&self) -> bool {
        true
    }

    fn strided(&self) -> bool {
        true
    }

    fn in_place(&self) -> bool {
        true
    }

    fn infer(
        &self,
        inputs: &[&TensorMeta],
        given: &[&TensorMeta],
        attrs: &Attrs,
        out: &mut OutSpecs,
    ) -> Result<(), String> {
        // The CPU's rule: the output given or the input's shape; an input that broadcasts
        // to a given output is read through broadcast strides (`copy_` of a row into rows).
        crate::kernels::copy::CopyKernel.infer(inputs, given, attrs, out)
    }

    fn compute(&self, ctx: &mut KernelCtx<'_, '_>) -> Result<(), String> {
        let src = ctx.inputs.first().ok_or("missing input 0")?;
        let dst = ctx.outputs.first().ok_or("missing output 0")?;
        let expanded;
        let src_meta = if src.meta.shape == dst.meta.shape {
            src.meta
        } else {
            expanded = broadcast(src.meta, &dst.meta.shape).ok_or_else(|| {
                format!("input 0 is {} but output 0 is {}", src.meta.describe(), dst.meta.describe())
            })?;
            &expanded
        };
        if src_meta.dtype != dst.meta.dtype {
            return Err(format!(
                "input 0 is {} but output 0 is {}",
                src.meta.describe(),
                dst.meta.describe()
            ));
        }
        let src = crate::vm::TensorView { meta: src_meta, data: src.data };
        on_stream("copy", |s| {
            match (src.data.device_buffer().is_some(), dst.data.device_buffer().is_some()) {
                (true, true) => {
                    let from = device_operand(s, "input 0", src.meta, src.data)?;
                    let to = device_operand(s, "output 0", dst.meta, dst.data)?;
                    device_to_device(s, &to, &from)
                }
                (false, true) => {
                    host_operand("input 0", src.meta, src.data)?;
                    let to = device_operand(s, "output 0", dst.meta, dst.data)?;
                    host_to_device(s, &to, src.meta, src.data)
                }
                (true, false) => {
                    let from = device_operand(s, "input 0", src.meta, src.data)?;
                    host_operand("output 0", dst.meta, dst.data)?;
                    device_to_host(s, dst.meta, dst.data, &from)
                }
                (false, false) => {
                    host_operand("input 0", src.meta, src.data)?;
                    host_operand("output 0", dst.meta, dst.data)?;
                    let mut buf = vec![0u8; src.meta.bytes()];
                    // SAFETY: both layouts were checked against their storages; the input is
                    // gathered into `buf` before anything is written, so an output sharing its
                    // storage cannot change what is read; this instruction holds the write
                    // access to the output's storage and makes no reference to its bytes.
                    unsafe {
                        gather(src.meta, src.data.as_ptr(), buf.as_mut_ptr());
                        scatter(dst.meta, buf.as_ptr(), dst.data.as_mut_ptr());
                    }
                    Ok(())
                }
            }
        })
    }
}

/// `meta` read as `shape` with NumPy's broadcasting: stride 0 along each dimension it lacks
/// or has of size 1; `None` where it does not broadcast to `shape`.
fn broadcast(meta: &TensorMeta, shape: &[usize]) -> Option<TensorMeta> {
    let lead = shape.len().checked_sub(meta.shape.len())?;
    let mut out = meta.clone();
    out.shape = shape.iter().copied().collect();
    out.strides = shape.iter().map(|_| 0).collect();
    for (d, (&n, &s)) in meta.shape.iter().zip(&meta.strides).enumerate() {
        match n {
            _ if n == shape[lead + d] => out.strides[lead + d] = s,
            1 => {}
            _ => return None,
        }
    }
    Some(out)
}

/// Device to device on this device.
fn device_to_device(s: &CudaEpStream, to: &Dev<'_>, from: &Dev<'_>) -> Result<(), String> {
    let bytes = to.meta.bytes();
    if bytes == 0 || (to.base == from.base && *to.meta == *from.meta) {
        // Nothing, or each element onto itself.
        return Ok(());
    }
    if must_stage(from, to) {
        let staged = stage(s, "copy", from)?;
        return copy_elements(s, "copy", to, &staged);
    }
    if to.is_contiguous() && from.is_contiguous() {
        // SAFETY: both ranges of `bytes` bytes start at their operand's offset inside blocks
        // of this device (layouts checked), do not overlap (`must_stage` said so), and stay
        // alive until the instruction retires.
        return unsafe { sys::cuMemcpyDtoDAsync_v2(to.addr(), from.addr(), bytes, s.cu_stream()) }
            .result()
            .map_err(|e| format!("cuMemcpyDtoDAsync: {e}"));
    }
    copy_elements(s, "copy", to, from)
}

/// Host (`meta` over `data`) to the device operand `to`.
fn host_to_device(s: &CudaEpStream, to: &Dev<'_>, meta: &TensorMeta, data: &Storage) -> Result<(), String> {
    let bytes = meta.bytes();
    if bytes == 0 {
        return Ok(());
    }
    // The bytes land in the destination itself, or in a contiguous temporary scattered below.
    let temp = if to.is_contiguous() { None } else { Some(contiguous_temp(s, &meta.shape, meta.dtype)?) };
    let land = temp.as_ref().map_or(to.addr(), Dev::addr);
    let base = data.as_ptr();
    let contiguous = meta.is_contiguous();
    if contiguous && locked(s, data, bytes) {
        // SAFETY: the source's `bytes` bytes from its offset lie in its host block (layout
        // checked), which is page-locked, alive and unwritten until this instruction retires,
        // after the event behind this copy; the copy engine reads it in stream order, so a
        // write to it ordered before this copy by a device-side wait has landed by then.
        // `land` holds `bytes` bytes on this device.
        let from = unsafe { base.add(meta.offset * meta.dtype.size()) };
        // SAFETY: as above.
        unsafe { sys::cuMemcpyHtoDAsync_v2(land, from.cast(), bytes, s.cu_stream()) }
            .result()
            .map_err(|e| format!("cuMemcpyHtoDAsync: {e}"))?;
    } else {
        let pinned = s.pinned().clone();
        let staging = pinned.take(bytes).map_err(|e| staging_error(bytes, e))?;
        // The source's bytes are final here unless a copy from this device that writes them
        // is still pending: that copy may be earlier on another stream of this device,
        // ordered before this one only by a device-side wait, and it writes from a host
        // function. Then the source is read by a host function too, in stream order, after
        // that wait.
        let pending = s.host_writes().lock().contains_key(&(base as usize));
        let (from, into, m) = (HostSrc(base), HostDst(staging.ptr), meta.clone());
        let fill = move || {
            let (from, into) = (from, into);
            // SAFETY: `m`'s layout was checked against the source storage at `from.0`, which
            // nothing writes until this instruction retires (see `HostSrc`), and any pending
            // write to it ran earlier in stream order; the staging buffer holds at least
            // `bytes` bytes and is this copy's alone.
            unsafe { gather(&m, from.0, into.0) };
        };
        if pending {
            s.then(Box::new(fill)).map_err(|e| e.to_string())?;
        } else {
            fill();
        }
        // SAFETY: `land` holds `bytes` bytes on this device; the staging buffer stays alive
        // until the event behind this copy is reached, and the stream runs the copy after the
        // staging buffer is filled.
        unsafe { sys::cuMemcpyHtoDAsync_v2(land, staging.ptr.cast(), bytes, s.cu_stream()) }
            .result()
            .map_err(|e| format!("cuMemcpyHtoDAsync: {e}"))?;
        // Reused once an event behind the copy is reached; no host function, which would
        // queue behind other streams' host functions (the copies from the device) on the
        // driver's one thread for them.
        if let Err((staging, _)) = pinned.give_after(staging, s.cu_stream()) {
            s.then(Box::new(move || pinned.give(staging))).map_err(|e| e.to_string())?;
        }
    }
    match &temp {
        Some(t) => copy_elements(s, "copy", to, t),
        None => Ok(()),
    }
}

/// The device operand `from` to host (`meta` over `data`).
fn device_to_host(s: &CudaEpStream, meta: &TensorMeta, data: &Storage, from: &Dev<'_>) -> Result<(), String> {
    let bytes = meta.bytes();
    if bytes == 0 {
        return Ok(());
    }
    // The bytes leave from the source itself, or from a contiguous gather of it.
    let staged = if from.is_contiguous() { None } else { Some(stage(s, "copy", from)?) };
    let leave = staged.as_ref().map_or(from.addr(), Dev::addr);
    let base = data.as_mut_ptr();
    if meta.is_contiguous() && locked(s, data, bytes) {
        // SAFETY: the destination's `bytes` bytes from its offset lie in its host block
        // (layout checked), which is page-locked and which nothing else touches until this
        // instruction retires, after the event behind this copy (this instruction holds the
        // write access; the input is on the device, so no input shares it).
        let to = unsafe { base.add(meta.offset * meta.dtype.size()) };
        // SAFETY: as above; `leave` holds `bytes` bytes on this device.
        return unsafe { sys::cuMemcpyDtoHAsync_v2(to.cast(), leave, bytes, s.cu_stream()) }
            .result()
            .map_err(|e| format!("cuMemcpyDtoHAsync: {e}"));
    }
    let key = base as usize;
    let pinned = s.pinned().clone();
    let staging = pinned.take(bytes).map_err(|e| staging_error(bytes, e))?;
    // SAFETY: `leave` holds `bytes` bytes; the staging buffer is ours until the host
    // function gives it back, after the copy has landed in it.
    unsafe { sys::cuMemcpyDtoHAsync_v2(staging.ptr.cast(), leave, bytes, s.cu_stream()) }
        .result()
        .map_err(|e| format!("cuMemcpyDtoHAsync: {e}"))?;
    let writes = s.host_writes().clone();
    *writes.lock().entry(key).or_insert(0) += 1;
    let done_writing = move |writes: &parking_lot::Mutex<std::collections::HashMap<usize, u32>>| {
        let mut w = writes.lock();
        if let Some(n) = w.get_mut(&key) {
            *n -= 1;
            if *n == 0 {
                w.remove(&key);
            }
        }
    };
    let (writes2, out, m) = (writes.clone(), HostDst(base), meta.clone());
    s.then(Box::new(move || {
        let out = out;
        // SAFETY: the copy into `staging` has finished (stream order); `m`'s layout was
        // checked against the storage at `out.0`, whose elements nothing else touches until
        // this instruction retires (see `HostDst`); the staging buffer holds `bytes` bytes.
        unsafe { scatter(&m, staging.ptr, out.0) };
        pinned.give(staging);
        done_writing(&writes2);
    }))
    .map_err(|e| {
        // No host function will write: nothing is pending.
        done_writing(&writes);
        e.to_string()
    })
}
