//! The built-in programs: each runs, is deterministic, and checks what it shows.

use std::time::Instant;

use eagervm::ep::mock::MockConfig;
use eagervm::prelude::*;
use eagervm::programs::{
    self, builtin, FailureOptions, FanoutOptions, MlpOptions, PipelineOptions, Report, RunOptions,
};

fn vm() -> VirtualMachine {
    VirtualMachine::new(Config::default().with_mock_devices(1, MockConfig::default())).unwrap()
}

#[test]
fn mlp_loss_falls_and_is_the_same_bit_for_bit_on_cpu_and_mock() {
    let vm = vm();
    let cpu = programs::mlp(&vm, &MlpOptions::default()).unwrap();
    let mock =
        programs::mlp(&vm, &MlpOptions { device: DeviceId::mock(0), ..MlpOptions::default() }).unwrap();
    assert_eq!(cpu.losses.len(), 60);
    assert!(cpu.losses.iter().all(|l| l.is_finite()));
    assert!(cpu.final_loss() < 0.5 * cpu.initial_loss(), "{cpu}: {:?}", cpu.losses);
    let bits = |r: &programs::MlpReport| r.losses.iter().map(|l| l.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&cpu), bits(&mock));
    assert_eq!((cpu.device.as_str(), mock.device.as_str()), ("cpu:0", "mock:0"));
    // Deterministic across runs.
    assert_eq!(programs::mlp(&vm, &MlpOptions::default()).unwrap(), cpu);
}

#[test]
fn mlp_initial_loss_matches_a_host_forward_pass() {
    let opts = MlpOptions { steps: 1, ..MlpOptions::default() };
    let r = programs::mlp(&vm(), &opts).unwrap();
    // The forward pass in plain Rust, from the same data and initial weights (biases 0).
    let (x, y) = programs::mlp::dataset(&opts);
    let (w1, w2) = programs::mlp::initial_weights(&opts);
    let (n, d, h) = (opts.samples, opts.inputs, opts.hidden);
    assert_eq!((x.len(), y.len(), w1.len(), w2.len()), (n * d, n, d * h, h));
    let mut loss = 0.0f64;
    for i in 0..n {
        let mut p = 0.0f64;
        for j in 0..h {
            let z: f64 = (0..d).map(|k| x[i * d + k] as f64 * w1[k * h + j] as f64).sum();
            p += z.max(0.0) * w2[j] as f64;
        }
        loss += (p - y[i] as f64).powi(2);
    }
    loss /= n as f64;
    let got = r.initial_loss() as f64;
    assert!((got - loss).abs() < 1e-4 * (1.0 + loss), "{got} vs {loss}");
    assert!(loss > 0.1, "the target is not trivial: {loss}");
}

#[test]
fn pipeline_through_the_mock_device_equals_the_cpu_and_a_host_reference() {
    let vm = vm();
    let opts = PipelineOptions { chunks: 8, rows: 16, cols: 8, ..PipelineOptions::default() };
    let r = programs::pipeline(&vm, &opts).unwrap();
    assert!(r.matches_reference, "{r}");
    let cpu = programs::pipeline(&vm, &PipelineOptions { device: DeviceId::CPU, ..opts.clone() }).unwrap();
    assert_eq!(cpu.checksums, r.checksums);

    // A host reference in plain Rust, with the data the program makes from its seed.
    let mut rng = programs::pipeline::chunk_source(&opts);
    let w = rng.weight();
    for (i, &got) in r.checksums.iter().enumerate() {
        let x = rng.chunk();
        let (rows, cols) = (opts.rows, opts.cols);
        let mut total = 0.0f64;
        for r_ in 0..rows {
            for j in 0..cols {
                let v: f32 = (0..cols).map(|p| x[r_ * cols + p] * w[p * cols + j]).sum();
                total += v.max(0.0) as f64;
            }
        }
        assert!((got as f64 - total).abs() < 1e-3 * (1.0 + total.abs()), "chunk {i}: {got} vs {total}");
    }
}

#[test]
fn fanout_matches_the_host_reference_on_cpu_and_mock() {
    let vm = vm();
    for device in [DeviceId::CPU, DeviceId::mock(0)] {
        let r =
            programs::fanout(&vm, &FanoutOptions { device, width: 33, len: 500, ..FanoutOptions::default() })
                .unwrap();
        assert!(r.matches_reference, "{r}");
        assert_eq!(r.branches.len(), 33);
        // Branches with a negative factor see relu cut the positive inputs: all differ.
        assert!(r.branches[0] > 0.0 && r.branches[16] == 0.0 && r.branches[32] > 0.0, "{:?}", r.branches);
        let plain: f32 = r.branches.iter().sum();
        assert!((plain - r.total).abs() < 1e-3 * (1.0 + plain.abs()));
    }
}

#[test]
fn failure_poisons_only_what_it_feeds() {
    let vm = vm();
    for device in [DeviceId::CPU, DeviceId::mock(0)] {
        let r = programs::failure(&vm, &FailureOptions { device, ..FailureOptions::default() }).unwrap();
        assert!(r.as_expected, "{r}");
        assert_eq!(r.expected_error, "fail op: 13");
        assert_eq!(r.poisoned.len(), 3);
        for o in &r.poisoned {
            assert!(o.value.is_none());
            assert!(o.error.as_deref().unwrap().ends_with("failed: fail op: 13"), "{o:?}");
        }
        assert!(r.healthy.iter().all(|o| o.value.is_some() && o.error.is_none()), "{r}");
        assert!(r.sync_error.as_deref().unwrap().contains("fail op: 13"));
        // The VM keeps working.
        vm.sync().unwrap();
    }
}

#[test]
fn every_builtin_runs_by_name_at_its_defaults_quickly() {
    let needs = builtin().iter().map(|p| p.mock_devices).max().unwrap();
    let vm = VirtualMachine::new(Config::default().with_mock_devices(needs, MockConfig::default())).unwrap();
    for p in builtin() {
        assert!(!p.about.is_empty() && !p.size_means.is_empty());
        let t = Instant::now();
        let r = (p.run)(&vm, &RunOptions::default()).unwrap();
        let took = t.elapsed();
        assert!(r.ok(), "{}: {r}", p.name);
        assert!(r.to_json().starts_with(&format!("{{\"program\":\"{}\"", p.name)), "{}", r.to_json());
        assert!(!r.to_string().is_empty());
        assert!(took.as_secs_f64() < 10.0, "{} took {took:?}", p.name);
        // Same options, same report.
        assert_eq!((p.run)(&vm, &RunOptions::default()).unwrap(), r, "{}", p.name);
    }
    let small = RunOptions { device: Some(DeviceId::mock(0)), size: Some(3) };
    match (programs::find("mlp").unwrap().run)(&vm, &small).unwrap() {
        Report::Mlp(r) => assert_eq!((r.losses.len(), r.device.as_str()), (3, "mock:0")),
        other => panic!("{other:?}"),
    }
}

#[test]
fn programs_refuse_a_missing_device() {
    let vm = VirtualMachine::new(Config::default()).unwrap();
    let r = programs::pipeline(&vm, &PipelineOptions::default());
    assert!(matches!(r, Err(Error::Device(_))), "{r:?}");
}

#[test]
fn programs_give_the_same_reports_in_synchronous_mode() {
    let threaded = vm();
    let sync = VirtualMachine::new(Config {
        synchronous: true,
        ..Config::default().with_mock_devices(1, MockConfig::default())
    })
    .unwrap();
    let on_mock = RunOptions { device: Some(DeviceId::mock(0)), size: None };
    for p in builtin() {
        let a = (p.run)(&threaded, &on_mock).unwrap();
        let b = (p.run)(&sync, &on_mock).unwrap();
        assert!(a.ok() && b.ok(), "{}: {a} / {b}", p.name);
        assert_eq!(a, b, "{}", p.name);
    }
}

/// Above the kernels' sequential thresholds (sums of more than 4096 elements, products of
/// more than 64³ multiply-adds, which take other summation orders), the programs still agree
/// with their references: cpu and mock bit for bit, the host references in the kernels' order.
#[test]
fn programs_agree_with_their_references_above_the_kernels_sequential_sizes() {
    let vm = vm();
    const { assert!(10_000 > eagervm::kernels::SEQUENTIAL_SUM_MAX) };
    for device in [DeviceId::CPU, DeviceId::mock(0)] {
        let r = programs::fanout(
            &vm,
            &FanoutOptions { device, width: 4, len: 10_000, ..FanoutOptions::default() },
        )
        .unwrap();
        assert!(r.matches_reference, "{r}");
        let r = programs::failure(&vm, &FailureOptions { device, len: 10_000, ..FailureOptions::default() })
            .unwrap();
        assert!(r.as_expected, "{r}");
    }
    // 96 × 96 chunks times a 96 × 96 weight: 96³ multiply-adds per product.
    const { assert!(96 * 96 * 96 > eagervm::kernels::SEQUENTIAL_MAX_MACS) };
    let opts = PipelineOptions { chunks: 4, rows: 96, cols: 96, ..PipelineOptions::default() };
    let r = programs::pipeline(&vm, &opts).unwrap();
    assert!(r.matches_reference, "{r}");
    // The MLP with products of 128·96·96 multiply-adds: the same losses on cpu and mock.
    let big = MlpOptions { steps: 5, samples: 128, inputs: 96, hidden: 96, ..MlpOptions::default() };
    let cpu = programs::mlp(&vm, &big).unwrap();
    let mock = programs::mlp(&vm, &MlpOptions { device: DeviceId::mock(0), ..big.clone() }).unwrap();
    let bits = |r: &programs::MlpReport| r.losses.iter().map(|l| l.to_bits()).collect::<Vec<_>>();
    assert!(cpu.losses.iter().all(|l| l.is_finite()), "{cpu}");
    assert_eq!(bits(&cpu), bits(&mock));
}
