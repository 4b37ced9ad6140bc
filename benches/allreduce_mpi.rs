//! The VM's all-reduce over MPI against the same `MPI_Allreduce` called directly, for sizes
//! from 4 B to 64 MiB: the VM's overhead per call at small sizes, its bandwidth against
//! MPI's at large ones, as ratios measured in the same run.
//!
//! `cargo bench --features mpi --bench allreduce_mpi` starts `mpirun -np 2` on this binary
//! (`EAGERVM_MPI_RANKS` sets another rank count); under `mpirun` it runs the measurement, and
//! rank 0 prints the table. Each size is timed as `iters` calls one after the other, issue
//! and wait (the VM: `vm.run(|b| b.all_reduce(..))` then `wait` on the output; MPI: a
//! blocking `MPI_Allreduce` on `f32`s with `MPI_SUM`), the best of 3 rounds, each round
//! starting after a barrier. Bandwidth is the algorithm bandwidth: bytes per rank / time.
//! `EAGERVM_MPI_YIELD_US` and `EAGERVM_MPI_MAX_SLEEP_US` set the backend's polling
//! (`ep::ccl::mpi::Polling`), `EAGERVM_MPI_MAX_BYTES` the largest size.

use std::sync::Arc;
use std::time::{Duration, Instant};

use eagervm::ep::ccl::mpi::{MpiBackend, Polling};
use eagervm::ep::ccl::ReduceOp;
use eagervm::ep::DeviceId;
use eagervm::vm::Config;
use eagervm::VirtualMachine;
use mpi::collective::SystemOperation;
use mpi::traits::CommunicatorCollectives;

fn main() {
    let launched =
        ["OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE"].iter().any(|v| std::env::var_os(v).is_some());
    if !launched {
        let ranks = std::env::var("EAGERVM_MPI_RANKS").unwrap_or_else(|_| "2".into());
        let exe = std::env::current_exe().expect("the benchmark's path");
        let mut c = std::process::Command::new("mpirun");
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            c.arg("--allow-run-as-root");
        }
        let status = c
            .args(["--oversubscribe", "-np", &ranks])
            .arg(exe)
            .status()
            .expect("mpirun starts (is OpenMPI installed?)");
        std::process::exit(status.code().unwrap_or(1));
    }
    let us =
        |var: &str| std::env::var(var).ok().and_then(|v| v.parse::<u64>().ok()).map(Duration::from_micros);
    let mut polling = Polling::default();
    if let Some(d) = us("EAGERVM_MPI_YIELD_US") {
        polling.yield_for = d;
    }
    if let Some(d) = us("EAGERVM_MPI_MAX_SLEEP_US") {
        polling.max_sleep = d;
    }
    let max_bytes: usize =
        std::env::var("EAGERVM_MPI_MAX_BYTES").ok().and_then(|v| v.parse().ok()).unwrap_or(64 << 20);
    let backend = MpiBackend::world().expect("MPI starts").with_polling(polling);
    let (rank, n) = (backend.rank(), eagervm::ep::ccl::Backend::world_size(&backend));
    let vm = VirtualMachine::new(Config::default()).expect("vm starts");
    let comm = vm.communicator("world", Arc::new(backend)).expect("communicator");
    let world = mpi::topology::SimpleCommunicator::world();
    if rank == 0 {
        println!(
            "all_reduce sum of f32 over {n} ranks (MPI polled with {:?} of yields, sleeps up to {:?})",
            polling.yield_for, polling.max_sleep
        );
        println!(
            "{:>9} {:>7} {:>11} {:>11} {:>13} {:>11} {:>11} {:>9}",
            "bytes", "iters", "mpi µs", "vm µs", "overhead µs", "mpi GB/s", "vm GB/s", "vm/mpi"
        );
    }
    let mut bytes = 4usize;
    while bytes <= max_bytes {
        let count = bytes / 4;
        let iters = ((256usize << 20) / bytes).clamp(5, 2000);
        let data: Vec<f32> = (0..count).map(|i| (i % 7) as f32 + rank as f32).collect();
        let mut out = vec![0f32; count];
        let x = vm.from_slice(&data, &[count], DeviceId::CPU).expect("input");
        let mut best_mpi = Duration::MAX;
        let mut best_vm = Duration::MAX;
        for _ in 0..3 {
            world.barrier();
            let t0 = Instant::now();
            for _ in 0..iters {
                world.all_reduce_into(&data[..], &mut out[..], SystemOperation::sum());
            }
            best_mpi = best_mpi.min(t0.elapsed() / iters as u32);
            world.barrier();
            let t0 = Instant::now();
            for _ in 0..iters {
                let y = vm.run(|b| b.all_reduce(&comm, &[&x], ReduceOp::Sum)).expect("issued");
                y[0].wait().expect("all_reduce");
            }
            best_vm = best_vm.min(t0.elapsed() / iters as u32);
        }
        // Both computed the same sum.
        let y = vm.run(|b| b.all_reduce(&comm, &[&x], ReduceOp::Sum)).expect("issued");
        assert!(y[0].to_vec::<f32>().expect("all_reduce") == out, "the VM and MPI disagree at {bytes} B");
        if rank == 0 {
            let gbs = |d: Duration| bytes as f64 / d.as_secs_f64() / 1e9;
            println!(
                "{:>9} {:>7} {:>11.1} {:>11.1} {:>13.1} {:>11.3} {:>11.3} {:>9.2}",
                bytes,
                iters,
                best_mpi.as_secs_f64() * 1e6,
                best_vm.as_secs_f64() * 1e6,
                (best_vm.as_secs_f64() - best_mpi.as_secs_f64()) * 1e6,
                gbs(best_mpi),
                gbs(best_vm),
                best_mpi.as_secs_f64() / best_vm.as_secs_f64(),
            );
        }
        bytes *= 4;
    }
    drop(vm);
}
