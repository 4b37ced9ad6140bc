//! The op-kernel trait, the arguments a kernel sees, and the registry of kernels.
//!
//! An op is a name (`add`, `matmul`, ...) with one kernel per device type: CPU and mock
//! share the built-in kernels, CUDA has its own (`kernels::cuda`, feature `cuda`). The
//! builder asks the kernel to [`infer`](OpKernel::infer) its outputs' shapes and dtypes
//! before emitting an instruction, so that bad calls are refused before anything runs; the
//! stream policy later calls [`compute`](OpKernel::compute) on the stream's worker (CPU),
//! on the device's own thread (mock), or on the stream's worker with the device's CUDA
//! stream current (CUDA: the kernel enqueues its work there and returns, and an event
//! recorded behind it tells when it is done).

use std::collections::HashMap;
use std::fmt;

use smallvec::SmallVec;

use crate::alloc::Storage;
use crate::ep::{DeviceId, DeviceType};
use crate::error::{Error, Result};
use crate::framework::tensor::{DType, Shape, TensorMeta};

/// Scalar attributes of an op call (`fill`'s value, `scale`'s factor).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Attrs {
    /// The scalar argument, if the op takes one.
    pub scalar: f64,
}

impl Attrs {
    /// Attributes with the given scalar.
    pub fn scalar(v: f64) -> Self {
        Attrs { scalar: v }
    }
}

/// The shape and dtype of one output, as inferred by a kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutSpec {
    /// Dimension sizes.
    pub shape: Shape,
    /// Element type.
    pub dtype: DType,
}

/// Output specs; two inline.
pub type OutSpecs = SmallVec<[OutSpec; 2]>;

/// A kernel: shape inference plus the computation.
///
/// Kernels are registered once and live for the whole process (`&'static`), so an
/// instruction carries a plain reference and no reference count.
pub trait OpKernel: Send + Sync + 'static {
    /// The op's name.
    fn name(&self) -> &'static str;

    /// Check the inputs (count, shapes, dtypes) and push one [`OutSpec`] per output. The
    /// error message names the operand at fault; the builder wraps it in
    /// [`Error::InvalidOperands`].
    ///
    /// `outputs` holds the specs of the outputs the caller gave, if it gave any (for ops
    /// like `fill` whose output shape is the caller's choice); it is empty otherwise.
    fn infer(
        &self,
        inputs: &[&TensorMeta],
        given: &[&TensorMeta],
        attrs: &Attrs,
        outputs: &mut OutSpecs,
    ) -> Result<(), String>;

    /// Whether inputs may live on another device than the stream's (copies).
    fn cross_device(&self) -> bool {
        false
    }

    /// Compute the outputs from the inputs. Runs on the stream's execution context; outputs
    /// are allocated (zeroed on first use) before the call.
    fn compute(&self, ctx: &mut KernelCtx<'_, '_>) -> Result<(), String>;
}

impl fmt::Debug for dyn OpKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OpKernel({})", self.name())
    }
}

/// A read-only view of an input.
#[derive(Debug)]
pub struct TensorView<'a> {
    /// Shape, dtype and device.
    pub meta: &'a TensorMeta,
    /// The bytes.
    pub data: &'a Storage,
}

/// A writable view of an output.
#[derive(Debug)]
pub struct TensorViewMut<'a> {
    /// Shape, dtype and device.
    pub meta: &'a TensorMeta,
    /// The bytes.
    pub data: &'a mut Storage,
}

/// What a kernel sees: its attributes, inputs and outputs (`'a`: the lists, `'t`: the
/// tensors' bytes).
#[derive(Debug)]
pub struct KernelCtx<'a, 't> {
    /// The call's attributes.
    pub attrs: Attrs,
    /// Inputs, in call order.
    pub inputs: &'a [TensorView<'t>],
    /// Outputs, in call order, allocated.
    pub outputs: &'a mut [TensorViewMut<'t>],
}

/// Number of device types with a kernel slot in [`Op`].
const DEVICE_TYPES: usize = 3;

fn slot(ty: DeviceType) -> usize {
    match ty {
        DeviceType::Cpu => 0,
        DeviceType::Mock => 1,
        DeviceType::Cuda => 2,
    }
}

/// A kernel in one word: a reference to a `&'static dyn OpKernel` that lives for the rest of
/// the process (an entry of a static kernel table, or one leaked box per registration of a
/// kernel built at run time). An instruction holds one, so that its body fits in three words.
#[derive(Clone, Copy)]
pub(crate) struct KernelRef(&'static &'static dyn OpKernel);

impl KernelRef {
    /// A reference to `kernel`.
    pub(crate) const fn new(kernel: &'static &'static dyn OpKernel) -> Self {
        KernelRef(kernel)
    }

    /// The kernel.
    #[inline]
    pub(crate) fn get(self) -> &'static dyn OpKernel {
        *self.0
    }

    /// The address that identifies this reference (compared, never dereferenced, by caches).
    #[inline]
    pub(crate) fn addr(self) -> usize {
        self.0 as *const &'static dyn OpKernel as usize
    }
}

impl std::ops::Deref for KernelRef {
    type Target = dyn OpKernel;
    #[inline]
    fn deref(&self) -> &(dyn OpKernel + 'static) {
        *self.0
    }
}

impl fmt::Debug for KernelRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OpKernel({})", self.name())
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
    /// The kernel for `device` as an instruction holds it.
    #[inline]
    pub(crate) fn kernel_ref(&self, device: DeviceType) -> Option<KernelRef> {
        self.kernels[slot(device)]
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
        crate::kernels::register_builtins(&mut r);
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
