//! `sum` and `sum_rows` on CUDA: any layout, every dtype, in an order fixed by the input's
//! size alone, so that a sum is the same on every run and every GPU.
//!
//! # The order of `sum`
//!
//! The `n` elements, in row-major order of their index, are cut into chunks of `chunk`
//! elements: `chunk` is `n / 1024` rounded up to a multiple of 256, and at least 4096, so
//! there are at most 1024 chunks. Block `b` sums chunk `b`: thread `t` adds elements
//! `t, t + 256, t + 512, ...` of the chunk in increasing order, then the 256 partial sums
//! are added as a tree (`p[t] += p[t + 128]`, then `+ 64`, ... `+ 1`). With more than one
//! chunk, the chunk sums are added the same way by one block (thread `t` adds chunk sums
//! `t, t + 256, ...`, then the tree). Sums of up to 4096 elements take one launch.
//!
//! Floats accumulate in `f32` (`f16`, `bf16`, `f32`) or `f64`, and the total is rounded once
//! to the output's dtype; `bool` and the integers accumulate modulo 2^64, which is the
//! wrapping `i64` sum in any order, so those sums equal the CPU's exactly.
//!
//! `sum` with a parameter list (along dims) is a reduction of `reduce_dims`, in its order.
//!
//! `sum_rows` gives each column one thread, which adds the rows in increasing index from
//! zero: the CPU kernel's order, so its float results are the CPU's bit for bit.

use cudarc::driver::{LaunchConfig, PushKernelArg};

use super::infer;
use super::launch::{device_operand, launch_config, temp};
use super::layout::Layout;
use super::ops::sum_dtype;
use super::source::THREADS;
use super::{function, on_stream};
use crate::vm::{Attrs, DType, KernelCtx, OpKernel, OutSpecs, TensorMeta};

/// Chunks of `sum` hold at least this many elements.
const CHUNK_MIN: u64 = 4096;
/// `sum` adds at most this many chunk sums.
const MAX_CHUNKS: u64 = 1024;

/// `(chunk, chunks)` of a sum of `n` elements (see the module docs).
pub fn sum_plan(n: u64) -> (u64, u64) {
    let per = n.div_ceil(MAX_CHUNKS).div_ceil(u64::from(THREADS)) * u64::from(THREADS);
    let chunk = per.max(CHUNK_MIN);
    (chunk, n.div_ceil(chunk).max(1))
}

/// Bytes of one chunk sum of `sum` over `d` (its accumulator).
fn accumulator_size(d: DType) -> usize {
    match d {
        DType::F16 | DType::BF16 | DType::F32 => 4,
        _ => 8,
    }
}

/// `sum` on CUDA: the whole tensor to a 0-d tensor (see the module docs).
#[derive(Debug, Clone, Copy, Default)]
pub struct CudaSum;

impl OpKernel for CudaSum {
    fn name(&self) -> &'static str {
        "sum"
    }

    fn dtypes(&self) -> &'static [DType] {
        &DType::ALL
    }

    fn infer(
        &self,
        inputs: &[&TensorMeta],
        _: &[&TensorMeta],
        attrs: &Attrs,
        out: &mut OutSpecs,
    ) -> Result<(), String> {
        if !attrs.params().is_empty() {
            // Along dims: the CPU kernel's rules (`kernels::reduce_dims`).
            return crate::kernels::SumKernel.infer(inputs, &[], attrs, out);
        }
        infer::sum(inputs, out)
    }

    fn strided(&self) -> bool {
        true
    }

    fn compute(&self, ctx: &mut KernelCtx<'_, '_>) -> Result<(), String> {
        if !ctx.attrs.params().is_empty() {
            return super::reduce_dims::reduce(super::reduce_dims::Red::Sum, ctx);
        }
        let x = ctx.inputs.first().ok_or("missing input 0")?;
        let out = ctx.outputs.first().ok_or("missing output 0")?;
        let d = x.meta.dtype;
        if out.meta.dtype != sum_dtype(d) || out.meta.numel() != 1 {
            return Err(format!(
                "output 0 is {} but the sum of {} is {}[]",
                out.meta.describe(),
                x.meta.describe(),
                sum_dtype(d)
            ));
        }
        on_stream("sum", |s| {
            let (xd, od) = (
                device_operand(s, "input 0", x.meta, x.data)?,
                device_operand(s, "output 0", out.meta, out.data)?,
            );
            let layout = Layout::plan(&x.meta.shape, &[&x.meta.strides])?;
            let (chunk, chunks) = sum_plan(layout.n);
            let block = |grid: u64| LaunchConfig {
                grid_dim: (grid as u32, 1, 1),
                block_dim: (THREADS, 1, 1),
                shared_mem_bytes: 0,
            };
            let (sum, x_addr) = (function(s, &format!("sum_{d}"))?, xd.addr());
            let parts = if chunks > 1 { Some(temp(s, chunks as usize * accumulator_size(d))?) } else { None };
            let (dst, finish) = match &parts {
                Some(p) => (p.addr(), 0i32),
                None => (od.addr(), 1i32),
            };
            let mut l = s.cuda_stream().launch_builder(&sum);
            l.arg(&dst).arg(&x_addr).arg(&layout).arg(&chunk).arg(&finish);
            // SAFETY: `sum_<d>` takes (void*, const T*, Layout, u64, int), matching these
            // arguments. The input's layout was checked against its storage, so every
            // offset of `layout` is inside it; with `finish` the one block writes one
            // element of the output's dtype (checked above), otherwise block `b` writes
            // accumulator `b` of `parts`, which holds `chunks` of them. The blocks live
            // until the instruction retires (operands) or this stream is past the work
            // (the temporary: `launch`'s module docs).
            unsafe { l.launch(block(chunks)) }.map_err(|e| format!("launching sum_{d}: {e}"))?;
            if let Some(p) = &parts {
                let out_d = sum_dtype(d);
                let fin = function(s, &format!("sum_final_{out_d}"))?;
                let (p_addr, o_addr) = (p.addr(), od.addr());
                let mut l = s.cuda_stream().launch_builder(&fin);
                l.arg(&o_addr).arg(&p_addr).arg(&chunks);
                // SAFETY: `sum_final_<out>` takes (out*, const acc*, u64): `parts` holds
                // `chunks` accumulators of the type `sum_<d>` wrote (`source::accumulator`),
                // and the output one element of `out_d`; live as above.
                unsafe { l.launch(block(1)) }.map_err(|e| format!("launching sum_final_{out_d}: {e}"))?;
            }
            Ok(())
        })
    }
}

/// `sum_rows` on CUDA: column sums of `x: [n, k]`, any strides.
#[derive(Debug, Clone, Copy, Default)]
pub struct CudaSumRows;

impl OpKernel for CudaSumRows {
    fn name(&self) -> &'static str {
        "sum_rows"
    }

    fn dtypes(&self) -> &'static [DType] {
        &DType::ALL
    }

    fn infer(
        &self,
        inputs: &[&TensorMeta],
        _: &[&TensorMeta],
        _: &Attrs,
        out: &mut OutSpecs,
    ) -> Result<(), String> {
        infer::sum_rows(inputs, out)
    }

    fn strided(&self) -> bool {
        true
    }

    fn compute(&self, ctx: &mut KernelCtx<'_, '_>) -> Result<(), String> {
        let x = ctx.inputs.first().ok_or("missing input 0")?;
        let out = ctx.outputs.first().ok_or("missing output 0")?;
        let d = x.meta.dtype;
        let (&[rows, k], &[rs, cs]) = (x.meta.shape.as_slice(), x.meta.strides.as_slice()) else {
            return Err(format!("input 0 is {}: expected a 2-D input [n, k]", x.meta.describe()));
        };
        if out.meta.shape.as_slice() != [k] || out.meta.dtype != sum_dtype(d) {
            return Err(format!(
                "output 0 is {} but sum_rows of {} is {}[{k}]",
                out.meta.describe(),
                x.meta.describe(),
                sum_dtype(d)
            ));
        }
        on_stream("sum_rows", |s| {
            let (xd, od) = (
                device_operand(s, "input 0", x.meta, x.data)?,
                device_operand(s, "output 0", out.meta, out.data)?,
            );
            if k == 0 {
                return Ok(());
            }
            let f = function(s, &format!("sum_rows_{d}"))?;
            let (po, px) = (od.addr(), xd.addr());
            let (rows, k64, rs, cs, os) =
                (rows as u64, k as u64, rs as i64, cs as i64, out.meta.strides[0] as i64);
            let mut l = s.cuda_stream().launch_builder(&f);
            l.arg(&po).arg(&px).arg(&rows).arg(&k64).arg(&rs).arg(&cs).arg(&os);
            // SAFETY: `sum_rows_<d>` takes (out*, const T*, u64, u64, i64, i64, i64),
            // matching these arguments. Both layouts were checked against their storages,
            // so `x[i·rs + j·cs]` for `i < rows`, `j < k` and `out[j·os]` for `j < k` are
            // inside them; they live until the instruction retires. With no rows the
            // kernel writes zeros and reads nothing.
            unsafe { l.launch(launch_config(k)) }
                .map(|_| ())
                .map_err(|e| format!("launching sum_rows_{d}: {e}"))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sum_chunks_depend_on_the_size_alone() {
        assert_eq!(sum_plan(0), (4096, 1));
        assert_eq!(sum_plan(4096), (4096, 1));
        assert_eq!(sum_plan(4097), (4096, 2));
        assert_eq!(sum_plan(10_003), (4096, 3));
        // Above 2^22 elements the chunks grow (multiples of 256) and stay at most 1024.
        let (chunk, chunks) = sum_plan(100_000_000);
        assert_eq!((chunk, chunks), (97_792, 1023));
        assert!(chunk * chunks >= 100_000_000 && chunk * (chunks - 1) < 100_000_000);
        for n in [1u64, 255, 4 << 20, (4 << 20) + 1, 1 << 40] {
            let (chunk, chunks) = sum_plan(n);
            assert!(chunks <= 1024 && chunk * chunks >= n, "{n}");
        }
    }
}
