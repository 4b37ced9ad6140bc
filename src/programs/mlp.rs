//! `mlp`: train a two-layer perceptron by hand-written backward passes and SGD.
//!
//! Data: `samples` points `x` uniform in `[-1, 1)^inputs` and a target made by a fixed
//! "teacher" (`y = sum_j c_j x_j + x_0 x_1`), all from a fixed seed. Model:
//! `p = relu(x W1 + b1) W2 + b2`, loss `mean((p - y)^2)`. Each step runs the forward pass,
//! the backward pass
//!
//! ```text
//! dp  = (p - y) * 2/n            dW2 = hᵀ dp     db2 = sum_rows(dp)
//! dh  = dp W2ᵀ                   dz  = relu_grad(z, dh)   (z = x W1 + b1, h = relu(z))
//! dW1 = xᵀ dz                    db1 = sum_rows(dz)
//! ```
//!
//! and the update `W -= lr * dW`, about twenty op calls, without waiting: the losses of all
//! steps are read once training is done. Every kernel adds in a fixed order, so the losses
//! are the same bit for bit on the CPU and on the mock device.

use std::fmt;

use serde::Serialize;

use super::Rng;
use crate::eager::{Array, Context};
use crate::ep::DeviceId;
use crate::framework::VirtualMachine;
use crate::framework::{DType, Tensor};
use crate::vm::Result;

/// Options of [`mlp()`].
#[derive(Debug, Clone, PartialEq)]
pub struct MlpOptions {
    /// Where to train. Default `cpu:0`.
    pub device: DeviceId,
    /// SGD steps. Default 60.
    pub steps: usize,
    /// Training points. Default 64.
    pub samples: usize,
    /// Input features. Default 8.
    pub inputs: usize,
    /// Hidden units. Default 32.
    pub hidden: usize,
    /// Learning rate. Default 0.05.
    pub lr: f32,
    /// Seed of the data and the initial weights. Default 1.
    pub seed: u64,
}

impl Default for MlpOptions {
    fn default() -> Self {
        MlpOptions { device: DeviceId::CPU, steps: 60, samples: 64, inputs: 8, hidden: 32, lr: 0.05, seed: 1 }
    }
}

/// What [`mlp()`] did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MlpReport {
    /// The device it trained on.
    pub device: String,
    /// The loss before each step's update (so `losses[0]` is the initial loss).
    pub losses: Vec<f32>,
}

impl MlpReport {
    /// The loss before the first update.
    pub fn initial_loss(&self) -> f32 {
        self.losses.first().copied().unwrap_or(f32::NAN)
    }
    /// The loss before the last update.
    pub fn final_loss(&self) -> f32 {
        self.losses.last().copied().unwrap_or(f32::NAN)
    }
    /// Whether training more than halved the loss.
    pub fn loss_fell(&self) -> bool {
        self.final_loss() < 0.5 * self.initial_loss()
    }
}

impl fmt::Display for MlpReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "mlp on {}: {} steps, loss {:.6} -> {:.6} ({})",
            self.device,
            self.losses.len(),
            self.initial_loss(),
            self.final_loss(),
            if self.loss_fell() { "fell by more than half" } else { "did NOT halve" }
        )?;
        // The curve: about ten steps of it, always including the last.
        let every = self.losses.len().div_ceil(10).max(1);
        for (i, l) in self.losses.iter().enumerate() {
            if i % every == 0 || i + 1 == self.losses.len() {
                write!(f, "\n  step {:>4}  loss {l:.6}", i + 1)?;
            }
        }
        Ok(())
    }
}

/// The synthetic data set: `x` is `[samples, inputs]`, `y` is `[samples, 1]`.
pub fn dataset(opts: &MlpOptions) -> (Vec<f32>, Vec<f32>) {
    let mut rng = Rng::new(opts.seed);
    let coef = rng.vec(opts.inputs, 1.0);
    let x = rng.vec(opts.samples * opts.inputs, 1.0);
    let y = x
        .chunks_exact(opts.inputs.max(1))
        .map(|row| {
            let linear = row.iter().zip(&coef).fold(0.0f32, |s, (a, c)| s + a * c);
            linear + row.first().copied().unwrap_or(0.0) * row.get(1).copied().unwrap_or(0.0)
        })
        .collect();
    (x, y)
}

/// The initial weights `W1: [inputs, hidden]` and `W2: [hidden, 1]` (the biases start at
/// 0): uniform, scaled by `sqrt(3 / fan_in)`.
pub fn initial_weights(opts: &MlpOptions) -> (Vec<f32>, Vec<f32>) {
    let (d, h) = (opts.inputs, opts.hidden);
    let mut rng = Rng::new(opts.seed ^ 0x5EED);
    let w1 = rng.vec(d * h, (3.0 / d.max(1) as f32).sqrt());
    let w2 = rng.vec(h, (3.0 / h.max(1) as f32).sqrt());
    (w1, w2)
}

/// Train the MLP for `opts.steps` steps; see the module docs.
pub fn mlp(vm: &VirtualMachine, opts: &MlpOptions) -> Result<MlpReport> {
    mlp_keeping(vm, opts, &mut Vec::new())
}

/// [`mlp()`], also pushing onto `keep` handles to the per-step losses and the trained weights (the command line
/// checksums them, and a recorded trace expects those checksums on replay).
pub fn mlp_keeping(vm: &VirtualMachine, opts: &MlpOptions, keep: &mut Vec<Tensor>) -> Result<MlpReport> {
    let cx = Context::new(vm);
    let dev = opts.device;
    let (n, d, h) = (opts.samples, opts.inputs, opts.hidden);
    let (xv, yv) = dataset(opts);
    let (w1v, w2v) = initial_weights(opts);

    let x = cx.from_slice(&xv, &[n, d], dev)?;
    let y = cx.from_slice(&yv, &[n, 1], dev)?;
    let mut w1 = cx.from_slice(&w1v, &[d, h], dev)?;
    let mut b1 = cx.zeros(&[h], DType::F32, dev)?;
    let mut w2 = cx.from_slice(&w2v, &[h, 1], dev)?;
    let mut b2 = cx.zeros(&[1], DType::F32, dev)?;
    let (inv_n, lr) = (1.0 / n.max(1) as f64, opts.lr as f64);

    let mut losses: Vec<Array> = Vec::with_capacity(opts.steps);
    for _ in 0..opts.steps {
        // Forward.
        let z = x.matmul(&w1)?.add_bias(&b1)?;
        let a = z.relu()?;
        let p = a.matmul(&w2)?.add_bias(&b2)?;
        let diff = p.sub(&y)?;
        losses.push(diff.mul(&diff)?.sum()?.scale(inv_n)?.to(DeviceId::CPU)?);
        // Backward.
        let dp = diff.scale(2.0 * inv_n)?;
        let dw2 = a.matmul_tn(&dp)?;
        let db2 = dp.sum_rows()?;
        let dz = z.relu_grad(&dp.matmul_nt(&w2)?)?;
        let dw1 = x.matmul_tn(&dz)?;
        let db1 = dz.sum_rows()?;
        // SGD.
        w1 = w1.sub(&dw1.scale(lr)?)?;
        b1 = b1.sub(&db1.scale(lr)?)?;
        w2 = w2.sub(&dw2.scale(lr)?)?;
        b2 = b2.sub(&db2.scale(lr)?)?;
    }
    for a in losses.iter().chain([&w1, &b1, &w2, &b2]) {
        keep.push(a.tensor()?.clone());
    }
    let losses = losses.iter().map(|l| l.item::<f32>()).collect::<Result<Vec<_>>>()?;
    Ok(MlpReport { device: dev.to_string(), losses })
}
