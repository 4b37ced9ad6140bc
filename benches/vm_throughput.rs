//! Criterion view of the VM's overhead: a batch of no-op instructions on the CPU stream
//! (independent writes, and one write chain) against the bare baseline pipeline moving the
//! same number of items. `eagervm bench` is the full four-workload report.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use eagervm::bench::baseline;
use eagervm::prelude::*;

const N: usize = 20_000;

fn vm_noops(c: &mut Criterion) {
    let vm = VirtualMachine::new(Config::default()).expect("vm");
    let cpu = vm.compute_stream(DeviceId::CPU).expect("cpu");
    let (noop, fill) = (vm.op("noop").expect("noop"), vm.op("fill").expect("fill"));
    let ts: Vec<Tensor> =
        (0..1024).map(|_| vm.empty(&[], DType::F32, DeviceId::CPU).expect("tensor")).collect();
    vm.run(|b| ts.iter().try_for_each(|t| b.call_into(fill, &[], &[t], Attrs::scalar(0.0), cpu)))
        .expect("fill");
    let mut g = c.benchmark_group("noop");
    g.throughput(Throughput::Elements(N as u64));
    g.bench_function("vm_independent", |bch| {
        bch.iter(|| {
            vm.run(|b| {
                for i in 0..N {
                    b.call_into(noop, &[], &[&ts[i % 1024]], Attrs::default(), cpu).expect("call");
                }
            });
            vm.sync().expect("sync");
        })
    });
    g.bench_function("vm_chain", |bch| {
        bch.iter(|| {
            vm.run(|b| {
                for _ in 0..N {
                    b.call_into(noop, &[], &[&ts[0]], Attrs::default(), cpu).expect("call");
                }
            });
            vm.sync().expect("sync");
        })
    });
    let cfg = vm.config().clone();
    let mut pipeline = baseline::Pipeline::new(cfg.batch_size, cfg.backoff(), cfg.high_water, cfg.low_water)
        .expect("the baseline pipeline's threads start");
    g.bench_function("baseline_pipeline", |bch| bch.iter(|| pipeline.run(N)));
    g.finish();
}

criterion_group!(benches, vm_noops);
criterion_main!(benches);
