//! The NCCL backend. Without libnccl or a GPU, making a communicator is a typed
//! `Unavailable` error (always checked here). The tests that need a GPU are
//! `#[ignore = "needs a GPU"]`: `cargo test --release --test integration nccl:: -- --ignored`
//! runs them where there is one, with libnccl (`libnccl.so.2` on the loader's path, or
//! `EAGERVM_NCCL_LIB` naming it); each fails, saying why, where there is none.

use std::sync::Arc;
use std::time::Duration;

use eagervm::ep::ccl::nccl::{NcclBackend, ENV_NCCL_LIB};
use eagervm::ep::ccl::store::{Rendezvous, Store};
use eagervm::ep::ccl::{CclError, Collective, ReduceOp};
use eagervm::prelude::*;

const NO_NCCL: &str = "libeagervm-no-such-nccl.so.2";

/// In a child process whose environment names an NCCL library that does not exist (the
/// library is loaded once per process).
#[test]
fn absent_nccl_is_a_typed_error() {
    let name = "absent_nccl_is_a_typed_error";
    if !crate::common::alone(module_path!(), name, &[(ENV_NCCL_LIB, NO_NCCL)]) {
        return;
    }
    for r in [NcclBackend::local(&[0]), NcclBackend::from_env("world", Duration::from_millis(10))] {
        match r {
            Err(CclError::Unavailable { backend: "nccl", why }) => {
                assert!(why.contains(NO_NCCL), "{why}");
            }
            Err(e) => panic!("expected Unavailable, got {e:?}"),
            Ok(_) => panic!("an NCCL communicator was made without libnccl"),
        }
    }
    assert!(eagervm::ep::ccl::nccl::probe().is_err());
}

fn one_rank() -> NcclBackend {
    match NcclBackend::local(&[0]) {
        Ok(b) => b,
        Err(e) => panic!("this test needs a GPU (cuda:0) and libnccl: {e}"),
    }
}

/// Every collective on a one-rank communicator over `cuda:0`, through the VM: each
/// returns its input (the reduction, gather, scatter over one rank), the barrier's token is
/// 1, and an aborted communicator fails its next collective with a typed error while the
/// VM lives on.
fn every_collective(vm: &VirtualMachine, backend: NcclBackend) {
    let g = DeviceId::cuda(0);
    let comm = vm.communicator("world", Arc::new(backend)).unwrap();
    assert_eq!(comm.backend(), "nccl");
    let x = vm.from_slice(&[1.0f32, -2.0, 3.5, 0.25], &[4], g).unwrap();
    let xi = vm.from_slice(&[7i64, -9, 1 << 40, 0], &[4], g).unwrap();
    let want = [1.0f32, -2.0, 3.5, 0.25];
    let ops = [
        Collective::AllReduce(ReduceOp::Sum),
        Collective::AllReduce(ReduceOp::Max),
        Collective::AllReduce(ReduceOp::Min),
        Collective::AllReduce(ReduceOp::Mean),
        Collective::Broadcast { root: 0 },
        Collective::AllGather,
        Collective::ReduceScatter(ReduceOp::Sum),
        Collective::ReduceScatter(ReduceOp::Mean),
    ];
    for c in ops {
        let out = vm.run(|b| b.collective(&comm, c, &[&x])).unwrap();
        assert_eq!(out[0].to_vec::<f32>().unwrap(), want, "{c:?}");
        assert_eq!(out[0].device(), g);
    }
    for c in [Collective::AllReduce(ReduceOp::Sum), Collective::AllGather, Collective::Broadcast { root: 0 }]
    {
        let out = vm.run(|b| b.collective(&comm, c, &[&xi])).unwrap();
        assert_eq!(out[0].to_vec::<i64>().unwrap(), [7, -9, 1 << 40, 0], "{c:?}");
    }
    let token = vm.run(|b| b.barrier(&comm)).unwrap();
    assert_eq!(token[0].to_vec::<i64>().unwrap(), [1]);
    vm.sync().unwrap();
    comm.abort("by the test");
    assert_eq!(comm.aborted().as_deref(), Some("by the test"));
    let out = vm.run(|b| b.all_reduce(&comm, &[&x], ReduceOp::Sum)).unwrap();
    match out[0].to_vec::<f32>() {
        Err(Error::Kernel { message, .. }) => assert!(message.contains("aborted"), "{message}"),
        other => panic!("{other:?}"),
    }
    let _ = vm.sync();
    assert_eq!(x.to_vec::<f32>().unwrap(), want);
}

#[test]
#[ignore = "needs a GPU"]
fn every_collective_on_one_gpu() {
    let vm = VirtualMachine::new(Config::default().with_cuda_devices(1)).unwrap();
    every_collective(&vm, one_rank());
}

/// The torchrun path with one rank: the store served on a free port, the unique id put and
/// taken through it, `ncclCommInitRank` on `cuda:0`.
#[test]
#[ignore = "needs a GPU"]
fn every_collective_through_the_rendezvous() {
    let store = Store::serve("127.0.0.1:0").unwrap();
    let port = store.local_addr().unwrap().port();
    let rdv = Rendezvous {
        world_size: 1,
        rank: 0,
        local_rank: 0,
        master_addr: "127.0.0.1".into(),
        master_port: port,
    };
    let backend = NcclBackend::from_rendezvous(&rdv, &store, "world", None, Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("this test needs a GPU (cuda:0) and libnccl: {e}"));
    assert_eq!(store.get("nccl/world/id", Duration::ZERO).unwrap().len(), 128);
    let vm = VirtualMachine::new(Config::default().with_cuda_devices(1)).unwrap();
    every_collective(&vm, backend);
}
