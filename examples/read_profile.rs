//! Profile a run and read the profile from code: each instruction's times on its stream,
//! per-stream busy time, and the per-op table (the time each stream spent on each op); the
//! profile is also written as a Chrome/Perfetto timeline.
//!
//! ```sh
//! cargo run --release --example read_profile
//! ```

use std::time::Duration;

use eagervm::ep::mock::MockConfig;
use eagervm::prelude::*;
use eagervm::profile::Profile;

/// Chunks copied in, computed on, and copied out (the copies overlap the compute), profiled:
/// the profile and the sums.
fn profiled_run(vm: &VirtualMachine) -> Result<(Profile, Vec<Array>), Box<dyn std::error::Error>> {
    let cx = Context::new(vm);
    let gpu = DeviceId::mock(0);
    vm.start_profiling()?;
    let w = cx.full(&[64, 64], 0.01, DType::F32, gpu)?;
    let mut sums = Vec::new();
    for i in 0..16 {
        let chunk = cx.full(&[64, 64], i as f64, DType::F32, DeviceId::CPU)?.to(gpu)?;
        sums.push(chunk.matmul(&w)?.relu()?.sum_rows()?.to(DeviceId::CPU)?);
    }
    for s in &sums {
        s.wait()?;
    }
    Ok((vm.stop_profiling()?, sums))
}

/// Per op and stream: count, and the time the stream spent on those instructions alone
/// ([`Profile::op_table`]). An instruction on a device is launched ahead of the device and
/// waits in its queue behind earlier work; that wait is not its time (summing each one's
/// launch-to-done time would count the queue again for every instruction in it, and give an
/// op more time than the run lasted). So each stream's rows add up to its busy time, which
/// lies within the span.
fn op_rows(profile: &Profile) -> Vec<(&'static str, String, usize, Duration)> {
    profile.op_table().rows.into_iter().map(|r| (r.name, r.stream_name, r.count, r.total)).collect()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let vm = VirtualMachine::new(Config::default().with_mock_devices(1, MockConfig::default()))?;
    let (profile, sums) = profiled_run(&vm)?;

    let rows = op_rows(&profile);
    println!("{:<16} {:<16} {:>6} {:>12}", "op", "stream", "count", "total µs");
    for (name, stream, count, time) in &rows {
        println!("{name:<16} {stream:<16} {count:>6} {:>12.1}", time.as_secs_f64() * 1e6);
    }
    // Per stream: busy time (streams that ran nothing are named on the last line).
    println!("{}", profile.summary());
    let path = std::env::temp_dir().join(format!("eagervm-example-{}.json", std::process::id()));
    profile.write_chrome_json(&path)?;
    println!("timeline written to {} (open it in ui.perfetto.dev)", path.display());
    std::fs::remove_file(&path)?;

    // Checks: 16 products and 32 copies in (W's fill is on the device) and out were seen,
    // each done after it was dispatched; every op's time on a stream lies within the span;
    // the values are right.
    let count = |op: &str| rows.iter().filter(|r| r.0 == op).map(|r| r.2).sum::<usize>();
    let ordered = profile.instructions().iter().all(|s| s.queued <= s.dispatched && s.dispatched <= s.done);
    let span = profile.summary().span;
    let within = rows.iter().all(|r| r.3 <= span);
    let first = sums[1].to_vec::<f32>()?; // every row of chunk 1 is 1; x W sums 64 x 0.01
    let want = 64.0 * 64.0 * 0.01;
    vm.sync()?;
    if count("matmul") != 16 || count("copy") < 32 || !ordered || !within || (first[0] - want).abs() > 1e-3 {
        eprintln!(
            "unexpected profile or values: {rows:?}, ordered {ordered}, span {span:?}, {} != {want}",
            first[0]
        );
        std::process::exit(1);
    }
    println!("ok");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_streams_op_times_add_up_within_the_span() {
        let vm = VirtualMachine::new(Config::default().with_mock_devices(1, MockConfig::default())).unwrap();
        let (profile, _) = profiled_run(&vm).unwrap();
        let summary = profile.summary();
        let rows = op_rows(&profile);
        assert!(rows.iter().any(|r| r.0 == "Release"), "{rows:?}");
        for s in &summary.streams {
            let total: Duration = rows.iter().filter(|r| r.1 == s.name).map(|r| r.3).sum();
            assert!(
                total <= summary.span,
                "{}: {total:?} of ops in a span of {:?}: {rows:?}",
                s.name,
                summary.span
            );
        }
    }
}
