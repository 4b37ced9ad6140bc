//! Collective communication: the engines that move tensors between the ranks of a
//! communicator (OneFlow's CCL, PyTorch's process-group backends).
//!
//! A communicator has `world_size` ranks. A process takes part with one or more *members*,
//! each a local device with its global rank: one GPU per process (torchrun's layout, MPI's),
//! or several devices of one process in one communicator, whose parts of a collective are
//! issued together (NCCL's grouped calls). A [`Backend`] runs one collective for all local
//! members at once ([`Backend::run`]), given one [`Part`] (send and receive buffer) per
//! member, in member order.
//!
//! Backends, one file each:
//! - [`mock`]: every rank is a mock (or CPU) device of one VM, so the backend computes the
//!   result from the parts it is given. A test double, like the mock device: it lets the
//!   property tests mix collectives into random programs, and its injected hang lets the
//!   watchdog be tested, without a second process.
//! - `mpi` (cargo feature `mpi`): host tensors over MPI, one rank per process, launched by
//!   `mpirun` (`docs/distributed.md`).
//! - `nccl` (cargo feature `cuda`): CUDA tensors over NCCL, loaded at run time.
//!
//! [`store`] is the torchrun-style rendezvous (`WORLD_SIZE`, `RANK`, `LOCAL_RANK`,
//! `MASTER_ADDR`, `MASTER_PORT`) and the TCP store through which ranks exchange the NCCL
//! unique id.
//!
//! Every backend can be *aborted* ([`Backend::abort`]): a collective waiting for a peer
//! then returns [`CclError::Aborted`] instead of waiting for ever, and so does every later
//! one. The VM's watchdog aborts a communicator whose collective has been in flight longer
//! than its timeout (`docs/distributed.md`).

pub mod mock;
#[cfg(feature = "mpi")]
pub mod mpi;
#[cfg(feature = "cuda")]
pub mod nccl;
pub mod reduce;
pub mod store;

use std::fmt;

use super::DeviceId;

/// The element type of a collective's buffers (the VM's dtypes, as the device layer names
/// them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScalarType {
    /// 32-bit float.
    F32,
    /// 64-bit signed integer.
    I64,
}

impl ScalarType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            ScalarType::F32 => 4,
            ScalarType::I64 => 8,
        }
    }
}

/// How an all-reduce or a reduce-scatter combines the ranks' values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// The sum.
    Sum,
    /// The largest value.
    Max,
    /// The smallest value.
    Min,
    /// The sum divided by the number of ranks (floating-point dtypes only).
    Mean,
}

impl ReduceOp {
    /// All reductions, in the order of their names in traces.
    pub const ALL: [ReduceOp; 4] = [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min, ReduceOp::Mean];

    /// Its name (`sum`, `max`, `min`, `mean`).
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
            ReduceOp::Mean => "mean",
        }
    }
}

/// One collective operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Collective {
    /// Every rank receives the reduction of all ranks' buffers.
    AllReduce(ReduceOp),
    /// Every rank receives rank `root`'s buffer.
    Broadcast {
        /// The rank whose buffer is sent.
        root: usize,
    },
    /// Every rank receives all ranks' buffers, concatenated in rank order.
    AllGather,
    /// Rank `r` receives the `r`-th of `world_size` equal slices of the reduction.
    ReduceScatter(ReduceOp),
    /// Returns on every rank once every rank has entered it, and writes the number of ranks
    /// into each member's receive buffer: one `i64`, the barrier's token.
    Barrier,
}

impl Collective {
    /// Its name as ops are named (`all_reduce`, `broadcast`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Collective::AllReduce(_) => "all_reduce",
            Collective::Broadcast { .. } => "broadcast",
            Collective::AllGather => "all_gather",
            Collective::ReduceScatter(_) => "reduce_scatter",
            Collective::Barrier => "barrier",
        }
    }
}

/// One call of a collective, as a backend receives it.
#[derive(Debug, Clone, Copy)]
pub struct Call {
    /// What to do.
    pub op: Collective,
    /// The element type.
    pub dtype: ScalarType,
    /// Elements in each member's send buffer (0 for a barrier).
    pub count: usize,
    /// Its position among the communicator's collectives in this process, from 0: every
    /// rank issues the same collectives in the same order, so the `seq`-th call of every
    /// rank is one collective.
    pub seq: u64,
}

/// A range of device memory that a device backend may hand to its library. Made only
/// through the `unsafe` [`DeviceSpan::new`], whose caller vouches for the range, so that
/// safe code can never make a backend read or write memory it does not own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceSpan {
    addr: u64,
    len: usize,
}

impl DeviceSpan {
    /// The `len` bytes at device address `addr`.
    ///
    /// # Safety
    ///
    /// The range must be memory of the part's device, allocated, and neither freed nor used
    /// by anything else until the collective it is given to has completed on the stream it
    /// is enqueued on; readable by the device for a send buffer and writable for a receive
    /// buffer.
    pub unsafe fn new(addr: u64, len: usize) -> DeviceSpan {
        DeviceSpan { addr, len }
    }

    /// Address of the first byte.
    pub fn addr(self) -> u64 {
        self.addr
    }

    /// Length in bytes.
    pub fn len(self) -> usize {
        self.len
    }

    /// Whether it holds no bytes.
    pub fn is_empty(self) -> bool {
        self.len == 0
    }
}

/// Bytes a collective reads.
#[derive(Debug)]
pub enum Buf<'a> {
    /// In host memory.
    Host(&'a [u8]),
    /// In device memory.
    Device(DeviceSpan),
}

/// Bytes a collective writes.
#[derive(Debug)]
pub enum BufMut<'a> {
    /// In host memory.
    Host(&'a mut [u8]),
    /// In device memory.
    Device(DeviceSpan),
}

/// One local member's buffers for one collective.
#[derive(Debug)]
pub struct Part<'a> {
    /// The member's device.
    pub device: DeviceId,
    /// What it contributes (empty for a barrier).
    pub send: Buf<'a>,
    /// What it receives (for a barrier, the token: one `i64`).
    pub recv: BufMut<'a>,
}

/// A local device taking part in a communicator, with its rank there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Member {
    /// The device.
    pub device: DeviceId,
    /// Its rank in the communicator.
    pub rank: usize,
}

/// What can go wrong in a collective.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CclError {
    /// The communicator was aborted (by the watchdog, or by the user): this collective and
    /// every later one of the communicator fail.
    #[error("the communicator was aborted: {0}")]
    Aborted(String),
    /// The backend reported an error.
    #[error("{backend}: {what}")]
    Backend {
        /// Which backend (`mpi`, `nccl`, `mock`).
        backend: &'static str,
        /// Its message.
        what: String,
    },
    /// The backend cannot be used here (no library, no launcher, a bad rendezvous).
    #[error("{backend} is not available: {why}")]
    Unavailable {
        /// Which backend.
        backend: &'static str,
        /// Why not.
        why: String,
    },
    /// The call does not fit the communicator (buffer sizes, member count, root).
    #[error("{0}")]
    Invalid(String),
}

/// A collective-communication engine for the local members of one communicator.
///
/// Implementations are shared by every stream that issues the communicator's collectives;
/// the VM issues them in program order, one at a time per communicator, from the collective
/// stream of the communicator's first member.
pub trait Backend: Send + Sync + fmt::Debug {
    /// The backend's name (`mock`, `mpi`, `nccl`).
    fn kind(&self) -> &'static str;
    /// Ranks in the communicator, over all processes.
    fn world_size(&self) -> usize;
    /// The local members, in the order of the parts [`run`](Self::run) is given.
    fn members(&self) -> &[Member];
    /// Run `call` for every local member: `parts[i]` is member `i`'s. Returns once the
    /// collective is complete for the local members (host backends), or once it is
    /// enqueued on the members' streams (device backends, whose completion the stream's
    /// events report). Fails with [`CclError::Aborted`] once the communicator is aborted.
    fn run(&self, call: &Call, parts: &mut [Part<'_>]) -> Result<(), CclError>;
    /// Abort the communicator: a collective waiting for a peer returns an error, and every
    /// later one fails at once. Safe to call from any thread, more than once.
    fn abort(&self, why: &str);
    /// Whether the communicator has been aborted, and why.
    fn aborted(&self) -> Option<String>;
}

/// The size of a barrier's receive buffer: one `i64`, the number of ranks.
pub const BARRIER_TOKEN_BYTES: usize = 8;

/// Check that `parts` fit `call` on a communicator of `world` ranks with `members`: one
/// part per member, on its device, and buffers of the sizes the collective needs. Every
/// backend calls it before touching a byte.
pub fn check_parts(
    call: &Call,
    world: usize,
    members: &[Member],
    parts: &[Part<'_>],
) -> Result<(), CclError> {
    if parts.len() != members.len() {
        return Err(CclError::Invalid(format!(
            "{} parts given for {} local members",
            parts.len(),
            members.len()
        )));
    }
    let n = call.count * call.dtype.size();
    let (send, recv) = match call.op {
        Collective::AllReduce(_) | Collective::Broadcast { .. } => (n, n),
        Collective::AllGather => (n, n * world),
        Collective::ReduceScatter(_) => {
            if call.count % world != 0 {
                return Err(CclError::Invalid(format!(
                    "reduce_scatter of {} elements over {world} ranks: not a multiple",
                    call.count
                )));
            }
            (n, n / world)
        }
        Collective::Barrier => (0, BARRIER_TOKEN_BYTES),
    };
    if let Collective::Broadcast { root } = call.op {
        if root >= world {
            return Err(CclError::Invalid(format!("broadcast from rank {root} of {world}")));
        }
    }
    for (m, p) in members.iter().zip(parts) {
        if p.device != m.device {
            return Err(CclError::Invalid(format!("a part on {} for the member on {}", p.device, m.device)));
        }
        let (s, r) = (buf_len(&p.send), buf_mut_len(&p.recv));
        if s != send || r != recv {
            return Err(CclError::Invalid(format!(
                "{} on {}: buffers of {s} and {r} bytes, expected {send} and {recv}",
                call.op.name(),
                m.device
            )));
        }
    }
    Ok(())
}

fn buf_len(b: &Buf<'_>) -> usize {
    match b {
        Buf::Host(s) => s.len(),
        Buf::Device(d) => d.len(),
    }
}

fn buf_mut_len(b: &BufMut<'_>) -> usize {
    match b {
        BufMut::Host(s) => s.len(),
        BufMut::Device(d) => d.len(),
    }
}
