//! `mlp-dp`, data-parallel training on mock communicators: its loss curve against the
//! one-rank MLP on the global batch, the replicas staying equal, and its gradient
//! all-reduces overlapping the backward pass on the timeline.

use std::time::Duration;

use eagervm::ep::mock::MockConfig;
use eagervm::ep::DeviceId;
use eagervm::programs::mlp_dp::{collective_overlap, max_rel_diff, mock_devices, LOSS_REL_TOLERANCE};
use eagervm::programs::{mlp, mlp_dp, MlpDpOptions, MlpOptions};
use eagervm::vm::Config;
use eagervm::{Error, VirtualMachine};

fn vm(ranks: usize, mock: MockConfig) -> VirtualMachine {
    VirtualMachine::new(Config::default().with_mock_devices(ranks as u16, mock)).expect("vm starts")
}

/// The one-rank loss curve on the global batch (on a mock device, as the ranks are).
fn one_rank(opts: &MlpOptions) -> Vec<f32> {
    let vm = vm(1, MockConfig::jittery());
    mlp(&vm, &MlpOptions { device: DeviceId::mock(0), ..opts.clone() }).unwrap().losses
}

fn dp(ranks: usize, opts: &MlpDpOptions, mock: MockConfig) -> eagervm::programs::MlpDpReport {
    let vm = vm(ranks, mock);
    let comm = vm.mock_communicator("dp", &mock_devices(ranks)).unwrap();
    let r = mlp_dp(&vm, &comm, opts).unwrap();
    vm.sync().unwrap();
    r
}

#[test]
fn one_rank_is_the_mlp_bit_for_bit() {
    let opts = MlpDpOptions::default();
    let r = dp(1, &opts, MockConfig::jittery());
    assert!(r.ok(), "{r}");
    assert_eq!(r.losses, one_rank(&opts.mlp), "a world of one is the plain MLP");
}

#[test]
fn loss_curves_match_one_rank_on_the_global_batch() {
    let opts = MlpDpOptions::default();
    let want = one_rank(&opts.mlp);
    for ranks in [2, 3, 4] {
        let r = dp(ranks, &opts, MockConfig::jittery());
        assert!(r.ok(), "{r}");
        assert_eq!(r.world_size, ranks);
        assert_eq!(r.shards.iter().sum::<usize>(), opts.mlp.samples);
        assert_eq!(r.losses.len(), opts.mlp.steps);
        let rel = max_rel_diff(&r.losses, &want);
        assert!(rel <= LOSS_REL_TOLERANCE, "{ranks} ranks: largest relative difference {rel:e}\n{r}");
        // Not trivially equal: the shards' sums are split differently.
        assert!(rel > 0.0 || ranks == 1);
    }
}

#[test]
fn the_loss_curve_depends_on_the_whole_batch() {
    // A control for the test above: a rank training alone on its shard (no reduction)
    // follows another curve, far outside the tolerance.
    let mut opts = MlpDpOptions::default();
    let want = one_rank(&opts.mlp);
    opts.mlp.samples /= 2;
    let half = one_rank(&opts.mlp);
    assert!(max_rel_diff(&half, &want) > 100.0 * LOSS_REL_TOLERANCE);
}

#[test]
fn overlap_changes_the_timing_not_the_results() {
    let on = dp(2, &MlpDpOptions::default(), MockConfig::jittery());
    let off = dp(2, &MlpDpOptions { overlap: false, ..MlpDpOptions::default() }, MockConfig::jittery());
    assert!(on.overlap && !off.overlap);
    assert_eq!(on.losses, off.losses, "the same collectives in the same order");
}

#[test]
fn a_batch_smaller_than_the_world_is_refused() {
    let vm = vm(4, MockConfig::default());
    let comm = vm.mock_communicator("dp", &mock_devices(4)).unwrap();
    let mut opts = MlpDpOptions::default();
    opts.mlp.samples = 3;
    let r = mlp_dp(&vm, &comm, &opts);
    assert!(matches!(r, Err(Error::Config(_))), "{r:?}");
    assert_eq!(comm.issued(), 0);
}

/// Profile `ranks`-rank training on mock devices whose launches take `delay`, and measure
/// the overlap of the all-reduces with the backward pass.
fn overlap_of(ranks: usize, overlap: bool, delay: Duration) -> eagervm::programs::mlp_dp::Overlap {
    let vm = vm(ranks, MockConfig { launch_delay: delay, ..MockConfig::default() });
    let devices = mock_devices(ranks);
    let comm = vm.mock_communicator("dp", &devices).unwrap();
    let mut opts = MlpDpOptions { overlap, ..MlpDpOptions::default() };
    opts.mlp.steps = 8;
    vm.start_profiling().unwrap();
    let r = mlp_dp(&vm, &comm, &opts).unwrap();
    let profile = vm.stop_profiling().unwrap();
    assert!(r.replicas_agree, "{r}");
    let compute: Vec<_> = devices.iter().map(|&d| vm.compute_stream(d).unwrap()).collect();
    let o = collective_overlap(&profile, comm.stream(), &compute);
    assert!(o.collective_busy > Duration::ZERO, "{o}");
    o
}

#[test]
fn gradient_all_reduces_overlap_the_backward_pass_on_the_timeline() {
    let delay = Duration::from_micros(300);
    for ranks in [2, 4] {
        let o = overlap_of(ranks, true, delay);
        // Per step, the loss's reduction is followed by the backward pass of layer 2, the
        // second all-reduce of layer 2's bucket by the backward pass of layer 1 (the first is
        // followed by the second at once), and the last of layer 1's by the update and the
        // next forward pass: 3 candidates a step.
        assert_eq!(o.candidates, 3 * 8, "{ranks} ranks: {o}");
        eprintln!("{ranks} ranks, overlap: {o}");
        assert!(o.overlapped * 4 >= o.candidates * 3, "{ranks} ranks: {o}");
        assert!(o.overlapped_time * 4 >= o.collective_busy, "{ranks} ranks: {o}");
    }
    // With every bucket after the backward pass, no gradient's reduction is followed by
    // backward work: only the loss's and the last gradient's have work after them.
    let o = overlap_of(2, false, delay);
    assert_eq!(o.candidates, 2 * 8, "{o}");
    eprintln!("without overlap: {o}");
}
