//! Built-in programs: named tensor programs that `eagervm run` runs and `eagervm record`
//! records. Each is an ordinary function over a [`VirtualMachine`] that builds its work
//! with [`InstructionsBuilder`](crate::framework::InstructionsBuilder) and returns the
//! tensors that hold its results; adding one is one entry in [`builtin_programs`].

use crate::ep::{DeviceId, StreamType};
use crate::framework::{Attrs, DType, Tensor};
use crate::programs::{Report, RunOptions};
use crate::{Error, Result, VirtualMachine};

/// A built-in program.
#[derive(Debug, Clone, Copy)]
pub struct Program {
    /// The name `run`/`record` take.
    pub name: &'static str,
    /// One line on what it does.
    pub about: &'static str,
    /// Mock devices it needs (`mock:0` ..).
    pub mock_devices: u16,
    /// Build and submit the program; return the tensors holding its results.
    pub run: fn(&VirtualMachine) -> Result<ProgramOutput>,
}

/// What a built-in program leaves behind.
#[derive(Debug, Default)]
pub struct ProgramOutput {
    /// The tensors holding its results (checksummed by `run`, expected by a recorded trace).
    pub tensors: Vec<Tensor>,
    /// The report of a program that checks itself (the [`crate::programs`] ones).
    pub report: Option<Report>,
}

impl From<Vec<Tensor>> for ProgramOutput {
    fn from(tensors: Vec<Tensor>) -> Self {
        ProgramOutput { tensors, report: None }
    }
}

/// Run the self-checking program `name` of [`crate::programs`] at its defaults.
fn checked(vm: &VirtualMachine, name: &str) -> Result<ProgramOutput> {
    let info = crate::programs::find(name).ok_or_else(|| Error::Config(format!("no program `{name}`")))?;
    let mut tensors = Vec::new();
    let report = (info.run_keeping)(vm, &RunOptions::default(), &mut tensors)?;
    Ok(ProgramOutput { tensors, report: Some(report) })
}

/// Every built-in program, by name.
pub fn builtin_programs() -> &'static [Program] {
    &[
        Program {
            name: "mlp",
            about: "train a two-layer MLP on cpu:0 (forward, hand-written backward, SGD); prints the loss per step",
            mock_devices: 0,
            run: |vm| checked(vm, "mlp"),
        },
        Program {
            name: "pipeline",
            about: "chunks host -> mock:0 (H2D) -> matmul/relu (compute) -> host (D2H), copies overlapping compute",
            mock_devices: 1,
            run: |vm| checked(vm, "pipeline"),
        },
        Program {
            name: "fanout",
            about: "one array read by 64 independent branches on cpu:0, reduced by a tree of adds",
            mock_devices: 0,
            run: |vm| checked(vm, "fanout"),
        },
        Program {
            name: "failure",
            about: "a deliberately failing kernel poisons what it feeds while the other arrays keep working",
            mock_devices: 0,
            run: |vm| checked(vm, "failure"),
        },
        Program {
            name: "demo",
            about: "matmul on cpu:0, copy to mock:0, relu/scale/add/sum there (the `demo` command's program)",
            mock_devices: 1,
            run: |vm| demo(vm).map(Into::into),
        },
        Program {
            name: "branches",
            about: "a 32x32 input fanned out to 8 branches on two mock devices and the cpu, reduced by an add tree",
            mock_devices: 2,
            run: |vm| branches(vm).map(Into::into),
        },
        Program {
            name: "layers",
            about: "two chains of 1000 dense layers (16x16 matmul, add, relu), one on cpu:0 and one on mock:0",
            mock_devices: 1,
            run: |vm| layers(vm).map(Into::into),
        },
        Program {
            name: "noops",
            about: "100000 no-op instructions over 64 tensors on cpu:0 (the VM's own cost only)",
            mock_devices: 0,
            run: |vm| noops(vm).map(Into::into),
        },
    ]
}

/// The program called `name`.
pub fn find_program(name: &str) -> Option<&'static Program> {
    builtin_programs().iter().find(|p| p.name == name)
}

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
