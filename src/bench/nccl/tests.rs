use super::*;
use crate::ep::mock::MockConfig;

#[test]
fn sizes_go_up_by_four_from_4_b_to_64_mib() {
    let s = sizes(4, 64 << 20);
    assert_eq!(s.len(), 13);
    assert_eq!((s[0], s[12]), (4, 64 << 20));
    assert!(s.windows(2).all(|w| w[1] == 4 * w[0]));
    // Whole f32s, at least one; an empty range; no overflow at the top.
    assert_eq!(sizes(5, 100), vec![8, 32]);
    assert_eq!(sizes(0, 4), vec![4]);
    assert!(sizes(4, 0).is_empty());
    assert_eq!(sizes(usize::MAX / 8 * 4, usize::MAX).len(), 1);
}

#[test]
fn iterations_move_256_mib_per_round_within_bounds() {
    assert_eq!(iterations(4), 2000);
    assert_eq!(iterations(1 << 20), 256);
    assert_eq!(iterations(64 << 20), 5);
}

#[test]
fn bandwidths_follow_nccl_tests() {
    let t = Duration::from_millis(500);
    assert_eq!(alg_bandwidth(1_000_000_000, t), 2.0);
    assert_eq!(bus_bandwidth(1_000_000_000, t, 1), 0.0);
    assert_eq!(bus_bandwidth(1_000_000_000, t, 2), 2.0);
    assert_eq!(bus_bandwidth(1_000_000_000, t, 4), 3.0);
    assert_eq!(bus_bandwidth(1_000_000_000, t, 8), 3.5);
}

#[test]
fn options_come_from_the_environment_strictly() {
    let none = |_: &str| None;
    assert_eq!(NcclBenchOptions::from_vars(none).unwrap(), NcclBenchOptions::default());
    let set = |n: &str| match n {
        "EAGERVM_NCCL_MAX_BYTES" => Some("1024".to_string()),
        "EAGERVM_NCCL_ROUNDS" => Some(" 3".to_string()),
        "EAGERVM_NCCL_DP_STEPS" => Some("0".to_string()),
        _ => None,
    };
    let o = NcclBenchOptions::from_vars(set).unwrap();
    assert_eq!((o.max_bytes, o.rounds, o.dp_steps), (1024, 3, 0));
    let bad = |n: &str| (n == "EAGERVM_NCCL_DP_STEPS").then(|| "many".to_string());
    let e = NcclBenchOptions::from_vars(bad).unwrap_err().to_string();
    assert!(e.starts_with("EAGERVM_NCCL_DP_STEPS=\"many\""), "{e}");
    let zero = |n: &str| (n == "EAGERVM_NCCL_ROUNDS").then(|| "0".to_string());
    assert!(NcclBenchOptions::from_vars(zero).is_err());
}

#[test]
fn the_skip_reason_names_everything_missing() {
    assert_eq!(skip_reason(Ok(()), Ok(22703)), None);
    assert_eq!(skip_reason(Err("no driver".into()), Ok(22703)).unwrap(), "no CUDA device (no driver)");
    assert_eq!(skip_reason(Ok(()), Err("no lib".into())).unwrap(), "no NCCL library (no lib)");
    assert_eq!(
        skip_reason(Err("a".into()), Err("b".into())).unwrap(),
        "no CUDA device (a); no NCCL library (b)"
    );
}

/// Here (no GPU or no libnccl) the report says which is missing and has no figures; where
/// both are, it has every figure.
#[test]
fn without_a_gpu_or_libnccl_the_report_says_why() {
    let opts = NcclBenchOptions { min_bytes: 4, max_bytes: 64, rounds: 1, dp_steps: 2, dp_reps: 1 };
    let r = run(&opts, &Config::default()).unwrap();
    let gpu = crate::ep::cuda::available(0);
    #[cfg(feature = "cuda")]
    let nccl = crate::ep::ccl::nccl::probe().is_ok();
    #[cfg(not(feature = "cuda"))]
    let nccl = false;
    match (&r.skipped, gpu.is_ok() && nccl) {
        (Some(why), false) => {
            if let Err(e) = &gpu {
                assert!(why.starts_with(&format!("no CUDA device ({e})")), "{why}");
            }
            assert_eq!(why.contains("no NCCL library"), !nccl, "{why}");
            assert!(r.to_string().starts_with("nccl benchmarks skipped: no "), "{r}");
            assert!(r.sizes.is_empty() && r.dp.is_none());
            let json = serde_json::to_value(&r).unwrap();
            assert_eq!(json["skipped"], serde_json::json!(why));
        }
        (None, true) => {
            assert_eq!(r.ranks, 1);
            assert_eq!(r.sizes.iter().map(|s| s.bytes).collect::<Vec<_>>(), [4, 16, 64]);
            assert!(r.sizes.iter().all(|s| s.direct_us > 0.0 && s.vm_us > 0.0 && s.ratio > 0.0));
            assert!(r.dp.is_some_and(|d| d.one_rank_ms > 0.0 && d.max_rel_diff <= LOSS_REL_TOLERANCE));
        }
        (skipped, usable) => panic!("skipped: {skipped:?}, but a GPU and libnccl usable: {usable}"),
    }
}

/// The all-reduce made on the host: a one-rank sum is a copy.
struct HostCopy {
    data: Vec<f32>,
    out: Vec<f32>,
    /// Give a wrong result, to check that the comparison notices.
    wrong: bool,
}

impl Reference for HostCopy {
    fn prepare(&mut self, data: &[f32]) -> Result<(), NcclBenchError> {
        self.data = data.to_vec();
        self.out = vec![0.0; data.len()];
        Ok(())
    }
    fn run(&mut self, iters: usize) -> Result<(), NcclBenchError> {
        for _ in 0..iters {
            self.out.copy_from_slice(std::hint::black_box(&self.data));
        }
        if self.wrong {
            self.out[0] += 1.0;
        }
        Ok(())
    }
    fn result(&mut self) -> Result<Vec<f32>, NcclBenchError> {
        Ok(self.out.clone())
    }
}

fn mock_vm() -> (VirtualMachine, Communicator) {
    let vm = VirtualMachine::new(Config::default().with_mock_devices(1, MockConfig::default())).unwrap();
    let comm = vm.mock_communicator("one", &[DeviceId::mock(0)]).unwrap();
    (vm, comm)
}

/// The measurement loop, on a one-rank mock communicator against a host copy: a row per
/// size with every figure, and a reference that computes something else is caught.
#[test]
fn the_size_table_times_every_side_and_checks_the_results() {
    let (vm, comm) = mock_vm();
    let mut host = HostCopy { data: Vec::new(), out: Vec::new(), wrong: false };
    let rows = measure_sizes(&vm, &comm, DeviceId::mock(0), &[4, 1 << 20], 1, &mut host).unwrap();
    assert_eq!(rows.iter().map(|r| (r.bytes, r.iters)).collect::<Vec<_>>(), [(4, 2000), (1 << 20, 256)]);
    for r in &rows {
        assert!(r.direct_us > 0.0 && r.vm_us > 0.0 && r.vm_into_us > 0.0, "{r:?}");
        assert!((r.overhead_us - (r.vm_us - r.direct_us)).abs() < 1e-9);
        assert!((r.ratio - r.vm_us / r.direct_us).abs() < 1e-9 * r.ratio);
        assert!(r.ratio_range[0] <= r.ratio_range[1] && r.ratio_range[0] > 0.0);
        assert!((r.vm_gbs - r.bytes as f64 / r.vm_us / 1e3).abs() < 1e-9 * r.vm_gbs.max(1.0));
    }
    host.wrong = true;
    match measure_sizes(&vm, &comm, DeviceId::mock(0), &[16], 1, &mut host) {
        Err(NcclBenchError::Mismatch { bytes: 16, what }) => assert!(what.contains("direct"), "{what}"),
        other => panic!("expected a mismatch, got {other:?}"),
    }
    vm.sync().unwrap();
}

/// The data-parallel comparison on a one-rank mock communicator: the same losses as one
/// rank, and a time per step for each kind.
#[test]
fn the_dp_step_is_timed_against_one_rank() {
    let (vm, comm) = mock_vm();
    let d = dp_step(&vm, &comm, DeviceId::mock(0), 4, 2).unwrap();
    assert_eq!((d.steps, d.reps), (4, 2));
    assert!(d.one_rank_ms > 0.0 && d.overlapped_ms > 0.0 && d.after_backward_ms > 0.0, "{d:?}");
    assert!(d.max_rel_diff <= LOSS_REL_TOLERANCE, "{d:?}");
}

#[test]
fn the_report_reads_as_a_table() {
    let row = SizeRow {
        bytes: 1 << 20,
        iters: 256,
        direct_us: 10.0,
        vm_us: 15.0,
        vm_into_us: 14.0,
        overhead_us: 5.0,
        direct_gbs: 104.8576,
        vm_gbs: 69.905,
        ratio: 1.5,
        ratio_range: [1.4, 1.6],
    };
    let mut r = NcclBenchReport {
        skipped: None,
        nccl_version: Some(22703),
        ranks: 1,
        device: "cuda:0".into(),
        sizes: vec![row],
        dp: Some(DpStep {
            steps: 60,
            reps: 5,
            one_rank_ms: 0.5,
            overlapped_ms: 0.75,
            after_backward_ms: 1.0,
            max_rel_diff: 0.0,
        }),
    };
    let text = r.to_string();
    assert!(text.contains("NCCL 2.27.3"), "{text}");
    assert!(text.contains("1048576    256       10.0       15.0       14.0"), "{text}");
    assert!(text.contains("1.50  1.40–1.60"), "{text}");
    assert!(text.contains("bus bandwidth 2(n-1)/n x alg is 0"), "{text}");
    assert!(text.contains("(1.50x)") && text.contains("(2.00x)"), "{text}");
    assert!(!text.contains("vm bus GB/s"));
    r.ranks = 2;
    let text = r.to_string();
    assert!(text.contains("vm bus GB/s") && !text.contains("is 0"), "{text}");
}
