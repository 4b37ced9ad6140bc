//! GPU benchmarks (VM overhead, copy/compute overlap, MLP step) through
//! `eagervm::bench::cuda`, printed as ratios; without a GPU they report why they skipped.

use criterion::{criterion_group, criterion_main, Criterion};
use eagervm::bench::cuda::{run, CudaBenchOptions};
use eagervm::vm::Config;

fn cuda(c: &mut Criterion) {
    let config = Config::from_env();
    let report = match run(&CudaBenchOptions::default(), &config) {
        Ok(r) => r,
        Err(e) => {
            println!("cuda benchmarks failed: {e}");
            return;
        }
    };
    println!("{report}");
    if report.skipped.is_some() {
        return;
    }
    let small =
        CudaBenchOptions { chain: 10_000, chunks: 8, chunk_elems: 1 << 18, rounds: 4, steps: 20, width: 256 };
    c.bench_function("cuda/all-three (small)", |b| {
        b.iter(|| run(&small, &config).expect("the benchmarks ran once"))
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(10);
    targets = cuda
}
criterion_main!(benches);
