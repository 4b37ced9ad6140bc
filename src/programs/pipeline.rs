//! `pipeline`: stream chunks of host data through a device, with copies overlapping
//! compute.
//!
//! For each chunk `x_i` (`[rows, cols]`, made on the host from a fixed seed):
//! `x_i` → H2D copy → `relu(x_i W) ` → column sums → D2H copy → host, where the checksum of
//! the chunk (the sum of its column sums) is taken on the host. The calls for every chunk
//! are made without waiting, so the device's H2D stream copies chunk `i + 1` while its
//! compute stream works on chunk `i` and its D2H stream brings back chunk `i - 1`; the VM's
//! cross-stream waits keep each chunk's three steps in order.
//!
//! Run on `cpu:0`, the same program has no copies: that is the CPU-only reference the
//! report compares with, bit for bit where the kernels add in the CPU's order
//! ([`bit_exact_on`]). On CUDA the product `x W` comes from cuBLAS, so
//! each checksum may differ by [`CUDA_REL`] times the chunk's
//! `Σ_r Σ_j Σ_p |x_rp w_pj|` (relu does not enlarge differences, and the sums after it add
//! non-negative values), plus `CUDA_REL · |checksum|` for their rounding.

use std::fmt;

use serde::Serialize;

use super::{agrees, bit_exact_on, Rng, CUDA_REL};
use crate::eager::{Array, Context};
use crate::ep::DeviceId;
use crate::framework::Tensor;
use crate::framework::VirtualMachine;
use crate::vm::Result;

/// Options of [`pipeline()`].
#[derive(Debug, Clone, PartialEq)]
pub struct PipelineOptions {
    /// The device to stream through. Default `mock:0`.
    pub device: DeviceId,
    /// Chunks. Default 32.
    pub chunks: usize,
    /// Rows per chunk. Default 64.
    pub rows: usize,
    /// Columns per chunk (and the size of the square weight). Default 64.
    pub cols: usize,
    /// Seed of the data. Default 3.
    pub seed: u64,
}

impl Default for PipelineOptions {
    fn default() -> Self {
        PipelineOptions { device: DeviceId::mock(0), chunks: 32, rows: 64, cols: 64, seed: 3 }
    }
}

/// What [`pipeline()`] did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PipelineReport {
    /// The device the chunks went through.
    pub device: String,
    /// The checksum of each chunk, computed through the device.
    pub checksums: Vec<f32>,
    /// Whether they equal the same program run on the CPU alone: bit for bit on `cpu` and
    /// `mock`, within the tolerance of the module docs on CUDA.
    pub matches_reference: bool,
}

impl fmt::Display for PipelineReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let total: f64 = self.checksums.iter().map(|&c| c as f64).sum();
        write!(
            f,
            "pipeline through {}: {} chunks, checksum total {total:.4}, {}",
            self.device,
            self.checksums.len(),
            if self.matches_reference {
                "equal to the CPU-only run"
            } else {
                "DIFFERENT from the CPU-only run"
            }
        )
    }
}

/// Stream the chunks through `opts.device`; see the module docs.
pub fn pipeline(vm: &VirtualMachine, opts: &PipelineOptions) -> Result<PipelineReport> {
    pipeline_keeping(vm, opts, &mut Vec::new())
}

/// [`pipeline()`], also pushing onto `keep` handles to the per-chunk checksums computed on the device (the command line
/// checksums them, and a recorded trace expects those checksums on replay).
pub fn pipeline_keeping(
    vm: &VirtualMachine,
    opts: &PipelineOptions,
    keep: &mut Vec<Tensor>,
) -> Result<PipelineReport> {
    let checksums = checksums(vm, opts, opts.device, keep)?;
    let reference = if opts.device.is_host() {
        checksums.clone()
    } else {
        self::checksums(vm, opts, DeviceId::CPU, &mut Vec::new())?
    };
    let exact = bit_exact_on(opts.device);
    let tolerances = if exact { vec![0.0; opts.chunks] } else { tolerances(opts) };
    let same = checksums.len() == reference.len()
        && checksums.iter().zip(&reference).zip(&tolerances).all(|((&a, &b), &t)| agrees(a, b, exact, t));
    Ok(PipelineReport { device: opts.device.to_string(), checksums, matches_reference: same })
}

/// The program's data, drawn from its seed: first the weight, then one chunk after another.
#[derive(Debug, Clone)]
pub struct ChunkSource {
    rng: Rng,
    rows: usize,
    cols: usize,
}

impl ChunkSource {
    /// The `[cols, cols]` weight (draw it first).
    pub fn weight(&mut self) -> Vec<f32> {
        self.rng.vec(self.cols * self.cols, 1.0 / (self.cols.max(1) as f32).sqrt())
    }
    /// The next `[rows, cols]` chunk.
    pub fn chunk(&mut self) -> Vec<f32> {
        self.rng.vec(self.rows * self.cols, 1.0)
    }
}

/// The data [`pipeline()`] streams for `opts`, for host-side references.
pub fn chunk_source(opts: &PipelineOptions) -> ChunkSource {
    ChunkSource { rng: Rng::new(opts.seed), rows: opts.rows, cols: opts.cols }
}

/// Each chunk's tolerance off the CPU order: `CUDA_REL · (Σ_p (Σ_r |x_rp|)(Σ_j |w_pj|) +
/// |checksum|)`, the checksum bounded by the same magnitude.
fn tolerances(opts: &PipelineOptions) -> Vec<f64> {
    let cols = opts.cols;
    let mut data = chunk_source(opts);
    let w = data.weight();
    let w_rows: Vec<f64> =
        (0..cols).map(|p| w[p * cols..(p + 1) * cols].iter().map(|v| v.abs() as f64).sum()).collect();
    (0..opts.chunks)
        .map(|_| {
            let x = data.chunk();
            let mag: f64 = (0..cols)
                .map(|p| {
                    x.iter().skip(p).step_by(cols.max(1)).map(|v| v.abs() as f64).sum::<f64>() * w_rows[p]
                })
                .sum();
            CUDA_REL * 2.0 * mag
        })
        .collect()
}

/// The per-chunk checksums, computing on `device`.
fn checksums(
    vm: &VirtualMachine,
    opts: &PipelineOptions,
    device: DeviceId,
    keep: &mut Vec<Tensor>,
) -> Result<Vec<f32>> {
    let cx = Context::new(vm);
    let (rows, cols) = (opts.rows, opts.cols);
    let mut data = chunk_source(opts);
    let w = cx.from_slice(&data.weight(), &[cols, cols], device)?;
    let mut sums: Vec<Array> = Vec::with_capacity(opts.chunks);
    for _ in 0..opts.chunks {
        let host = cx.from_slice(&data.chunk(), &[rows, cols], DeviceId::CPU)?;
        let x = host.to(device)?; // H2D
        let col_sums = x.matmul(&w)?.relu()?.sum_rows()?; // compute
        let back = col_sums.to(DeviceId::CPU)?; // D2H
        sums.push(back.sum()?); // host
    }
    for s in &sums {
        keep.push(s.tensor()?.clone());
    }
    sums.iter().map(|s| s.item::<f32>()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_tolerances_are_tight_enough_to_catch_errors() {
        let vm = VirtualMachine::new(crate::vm::Config::default()).unwrap();
        let opts = PipelineOptions {
            device: DeviceId::CPU,
            chunks: 4,
            rows: 16,
            cols: 8,
            ..PipelineOptions::default()
        };
        let sums = checksums(&vm, &opts, DeviceId::CPU, &mut Vec::new()).unwrap();
        let tols = tolerances(&opts);
        assert_eq!(tols.len(), sums.len());
        for (s, t) in sums.iter().zip(&tols) {
            // Positive, and a 0.1% error in a checksum is outside it.
            assert!(*t > 0.0 && *t < 1e-3 * s.abs() as f64, "checksum {s}, tolerance {t}");
        }
        assert!(!agrees(sums[0] * 1.001, sums[0], false, tols[0]));
        assert!(agrees(sums[0], sums[0], false, tols[0]));
    }
}
