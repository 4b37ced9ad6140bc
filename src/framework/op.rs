//! The op registry: ops by name, each with one kernel per device type.
//!
//! An op is a name (`add`, `matmul`, ...) with one kernel per device type: CPU and mock
//! share the built-in kernels, CUDA has its own (`kernels::cuda`, feature `cuda`). The
//! kernels themselves implement the engine's kernel ABI ([`OpKernel`], `vm::kernel`).

use std::collections::HashMap;
use std::fmt;

use crate::ep::{DeviceId, DeviceType};
use crate::vm::kernel::{Attrs, KernelRef, OpKernel};
use crate::vm::{Error, Result, StreamId};

/// Number of device types with a kernel slot in [`Op`].
const DEVICE_TYPES: usize = 3;

fn slot(ty: DeviceType) -> usize {
    match ty {
        DeviceType::Cpu => 0,
        DeviceType::Mock => 1,
        DeviceType::Cuda => 2,
    }
}

/// An op resolved from the registry: its name and its kernel per device type. Copy it and
/// reuse it; calls through it do no lookup by name.
#[derive(Clone, Copy)]
pub struct Op {
    name: &'static str,
    kernels: [Option<KernelRef>; DEVICE_TYPES],
}

impl Op {
    /// The op's name.
    pub fn name(&self) -> &'static str {
        self.name
    }
    /// The kernel for `device`, if the op has one there.
    pub fn kernel(&self, device: DeviceType) -> Option<&'static dyn OpKernel> {
        self.kernels[slot(device)].map(KernelRef::get)
    }
    /// An op outside any registry whose kernel for each of `devices` is `kernel`
    /// (collectives: `framework::collective`).
    pub(crate) fn of_kernel(kernel: &'static &'static dyn OpKernel, devices: &[DeviceType]) -> Op {
        let mut op = Op { name: kernel.name(), kernels: [None; DEVICE_TYPES] };
        for &d in devices {
            op.kernels[slot(d)] = Some(KernelRef::new(kernel));
        }
        op
    }

    /// The kernel for `device` as an instruction holds it.
    #[inline]
    pub(crate) fn kernel_ref(&self, device: DeviceType) -> Option<KernelRef> {
        self.kernels[slot(device)]
    }
}

impl Op {
    /// A call of this op with `attrs` (on the default stream unless [`Call::on`] names one).
    pub fn with(self, attrs: Attrs) -> Call {
        Call { op: self, attrs, stream: None }
    }

    /// A call of this op on `stream` (with default attributes unless [`Call::with`] gives
    /// some).
    pub fn on(self, stream: StreamId) -> Call {
        Call { op: self, attrs: Attrs::default(), stream: Some(stream) }
    }
}

/// An op with its attributes and, optionally, its stream: what
/// [`InstructionsBuilder::apply`](super::InstructionsBuilder::apply) calls. An [`Op`] alone
/// is a call with default attributes on the compute stream of its first input's device.
///
/// ```
/// use eagervm::prelude::*;
///
/// let vm = VirtualMachine::new(Config::default())?;
/// let a = vm.from_slice(&[1.0f32, -2.0, 3.0], &[3], DeviceId::CPU)?;
/// let (relu, scale) = (vm.op("relu")?, vm.op("scale")?);
/// let cpu = vm.compute_stream(DeviceId::CPU)?;
/// let y = vm.run(|b| {
///     let r = b.apply(relu, &[&a])?; // default attributes, `a`'s compute stream
///     b.apply(scale.with(Attrs::scalar(2.0)).on(cpu), &[&r])
/// })?;
/// assert_eq!(y.to_vec::<f32>()?, vec![2.0, 0.0, 6.0]);
/// # Ok::<(), eagervm::Error>(())
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Call {
    /// The op.
    pub op: Op,
    /// Its attributes.
    pub attrs: Attrs,
    /// Its stream; `None`: the compute stream of the first input's device.
    pub stream: Option<StreamId>,
}

impl Call {
    /// This call with `attrs`.
    pub fn with(self, attrs: Attrs) -> Call {
        Call { attrs, ..self }
    }

    /// This call on `stream`.
    pub fn on(self, stream: StreamId) -> Call {
        Call { stream: Some(stream), ..self }
    }
}

impl From<Op> for Call {
    fn from(op: Op) -> Call {
        Call { op, attrs: Attrs::default(), stream: None }
    }
}

impl fmt::Debug for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Op({})", self.name)
    }
}

/// The process-wide one-word reference of `kernel`: made (and kept) on first use, so that
/// registering the same kernel again, in every new VM's registry, keeps nothing more.
fn interned(kernel: &'static dyn OpKernel) -> &'static &'static dyn OpKernel {
    use std::sync::{Mutex, OnceLock};
    static TABLE: OnceLock<Mutex<Vec<&'static &'static dyn OpKernel>>> = OnceLock::new();
    // Data and vtable address together (zero-sized kernels may share a data address), and
    // the name: a kernel whose vtable was duplicated only costs one more box.
    #[allow(ambiguous_wide_pointer_comparisons)]
    let same = |k: &&'static &'static dyn OpKernel| std::ptr::eq(**k, kernel) && k.name() == kernel.name();
    let mut table = TABLE.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
    if let Some(&k) = table.iter().find(|k| same(k)) {
        return k;
    }
    let k: &'static &'static dyn OpKernel = Box::leak(Box::new(kernel));
    table.push(k);
    k
}

/// All registered kernels, by op name and device type.
#[derive(Default)]
pub struct OpRegistry {
    ops: HashMap<&'static str, Op>,
}

impl fmt::Debug for OpRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.names()).finish()
    }
}

impl OpRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        OpRegistry::default()
    }

    /// A registry with the built-in kernels (see [`crate::kernels`]).
    pub fn with_builtins() -> Self {
        let mut r = OpRegistry::new();
        for kernel in crate::kernels::BUILTINS {
            for device in [DeviceType::Cpu, DeviceType::Mock] {
                r.register_static(device, kernel);
            }
        }
        #[cfg(feature = "cuda")]
        for kernel in crate::kernels::cuda::kernels() {
            r.register(DeviceType::Cuda, kernel);
        }
        r
    }

    /// Register `kernel` for `device`, replacing an earlier one of the same name there.
    /// The first registration of a kernel in the process keeps one word-sized box for the
    /// rest of the process, shared by every later registration of the same kernel (kernels
    /// in a static table register through [`register_static`](Self::register_static)
    /// without it).
    pub fn register(&mut self, device: DeviceType, kernel: &'static dyn OpKernel) {
        self.register_static(device, interned(kernel));
    }

    /// Register the kernel `kernel` refers to (an entry of a static table) for `device`,
    /// replacing an earlier one of the same name there.
    pub fn register_static(&mut self, device: DeviceType, kernel: &'static &'static dyn OpKernel) {
        let name = kernel.name();
        let op = self.ops.entry(name).or_insert(Op { name, kernels: [None; DEVICE_TYPES] });
        op.kernels[slot(device)] = Some(KernelRef::new(kernel));
    }

    /// Add `op` as it is, under its name (replacing an op of that name).
    pub(crate) fn insert(&mut self, op: Op) {
        self.ops.insert(op.name, op);
    }

    /// Register a kernel built at run time (it lives for the rest of the process).
    pub fn register_boxed(&mut self, device: DeviceType, kernel: Box<dyn OpKernel>) {
        self.register(device, Box::leak(kernel));
    }

    /// The op called `name`.
    pub fn get(&self, name: &str) -> Option<Op> {
        self.ops.get(name).copied()
    }

    /// The op called `name`, or [`Error::UnknownOp`] naming what is registered.
    pub fn resolve(&self, name: &str, device: DeviceId) -> Result<Op> {
        match self.get(name) {
            Some(op) if op.kernel(device.ty).is_some() => Ok(op),
            _ => Err(Error::UnknownOp {
                op: name.to_string(),
                device,
                known: self.names_on(device.ty).join(", "),
            }),
        }
    }

    /// Names of all registered ops, sorted.
    pub fn names(&self) -> Vec<&'static str> {
        let mut v: Vec<_> = self.ops.keys().copied().collect();
        v.sort_unstable();
        v
    }

    fn names_on(&self, ty: DeviceType) -> Vec<&'static str> {
        let mut v: Vec<_> = self.ops.values().filter(|o| o.kernel(ty).is_some()).map(|o| o.name).collect();
        v.sort_unstable();
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtins_are_registered_on_cpu_and_mock() {
        let r = OpRegistry::with_builtins();
        let mut names = [
            "abs",
            "adaptive_avg_pool2d",
            "add",
            "add_bias",
            "add_scalar",
            "addcdiv",
            "addcmul",
            "all",
            "amax",
            "amin",
            "any",
            "argmax",
            "argmin",
            "atan2",
            "avg_pool2d",
            "bmm",
            "cast",
            "cat",
            "ceil",
            "clamp",
            "clamp_scalar",
            "conv2d",
            "copy",
            "cos",
            "cumprod",
            "cumsum",
            "div",
            "div_floor",
            "div_scalar",
            "div_trunc",
            "eq",
            "eq_scalar",
            "erf",
            "exp",
            "exp2",
            "expm1",
            "fail",
            "fill",
            "floor",
            "fmod",
            "gather",
            "ge",
            "ge_scalar",
            "gelu",
            "gt",
            "gt_scalar",
            "index",
            "index_add",
            "index_put",
            "index_select",
            "isfinite",
            "isinf",
            "isnan",
            "layer_norm",
            "le",
            "le_scalar",
            "lerp",
            "lerp_scalar",
            "log",
            "log1p",
            "log2",
            "log_softmax",
            "logical_and",
            "logical_not",
            "logical_or",
            "logical_xor",
            "logsumexp",
            "lt",
            "lt_scalar",
            "masked_fill",
            "matmul",
            "matmul_nt",
            "matmul_tn",
            "max",
            "max_pool2d",
            "max_pool2d_with_indices",
            "maximum",
            "mean",
            "min",
            "minimum",
            "mul",
            "mul_scalar",
            "ne",
            "ne_scalar",
            "neg",
            "nll_loss",
            "nonzero",
            "noop",
            "norm",
            "one_hot",
            "panic",
            "pow",
            "pow_scalar",
            "prod",
            "rdiv_scalar",
            "reciprocal",
            "relu",
            "relu_grad",
            "remainder",
            "round",
            "rsqrt",
            "rsub_scalar",
            "scale",
            "scaled_dot_product_attention",
            "scatter",
            "sigmoid",
            "sign",
            "silu",
            "sin",
            "softmax",
            "sqrt",
            "std",
            "sub",
            "sum",
            "sum_rows",
            "tanh",
            "tril",
            "triu",
            "var",
            "where",
        ];
        names.sort_unstable();
        assert_eq!(r.names_on(DeviceType::Cpu), names);
        for name in names {
            let op = r.get(name).unwrap();
            for device in [DeviceType::Cpu, DeviceType::Mock] {
                let kernel = op.kernel(device).unwrap_or_else(|| panic!("{name} on {device:?}"));
                assert_eq!(kernel.name(), name);
                assert_eq!(kernel.cross_device(), name == "copy");
            }
        }
    }
}
