//! Random programs over views: every tensor of a program is a `[2, 2]` view of a `[4, 4]`
//! storage (three views a storage, owners on the devices of the mix), so that reads and
//! writes through different views of one storage must be ordered by the storage's one
//! dependence object. A program's steps are those of [`Program`](super::Program); an output
//! never overlaps an input of its step other than element for element (the builder refuses
//! partial overlaps), and a step whose output *is* an input (`x.add_(y)`) runs in place.
//!
//! The interpreter keeps one vector per storage and reads and writes each view through its
//! layout; the runner makes the storages, takes three views of each, drops the owners'
//! handles (the views keep the storages) and runs the steps as [`super::execute`] does.

use eagervm::prelude::*;

use super::{bits, emit, Mix, Outcome, Program, Step};

/// Elements of each storage (`[4, 4]`).
pub const STORAGE: usize = 16;

/// The layouts of a program's views, as (offset, strides) of a `[2, 2]` view of a `[4, 4]`
/// storage. Storages alternate between the first three (disjoint quadrants) and the last
/// three, which overlap: a transposed quadrant, the centre window (dense: a partial overlap
/// with the quadrant) and the four corners of the top-left 3x3 block (strided: an overlap
/// the builder cannot tell, which it lets through).
pub const LAYOUTS: [(usize, [isize; 2]); 6] =
    [(0, [4, 1]), (2, [4, 1]), (8, [4, 1]), (10, [1, 4]), (5, [4, 1]), (0, [8, 2])];

/// The storage tensor `t` views.
pub fn owner(t: usize) -> usize {
    t / 3
}

/// The layout of tensor `t`.
pub fn layout(t: usize) -> (usize, [isize; 2]) {
    LAYOUTS[t % 3 + 3 * (owner(t) % 2)]
}

/// The storage elements of tensor `t`, in its row-major order.
pub fn elements(t: usize) -> [usize; 4] {
    let (o, [s0, s1]) = layout(t);
    let at = |i: isize, j: isize| (o as isize + i * s0 + j * s1) as usize;
    [at(0, 0), at(0, 1), at(1, 0), at(1, 1)]
}

/// Whether tensors `a` and `b` share an element.
fn overlap(a: usize, b: usize) -> bool {
    owner(a) == owner(b) && elements(a).iter().any(|e| elements(b).contains(e))
}

/// The ops that may write their first input in place (`OpKernel::in_place`).
fn in_place(op: &str) -> bool {
    matches!(op, "add" | "mul" | "sub" | "relu" | "scale" | "relu_grad" | "maximum")
        || super::UNARY_OPS.contains(&op)
}

/// Whether step `s` is one a valid program may have: its output shares no element with an
/// input, except an op that works in place writing exactly its first input.
fn valid(s: &Step) -> bool {
    match *s {
        Step::Unary { op, a, out, .. } => !overlap(a, out) || (a == out && in_place(op)),
        Step::Binary { op, a, b, out, .. } => {
            (!overlap(a, out) || (a == out && in_place(op))) && !overlap(b, out)
        }
        Step::Copy { src, dst, .. } => !overlap(src, dst),
        _ => true,
    }
}

/// The program of `raw` over `tensors` views (a multiple of three), its owners on the devices
/// of `mix`: as [`super::decode_on`] makes it for tensors on their owners' devices, with the
/// steps whose operands overlap otherwise dropped, and some steps turned into in-place ones.
pub fn decode(mix: Mix, tensors: usize, raw: &[(u8, u8, u8, u8, u8, i8)]) -> Program {
    let tensors = tensors.div_ceil(3) * 3;
    // The base decoder places tensor `t` on `device_of(t)`: owners go there instead, so the
    // steps are decoded for a mix in which each tensor lives on its owner's device.
    let mut p = super::decode_with(mix, tensors, raw, |t| mix.device_of(owner(t)));
    for (k, s) in p.steps.iter_mut().enumerate() {
        // Every fifth binary or unary step writes its first input.
        if k % 5 == 2 {
            match s {
                Step::Binary { op, a, out, .. } if in_place(op) => *out = *a,
                Step::Unary { op, a, out, .. } if in_place(op) => *out = *a,
                _ => {}
            }
        }
    }
    p.steps.retain(valid);
    p.views = true;
    p
}

/// The initial values of storage `o`.
fn initial(o: usize) -> Vec<f32> {
    (0..STORAGE).map(|k| (o * STORAGE + k) as f32 * 0.125 - 3.0).collect()
}

/// Run the program of views one step at a time on plain vectors, one per storage.
pub fn interpret(p: &Program) -> Outcome {
    let owners = p.tensors / 3;
    let mut st: Vec<Vec<f32>> = (0..owners).map(initial).collect();
    let read =
        |st: &Vec<Vec<f32>>, t: usize| -> Vec<f32> { elements(t).iter().map(|&e| st[owner(t)][e]).collect() };
    let mut out = Vec::new();
    // The base interpreter computes a step's value from its inputs' values; each tensor's
    // value is read through its view before the step and the result written through it.
    let never = &mut |_| None;
    for s in &p.steps {
        match *s {
            Step::Read { t } => out.push(bits(&read(&st, t))),
            Step::Recreate { .. } => {}
            _ => {
                let mut it = super::Interpreter::new(0, never);
                let involved = step_tensors(s);
                it.load(involved.iter().map(|&t| (t, read(&st, t))));
                it.step(s, never);
                let w = written(s);
                let v = it.value(w).clone().expect("the view programs have no failing steps");
                for (k, &e) in elements(w).iter().enumerate() {
                    st[owner(w)][e] = v[k];
                }
            }
        }
    }
    out.extend((0..p.tensors).map(|t| bits(&read(&st, t))));
    out
}

/// The tensors a step reads or writes.
fn step_tensors(s: &Step) -> Vec<usize> {
    match *s {
        Step::Fill { out, .. } => vec![out],
        Step::Unary { a, out, .. } => vec![a, out],
        Step::Binary { a, b, out, .. } => vec![a, b, out],
        Step::Copy { src, dst, .. } => vec![src, dst],
        _ => vec![],
    }
}

/// The tensor a step writes.
fn written(s: &Step) -> usize {
    match *s {
        Step::Fill { out, .. } | Step::Unary { out, .. } | Step::Binary { out, .. } => out,
        Step::Copy { dst, .. } => dst,
        _ => unreachable!("only writing steps are interpreted"),
    }
}

/// Run the program of views on `vm`: the storages made with their initial values, three
/// views of each taken and the owners' handles dropped, then the steps.
pub fn execute(vm: &VirtualMachine, p: &Program) -> eagervm::Result<Outcome> {
    let streams = p.mix.stream_table(vm)?;
    let owners: Vec<Tensor> = (0..p.tensors / 3)
        .map(|o| vm.from_slice(&initial(o), &[4, 4], p.mix.device_of(o)))
        .collect::<eagervm::Result<_>>()?;
    let view_of = |base: &Tensor, t: usize| {
        let (offset, strides) = layout(t);
        base.view_layout(&[2, 2], &strides, offset)
    };
    let mut ts: Vec<Tensor> =
        (0..p.tensors).map(|t| view_of(&owners[owner(t)], t)).collect::<eagervm::Result<_>>()?;
    drop(owners);
    let mut out = Vec::new();
    let mut i = 0;
    while i < p.steps.len() {
        vm.run(|b| -> eagervm::Result<()> {
            while i < p.steps.len() {
                match p.steps[i] {
                    Step::Read { t } => {
                        out.push(bits(&b.to_vec::<f32>(&ts[t])?));
                        break;
                    }
                    Step::Recreate { .. } => break,
                    _ => emit(vm, b, &p.steps[i], &ts, &streams)?,
                }
                i += 1;
            }
            Ok(())
        })?;
        if let Some(Step::Recreate { t }) = p.steps.get(i) {
            // A new view of the same elements, made from another view of the storage (the
            // owner's handle is gone), then the old one dropped: its values stay.
            let sibling =
                (0..3).map(|k| owner(*t) * 3 + k).find(|&k| k != *t).expect("three views a storage");
            let fresh = view_of(&ts[sibling], *t)?;
            ts[*t] = fresh;
        }
        i += 1;
    }
    for t in &ts {
        out.push(bits(&t.to_vec::<f32>()?));
    }
    Ok(out)
}
