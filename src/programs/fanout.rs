//! `fanout`: a wide fan-out/fan-in graph.
//!
//! One array `x` is read by `width` independent branches, branch `i` computing
//! `sum(relu(x * s_i))` with `s_i = (i - width/2) / width` (so half of the branches see
//! mostly negative values); the branch results are then reduced by a balanced tree of
//! `add`s. Every branch only reads `x`, so the scheduler may run all of them as soon as `x`
//! is written, with no edges between them; the tree joins them again.
//!
//! The report compares with the same arithmetic on the host: bit for bit where the kernels
//! add in the CPU's order ([`bit_exact_on`]); on CUDA, whose `sum`
//! adds in another order, each branch within [`CUDA_REL`] times the sum of
//! its terms' absolute values, and the total within the sum of those plus `1e-6 · |total|`.

use std::fmt;

use serde::Serialize;

use super::{agrees, bit_exact_on, Rng, CUDA_REL};
use crate::eager::{Array, Context};
use crate::ep::DeviceId;
use crate::framework::Tensor;
use crate::framework::VirtualMachine;
use crate::vm::Result;

/// Options of [`fanout()`].
#[derive(Debug, Clone, PartialEq)]
pub struct FanoutOptions {
    /// Where to compute. Default `cpu:0`.
    pub device: DeviceId,
    /// Branches reading the shared array. Default 64.
    pub width: usize,
    /// Elements of the shared array. Default 4096.
    pub len: usize,
    /// Seed of the data. Default 5.
    pub seed: u64,
}

impl Default for FanoutOptions {
    fn default() -> Self {
        FanoutOptions { device: DeviceId::CPU, width: 64, len: 4096, seed: 5 }
    }
}

/// What [`fanout()`] did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FanoutReport {
    /// The device it computed on.
    pub device: String,
    /// Each branch's result.
    pub branches: Vec<f32>,
    /// The tree reduction of the branches.
    pub total: f32,
    /// Whether the branches and the total equal a plain host computation in the same order:
    /// bit for bit on `cpu` and `mock`, within the tolerance of the module docs on CUDA.
    pub matches_reference: bool,
}

impl fmt::Display for FanoutReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "fanout on {}: {} branches, total {:.4}, {}",
            self.device,
            self.branches.len(),
            self.total,
            if self.matches_reference {
                "equal to the host reference"
            } else {
                "DIFFERENT from the host reference"
            }
        )
    }
}

fn factor(i: usize, width: usize) -> f64 {
    (i as f64 - (width / 2) as f64) / width.max(1) as f64
}

/// Reduce by a balanced tree: pairs `(0, 1), (2, 3), ...`, an odd last one carried up.
fn tree<T: Clone>(mut level: Vec<T>, mut add: impl FnMut(&T, &T) -> Result<T>) -> Result<Option<T>> {
    while level.len() > 1 {
        let mut next = Vec::with_capacity(level.len().div_ceil(2));
        for pair in level.chunks(2) {
            next.push(match pair {
                [a, b] => add(a, b)?,
                [a] => a.clone(),
                _ => unreachable!("chunks(2)"),
            });
        }
        level = next;
    }
    Ok(level.pop())
}

/// Run the fan-out/fan-in graph; see the module docs.
pub fn fanout(vm: &VirtualMachine, opts: &FanoutOptions) -> Result<FanoutReport> {
    fanout_keeping(vm, opts, &mut Vec::new())
}

/// [`fanout()`], also pushing onto `keep` handles to the branch sums and the total (the command line
/// checksums them, and a recorded trace expects those checksums on replay).
pub fn fanout_keeping(
    vm: &VirtualMachine,
    opts: &FanoutOptions,
    keep: &mut Vec<Tensor>,
) -> Result<FanoutReport> {
    let cx = Context::new(vm);
    let xv = Rng::new(opts.seed).vec(opts.len, 1.0);
    let x = cx.from_slice(&xv, &[opts.len], opts.device)?;
    let branches: Vec<Array> =
        (0..opts.width).map(|i| x.scale(factor(i, opts.width))?.relu()?.sum()).collect::<Result<_>>()?;
    let total_array = tree(branches.clone(), |a, b| a.add(b))?;
    for a in branches.iter().chain(&total_array) {
        keep.push(a.tensor()?.clone());
    }
    let total = match &total_array {
        Some(t) => t.item::<f32>()?,
        None => 0.0,
    };
    let branches = branches.iter().map(|b| b.item::<f32>()).collect::<Result<Vec<_>>>()?;

    // The same arithmetic on the host, in the kernels' order.
    let reference: Vec<f32> = (0..opts.width)
        .map(|i| {
            let s = factor(i, opts.width) as f32;
            let relu: Vec<f32> = xv.iter().map(|&v| v * s).map(|y| if y < 0.0 { 0.0 } else { y }).collect();
            crate::kernels::sum_f32(&relu)
        })
        .collect();
    let ref_total = tree(reference.clone(), |a, b| Ok(a + b))?.unwrap_or(0.0);
    let exact = bit_exact_on(opts.device);
    // Off the CPU order: the terms' absolute values are the terms (relu's outputs).
    let tols: Vec<f64> = (0..opts.width)
        .map(|i| {
            if exact {
                return 0.0;
            }
            let s = factor(i, opts.width) as f32;
            CUDA_REL * xv.iter().map(|&v| (v * s).max(0.0) as f64).sum::<f64>()
        })
        .collect();
    let total_tol = tols.iter().sum::<f64>() + 1e-6 * (ref_total as f64).abs();
    let same = branches.len() == reference.len()
        && reference.iter().zip(&branches).zip(&tols).all(|((&r, &b), &t)| agrees(b, r, exact, t))
        && agrees(total, ref_total, exact, total_tol);
    Ok(FanoutReport { device: opts.device.to_string(), branches, total, matches_reference: same })
}
