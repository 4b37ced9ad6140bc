//! Views over shared storage at the builder's level: a view's reads and writes are those of
//! its storage (ordered by its one dependence object, allocated and released as one), a view
//! outlives the handles of the tensor it views, and the builder refuses overlapping outputs.

use eagervm::ep::mock::MockConfig;
use eagervm::prelude::*;

fn vm() -> VirtualMachine {
    VirtualMachine::new(Config::default().with_mock_devices(1, MockConfig::default())).unwrap()
}

#[test]
fn a_write_through_a_view_writes_its_storage_on_every_device() {
    let vm = vm();
    for dev in [DeviceId::CPU, DeviceId::mock(0)] {
        let s = vm.compute_stream(dev).unwrap();
        let fill = vm.op("fill").unwrap();
        let x = vm.empty(&[8], DType::F32, dev).unwrap();
        let mid = x.view_layout(&[4], &[1], 2).unwrap();
        assert!(mid.is_view() && mid.shares_storage(&x) && !mid.is_whole());
        vm.run(|b| {
            b.call_into(fill, &[], &[&x], Attrs::scalar(1.0), s)?;
            // Ordered after the fill of the whole storage, though another tensor object.
            b.call_into(fill, &[], &[&mid], Attrs::scalar(7.0), s)
        })
        .unwrap();
        assert_eq!(x.to_vec::<f32>().unwrap(), [1.0, 1.0, 7.0, 7.0, 7.0, 7.0, 1.0, 1.0], "{dev}");
        // Reading the view reads its elements alone.
        assert_eq!(mid.to_vec::<f32>().unwrap(), [7.0; 4], "{dev}");
    }
}

#[test]
fn the_first_write_through_a_view_allocates_the_whole_storage() {
    let vm = vm();
    let s = vm.compute_stream(DeviceId::CPU).unwrap();
    let fill = vm.op("fill").unwrap();
    let x = vm.empty(&[6], DType::I64, DeviceId::CPU).unwrap();
    let tail = x.view_layout(&[2], &[1], 4).unwrap();
    vm.run(|b| b.call_into(fill, &[], &[&tail], Attrs::integer(5), s)).unwrap();
    // The rest of the storage reads as the zeros it was allocated with.
    assert_eq!(x.to_vec::<i64>().unwrap(), [0, 0, 0, 0, 5, 5]);
}

#[test]
fn a_view_keeps_its_storage_after_the_viewed_tensor_is_dropped() {
    let vm = vm();
    let s = vm.compute_stream(DeviceId::mock(0)).unwrap();
    let scale = vm.op("scale").unwrap();
    let x = vm.from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[4], DeviceId::mock(0)).unwrap();
    let back = x.view_layout(&[2], &[1], 2).unwrap();
    drop(x);
    let y = vm.run(|b| b.call(scale, &[&back], Attrs::scalar(10.0), s)).unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), [30.0, 40.0]);
    drop(back);
    vm.sync().unwrap();
}

#[test]
fn an_explicitly_released_owner_keeps_its_storage_for_its_views() {
    let vm = vm();
    let s = vm.compute_stream(DeviceId::CPU).unwrap();
    let scale = vm.op("scale").unwrap();
    let x = vm.from_slice(&[1.0f32, 2.0, 3.0], &[3], DeviceId::CPU).unwrap();
    let v = x.view_layout(&[3], &[1], 0).unwrap();
    assert!(v.is_whole());
    let cx = eagervm::eager::Context::new(&vm);
    cx.wrap(x.clone()).release().unwrap();
    assert!(matches!(vm.run(|b| b.call(scale, &[&x], Attrs::scalar(2.0), s)), Err(Error::Released { .. })));
    let y = vm.run(|b| b.call(scale, &[&v], Attrs::scalar(2.0), s)).unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), [2.0, 4.0, 6.0]);
    drop((x, v));
    vm.sync().unwrap();
}

#[test]
fn overlapping_outputs_are_refused() {
    let vm = vm();
    let s = vm.compute_stream(DeviceId::CPU).unwrap();
    let (copy, cast) = (vm.op("copy").unwrap(), vm.op("cast").unwrap());
    let x = vm.from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0], &[5], DeviceId::CPU).unwrap();
    let a = x.view_layout(&[4], &[1], 0).unwrap();
    let b = x.view_layout(&[4], &[1], 1).unwrap();
    // Shifted by one: the output overlaps the input other than element for element.
    match vm.run(|bd| bd.call_into(copy, &[&a], &[&b], Attrs::default(), s)) {
        Err(Error::Overlap { op, output, .. }) => assert_eq!((op.as_str(), output), ("copy", b.id())),
        other => panic!("{other:?}"),
    }
    // The same elements, to a kernel that does not work in place (`cast`; `add` does).
    let to_f32 = Attrs::default().with_dtype(DType::F32);
    assert!(matches!(vm.run(|bd| bd.call_into(cast, &[&a], &[&a], to_f32, s)), Err(Error::Aliased { .. })));
    // An expanded output names its elements more than once.
    let e = x.view_layout(&[3, 2], &[0, 1], 0).unwrap();
    assert!(matches!(
        vm.run(|bd| bd.call_into(copy, &[&e], &[&e], Attrs::default(), s)),
        Err(Error::Overlap { .. })
    ));
    // Layouts outside the storage are refused where the view is made.
    match x.view_layout(&[3], &[2], 1) {
        Err(Error::InvalidOperands { op, detail }) => {
            assert_eq!(op, "as_strided");
            assert!(detail.contains("outside a storage of 5 elements"), "{detail}");
        }
        other => panic!("{other:?}"),
    }
    assert!(x.view_layout(&[2], &[1, 1], 0).is_err(), "one stride per dimension");
    vm.sync().unwrap();
}
