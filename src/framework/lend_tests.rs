//! Loans of a tensor's storage (`Tensor::lend_host`) and tensors over foreign memory
//! (`VirtualMachine::from_host_memory`): the Rust side of the zero-copy DLPack exchange.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::ep::mock::MockConfig;
use crate::prelude::*;

/// Counts its drops.
struct Owner(Arc<AtomicUsize>);
impl Drop for Owner {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn f32s(p: *mut u8, n: usize) -> Vec<f32> {
    // SAFETY: every caller passes a loan's pointer or a live buffer of at least `n` f32s,
    // which no instruction writes at that moment.
    unsafe { std::slice::from_raw_parts(p.cast::<f32>(), n) }.to_vec()
}

#[test]
fn a_loan_sees_the_final_value_and_outlives_the_tensor_and_the_vm() {
    let vm = VirtualMachine::new(Config::default()).unwrap();
    let cpu = vm.compute_stream(DeviceId::CPU).unwrap();
    let x = vm.from_slice(&[1.0f32, -2.0, 3.0], &[3], DeviceId::CPU).unwrap();
    let relu = vm.op("relu").unwrap();
    let y = vm.run(|b| b.call(relu, &[&x], Attrs::default(), cpu)).unwrap();
    let loan = y.lend_host().unwrap();
    assert_eq!(loan.len(), 12);
    assert_eq!(f32s(loan.as_ptr(), 3), [1.0, 0.0, 3.0]);
    // The loan is of the tensor's own storage: a later in-place write shows through it.
    let scale = vm.op("scale").unwrap();
    vm.run(|b| b.call_into(scale, &[&x], &[&y], Attrs::scalar(2.0), cpu)).unwrap();
    y.wait().unwrap();
    assert_eq!(f32s(loan.as_ptr(), 3), [2.0, -4.0, 6.0]);
    drop((x, y));
    vm.sync().unwrap();
    drop(vm);
    assert_eq!(f32s(loan.as_ptr(), 3), [2.0, -4.0, 6.0], "kept after the release and the VM");
}

#[test]
fn an_explicit_release_waits_for_the_loan() {
    let vm = VirtualMachine::new(Config::default()).unwrap();
    let a = vm.from_slice(&[5.0f32; 64], &[64], DeviceId::CPU).unwrap();
    let loan = a.lend_host().unwrap();
    // `Array::release`'s path: a `Release` while the handle lives on.
    a.release_now().unwrap();
    vm.sync().unwrap();
    // A new tensor of the same size must get another block.
    let b = vm.from_slice(&[7.0f32; 64], &[64], DeviceId::CPU).unwrap();
    let other = b.lend_host().unwrap();
    assert_ne!(other.as_ptr(), loan.as_ptr());
    assert_eq!(f32s(loan.as_ptr(), 64), vec![5.0; 64]);
}

#[test]
fn a_device_tensor_lends_a_host_copy_and_an_unwritten_one_is_an_error() {
    let vm = VirtualMachine::new(Config::default().with_mock_devices(1, MockConfig::jittery())).unwrap();
    let x = vm.from_slice(&[4i64, 5, 6], &[3], DeviceId::mock(0)).unwrap();
    let loan = x.lend_host().unwrap();
    // SAFETY: the loan holds 3 i64s that nothing writes.
    assert_eq!(unsafe { std::slice::from_raw_parts(loan.as_ptr().cast::<i64>(), 3) }, [4, 5, 6]);
    let e = vm.empty(&[2], DType::F32, DeviceId::CPU).unwrap();
    assert!(matches!(e.lend_host(), Err(Error::Uninitialized { .. })), "{:?}", e.lend_host());
    let z = vm.from_slice::<f32>(&[], &[0, 3], DeviceId::CPU).unwrap();
    assert!(z.lend_host().unwrap().is_empty());
}

#[test]
fn foreign_memory_is_read_and_written_in_place_and_its_owner_dropped_once() {
    let vm = VirtualMachine::new(Config::default()).unwrap();
    let cpu = vm.compute_stream(DeviceId::CPU).unwrap();
    let drops = Arc::new(AtomicUsize::new(0));
    let mut mem = vec![1.0f32, -1.0, 2.0, -2.0];
    let ptr = NonNull::new(mem.as_mut_ptr().cast::<u8>()).unwrap();
    // SAFETY: `mem` outlives the VM (dropped last) and is not touched while the VM may use
    // it: it is read only after waits below.
    let t = unsafe { vm.from_host_memory(ptr, &[4], DType::F32, Box::new(Owner(drops.clone()))) }.unwrap();
    let (relu, scale) = (vm.op("relu").unwrap(), vm.op("scale").unwrap());
    let r = vm.run(|b| b.call(relu, &[&t], Attrs::default(), cpu)).unwrap();
    assert_eq!(r.to_vec::<f32>().unwrap(), [1.0, 0.0, 2.0, 0.0]);
    vm.run(|b| b.call_into(scale, &[&r], &[&t], Attrs::scalar(3.0), cpu)).unwrap();
    t.wait().unwrap();
    assert_eq!(f32s(ptr.as_ptr(), 4), [3.0, 0.0, 6.0, 0.0], "the VM wrote the foreign memory");
    // A loan of it keeps the owner past the tensor's release.
    let loan = t.lend_host().unwrap();
    assert_eq!(loan.as_ptr(), ptr.as_ptr());
    drop(t);
    vm.sync().unwrap();
    assert_eq!(drops.load(Ordering::SeqCst), 0, "lent");
    drop(loan);
    assert_eq!(drops.load(Ordering::SeqCst), 1);
    // Never used: freed with its last handle. Misaligned: refused, owner dropped.
    // SAFETY: as above.
    let u = unsafe { vm.from_host_memory(ptr, &[4], DType::F32, Box::new(Owner(drops.clone()))) }.unwrap();
    drop(u);
    assert_eq!(drops.load(Ordering::SeqCst), 2);
    let odd = NonNull::new(ptr.as_ptr().wrapping_add(4)).unwrap();
    // SAFETY: refused before anything reads it.
    let e = unsafe { vm.from_host_memory(odd, &[2], DType::F32, Box::new(Owner(drops.clone()))) };
    assert!(matches!(e, Err(Error::Access { .. })));
    assert_eq!(drops.load(Ordering::SeqCst), 3);
    drop(vm);
    drop(mem);
}

#[test]
fn loans_taken_and_dropped_on_several_threads_while_the_vm_frees_their_storage() {
    let vm = Arc::new(VirtualMachine::new(Config::default()).unwrap());
    let threads: Vec<_> = (0..4)
        .map(|k| {
            let vm = vm.clone();
            std::thread::spawn(move || {
                let cpu = vm.compute_stream(DeviceId::CPU).unwrap();
                let scale = vm.op("scale").unwrap();
                let mut kept = Vec::new();
                for i in 0..200 {
                    let v = (k * 1000 + i) as f32;
                    let x = vm.from_slice(&[v; 16], &[16], DeviceId::CPU).unwrap();
                    let y = vm.run(|b| b.call(scale, &[&x], Attrs::scalar(2.0), cpu)).unwrap();
                    let loan = y.lend_host().unwrap();
                    drop((x, y)); // released while lent
                    kept.push((v, loan));
                    if kept.len() > 8 {
                        let (v, loan) = kept.remove(0);
                        assert_eq!(f32s(loan.as_ptr(), 16), vec![2.0 * v; 16]);
                    }
                }
                for (v, loan) in kept {
                    assert_eq!(f32s(loan.as_ptr(), 16), vec![2.0 * v; 16]);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    vm.sync().unwrap();
}
