//! Communicators and collective calls: the front end of `ep::ccl`.
//!
//! A [`Communicator`] is made on a VM from a collective [`Backend`] (mock, MPI, NCCL) and a
//! name, which its op names carry (`all_reduce.sum@world`) so that traces say which
//! communicator each collective used. Its collectives are calls like any other: the builder
//! checks them (one input per local member, on the member's device, shapes and dtypes that
//! agree), makes their outputs on the members' devices, syncs their inputs onto the
//! collective stream (soft sync: a device-side wait where the device has one), and records
//! them in traces and timelines. They run on the collective stream of the communicator's
//! first local member, in the order the program issues them, which is the order every rank
//! must issue them in (`docs/distributed.md`).

use std::sync::{Arc, OnceLock};

use smallvec::SmallVec;

use crate::ep::ccl::{Backend, Collective, Member, ReduceOp};
use crate::ep::{DeviceType, StreamType};
use crate::kernels::collective::{op_name, CollectiveKernel, Sequence};
use crate::vm::engine::Engine;
use crate::vm::tensor::Fetch;
use crate::vm::{Attrs, Error, OpKernel, OutSpecs, Result, StreamId, TensorMeta};

use super::builder::InstructionsBuilder;
use super::op::Op;
use super::tensor::Tensor;
use super::virtual_machine::{new_tensor, VirtualMachine};

/// A communicator of one VM: a name, a backend and its local members. Cheap to clone.
#[derive(Clone)]
pub struct Communicator {
    inner: Arc<Inner>,
}

struct Inner {
    name: Arc<str>,
    backend: Arc<dyn Backend>,
    seq: Arc<Sequence>,
    /// The collective stream of the first local member, where every collective runs.
    stream: StreamId,
    /// The engine it belongs to (compared, never used to reach the engine).
    engine: std::sync::Weak<Engine>,
    /// `all_reduce` ×4, `reduce_scatter` ×4, `all_gather`, `barrier`, made with the
    /// communicator; `broadcast` per root, made on first use.
    ops: [Op; 10],
    broadcast: Vec<OnceLock<Op>>,
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Communicator")
            .field("name", &self.inner.name)
            .field("backend", &self.inner.backend.kind())
            .field("world_size", &self.world_size())
            .field("members", &self.members())
            .finish()
    }
}

/// An op whose one kernel (for every device type) is a collective of `inner`'s backend. The
/// kernel and its one-word reference live for the rest of the process: a communicator keeps
/// at most `10 + world_size` of them.
fn make_op(name: &Arc<str>, backend: &Arc<dyn Backend>, seq: &Arc<Sequence>, c: Collective) -> Op {
    let op_name: &'static str = Box::leak(op_name(c, name).into_boxed_str());
    let kernel: &'static dyn OpKernel =
        Box::leak(Box::new(CollectiveKernel::new(op_name, c, name.clone(), backend.clone(), seq.clone())));
    let kernel: &'static &'static dyn OpKernel = Box::leak(Box::new(kernel));
    Op::of_kernel(kernel, &[DeviceType::Cpu, DeviceType::Mock, DeviceType::Cuda])
}

/// The ops a communicator makes with itself, in the order [`Communicator::op`] indexes
/// them: `all_reduce` of each reduction (in `ReduceOp::ALL` order), `reduce_scatter` of
/// each, `all_gather`, `barrier`.
fn standard_ops(name: &Arc<str>, backend: &Arc<dyn Backend>, seq: &Arc<Sequence>) -> [Op; 10] {
    let all = ReduceOp::ALL.map(Collective::AllReduce);
    let scatter = ReduceOp::ALL.map(Collective::ReduceScatter);
    let mut cs = all.iter().chain(&scatter).chain(&[Collective::AllGather, Collective::Barrier]);
    std::array::from_fn(|_| make_op(name, backend, seq, *cs.next().expect("ten collectives")))
}

/// Every collective op of a communicator called `name` over `backend` (broadcasts from each
/// rank included), for checking calls without a VM (the trace validator's registry).
pub(crate) fn ops_of(name: &str, backend: Arc<dyn Backend>) -> Vec<Op> {
    let name: Arc<str> = name.into();
    let seq = Arc::new(Sequence::default());
    let roots =
        (0..backend.world_size()).map(|root| make_op(&name, &backend, &seq, Collective::Broadcast { root }));
    standard_ops(&name, &backend, &seq).into_iter().chain(roots).collect()
}

impl Communicator {
    /// Its name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Ranks over all processes.
    pub fn world_size(&self) -> usize {
        self.inner.backend.world_size()
    }

    /// The local members (device and rank), in the order collective calls take their
    /// tensors.
    pub fn members(&self) -> &[Member] {
        self.inner.backend.members()
    }

    /// The backend's name (`mock`, `mpi`, `nccl`).
    pub fn backend(&self) -> &'static str {
        self.inner.backend.kind()
    }

    /// The stream its collectives run on: the collective stream of the first local member.
    pub fn stream(&self) -> StreamId {
        self.inner.stream
    }

    /// How many collectives have run (or been skipped) on it so far.
    pub fn issued(&self) -> u64 {
        self.inner.seq.issued()
    }

    /// Abort it: a collective waiting for a peer fails, and so does every later one, with
    /// an error on its outputs. What the watchdog does to a communicator whose collective
    /// hangs; a user may do it too (on a peer's failure that it learned of otherwise).
    pub fn abort(&self, why: &str) {
        self.inner.backend.abort(why)
    }

    /// Why it was aborted, if it was.
    pub fn aborted(&self) -> Option<String> {
        self.inner.backend.aborted()
    }

    /// The op of collective `c` on this communicator (`None` for a broadcast from a rank it
    /// does not have).
    pub fn op(&self, c: Collective) -> Option<Op> {
        let i = &self.inner;
        let red =
            |r: ReduceOp| ReduceOp::ALL.iter().position(|x| *x == r).expect("every reduction is listed");
        Some(match c {
            Collective::AllReduce(r) => i.ops[red(r)],
            Collective::ReduceScatter(r) => i.ops[4 + red(r)],
            Collective::AllGather => i.ops[8],
            Collective::Barrier => i.ops[9],
            Collective::Broadcast { root } => {
                *i.broadcast.get(root)?.get_or_init(|| make_op(&i.name, &i.backend, &i.seq, c))
            }
        })
    }
}

impl VirtualMachine {
    /// Make a communicator called `name` over `backend`, whose local members must be
    /// devices of this VM. Its collectives run on the collective stream of its first member.
    /// Fails with [`Error::Collective`] if the name is taken here or a member's device is
    /// missing.
    pub fn communicator(&self, name: &str, backend: Arc<dyn Backend>) -> Result<Communicator> {
        let comm_err = |detail: String| Error::Collective { comm: name.to_string(), detail };
        if name.is_empty() || name.contains(|c: char| c.is_whitespace() || matches!(c, '@' | ',' | '=')) {
            return Err(comm_err("a name must be non-empty, without spaces, `@`, `,` or `=`".into()));
        }
        let members = backend.members();
        let Some(first) = members.first() else {
            return Err(comm_err("the backend has no local member".into()));
        };
        for m in members {
            self.engine()
                .check_device(m.device)
                .map_err(|e| comm_err(format!("member rank {}: {e}", m.rank)))?;
        }
        if backend.kind() != "mock" && members.iter().any(|m| m.device.ty == DeviceType::Mock) {
            return Err(comm_err(format!("the {} backend cannot run on mock devices", backend.kind())));
        }
        let stream = self.stream(first.device, StreamType::Collective)?;
        let name: Arc<str> = name.into();
        let seq = Arc::new(Sequence::default());
        let ops = standard_ops(&name, &backend, &seq);
        let issued = seq.clone();
        self.engine().add_communicator(name.clone(), backend.clone(), Arc::new(move || issued.issued()))?;
        let comm = Communicator {
            inner: Arc::new(Inner {
                broadcast: (0..backend.world_size()).map(|_| OnceLock::new()).collect(),
                name,
                backend,
                seq,
                stream,
                engine: Arc::downgrade(self.engine()),
                ops,
            }),
        };
        self.front().communicators.lock().push(comm.clone());
        Ok(comm)
    }

    /// A communicator over mock (or CPU) devices of this VM, rank `r` on `devices[r]`, with
    /// the mock backend (`ep::ccl::mock`): a test double for programs written for several
    /// devices.
    pub fn mock_communicator(&self, name: &str, devices: &[crate::ep::DeviceId]) -> Result<Communicator> {
        let backend = crate::ep::ccl::mock::MockBackend::new(devices)
            .map_err(|e| Error::Collective { comm: name.to_string(), detail: e.to_string() })?;
        self.communicator(name, Arc::new(backend))
    }

    /// The communicator called `name` made on this VM, if any.
    pub fn find_communicator(&self, name: &str) -> Option<Communicator> {
        self.front().communicators.lock().iter().find(|c| c.name() == name).cloned()
    }

    /// The communicators made on this VM, in the order they were made.
    pub fn communicators(&self) -> Vec<Communicator> {
        self.front().communicators.lock().clone()
    }
}

impl InstructionsBuilder<'_> {
    /// Issue collective `c` on `comm` with one input per local member (none for a
    /// barrier), in member order; returns one output per member, on its device. Refused
    /// calls issue nothing.
    pub fn collective(
        &mut self,
        comm: &Communicator,
        c: Collective,
        inputs: &[&Tensor],
    ) -> Result<Vec<Tensor>> {
        let engine = self.engine();
        let op = self.collective_op(comm, c)?;
        let kernel = op
            .kernel(comm.members()[0].device.ty)
            .expect("collective ops have a kernel for every device type");
        let metas: SmallVec<[&TensorMeta; 4]> = inputs.iter().map(|t| t.meta()).collect();
        let mut specs = OutSpecs::new();
        kernel
            .infer(&metas, &[], &Attrs::default(), &mut specs)
            .map_err(|detail| Error::InvalidOperands { op: op.name().into(), detail })?;
        let limit = engine.config().max_tensor_bytes;
        let mut outs = Vec::with_capacity(specs.len());
        for (s, m) in specs.into_iter().zip(comm.members()) {
            crate::vm::shape::check(&s.shape, s.dtype, limit, || {
                format!("output of `{}` on {}", op.name(), m.device)
            })?;
            let meta = TensorMeta::new(&s.shape, s.dtype, m.device);
            let id = engine.intern(&meta);
            outs.push(new_tensor(engine, meta, id, Fetch::No));
        }
        {
            let refs: SmallVec<[&Tensor; 4]> = outs.iter().collect();
            self.call_into(op, inputs, &refs, Attrs::default(), comm.stream())?;
        }
        Ok(outs)
    }

    /// Issue collective `c` on `comm`, writing into the given `outputs` (one per local
    /// member, on its device, of the shape and dtype the collective produces; a collective
    /// cannot write into its own input: give another tensor).
    pub fn collective_into(
        &mut self,
        comm: &Communicator,
        c: Collective,
        inputs: &[&Tensor],
        outputs: &[&Tensor],
    ) -> Result<()> {
        let op = self.collective_op(comm, c)?;
        self.call_into(op, inputs, outputs, Attrs::default(), comm.stream())
    }

    /// The op of `c` on `comm`, if `comm` is of this builder's VM and has the ranks `c`
    /// names.
    fn collective_op(&self, comm: &Communicator, c: Collective) -> Result<Op> {
        if !std::ptr::eq(comm.inner.engine.as_ptr(), Arc::as_ptr(self.engine())) {
            return Err(Error::Collective {
                comm: comm.name().to_string(),
                detail: "it belongs to another virtual machine".into(),
            });
        }
        comm.op(c).ok_or_else(|| Error::Collective {
            comm: comm.name().to_string(),
            detail: format!("{} from a rank it does not have ({} ranks)", c.name(), comm.world_size()),
        })
    }

    /// `all_reduce` with `op` over `comm`: every member's output is the reduction of every
    /// rank's input.
    pub fn all_reduce(
        &mut self,
        comm: &Communicator,
        inputs: &[&Tensor],
        op: ReduceOp,
    ) -> Result<Vec<Tensor>> {
        self.collective(comm, Collective::AllReduce(op), inputs)
    }

    /// `broadcast` over `comm`: every member's output is rank `root`'s input.
    pub fn broadcast(&mut self, comm: &Communicator, inputs: &[&Tensor], root: usize) -> Result<Vec<Tensor>> {
        self.collective(comm, Collective::Broadcast { root }, inputs)
    }

    /// `all_gather` over `comm`: every member's output is every rank's input, concatenated
    /// along the first dimension in rank order.
    pub fn all_gather(&mut self, comm: &Communicator, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
        self.collective(comm, Collective::AllGather, inputs)
    }

    /// `reduce_scatter` with `op` over `comm`: member of rank `r` gets slice `r` (along the
    /// first dimension) of the reduction.
    pub fn reduce_scatter(
        &mut self,
        comm: &Communicator,
        inputs: &[&Tensor],
        op: ReduceOp,
    ) -> Result<Vec<Tensor>> {
        self.collective(comm, Collective::ReduceScatter(op), inputs)
    }

    /// A collective barrier over `comm`: one `i64` scalar per member, written (with the
    /// number of ranks) once every rank has entered it.
    pub fn barrier(&mut self, comm: &Communicator) -> Result<Vec<Tensor>> {
        self.collective(comm, Collective::Barrier, &[])
    }
}
