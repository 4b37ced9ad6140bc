//! Profile a run and read the profile from code: each instruction's times on its stream,
//! per-stream busy time, and a per-op table built from the instruction events; the profile
//! is also written as a Chrome/Perfetto timeline.
//!
//! ```sh
//! cargo run --release --example read_profile
//! ```

use std::collections::BTreeMap;
use std::time::Duration;

use eagervm::ep::mock::MockConfig;
use eagervm::prelude::*;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let vm = VirtualMachine::new(Config::default().with_mock_devices(1, MockConfig::default()))?;
    let cx = Context::new(&vm);
    let gpu = DeviceId::mock(0);

    vm.start_profiling()?;
    // Chunks copied in, computed on, and copied out: the copies overlap the compute.
    let w = cx.full(&[64, 64], 0.01, DType::F32, gpu)?;
    let mut sums = Vec::new();
    for i in 0..16 {
        let chunk = cx.full(&[64, 64], i as f64, DType::F32, DeviceId::CPU)?.to(gpu)?;
        sums.push(chunk.matmul(&w)?.relu()?.sum_rows()?.to(DeviceId::CPU)?);
    }
    for s in &sums {
        s.wait()?;
    }
    let profile = vm.stop_profiling()?;

    // Per op: count, and time from dispatch to done (on a device: launch to completion).
    let mut ops: BTreeMap<&str, (usize, Duration)> = BTreeMap::new();
    for span in profile.instructions() {
        let e = ops.entry(span.name).or_default();
        e.0 += 1;
        e.1 += span.done.saturating_sub(span.dispatched);
    }
    println!("{:<16} {:>6} {:>12}", "op", "count", "total µs");
    for (name, (count, time)) in &ops {
        println!("{name:<16} {count:>6} {:>12.1}", time.as_secs_f64() * 1e6);
    }
    let summary = profile.summary();
    println!("span {:.2} ms", summary.span.as_secs_f64() * 1e3);
    for s in &summary.streams {
        println!(
            "  {:<20} {:>4} instructions, busy {:.2} ms",
            s.name,
            s.instructions,
            s.busy.as_secs_f64() * 1e3
        );
    }
    let path = std::env::temp_dir().join(format!("eagervm-example-{}.json", std::process::id()));
    profile.write_chrome_json(&path)?;
    println!("timeline written to {} (open it in ui.perfetto.dev)", path.display());
    std::fs::remove_file(&path)?;

    // Checks: 16 products and 32 copies in (W's fill is on the device) and out were seen,
    // each done after it was dispatched; the values are right.
    let count = |op: &str| ops.get(op).map_or(0, |e| e.0);
    let ordered = profile.instructions().iter().all(|s| s.queued <= s.dispatched && s.dispatched <= s.done);
    let first = sums[1].to_vec::<f32>()?; // every row of chunk 1 is 1; x W sums 64 x 0.01
    let want = 64.0 * 64.0 * 0.01;
    vm.sync()?;
    if count("matmul") != 16 || count("copy") < 32 || !ordered || (first[0] - want).abs() > 1e-3 {
        eprintln!("unexpected profile or values: {ops:?}, ordered {ordered}, {} != {want}", first[0]);
        std::process::exit(1);
    }
    println!("ok");
    Ok(())
}
