//! Record a program's instruction stream to a trace file from code, then parse, validate and
//! replay it on a fresh VM, which checks the checksums the recording wrote for its outputs.
//!
//! ```sh
//! cargo run --release --example trace_record_replay
//! ```

use eagervm::ep::mock::MockConfig;
use eagervm::prelude::*;
use eagervm::trace::{self, DeviceMap, Recorder, ReplayOptions};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::temp_dir().join(format!("eagervm-example-{}.trace", std::process::id()));
    let vm = VirtualMachine::new(Config::default().with_mock_devices(1, MockConfig::default()))?;
    let gpu = DeviceId::mock(0);

    // Record: everything the VM receives from here on goes to the file.
    let recorder = Recorder::start(&vm, &path)?;
    let cx = Context::new(&vm);
    let x = cx.from_slice(&[1.0f32, -2.0, 3.0, -4.0, 5.0, -6.0], &[2, 3], DeviceId::CPU)?.to(gpu)?;
    let w = cx.full(&[3, 3], 0.5, DType::F32, gpu)?;
    let y = x.matmul(&w)?.relu()?;
    let g = x.matmul_tn(&y)?; // recorded as `matmul ... transpose_a=true`
    let total = g.sum()?.to(DeviceId::CPU)?;
    let value: f32 = total.item()?;
    let outputs = [y.tensor()?, total.tensor()?];
    let summary = recorder.finish(&vm, &outputs, None)?;
    println!(
        "recorded {} instructions, {} tensors, {} checksums to {}",
        summary.instructions,
        summary.tensors,
        summary.expects,
        summary.path.display()
    );

    // Replay: parse, validate, run on a new VM (here on the CPU), check the checksums.
    let text = std::fs::read_to_string(&path)?;
    let transposed = text.lines().filter(|l| l.contains("transpose_a=true")).count();
    let parsed = trace::load(&path)?;
    for device in [DeviceMap::AsRecorded, DeviceMap::Cpu] {
        let opts = ReplayOptions { resync: device == DeviceMap::Cpu, device, ..Default::default() };
        let report = trace::replay(&parsed, &opts)?;
        println!(
            "replayed on {device:?}: {} instructions in {:.2} ms, {} checksums matched",
            report.instructions,
            report.wall.as_secs_f64() * 1e3,
            report.checked
        );
        if report.checked != summary.expects || !report.failures.is_empty() {
            eprintln!("the replay did not reproduce the recording: {:?}", report.failures);
            std::process::exit(1);
        }
    }
    std::fs::remove_file(&path)?;
    // relu(x W) = [[1, 1, 1], [0, 0, 0]]; xᵀ that = [[1, 1, 1], [-2, -2, -2], [3, 3, 3]].
    if value != 6.0 || transposed == 0 {
        eprintln!("wrong result: total {value} (expected 6), {transposed} transposed products in the trace");
        std::process::exit(1);
    }
    println!("ok: total {value}");
    Ok(())
}
