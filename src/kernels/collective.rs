//! Collective kernels: one op per collective and communicator, run on the collective stream
//! of the communicator's first local member.
//!
//! A collective call has one input and one output per local member of the communicator, in
//! member order, each on its member's device (a barrier has no inputs, and one `i64` scalar
//! output per member, which it sets to the number of ranks: a token to wait for). The kernel
//! hands the buffers to the communicator's [`Backend`], which runs the collective for all
//! local members at once (NCCL's grouped call; the mock backend computes it).
//!
//! | collective | input per member | output per member |
//! | --- | --- | --- |
//! | `all_reduce.<op>` | `x` | like `x`: the reduction over ranks |
//! | `broadcast.<root>` | `x` | like `x`: rank `root`'s |
//! | `all_gather` | `x: [n, ...]` (or a scalar) | `[world·n, ...]` (`[world]`): every rank's, in rank order |
//! | `reduce_scatter.<op>` | `x: [world·n, ...]` | `[n, ...]`: slice `rank` of the reduction |
//! | `barrier` | none | `i64[]`: the number of ranks |
//!
//! `<op>` is `sum`, `max`, `min` or `mean` (`mean` on `f32` only). Every rank must issue the
//! same collectives of a communicator in the same order; each kernel numbers its calls
//! (`seq`), and a call skipped because its input failed aborts the communicator, since this
//! rank can no longer keep step with its peers (`docs/distributed.md`).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use smallvec::SmallVec;

use crate::ep::ccl::{Backend, Buf, BufMut, Call, Collective, DeviceSpan, Part, ReduceOp, ScalarType};
use crate::vm::{DType, KernelCtx, OpKernel, OutSpec, TensorMeta};

use crate::vm::Attrs;

/// The calls of one communicator, numbered in issue order; shared by its kernels.
#[derive(Debug, Default)]
pub struct Sequence(AtomicU64);

impl Sequence {
    /// How many collectives of the communicator have been run (or skipped) so far.
    pub fn issued(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }

    fn next(&self) -> u64 {
        self.0.fetch_add(1, Ordering::Relaxed)
    }
}

/// The kernel of one collective on one communicator (module docs).
pub struct CollectiveKernel {
    name: &'static str,
    op: Collective,
    comm: Arc<str>,
    backend: Arc<dyn Backend>,
    seq: Arc<Sequence>,
}

impl CollectiveKernel {
    /// The kernel of `op` on the communicator called `comm`. `name` is its op name
    /// ([`op_name`]).
    pub fn new(
        name: &'static str,
        op: Collective,
        comm: Arc<str>,
        backend: Arc<dyn Backend>,
        seq: Arc<Sequence>,
    ) -> Self {
        CollectiveKernel { name, op, comm, backend, seq }
    }

    /// The collective.
    pub fn collective(&self) -> Collective {
        self.op
    }
}

/// The op name of `op` on the communicator `comm`: `all_reduce.sum@world`,
/// `broadcast.0@world`, `all_gather@world`, `reduce_scatter.mean@dp`, `barrier@world`.
pub fn op_name(op: Collective, comm: &str) -> String {
    match op {
        Collective::AllReduce(r) | Collective::ReduceScatter(r) => {
            format!("{}.{}@{comm}", op.name(), r.name())
        }
        Collective::Broadcast { root } => format!("broadcast.{root}@{comm}"),
        Collective::AllGather | Collective::Barrier => format!("{}@{comm}", op.name()),
    }
}

/// The collective an op name names, and its communicator's name: the inverse of
/// [`op_name`]. `None` for any other name.
pub fn parse_op_name(name: &str) -> Option<(Collective, &str)> {
    let (op, comm) = name.split_once('@')?;
    if comm.is_empty() {
        return None;
    }
    let reduce = |r: &str| ReduceOp::ALL.into_iter().find(|o| o.name() == r);
    let c = match op.split_once('.') {
        Some(("all_reduce", r)) => Collective::AllReduce(reduce(r)?),
        Some(("reduce_scatter", r)) => Collective::ReduceScatter(reduce(r)?),
        Some(("broadcast", root)) => Collective::Broadcast { root: root.parse().ok()? },
        None if op == "all_gather" => Collective::AllGather,
        None if op == "barrier" => Collective::Barrier,
        _ => return None,
    };
    Some((c, comm))
}

/// The backends' element type of `d`, for the dtypes collectives take (`f32`, `i64`).
fn scalar_type(d: DType) -> Result<ScalarType, String> {
    match d {
        DType::F32 => Ok(ScalarType::F32),
        DType::I64 => Ok(ScalarType::I64),
        d => Err(format!("collectives take f32 or i64 tensors, not {d}: cast with `to` first")),
    }
}

impl fmt::Debug for CollectiveKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CollectiveKernel").field("name", &self.name).field("backend", &self.backend).finish()
    }
}

impl OpKernel for CollectiveKernel {
    fn name(&self) -> &'static str {
        self.name
    }

    fn cross_device(&self) -> bool {
        // One operand per local member, on the members' devices.
        true
    }

    fn infer(
        &self,
        inputs: &[&TensorMeta],
        given: &[&TensorMeta],
        _attrs: &Attrs,
        outputs: &mut SmallVec<[OutSpec; 2]>,
    ) -> Result<(), String> {
        let members = self.backend.members();
        let world = self.backend.world_size();
        if self.op == Collective::Barrier {
            if !inputs.is_empty() {
                return Err(format!("a barrier takes no inputs, {} given", inputs.len()));
            }
            for (i, m) in members.iter().enumerate() {
                if let Some(g) = given.get(i) {
                    if g.device != m.device {
                        return Err(format!("output {i} is on {}, but member {i} is {}", g.device, m.device));
                    }
                }
                outputs.push(OutSpec { shape: SmallVec::new(), dtype: DType::I64 });
            }
            return Ok(());
        }
        if inputs.len() != members.len() {
            return Err(format!(
                "communicator `{}` has {} local member(s) here ({}), {} input(s) given",
                self.comm,
                members.len(),
                members.iter().map(|m| m.device.to_string()).collect::<Vec<_>>().join(", "),
                inputs.len()
            ));
        }
        let first = inputs[0];
        scalar_type(first.dtype)?;
        for (i, (x, m)) in inputs.iter().zip(members).enumerate() {
            if x.device != m.device {
                return Err(format!(
                    "input {i} is on {}, but member {i} of `{}` is {}",
                    x.device, self.comm, m.device
                ));
            }
            if x.shape != first.shape || x.dtype != first.dtype {
                return Err(format!(
                    "input {i} is {}{:?}, input 0 is {}{:?}: every member's must match",
                    x.dtype,
                    &x.shape[..],
                    first.dtype,
                    &first.shape[..]
                ));
            }
            if let Some(g) = given.get(i) {
                if g.device != m.device {
                    return Err(format!("output {i} is on {}, but member {i} is {}", g.device, m.device));
                }
            }
        }
        let reduce = match self.op {
            Collective::AllReduce(r) | Collective::ReduceScatter(r) => Some(r),
            _ => None,
        };
        if reduce == Some(ReduceOp::Mean) && first.dtype != DType::F32 {
            return Err(format!("mean of {} values: use f32, or sum and divide", first.dtype));
        }
        let mut shape = first.shape.clone();
        match self.op {
            Collective::AllReduce(_) | Collective::Broadcast { .. } | Collective::Barrier => {}
            Collective::AllGather => {
                if shape.is_empty() {
                    shape.push(world);
                } else {
                    shape[0] *= world;
                }
            }
            Collective::ReduceScatter(_) => match shape.first_mut() {
                Some(d) if *d % world == 0 => *d /= world,
                _ => {
                    return Err(format!(
                        "reduce_scatter over {world} ranks needs a first dimension divisible by {world}, found {:?}",
                        &first.shape[..]
                    ))
                }
            },
        }
        if let Collective::Broadcast { root } = self.op {
            if root >= world {
                return Err(format!("broadcast from rank {root}, but `{}` has {world} ranks", self.comm));
            }
        }
        for _ in members {
            outputs.push(OutSpec { shape: shape.clone(), dtype: first.dtype });
        }
        Ok(())
    }

    fn compute(&self, ctx: &mut KernelCtx<'_, '_>) -> Result<(), String> {
        let seq = self.seq.next();
        let fail = |e: &dyn fmt::Display| format!("communicator `{}`, collective #{seq}: {e}", self.comm);
        let members = self.backend.members();
        let (dtype, count) = match ctx.inputs.first() {
            Some(x) => (scalar_type(x.meta.dtype).map_err(|e| fail(&e))?, x.meta.numel()),
            None => (ScalarType::I64, 0),
        };
        for (what, meta, data) in ctx
            .inputs
            .iter()
            .map(|x| ("input", x.meta, x.data))
            .chain(ctx.outputs.iter().map(|o| ("output", o.meta, o.data)))
        {
            let len = data.device_buffer().map_or(data.len(), |b| b.len());
            if meta.offset != 0 || !meta.is_contiguous() || meta.bytes() != len {
                return Err(fail(&format!(
                    "an {what} ({}) is a part of its storage: collectives take whole contiguous tensors (contiguous() or clone() first)",
                    meta.describe()
                )));
            }
        }
        let call = Call { op: self.op, dtype, count, seq };
        let mut parts: SmallVec<[Part<'_>; 4]> = SmallVec::new();
        let barrier = self.op == Collective::Barrier;
        for (i, out) in ctx.outputs.iter_mut().enumerate() {
            let device =
                members.get(i).map(|m| m.device).ok_or_else(|| fail(&"more outputs than members"))?;
            let send = match ctx.inputs.get(i) {
                _ if barrier => Buf::Host(&[]),
                Some(x) => match x.data.device_buffer() {
                    // SAFETY: the input's own device buffer, alive while this instruction
                    // runs, and read only (the dependence rules give it a read access); a
                    // device backend enqueues on this stream, behind which its release is
                    // ordered (stream-ordered free).
                    Some(b) => Buf::Device(unsafe { DeviceSpan::new(b.addr(), b.len()) }),
                    None => Buf::Host(x.data.as_bytes()),
                },
                None => return Err(fail(&"fewer inputs than members")),
            };
            // A barrier's output is its token, which the backend writes (on the device for a
            // device backend).
            let recv = match out.data.device_buffer() {
                // SAFETY: the output's own device buffer, with this instruction's write
                // access, alive and ordered as the input's above.
                Some(b) => BufMut::Device(unsafe { DeviceSpan::new(b.addr(), b.len()) }),
                // SAFETY: this instruction holds the write access to the output's storage,
                // which no input shares (the kernel does not work in place, so the builder
                // refuses that).
                None => BufMut::Host(unsafe { out.data.bytes_mut() }),
            };
            parts.push(Part { device, send, recv });
        }
        self.backend.run(&call, &mut parts).map_err(|e| fail(&e))
    }

    fn skipped(&self, why: &dyn fmt::Display) {
        let seq = self.seq.next();
        self.backend
            .abort(&format!("collective #{seq} (`{}`) was not issued on this rank: {why}", self.name));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn op_names_round_trip() {
        for op in [
            Collective::AllReduce(ReduceOp::Mean),
            Collective::ReduceScatter(ReduceOp::Max),
            Collective::Broadcast { root: 3 },
            Collective::AllGather,
            Collective::Barrier,
        ] {
            let name = op_name(op, "world");
            assert_eq!(parse_op_name(&name), Some((op, "world")), "{name}");
        }
        assert_eq!(parse_op_name("add"), None);
        assert_eq!(parse_op_name("all_reduce.avg@w"), None);
        assert_eq!(parse_op_name("barrier@"), None);
    }
}
