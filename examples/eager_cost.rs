//! The cost of one eager call: 20 000 chained `add`s of 16 elements on `cpu:0` and
//! `mock:0`, one `vm.run` per call (`flush_every = 1`) and batched (the default, 128),
//! five repetitions each, medians printed in ns per call end to end. Checks every result.
//!
//! ```sh
//! cargo run --release --example eager_cost            # 20 000 calls per repetition
//! cargo run --release --example eager_cost -- 2000    # fewer
//! ```

use std::time::Instant;

use eagervm::eager::{Context, ContextOptions};
use eagervm::ep::mock::MockConfig;
use eagervm::prelude::*;

fn main() -> eagervm::Result<()> {
    let n: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(20_000);
    let vm = VirtualMachine::new(Config::default().with_mock_devices(1, MockConfig::default()))?;
    for dev in [DeviceId::CPU, DeviceId::mock(0)] {
        for flush_every in [1usize, 128] {
            let mut ns = Vec::new();
            for _ in 0..5 {
                let cx = Context::with_options(&vm, ContextOptions { flush_every });
                let mut a = cx.zeros(&[16], DType::F32, dev)?;
                let one = cx.full(&[16], 1.0, DType::F32, dev)?;
                a.wait()?;
                let t = Instant::now();
                for _ in 0..n {
                    a = a.add(&one)?;
                }
                a.wait()?;
                ns.push(t.elapsed().as_nanos() as f64 / n as f64);
                if a.to_vec::<f32>()? != vec![n as f32; 16] {
                    eprintln!("wrong sum on {dev}");
                    std::process::exit(1);
                }
            }
            ns.sort_by(f64::total_cmp);
            println!(
                "{dev} flush_every={flush_every}: median {:.0} ns/call (min {:.0}, max {:.0})",
                ns[2], ns[0], ns[4]
            );
        }
    }
    vm.sync()
}
