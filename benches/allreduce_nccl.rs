//! The VM's all-reduce over NCCL against the same `ncclAllReduce` called directly, 4 B to
//! 64 MiB, on `cuda:0` with a one-rank communicator, and the data-parallel MLP's step
//! against one rank's (`eagervm::bench::nccl`; `benches/allreduce_mpi.rs` is the MPI half).
//!
//! `cargo bench --bench allreduce_nccl`. libnccl is found as the backend finds it
//! (`EAGERVM_NCCL_LIB`, else `libnccl.so.2` on the loader's path). `EAGERVM_NCCL_MAX_BYTES`,
//! `EAGERVM_NCCL_ROUNDS` and `EAGERVM_NCCL_DP_STEPS` make it smaller; `EAGERVM_NCCL_JSON=FILE`
//! also writes the report as JSON. Without a GPU or libnccl it prints why it skipped and
//! exits 0; a failed measurement (an error, or sides that disagree) exits 1.

use std::process::ExitCode;

use eagervm::bench::nccl::{run, NcclBenchOptions};
use eagervm::vm::Config;

fn main() -> ExitCode {
    let opts = match NcclBenchOptions::from_vars(|v| std::env::var(v).ok()) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("allreduce_nccl: {e}");
            return ExitCode::FAILURE;
        }
    };
    let report = match run(&opts, &Config::from_env()) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("allreduce_nccl failed: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!("{report}");
    if let Some(path) = std::env::var_os("EAGERVM_NCCL_JSON") {
        let json = serde_json::to_string_pretty(&report).map_err(|e| e.to_string());
        if let Err(e) = json.and_then(|j| std::fs::write(&path, j + "\n").map_err(|e| e.to_string())) {
            eprintln!("allreduce_nccl: writing {}: {e}", path.to_string_lossy());
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}
