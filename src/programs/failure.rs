//! `failure`: a deliberate kernel failure, and what it touches.
//!
//! From one input `x`, the program computes a healthy branch (`relu(x)`, its sum, and that
//! sum doubled) and a poisoned one: the `fail` op (which always returns the error
//! `fail op: <scalar>`) writes `bad`, and `bad + x` and its sum read it. The VM marks the
//! failed instruction, skips its readers and stores the error on everything downstream;
//! the healthy branch and arrays made after the failure keep working, and the next
//! `sync` reports that something failed.
//!
//! The healthy values equal a host computation bit for bit where the kernels add in the
//! CPU's order ([`bit_exact_on`]); on CUDA, whose `sum` adds in another
//! order, within [`CUDA_REL`] times the sum of the terms' absolute values.

use std::fmt;

use serde::Serialize;

use super::{agrees, bit_exact_on, Rng, CUDA_REL};
use crate::eager::Context;
use crate::ep::DeviceId;
use crate::framework::VirtualMachine;
use crate::framework::{Attrs, DType, OutSpec, Tensor};
use crate::vm::{Error, Result};

/// Options of [`failure()`].
#[derive(Debug, Clone, PartialEq)]
pub struct FailureOptions {
    /// Where to compute. Default `cpu:0`.
    pub device: DeviceId,
    /// Elements of each array. Default 16.
    pub len: usize,
    /// The scalar the `fail` op puts in its message. Default 13.
    pub code: i32,
}

impl Default for FailureOptions {
    fn default() -> Self {
        FailureOptions { device: DeviceId::CPU, len: 16, code: 13 }
    }
}

/// One array and what reading it gave.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Outcome {
    /// The array's name in the program.
    pub name: String,
    /// Its value (the sum of its elements) if reading it succeeded.
    pub value: Option<f32>,
    /// The error reading it returned, as text (without the instruction's number).
    pub error: Option<String>,
}

/// What [`failure()`] did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FailureReport {
    /// The device it computed on.
    pub device: String,
    /// The message the failed kernel returns, which every poisoned array carries.
    pub expected_error: String,
    /// The arrays downstream of the failure: each must carry the kernel's error.
    pub poisoned: Vec<Outcome>,
    /// The arrays that do not depend on it: each must hold its value.
    pub healthy: Vec<Outcome>,
    /// What the `sync` after the failure returned.
    pub sync_error: Option<String>,
    /// Whether every poisoned array carried the kernel's error, every healthy one held the
    /// host reference's value, and the sync reported the failure.
    pub as_expected: bool,
}

impl fmt::Display for FailureReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "failure on {}: expected error `{}`", self.device, self.expected_error)?;
        for o in self.poisoned.iter().chain(&self.healthy) {
            match (&o.value, &o.error) {
                (_, Some(e)) => writeln!(f, "  {:<10} error: {e}", o.name)?,
                (Some(v), None) => writeln!(f, "  {:<10} value: {v}", o.name)?,
                (None, None) => writeln!(f, "  {:<10} (nothing)", o.name)?,
            }
        }
        writeln!(f, "  sync       {}", self.sync_error.as_deref().unwrap_or("ok"))?;
        write!(f, "  {}", if self.as_expected { "as expected" } else { "NOT as expected" })
    }
}

/// An error as text without instruction numbers (they depend on what the VM ran before),
/// so that reports of equal runs are equal.
fn describe(e: &Error) -> String {
    match e {
        Error::Kernel { op, stream, message, .. } => format!("`{op}` on {stream} failed: {message}"),
        Error::Failed { count, first } => {
            format!("{count} instruction(s) failed since the last sync; first: {}", describe(first))
        }
        other => other.to_string(),
    }
}

/// Run the failing program; see the module docs.
pub fn failure(vm: &VirtualMachine, opts: &FailureOptions) -> Result<FailureReport> {
    failure_keeping(vm, opts, &mut Vec::new())
}

/// [`failure()`], also pushing onto `keep` handles to the failed output, one array it poisons, and the healthy results (the command line
/// checksums them, and a recorded trace expects those checksums on replay).
pub fn failure_keeping(
    vm: &VirtualMachine,
    opts: &FailureOptions,
    keep: &mut Vec<Tensor>,
) -> Result<FailureReport> {
    let cx = Context::new(vm);
    // Failures left over from earlier work would be reported by this program's sync.
    vm.sync()?;
    let dev = opts.device;
    let xv = Rng::new(11).vec(opts.len, 2.0);
    let x = cx.from_slice(&xv, &[opts.len], dev)?;
    let spec = OutSpec { shape: [opts.len].into_iter().collect(), dtype: DType::F32 };
    let code = Attrs::scalar(opts.code as f64);
    let bad = cx.call("fail", &[&x], code, &[spec], dev)?.pop().expect("fail has one output");
    let bad_plus_x = bad.add(&x)?;
    let bad_sum = bad_plus_x.sum()?;
    let relu_sum = x.relu()?.sum()?;
    let doubled = relu_sum.scale(2.0)?;
    let later = cx.full(&[opts.len], 0.5, DType::F32, dev)?.add(&x)?.sum()?;

    for a in [&bad, &bad_sum, &relu_sum, &doubled, &later] {
        keep.push(a.tensor()?.clone());
    }
    let expected_error = format!("fail op: {}", opts.code);
    let outcome = |name: &str, a: &crate::eager::Array| {
        let r = a.sum().and_then(|s| s.item::<f32>());
        let (value, error) = match r {
            Ok(v) => (Some(v), None),
            Err(e) => (None, Some(e)),
        };
        (Outcome { name: name.into(), value, error: error.as_ref().map(describe) }, error)
    };
    let mut as_expected = true;
    let mut poisoned = Vec::new();
    for (name, a) in [("bad", &bad), ("bad + x", &bad_plus_x), ("sum", &bad_sum)] {
        let (o, e) = outcome(name, a);
        as_expected &= matches!(&e, Some(Error::Kernel { op, message, .. }) if op == "fail" && *message == expected_error);
        poisoned.push(o);
    }
    // In the `sum` kernel's order.
    let sum = |f: fn(f32) -> f32| crate::kernels::sum_f32(&xv.iter().map(|&v| f(v)).collect::<Vec<_>>());
    let relu_ref = sum(|v| if v < 0.0 { 0.0 } else { v });
    let later_ref = sum(|v| 0.5 + v);
    let abs_sum = |f: &dyn Fn(f32) -> f32| CUDA_REL * xv.iter().map(|&v| f(v).abs() as f64).sum::<f64>();
    let relu_tol = abs_sum(&|v| v.max(0.0));
    let exact = bit_exact_on(dev);
    let mut healthy = Vec::new();
    for (name, a, want, tol) in [
        ("relu sum", &relu_sum, relu_ref, relu_tol),
        ("doubled", &doubled, relu_ref * 2.0, 2.0 * relu_tol),
        ("later", &later, later_ref, abs_sum(&|v| 0.5 + v)),
    ] {
        let (o, _) = outcome(name, a);
        as_expected &= o.value.is_some_and(|v| agrees(v, want, exact, tol));
        healthy.push(o);
    }
    let sync = cx.sync();
    as_expected &= matches!(&sync, Err(Error::Failed { first, .. }) if matches!(&**first, Error::Kernel { message, .. } if *message == expected_error));
    Ok(FailureReport {
        device: dev.to_string(),
        expected_error,
        poisoned,
        healthy,
        sync_error: sync.as_ref().err().map(describe),
        as_expected,
    })
}
