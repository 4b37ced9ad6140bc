//! The MLP training step of `eagervm run mlp`, timed per step, at its own shapes and at
//! larger ones.
//!
//! One step is exactly the program's (`programs::mlp`): the forward pass, the loss copied to
//! the host, the hand-written backward pass and the SGD update, 24 op calls through the
//! eager front end, on the same data and initial weights. At 64×8×32 (samples × inputs ×
//! hidden) the step is a few microseconds of kernels and the rest is the VM's per-op cost;
//! at 1024×1024×1024 the two 1024³ matmuls dominate. Each figure is measured twice: with
//! the loss left unread until the end (a loop that never waits), and with the loss read
//! every step (`item`, as a training loop that prints or checks it does).
//!
//! `benches/peers/torch_mlp.py` and `benches/peers/aten_mlp.cpp` run the same step in
//! PyTorch at the same shapes.

use std::time::Instant;

use super::progress::Progress;
use super::spread::{disagree, median, range};
use crate::eager::{Array, Context};
use crate::ep::DeviceId;
use crate::framework::DType;
use crate::programs::mlp::{dataset, initial_weights, MlpOptions};
use crate::vm::Result;
use crate::VirtualMachine;

/// An MLP's shape: the batch, the inputs and the hidden width (one output).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct MlpShape {
    /// Training points per step.
    pub samples: usize,
    /// Input features.
    pub inputs: usize,
    /// Hidden units.
    pub hidden: usize,
}

impl MlpShape {
    /// The shape of `eagervm run mlp`: 64×8×32.
    pub const SMALL: MlpShape = MlpShape { samples: 64, inputs: 8, hidden: 32 };
    /// A shape where the kernels dominate: 1024×1024×1024.
    pub const LARGE: MlpShape = MlpShape { samples: 1024, inputs: 1024, hidden: 1024 };

    /// `64x8x32`.
    pub fn label(&self) -> String {
        format!("{}x{}x{}", self.samples, self.inputs, self.hidden)
    }

    /// Steps per repetition for a run of size `n` (instructions, as the other workloads'):
    /// about `n / 500` steps at the small shape (2000 at the default `n`), `n / 10^5` at the
    /// large one (10), at least 2.
    pub fn steps(&self, n: usize) -> usize {
        let work = self.samples * self.inputs * self.hidden;
        let per = if work <= 1 << 20 { 500 } else { 100_000 };
        (n / per).max(2)
    }

    fn options(&self, device: DeviceId) -> MlpOptions {
        MlpOptions {
            device,
            samples: self.samples,
            inputs: self.inputs,
            hidden: self.hidden,
            ..Default::default()
        }
    }
}

/// The time per MLP step at one shape (medians over the repetitions).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct MlpResult {
    /// `mlp`.
    pub workload: &'static str,
    /// The device it ran on.
    pub device: String,
    /// The shape.
    pub shape: MlpShape,
    /// Steps per repetition.
    pub steps: u64,
    /// Repetitions measured.
    pub reps: u32,
    /// Wall time per step, the loss read only at the end (µs).
    pub step_us: f64,
    /// Wall time per step, the loss read every step (µs).
    pub step_us_loss_read: f64,
    /// The fastest and slowest repetition's `step_us`.
    pub step_us_range: [f64; 2],
    /// Whether the repetitions of either figure disagree by more than twice.
    pub noisy: bool,
    /// The loss before the last step of the last repetition (training from the start each
    /// repetition): a finite number, or the run was wrong.
    pub last_loss: f32,
}

/// The model's state through the steps.
struct Mlp {
    x: Array,
    y: Array,
    w1: Array,
    b1: Array,
    w2: Array,
    b2: Array,
    inv_n: f64,
    lr: f64,
}

impl Mlp {
    /// The data and initial weights of `programs::mlp` at `opts`' shape, on its device.
    fn new(cx: &Context, opts: &MlpOptions) -> Result<Mlp> {
        let (dev, n, d, h) = (opts.device, opts.samples, opts.inputs, opts.hidden);
        let (xv, yv) = dataset(opts);
        let (w1v, w2v) = initial_weights(opts);
        Ok(Mlp {
            x: cx.from_slice(&xv, &[n, d], dev)?,
            y: cx.from_slice(&yv, &[n, 1], dev)?,
            w1: cx.from_slice(&w1v, &[d, h], dev)?,
            b1: cx.zeros(&[h], DType::F32, dev)?,
            w2: cx.from_slice(&w2v, &[h, 1], dev)?,
            b2: cx.zeros(&[1], DType::F32, dev)?,
            inv_n: 1.0 / n.max(1) as f64,
            lr: opts.lr as f64,
        })
    }

    /// One step of `programs::mlp` (the same calls in the same order); returns the loss
    /// before the update, on the host.
    fn step(&mut self) -> Result<Array> {
        let (x, inv_n, lr) = (&self.x, self.inv_n, self.lr);
        let z = x.matmul(&self.w1)?.add_bias(&self.b1)?;
        let a = z.relu()?;
        let p = a.matmul(&self.w2)?.add_bias(&self.b2)?;
        let diff = p.sub(&self.y)?;
        let loss = diff.mul(&diff)?.sum()?.scale(inv_n)?.to(DeviceId::CPU)?;
        let dp = diff.scale(2.0 * inv_n)?;
        let dw2 = a.matmul_tn(&dp)?;
        let db2 = dp.sum_rows()?;
        let dz = z.relu_grad(&dp.matmul_nt(&self.w2)?)?;
        let dw1 = x.matmul_tn(&dz)?;
        let db1 = dz.sum_rows()?;
        self.w1 = self.w1.sub(&dw1.scale(lr)?)?;
        self.b1 = self.b1.sub(&db1.scale(lr)?)?;
        self.w2 = self.w2.sub(&dw2.scale(lr)?)?;
        self.b2 = self.b2.sub(&db2.scale(lr)?)?;
        Ok(loss)
    }
}

/// Train from the start for `steps` steps; (wall µs per step, the last loss). The clock
/// starts after the data and weights are on the device and stops once the last loss is read.
fn timed_steps(
    vm: &VirtualMachine,
    opts: &MlpOptions,
    steps: usize,
    read_each: bool,
    progress: &Progress,
) -> Result<(f64, f32)> {
    let cx = Context::new(vm);
    let mut m = Mlp::new(&cx, opts)?;
    cx.sync()?;
    let t0 = Instant::now();
    let mut loss = m.step()?;
    progress.advance(1);
    for _ in 1..steps {
        if read_each {
            loss.item::<f32>()?;
        }
        loss = m.step()?;
        progress.advance(1);
    }
    let last = loss.item::<f32>()?;
    Ok((t0.elapsed().as_secs_f64() * 1e6 / steps.max(1) as f64, last))
}

/// The losses of `steps` steps at `opts`, each read after its step (for the tests: they
/// must equal `programs::mlp`'s bit for bit).
pub fn losses(vm: &VirtualMachine, opts: &MlpOptions) -> Result<Vec<f32>> {
    let cx = Context::new(vm);
    let mut m = Mlp::new(&cx, opts)?;
    (0..opts.steps).map(|_| m.step()?.item::<f32>()).collect()
}

/// Time the step at `shape` on `device` (`vm` must have it): `steps` steps per repetition,
/// `reps` repetitions of each figure after a warm-up run, the two figures in turn.
pub fn measure(
    vm: &VirtualMachine,
    device: DeviceId,
    shape: MlpShape,
    steps: usize,
    reps: u32,
    progress: &Progress,
) -> Result<MlpResult> {
    let (reps, steps) = (reps.max(1), steps.max(1));
    let opts = shape.options(device);
    let warm = (steps / 10).max(2);
    progress.start(format!("mlp {} warm-up", shape.label()), (warm + 2 * steps * reps as usize) as u64);
    timed_steps(vm, &opts, warm, false, progress)?;
    let (mut plain, mut read, mut last_loss) = (Vec::new(), Vec::new(), f32::NAN);
    for rep in 0..reps {
        progress.phase(format!("mlp {} rep {}/{reps}", shape.label(), rep + 1));
        let (us, loss) = timed_steps(vm, &opts, steps, false, progress)?;
        plain.push(us);
        read.push(timed_steps(vm, &opts, steps, true, progress)?.0);
        last_loss = loss;
    }
    Ok(MlpResult {
        workload: "mlp",
        device: device.to_string(),
        shape,
        steps: steps as u64,
        reps,
        step_us_range: range(&plain),
        noisy: disagree(&plain) || disagree(&read),
        step_us: median(&mut plain),
        step_us_loss_read: median(&mut read),
        last_loss,
    })
}
