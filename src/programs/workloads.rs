//! The trace workloads: built-in programs that do not check themselves but leave result
//! tensors, for `eagervm run` to checksum and `eagervm record` to record (a replay then
//! checks the checksums). Each runs at a fixed size on fixed devices (named in its
//! [`WorkloadInfo::about`]), so it takes no [`RunOptions`](super::RunOptions).
//!
//! They sit in the one registry of built-in programs beside the self-checking ones:
//! [`super::all`] lists both, [`super::lookup`] finds either by name. Adding a workload is
//! a function here and one entry in [`WORKLOADS`].

use crate::ep::{DeviceId, StreamType};
use crate::framework::VirtualMachine;
use crate::framework::{Attrs, DType, Tensor};
use crate::vm::Result;

/// A built-in workload: its name, what it does, and how to run it.
#[derive(Debug, Clone, Copy)]
pub struct WorkloadInfo {
    /// The name to run it by (`demo`, `layers`, ...).
    pub name: &'static str,
    /// One line on what it does, and where.
    pub about: &'static str,
    /// How many mock devices the VM needs (`mock:0` ..).
    pub mock_devices: u16,
    /// Build and submit it; return the tensors that hold its results.
    pub run: fn(&VirtualMachine) -> Result<Vec<Tensor>>,
}

/// Every workload, in a fixed order.
pub static WORKLOADS: [WorkloadInfo; 4] = [
    WorkloadInfo {
        name: "demo",
        about: "matmul on cpu:0, copy to mock:0, relu/scale/add/sum there (the `demo` command's program)",
        mock_devices: 1,
        run: demo,
    },
    WorkloadInfo {
        name: "branches",
        about:
            "a 32x32 input fanned out to 8 branches on two mock devices and the cpu, reduced by an add tree",
        mock_devices: 2,
        run: branches,
    },
    WorkloadInfo {
        name: "layers",
        about: "two chains of 1000 dense layers (16x16 matmul, add, relu), one on cpu:0 and one on mock:0",
        mock_devices: 1,
        run: layers,
    },
    WorkloadInfo {
        name: "noops",
        about: "100000 no-op instructions over 64 tensors on cpu:0 (the VM's own cost only)",
        mock_devices: 0,
        run: noops,
    },
];

/// `demo`: y = 10 * relu(x @ w) + x @ w on the mock device, and sum(y).
fn demo(vm: &VirtualMachine) -> Result<Vec<Tensor>> {
    let gpu = DeviceId::mock(0);
    let cpu = vm.compute_stream(DeviceId::CPU)?;
    let (g, h2d) = (vm.compute_stream(gpu)?, vm.stream(gpu, StreamType::H2D)?);
    let x = vm.from_slice(&[1.0f32, -2.0, 3.0, -4.0, 5.0, -6.0], &[2, 3], DeviceId::CPU)?;
    let w = vm.from_slice(&[0.5f32, -1.0, 1.5, 2.0, -0.5, 1.0], &[3, 2], DeviceId::CPU)?;
    vm.run(|b| {
        let xw = b.call(vm.op("matmul")?, &[&x, &w], Attrs::default(), cpu)?;
        let xw_dev = vm.empty(xw.shape(), DType::F32, gpu)?;
        b.call_into(vm.op("copy")?, &[&xw], &[&xw_dev], Attrs::default(), h2d)?;
        let r = b.call(vm.op("relu")?, &[&xw_dev], Attrs::default(), g)?;
        let s = b.call(vm.op("scale")?, &[&r], Attrs::scalar(10.0), g)?;
        let y = b.call(vm.op("add")?, &[&s, &xw_dev], Attrs::default(), g)?;
        let total = b.call(vm.op("sum")?, &[&y], Attrs::default(), g)?;
        Ok(vec![y, total])
    })
}

/// `branches`: x (32x32) is copied to two mock devices; 8 branches (scale, relu, matmul)
/// run on mock:0, mock:1 and the cpu; their results come back to the cpu and are summed by
/// a tree of adds. Cross-device copies and cross-stream waits on every path.
fn branches(vm: &VirtualMachine) -> Result<Vec<Tensor>> {
    const N: usize = 32;
    let data: Vec<f32> = (0..N * N).map(|i| ((i * 7919) % 97) as f32 / 48.0 - 1.0).collect();
    let cpu_dev = DeviceId::CPU;
    let x = vm.from_slice(&data, &[N, N], cpu_dev)?;
    let devices = [DeviceId::mock(0), DeviceId::mock(1), cpu_dev];
    let [copy, scale, relu, matmul, add, sum] =
        ["copy", "scale", "relu", "matmul", "add", "sum"].map(|n| vm.op(n));
    let (copy, scale, relu, matmul, add, sum) = (copy?, scale?, relu?, matmul?, add?, sum?);
    vm.run(|b| {
        let mut on_device = Vec::new();
        // The two mock devices of the three.
        for &d in &devices[..2] {
            let t = vm.empty(&[N, N], DType::F32, d)?;
            b.call_into(copy, &[&x], &[&t], Attrs::default(), vm.stream(d, StreamType::H2D)?)?;
            on_device.push(t);
        }
        on_device.push(x.clone());
        let mut results = Vec::new();
        for i in 0..8 {
            let k = i % devices.len();
            let (d, src) = (devices[k], &on_device[k]);
            let s = vm.compute_stream(d)?;
            let a = b.call(scale, &[src], Attrs::scalar(0.5 + i as f64 / 8.0), s)?;
            let r = b.call(relu, &[&a], Attrs::default(), s)?;
            let m = b.call(matmul, &[&r, src], Attrs::default(), s)?;
            let back = if d.is_host() {
                m
            } else {
                let h = vm.empty(&[N, N], DType::F32, cpu_dev)?;
                b.call_into(copy, &[&m], &[&h], Attrs::default(), vm.stream(d, StreamType::D2H)?)?;
                h
            };
            results.push(back);
        }
        let cpu = vm.compute_stream(cpu_dev)?;
        while results.len() > 1 {
            let mut next = Vec::new();
            for pair in results.chunks(2) {
                next.push(match pair {
                    [a, c] => b.call(add, &[a, c], Attrs::default(), cpu)?,
                    [a] => a.clone(),
                    _ => unreachable!("chunks of two"),
                });
            }
            results = next;
        }
        // Cannot fail: the tree of adds leaves one of the eight results.
        let total = b.call(sum, &[&results[0]], Attrs::default(), cpu)?;
        Ok(vec![results.remove(0), total])
    })
}

/// `layers`: on each of cpu:0 and mock:0, h <- relu(h @ w + b) a thousand times (16x16),
/// the two chains independent so that the devices overlap.
fn layers(vm: &VirtualMachine) -> Result<Vec<Tensor>> {
    const W: usize = 16;
    const DEPTH: usize = 1000;
    let init: Vec<f32> = (0..W * W).map(|i| ((i * 31) % 17) as f32 / 17.0 - 0.5).collect();
    let weights: Vec<f32> = (0..W * W).map(|i| ((i * 13) % 11) as f32 / 40.0 - 0.1).collect();
    let [matmul, add, relu] = ["matmul", "add", "relu"].map(|n| vm.op(n));
    let (matmul, add, relu) = (matmul?, add?, relu?);
    let mut outs = Vec::new();
    for d in [DeviceId::CPU, DeviceId::mock(0)] {
        let s = vm.compute_stream(d)?;
        let w = vm.from_slice(&weights, &[W, W], d)?;
        let bias = vm.from_slice(&vec![0.01f32; W * W], &[W, W], d)?;
        let mut h = vm.from_slice(&init, &[W, W], d)?;
        vm.run(|b| -> Result<()> {
            for _ in 0..DEPTH {
                let m = b.call(matmul, &[&h, &w], Attrs::default(), s)?;
                let a = b.call(add, &[&m, &bias], Attrs::default(), s)?;
                h = b.call(relu, &[&a], Attrs::default(), s)?;
            }
            Ok(())
        })?;
        outs.push(h);
    }
    Ok(outs)
}

/// `noops`: 100000 `noop` instructions, each reading one of 64 scalars and writing the
/// next, on cpu:0. Nothing but the VM's own work, the worst case for any per-instruction
/// cost such as recording.
fn noops(vm: &VirtualMachine) -> Result<Vec<Tensor>> {
    const N: usize = 100_000;
    const T: usize = 64;
    let cpu = vm.compute_stream(DeviceId::CPU)?;
    let (fill, noop) = (vm.op("fill")?, vm.op("noop")?);
    let ts: Vec<Tensor> = (0..T).map(|_| vm.empty(&[], DType::F32, DeviceId::CPU)).collect::<Result<_>>()?;
    vm.run(|b| -> Result<()> {
        for (i, t) in ts.iter().enumerate() {
            b.call_into(fill, &[], &[t], Attrs::scalar(i as f64), cpu)?;
        }
        for i in 0..N {
            b.call_into(noop, &[&ts[i % T]], &[&ts[(i + 1) % T]], Attrs::default(), cpu)?;
        }
        Ok(())
    })?;
    Ok(ts)
}
