//! The eager MLP: a two-layer network trained by hand-written backpropagation on owned
//! arrays. The model keeps its weights in a struct beside its VM; each step's calls return
//! at once and the VM runs them asynchronously; the loss is read once training is done.
//!
//! ```sh
//! cargo run --release --example eager_mlp
//! ```

use eagervm::eager::{Array, Context};
use eagervm::prelude::*;

/// A model that owns its VM and its weights.
struct Mlp {
    vm: VirtualMachine,
    cx: Context,
    w1: Array,
    b1: Array,
    w2: Array,
    b2: Array,
}

/// Deterministic values in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

impl Mlp {
    fn new(d: usize, h: usize) -> eagervm::Result<Self> {
        let vm = VirtualMachine::new(Config::default())?;
        let cx = Context::new(&vm);
        let dev = DeviceId::CPU;
        let scale = |v: Vec<f32>, s: f32| v.into_iter().map(|x| x * s).collect::<Vec<_>>();
        let w1 = cx.from_slice(&scale(values(d * h, 1), 0.5), &[d, h], dev)?;
        let w2 = cx.from_slice(&scale(values(h, 2), 0.5), &[h, 1], dev)?;
        let (b1, b2) = (cx.zeros(&[h], DType::F32, dev)?, cx.zeros(&[1], DType::F32, dev)?);
        Ok(Mlp { vm, cx, w1, b1, w2, b2 })
    }

    /// One step of SGD on the mean squared error; returns the loss (not yet computed).
    fn step(&mut self, x: &Array, y: &Array, lr: f64) -> eagervm::Result<Array> {
        let n = x.shape()[0] as f64;
        // Forward.
        let z = x.matmul(&self.w1)?.add_bias(&self.b1)?;
        let a = z.relu()?;
        let p = a.matmul(&self.w2)?.add_bias(&self.b2)?;
        let d = p.sub(y)?;
        let loss = d.mul(&d)?.sum()?.scale(1.0 / n)?;
        // Backward: dL/dp = 2 d / n.
        let dp = d.scale(2.0 / n)?;
        let dw2 = a.matmul_tn(&dp)?; // aᵀ dp: `matmul` with transpose_a
        let db2 = dp.sum_rows()?;
        let dz = z.relu_grad(&dp.matmul_nt(&self.w2)?)?; // dp w2ᵀ: `matmul` with transpose_b
        let dw1 = x.matmul_tn(&dz)?;
        let db1 = dz.sum_rows()?;
        // Update in place: w -= lr * dw.
        for (w, g) in [(&mut self.w1, dw1), (&mut self.b1, db1), (&mut self.w2, dw2), (&mut self.b2, db2)] {
            w.sub_(&g.scale(lr)?)?;
        }
        Ok(loss)
    }
}

fn main() -> eagervm::Result<()> {
    let (n, d, h, steps) = (64, 8, 32, 100);
    let mut model = Mlp::new(d, h)?;
    // The target: y = x0 * x1 + 0.5 x2.
    let xv = values(n * d, 7);
    let yv: Vec<f32> = (0..n).map(|i| xv[i * d] * xv[i * d + 1] + 0.5 * xv[i * d + 2]).collect();
    let x = model.cx.from_slice(&xv, &[n, d], DeviceId::CPU)?;
    let y = model.cx.from_slice(&yv, &[n, 1], DeviceId::CPU)?;
    let start = std::time::Instant::now();
    let losses: Vec<Array> = (0..steps).map(|_| model.step(&x, &y, 0.1)).collect::<eagervm::Result<_>>()?;
    let losses: Vec<f32> = losses.iter().map(|l| l.item::<f32>()).collect::<eagervm::Result<_>>()?;
    let stats = model.cx.stats();
    println!(
        "{steps} steps in {:.1} ms: {} calls in {} flushes",
        start.elapsed().as_secs_f64() * 1e3,
        stats.calls,
        stats.flushes
    );
    for (i, l) in losses.iter().enumerate().filter(|(i, _)| i % 20 == 0 || *i == steps - 1) {
        println!("step {i:3}: loss {l:.5}");
    }
    model.vm.sync()?;
    let (first, last) = (losses[0], losses[steps - 1]);
    // NaN fails too: only a loss below half the first passes.
    if last.partial_cmp(&(first / 2.0)) != Some(std::cmp::Ordering::Less) {
        eprintln!("the loss did not fall by half: {first} -> {last}");
        std::process::exit(1);
    }
    println!("ok: the loss fell from {first:.4} to {last:.4}");
    Ok(())
}
