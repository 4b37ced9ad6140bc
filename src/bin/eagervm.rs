//! The `eagervm` command line.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use eagervm::bench::{self, Workload};
use eagervm::ep::mock::MockConfig;
use eagervm::prelude::*;

/// eagervm: an eager-execution virtual machine for tensor programs.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Run a short program on the CPU and a mock asynchronous device, printing what ran.
    Demo,
    /// Measure the VM's throughput on four no-op workloads against a bare pipeline.
    Bench {
        /// Instructions per workload.
        #[arg(short, long, default_value_t = 1_000_000)]
        n: usize,
        /// Repetitions (the median is reported).
        #[arg(short, long, default_value_t = 3)]
        reps: u32,
        /// Workloads to run, e.g. `1,2` or `W3`.
        #[arg(short, long, default_value = "1,2,3,4", value_delimiter = ',')]
        workloads: Vec<String>,
        /// Print one JSON object per workload instead of a table.
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.command.unwrap_or(Command::Demo) {
        Command::Demo => demo(),
        Command::Bench { n, reps, workloads, json } => run_bench(n, reps, &workloads, json),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("eagervm: error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run_bench(n: usize, reps: u32, workloads: &[String], json: bool) -> eagervm::Result<()> {
    let ws: Vec<Workload> = workloads
        .iter()
        .map(|w| Workload::parse(w).ok_or_else(|| Error::Config(format!("unknown workload `{w}` (use 1-4)"))))
        .collect::<eagervm::Result<_>>()?;
    let config = Config::from_env();
    if !json {
        println!("eagervm bench: {n} no-op instructions per workload on cpu:0, median of {reps}");
        println!(
            "{:<4} {:<15} {:>10} {:>14} {:>14} {:>7} {:>7}  result",
            "", "workload", "push ns/i", "e2e instr/s", "baseline /s", "ratio", "target"
        );
    }
    let mut all_ok = true;
    for w in ws {
        let r = bench::measure(w, n, reps, &config)?;
        all_ok &= r.meets_target;
        if json {
            println!("{}", serde_json::to_string(&r).expect("plain struct serialises"));
        } else {
            println!(
                "{:<4} {:<15} {:>10.1} {:>14.0} {:>14.0} {:>7.2} {:>7.2}  {}",
                r.workload,
                w.describe(),
                r.push_ns_per_instr,
                r.e2e_instr_per_s,
                r.baseline_instr_per_s,
                r.ratio,
                r.target_ratio,
                if r.meets_target { "met" } else { "MISSED" }
            );
        }
    }
    if !json {
        println!(
            "ratio = e2e / baseline (a bare caller→forwarder→worker pipeline measured in the same run); \
             targets: W1 >= 0.50, W2-W4 >= 0.33, push <= 100 ns/instr{}",
            if all_ok { "; all met" } else { "" }
        );
    }
    Ok(())
}

fn demo() -> eagervm::Result<()> {
    let mut mock = MockConfig::from_env();
    if mock.launch_delay.is_zero() {
        mock.launch_delay = std::time::Duration::from_micros(200);
    }
    let delay = mock.launch_delay;
    let vm = VirtualMachine::new(Config::from_env().with_mock_devices(1, mock))?;
    let gpu = DeviceId::mock(0);
    println!("eagervm demo: devices cpu:0 and {gpu} (a mock asynchronous device: host threads, {delay:?} per launch)");
    println!("streams:");
    for (id, _, _, name) in vm.streams() {
        println!("  #{} {}", id.index(), name);
    }
    let cpu = vm.compute_stream(DeviceId::CPU)?;
    let g = vm.compute_stream(gpu)?;
    let h2d = vm.stream(gpu, StreamType::H2D)?;
    let [matmul, add, relu, sum, copy, scale, fail] =
        ["matmul", "add", "relu", "sum", "copy", "scale", "fail"].map(|n| vm.op(n).expect("built-in op"));

    let x = vm.from_slice(&[1.0f32, -2.0, 3.0, -4.0, 5.0, -6.0], &[2, 3], DeviceId::CPU)?;
    let w = vm.from_slice(&[0.5f32, -1.0, 1.5, 2.0, -0.5, 1.0], &[3, 2], DeviceId::CPU)?;
    println!("\nx = {:?} (2x3, cpu:0)\nw = {:?} (3x2, cpu:0)", x.to_vec::<f32>()?, w.to_vec::<f32>()?);

    let t0 = std::time::Instant::now();
    let (y, total) = vm.run(|b| -> eagervm::Result<_> {
        let xw = b.call(matmul, &[&x, &w], Attrs::default(), cpu)?;
        println!("  cpu:0         matmul(x, w)        -> {:?}", xw.shape());
        let xw_dev = vm.empty(xw.shape(), DType::F32, gpu)?;
        b.call_into(copy, &[&xw], &[&xw_dev], Attrs::default(), h2d)?;
        println!("  {gpu}:h2d    copy to device       (waits for the cpu matmul)");
        let r = b.call(relu, &[&xw_dev], Attrs::default(), g)?;
        println!("  {gpu}:compute relu                (device-side wait on the h2d copy)");
        let s = b.call(scale, &[&r], Attrs::scalar(10.0), g)?;
        let y = b.call(add, &[&s, &xw_dev], Attrs::default(), g)?;
        println!("  {gpu}:compute scale x10, add");
        let total = b.call(sum, &[&y], Attrs::default(), g)?;
        println!("  {gpu}:compute sum");
        Ok((y, total))
    })?;
    println!("submitted in {:?}; the caller did not wait for the device", t0.elapsed());
    println!("y = 10*relu(x@w) + x@w = {:?}", y.to_vec::<f32>()?);
    println!("sum(y) = {:?} (read back through {gpu}:d2h)", total.to_vec::<f32>()?);

    println!("\nerrors are values: a kernel that fails poisons what it writes, and what reads it");
    let bad = vm.run(|b| -> eagervm::Result<_> {
        let f = vm.empty(&[2], DType::F32, DeviceId::CPU)?;
        b.call_into(fail, &[], &[&f], Attrs::scalar(7.0), cpu)?;
        b.call(relu, &[&f], Attrs::default(), cpu)
    })?;
    println!("  relu(failed) -> {}", bad.to_vec::<f32>().unwrap_err());
    println!("  sync         -> {}", vm.sync().unwrap_err());
    println!("  x is untouched: {:?}", x.to_vec::<f32>()?);
    vm.sync()?;
    println!("\nnext: `eagervm bench` measures throughput; `cargo test` runs the tests");
    Ok(())
}
