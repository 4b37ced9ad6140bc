//! An instruction list built by hand, with explicit streams: data copied to a (mock) device
//! on its host-to-device stream, computed on its compute stream, read back through its
//! device-to-host stream. The builder inserts the cross-stream synchronisation itself.
//!
//! ```sh
//! cargo run --release --example instruction_list
//! ```

use eagervm::ep::mock::MockConfig;
use eagervm::prelude::*;

fn main() -> eagervm::Result<()> {
    let vm = VirtualMachine::new(Config::default().with_mock_devices(1, MockConfig::default()))?;
    let gpu = DeviceId::mock(0);
    let (h2d, compute) = (vm.stream(gpu, StreamType::H2D)?, vm.compute_stream(gpu)?);
    let (copy, matmul, add_bias, relu, sum) =
        (vm.op("copy")?, vm.op("matmul")?, vm.op("add_bias")?, vm.op("relu")?, vm.op("sum")?);

    // y = relu(x W + b) and its total, where x is 2 x 3 and W is 3 x 2.
    let x = vm.from_slice(&[1.0f32, 2.0, 3.0, -1.0, 0.5, 2.0], &[2, 3], DeviceId::CPU)?;
    let w = vm.from_slice(&[0.5f32, -1.0, 1.0, 0.0, -0.5, 1.0], &[3, 2], DeviceId::CPU)?;
    let b = vm.from_slice(&[0.25f32, -4.0], &[2], gpu)?; // copied in by `from_slice`
    let (y, total) = vm.run(|bld| {
        // Explicit streams: the copies on mock:0's H2D stream, the math on its compute stream.
        let xg = bld.call(copy, &[&x], Attrs::default(), h2d)?;
        let wg = bld.call(copy, &[&w], Attrs::default(), h2d)?;
        let xw = bld.call(matmul, &[&xg, &wg], Attrs::default(), compute)?;
        let z = bld.call(add_bias, &[&xw, &b], Attrs::default(), compute)?;
        // The short forms: default attributes, the input's compute stream.
        let y = bld.apply(relu, &[&z])?;
        let total = bld.apply(sum.on(compute), &[&y])?;
        Ok::<_, Error>((y, total))
    })?;
    for (id, device, ty, name) in vm.streams() {
        println!("stream {id:?}: {name} ({device}, {})", ty.name());
    }
    // x W = [1.0, -0.5; -1.5, 3.0]; + b = [1.25, -4.5; -1.25, -1.0]; relu: [1.25, 0, 0, 0].
    let (y, total) = (y.to_vec::<f32>()?, total.to_vec::<f32>()?);
    println!("relu(x W + b) = {y:?}, total {total:?}");
    vm.sync()?;
    if y != [1.25, 0.0, 0.0, 0.0] || total != [1.25] {
        eprintln!("wrong result: expected [1.25, 0, 0, 0] and [1.25]");
        std::process::exit(1);
    }
    println!("ok");
    Ok(())
}
