//! Collectives on mock communicators: every collective's values, the checks that refuse bad
//! calls, soft sync onto the collective stream, errors carried through a collective, and an
//! aborted communicator failing its collectives with a typed error while the VM lives on.

use std::sync::Arc;

use eagervm::ep::ccl::mock::MockBackend;
use eagervm::ep::ccl::{Collective, ReduceOp};
use eagervm::ep::mock::MockConfig;
use eagervm::ep::{DeviceId, StreamType};
use eagervm::vm::{Attrs, Config};
use eagervm::{Error, VirtualMachine};

const M0: DeviceId = DeviceId::mock(0);
const M1: DeviceId = DeviceId::mock(1);
const M2: DeviceId = DeviceId::mock(2);

fn vm(mocks: u16) -> VirtualMachine {
    VirtualMachine::new(Config::default().with_mock_devices(mocks, MockConfig::jittery())).expect("vm starts")
}

#[test]
fn every_collective_gives_the_reference_values() {
    let vm = vm(3);
    let comm = vm.mock_communicator("world", &[M0, M1, M2]).unwrap();
    assert_eq!(comm.world_size(), 3);
    assert_eq!(comm.stream(), vm.stream(M0, StreamType::Collective).unwrap());
    let xs: Vec<_> = [M0, M1, M2]
        .iter()
        .enumerate()
        .map(|(r, &d)| vm.from_slice(&[r as f32 + 1.0, -(r as f32), 10.0 * r as f32, 0.5], &[4], d).unwrap())
        .collect();
    let ins: Vec<_> = xs.iter().collect();
    let each = |c: Collective| -> Vec<Vec<f32>> {
        let outs = vm.run(|b| b.collective(&comm, c, &ins)).unwrap();
        outs.iter()
            .zip([M0, M1, M2])
            .map(|(t, d)| {
                assert_eq!(t.device(), d);
                t.to_vec::<f32>().unwrap()
            })
            .collect()
    };
    let all = |v: Vec<f32>| vec![v.clone(), v.clone(), v];
    assert_eq!(each(Collective::AllReduce(ReduceOp::Sum)), all(vec![6.0, -3.0, 30.0, 1.5]));
    assert_eq!(each(Collective::AllReduce(ReduceOp::Max)), all(vec![3.0, 0.0, 20.0, 0.5]));
    assert_eq!(each(Collective::AllReduce(ReduceOp::Min)), all(vec![1.0, -2.0, 0.0, 0.5]));
    assert_eq!(each(Collective::AllReduce(ReduceOp::Mean)), all(vec![2.0, -1.0, 10.0, 0.5]));
    assert_eq!(each(Collective::Broadcast { root: 1 }), all(vec![2.0, -1.0, 10.0, 0.5]));
    let gathered = each(Collective::AllGather);
    assert_eq!(gathered[2], [1.0, 0.0, 0.0, 0.5, 2.0, -1.0, 10.0, 0.5, 3.0, -2.0, 20.0, 0.5]);
    // reduce_scatter needs a first dimension divisible by 3.
    let ys: Vec<_> = [M0, M1, M2]
        .iter()
        .enumerate()
        .map(|(r, &d)| vm.from_slice(&[r as f32, 1.0, 2.0, 3.0, 4.0, 5.0], &[3, 2], d).unwrap())
        .collect();
    let yr: Vec<_> = ys.iter().collect();
    let outs = vm.run(|b| b.reduce_scatter(&comm, &yr, ReduceOp::Sum)).unwrap();
    assert_eq!(outs[0].shape(), [1, 2]);
    let got: Vec<_> = outs.iter().map(|t| t.to_vec::<f32>().unwrap()).collect();
    assert_eq!(got, [vec![3.0, 3.0], vec![6.0, 9.0], vec![12.0, 15.0]]);
    let tokens = vm.run(|b| b.barrier(&comm)).unwrap();
    for t in &tokens {
        assert_eq!(t.to_vec::<i64>().unwrap(), [3]);
    }
    assert_eq!(comm.issued(), 8);
    vm.sync().unwrap();
}

#[test]
fn inputs_made_on_the_compute_streams_reach_the_collective_stream() {
    // Long chains on each device's compute stream, then an all-reduce: without the sync
    // onto the collective stream it would read the inputs before the chains end.
    let vm = VirtualMachine::new(Config::default().with_mock_devices(
        2,
        MockConfig { launch_delay: std::time::Duration::from_micros(200), ..MockConfig::jittery() },
    ))
    .unwrap();
    let comm = vm.mock_communicator("w", &[M0, M1]).unwrap();
    let scale = vm.op("scale").unwrap();
    let outs = vm
        .run(|b| -> eagervm::Result<_> {
            let mut xs = Vec::new();
            for d in [M0, M1] {
                let mut x = vm.from_slice(&[1.0f32; 8], &[8], d)?;
                for _ in 0..20 {
                    x = b.call(scale, &[&x], Attrs::scalar(2.0), vm.compute_stream(d)?)?;
                }
                xs.push(x);
            }
            let refs: Vec<_> = xs.iter().collect();
            let summed = b.all_reduce(&comm, &refs, ReduceOp::Sum)?;
            // And back onto a compute stream.
            let y = b.call(scale, &[&summed[1]], Attrs::scalar(0.5), vm.compute_stream(M1)?)?;
            Ok((summed, y))
        })
        .unwrap();
    let want = 2.0 * (1u64 << 20) as f32;
    assert_eq!(outs.0[0].to_vec::<f32>().unwrap(), vec![want; 8]);
    assert_eq!(outs.1.to_vec::<f32>().unwrap(), vec![want / 2.0; 8]);
}

#[test]
fn bad_calls_are_refused_with_typed_errors() {
    let vm = vm(3);
    let comm = vm.mock_communicator("world", &[M0, M1]).unwrap();
    let a = vm.from_slice(&[1.0f32; 4], &[4], M0).unwrap();
    let b1 = vm.from_slice(&[1.0f32; 4], &[4], M1).unwrap();
    let wrong_shape = vm.from_slice(&[1.0f32; 2], &[2], M1).unwrap();
    let wrong_device = vm.from_slice(&[1.0f32; 4], &[4], M2).unwrap();
    let ints = vm.from_slice(&[1i64; 4], &[4], M1).unwrap();
    let ai = vm.from_slice(&[1i64; 4], &[4], M0).unwrap();
    vm.run(|b| {
        let refused = |r: eagervm::Result<Vec<eagervm::framework::Tensor>>| match r {
            Err(Error::InvalidOperands { op, detail }) => format!("{op}: {detail}"),
            other => panic!("expected a refusal, got {other:?}"),
        };
        assert!(refused(b.all_reduce(&comm, &[&a], ReduceOp::Sum)).contains("2 local member(s)"));
        assert!(refused(b.all_reduce(&comm, &[&a, &wrong_shape], ReduceOp::Sum))
            .contains("every member's must match"));
        assert!(refused(b.all_reduce(&comm, &[&a, &wrong_device], ReduceOp::Sum)).contains("member 1"));
        assert!(refused(b.all_reduce(&comm, &[&a, &ints], ReduceOp::Sum)).contains("must match"));
        assert!(refused(b.all_reduce(&comm, &[&ai, &ints], ReduceOp::Mean)).contains("mean of i64"));
        let (o0, o1) =
            (vm.from_slice(&[1.0f32; 3], &[3], M0).unwrap(), vm.from_slice(&[1.0f32; 3], &[3], M1).unwrap());
        assert!(refused(b.reduce_scatter(&comm, &[&o0, &o1], ReduceOp::Sum)).contains("divisible by 2"));
        assert!(matches!(b.broadcast(&comm, &[&a, &b1], 2), Err(Error::Collective { .. })));
    });
    assert_eq!(comm.issued(), 0, "refused calls issue nothing");
    // Names: unique per VM, no `@`; devices must exist.
    assert!(matches!(vm.mock_communicator("world", &[M0]), Err(Error::Collective { .. })));
    assert!(matches!(vm.mock_communicator("a@b", &[M0]), Err(Error::Collective { .. })));
    assert!(matches!(vm.mock_communicator("far", &[DeviceId::mock(7)]), Err(Error::Collective { .. })));
    // A communicator of another VM.
    let other = self::vm(2);
    let foreign = other.mock_communicator("world", &[M0, M1]).unwrap();
    let r = vm.run(|b| b.all_reduce(&foreign, &[&a, &b1], ReduceOp::Sum));
    assert!(matches!(r, Err(Error::Collective { .. })), "{r:?}");
}

#[test]
fn a_failed_input_fails_the_collective_and_aborts_the_communicator() {
    let vm = vm(2);
    let comm = vm.mock_communicator("world", &[M0, M1]).unwrap();
    let fail = vm.op("fail").unwrap();
    let a = vm.from_slice(&[1.0f32; 4], &[4], M0).unwrap();
    let b1 = vm.from_slice(&[1.0f32; 4], &[4], M1).unwrap();
    let outs = vm
        .run(|b| -> eagervm::Result<_> {
            let bad = vm.empty(&[4], eagervm::framework::DType::F32, M1)?;
            b.call_into(fail, &[&b1], &[&bad], Attrs::scalar(7.0), vm.compute_stream(M1)?)?;
            let first = b.all_reduce(&comm, &[&a, &bad], ReduceOp::Sum)?;
            let second = b.all_reduce(&comm, &[&a, &b1], ReduceOp::Sum)?;
            Ok((first, second))
        })
        .unwrap();
    // The failure is carried onto the collective's outputs ...
    match outs.0[0].to_vec::<f32>() {
        Err(Error::Kernel { op, .. }) => assert_eq!(op, "fail"),
        other => panic!("{other:?}"),
    }
    // ... and the communicator is aborted, since this rank skipped a collective its peers
    // ran: the next one fails at once instead of pairing with the wrong peer call.
    match outs.1[1].to_vec::<f32>() {
        Err(Error::Kernel { op, message, .. }) => {
            assert_eq!(op, "all_reduce.sum@world");
            assert!(message.contains("aborted") && message.contains("collective #0"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert!(comm.aborted().is_some());
    // The VM lives on.
    let c = vm.from_slice(&[2.0f32], &[1], M0).unwrap();
    assert_eq!(c.to_vec::<f32>().unwrap(), [2.0]);
}

#[test]
fn aborting_a_hung_collective_fails_it_and_the_vm_lives_on() {
    let vm = vm(2);
    let backend = Arc::new(MockBackend::new(&[M0, M1]).unwrap().hang_at(1));
    let comm = vm.communicator("hangs", backend).unwrap();
    let a = vm.from_slice(&[1.0f32; 4], &[4], M0).unwrap();
    let b1 = vm.from_slice(&[2.0f32; 4], &[4], M1).unwrap();
    let ok = vm.run(|b| b.all_reduce(&comm, &[&a, &b1], ReduceOp::Sum)).unwrap();
    assert_eq!(ok[0].to_vec::<f32>().unwrap(), [3.0; 4]);
    let hung = vm.run(|b| b.all_reduce(&comm, &[&a, &b1], ReduceOp::Sum)).unwrap();
    // It waits for a peer that never comes; work on other streams goes on.
    let c = vm.from_slice(&[5.0f32], &[1], M1).unwrap();
    assert_eq!(c.to_vec::<f32>().unwrap(), [5.0]);
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert!(vm.in_flight() > 0);
    comm.abort("test: peer lost");
    match hung[0].to_vec::<f32>() {
        Err(Error::Kernel { message, .. }) => assert!(message.contains("peer lost"), "{message}"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(vm.sync(), Err(Error::Failed { .. })));
    vm.sync().unwrap();
}
