//! The NCCL backend: collectives of CUDA tensors, with libnccl loaded at run time.
//!
//! # Loading
//!
//! Nothing links libnccl. The first [`NcclBackend`] opens it with `libloading`, trying
//! [`ENV_NCCL_LIB`] if set, else `libnccl.so.2` (the name NCCL 2 installs, also the one in
//! the `nvidia-nccl` Python packages) and `libnccl.so`, and resolves the dozen functions the
//! backend calls. A library that cannot be opened, or lacks one of them, is
//! [`CclError::Unavailable`] with `backend: "nccl"`; so is a machine without the CUDA driver
//! or the GPU asked for. Nothing here panics on a missing library. (cudarc's own NCCL
//! bindings are not used: their loader looks for names that the packaged `libnccl.so.2`
//! does not have, and panics when none loads.)
//!
//! # Communicators
//!
//! - One GPU per process, torchrun's layout ([`NcclBackend::from_rendezvous`],
//!   [`NcclBackend::from_env`]): rank 0 makes the NCCL unique id and puts it in the
//!   rendezvous [`Store`] under `nccl/<name>/id`; the other ranks get it from there; every
//!   rank then calls `ncclCommInitRank` on its device (`cuda:LOCAL_RANK` unless another is
//!   given), which returns once all ranks have joined.
//! - Several GPUs of one process ([`NcclBackend::local`]): `ncclCommInitAll` makes one
//!   communicator with a rank per device, and [`Backend::run`] issues the members' parts
//!   between `ncclGroupStart` and `ncclGroupEnd`.
//!
//! # Streams
//!
//! [`Backend::run`] is called by the collective kernel while the collective stream of the
//! communicator's first member is the thread's current CUDA stream (`ep::cuda::with_current`,
//! set by the stream's `launch`), and enqueues the first member's part there, so the VM's
//! events on that stream order the collective with everything else. The other members'
//! parts go on streams the backend owns, one per member, joined to the first member's
//! stream by events both ways (they start after everything enqueued before the call, and
//! the first member's stream continues only once they are done). `run` returns once the
//! work is enqueued.
//!
//! | collective | NCCL |
//! | --- | --- |
//! | `all_reduce` sum / max / min / mean | `ncclAllReduce` with `ncclSum` / `ncclMax` / `ncclMin` / `ncclAvg` |
//! | `broadcast` | `ncclBroadcast` |
//! | `all_gather` | `ncclAllGather` |
//! | `reduce_scatter` | `ncclReduceScatter` |
//! | `barrier` | each member's token (its output, one `i64`) set to 1, then `ncclAllReduce` sum of it in place: the number of ranks |
//!
//! `f32` is `ncclFloat32` and `i64` is `ncclInt64`; `mean` is for `f32` only.
//!
//! # Abort
//!
//! [`Backend::abort`] calls `ncclCommAbort` on every member's communicator, which stops the
//! collectives still running on the GPUs (those waiting for a peer that died) and frees the
//! communicator. From then on the communicator is unusable: every later [`Backend::run`]
//! returns [`CclError::Aborted`] with the reason given to the first abort. A call of `run`
//! may be inside NCCL on the host when `abort` comes (NCCL connects to peers lazily, in the
//! first collective); NCCL handles must not be freed under it, so `abort` waits for the call
//! to return for at most [`ABORT_WAIT`], and if it does not, the abort is completed by that
//! call when it returns (the reason is recorded at once, and no new call starts).
//! After each enqueue, `run` asks NCCL for asynchronous errors (`ncclCommGetAsyncError`)
//! and reports one as [`CclError::Backend`].

use std::ffi::{c_char, c_int, c_void, CStr};
use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use cudarc::driver::{sys, CudaContext};
use parking_lot::Mutex;

use super::store::{Rendezvous, Store};
use super::{
    check_parts, Backend, Buf, BufMut, Call, CclError, Collective, Member, Part, ReduceOp, ScalarType,
};
use crate::ep::{DeviceId, Stream};

/// The environment variable naming the NCCL library to open instead of `libnccl.so.2` /
/// `libnccl.so` (a path, or a name the dynamic loader finds).
pub const ENV_NCCL_LIB: &str = "EAGERVM_NCCL_LIB";

/// How long [`Backend::abort`] waits for a call of `run` that is inside NCCL (module docs).
pub const ABORT_WAIT: Duration = Duration::from_millis(500);

const BACKEND: &str = "nccl";

type Comm = *mut c_void;
type Res = c_int;
const SUCCESS: Res = 0;
const IN_PROGRESS: Res = 7;

/// `ncclUniqueId`: 128 opaque bytes.
#[repr(C)]
#[derive(Clone, Copy)]
struct UniqueId {
    internal: [c_char; 128],
}

/// The functions of libnccl the backend calls, with the library that holds them.
struct Lib {
    get_error_string: unsafe extern "C" fn(Res) -> *const c_char,
    get_version: unsafe extern "C" fn(*mut c_int) -> Res,
    get_unique_id: unsafe extern "C" fn(*mut UniqueId) -> Res,
    comm_init_rank: unsafe extern "C" fn(*mut Comm, c_int, UniqueId, c_int) -> Res,
    comm_init_all: unsafe extern "C" fn(*mut Comm, c_int, *const c_int) -> Res,
    comm_abort: unsafe extern "C" fn(Comm) -> Res,
    comm_destroy: unsafe extern "C" fn(Comm) -> Res,
    comm_get_async_error: unsafe extern "C" fn(Comm, *mut Res) -> Res,
    all_reduce:
        unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, Comm, sys::CUstream) -> Res,
    broadcast:
        unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, Comm, sys::CUstream) -> Res,
    all_gather: unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, Comm, sys::CUstream) -> Res,
    reduce_scatter:
        unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, Comm, sys::CUstream) -> Res,
    group_start: unsafe extern "C" fn() -> Res,
    group_end: unsafe extern "C" fn() -> Res,
    /// Keeps the functions above loaded; never dropped (the `Lib` lives in a static).
    _lib: libloading::Library,
}

/// Open the first of `names` that loads and resolve the functions; the error says which
/// names were tried, or which function is missing.
fn load(names: &[String]) -> Result<Lib, String> {
    let mut lib = None;
    for name in names {
        // SAFETY: opening libnccl runs its initialisers, which have no preconditions (it
        // initialises CUDA lazily, at its first call).
        if let Ok(l) = unsafe { libloading::Library::new(name) } {
            lib = Some(l);
            break;
        }
    }
    let lib = lib.ok_or_else(|| {
        format!("libnccl cannot be loaded (tried {}); install NCCL or set {ENV_NCCL_LIB}", names.join(", "))
    })?;
    macro_rules! sym {
        ($name:literal) => {
            // SAFETY: the symbol is NCCL's C function of this name, whose C signature (NCCL
            // 2's `nccl.h`, unchanged since 2.4) is the field's type; the pointer stays
            // valid while `_lib` is loaded, which is for the life of the process.
            *unsafe { lib.get($name) }.map_err(|e| {
                format!(
                    "libnccl lacks {} (an NCCL 2 library, 2.4 or later, is needed): {e}",
                    String::from_utf8_lossy(&$name[..$name.len() - 1])
                )
            })?
        };
    }
    Ok(Lib {
        get_error_string: sym!(b"ncclGetErrorString\0"),
        get_version: sym!(b"ncclGetVersion\0"),
        get_unique_id: sym!(b"ncclGetUniqueId\0"),
        comm_init_rank: sym!(b"ncclCommInitRank\0"),
        comm_init_all: sym!(b"ncclCommInitAll\0"),
        comm_abort: sym!(b"ncclCommAbort\0"),
        comm_destroy: sym!(b"ncclCommDestroy\0"),
        comm_get_async_error: sym!(b"ncclCommGetAsyncError\0"),
        all_reduce: sym!(b"ncclAllReduce\0"),
        broadcast: sym!(b"ncclBroadcast\0"),
        all_gather: sym!(b"ncclAllGather\0"),
        reduce_scatter: sym!(b"ncclReduceScatter\0"),
        group_start: sym!(b"ncclGroupStart\0"),
        group_end: sym!(b"ncclGroupEnd\0"),
        _lib: lib,
    })
}

/// The library names to try: [`ENV_NCCL_LIB`], or the usual ones.
fn lib_names() -> Vec<String> {
    match std::env::var(ENV_NCCL_LIB) {
        Ok(name) => vec![name],
        Err(_) => vec!["libnccl.so.2".into(), "libnccl.so".into()],
    }
}

fn lib() -> Result<&'static Lib, CclError> {
    static LIB: OnceLock<Result<Lib, String>> = OnceLock::new();
    LIB.get_or_init(|| load(&lib_names()))
        .as_ref()
        .map_err(|why| CclError::Unavailable { backend: BACKEND, why: why.clone() })
}

/// Whether libnccl can be loaded here: its version (`major * 10000 + minor * 100 + patch`
/// for NCCL 2.9 and later), or why not ([`CclError::Unavailable`]). Touches no GPU.
pub fn probe() -> Result<i32, CclError> {
    let lib = lib()?;
    let mut v: c_int = 0;
    // SAFETY: `v` is a valid out-pointer; ncclGetVersion has no other precondition.
    check(lib, unsafe { (lib.get_version)(&mut v) }, "ncclGetVersion")?;
    Ok(v)
}

/// NCCL's result `r` of `what` as an error value.
fn check(lib: &Lib, r: Res, what: &str) -> Result<(), CclError> {
    if r == SUCCESS || r == IN_PROGRESS {
        return Ok(());
    }
    // SAFETY: ncclGetErrorString returns a static NUL-terminated string for any code.
    let msg = unsafe { (lib.get_error_string)(r) };
    let msg = if msg.is_null() {
        format!("error {r}")
    } else {
        // SAFETY: non-null, NUL-terminated and static (above).
        unsafe { CStr::from_ptr(msg) }.to_string_lossy().into_owned()
    };
    Err(CclError::Backend { backend: BACKEND, what: format!("{what}: {msg} ({r})") })
}

fn unavailable(why: impl fmt::Display) -> CclError {
    CclError::Unavailable { backend: BACKEND, why: why.to_string() }
}

fn driver(what: &str) -> impl Fn(cudarc::driver::DriverError) -> CclError + '_ {
    move |e| CclError::Backend { backend: BACKEND, what: format!("{what}: {e}") }
}

/// The CUDA context of `cuda:index`, after the same checks as `ep::cuda::open`.
fn context(index: u16) -> Result<Arc<CudaContext>, CclError> {
    crate::ep::cuda::probe().map_err(|e| unavailable(format!("cuda:{index}: {e}")))?;
    let count = crate::ep::cuda::device_count().map_err(unavailable)?;
    if index >= count {
        return Err(unavailable(format!("cuda:{index} does not exist ({count} CUDA device(s))")));
    }
    std::panic::catch_unwind(|| CudaContext::new(usize::from(index)))
        .map_err(|_| unavailable(format!("opening cuda:{index} panicked")))?
        .map_err(|e| unavailable(format!("cuda:{index}: {e}")))
}

/// What the backend keeps per local member besides its communicator.
struct Local {
    ctx: Arc<CudaContext>,
    /// Members after the first: their stream, and the events that join it to the first
    /// member's stream (`before`: recorded there, waited for here; `after`: the reverse).
    aux: Option<(sys::CUstream, sys::CUevent, sys::CUevent)>,
}

/// The NCCL state, behind the lock that `run` and `abort` share (module docs, "Abort").
struct State {
    /// One communicator per local member; empty once aborted.
    comms: Vec<Comm>,
    locals: Vec<Local>,
}

/// A communicator over NCCL (module docs).
pub struct NcclBackend {
    lib: &'static Lib,
    members: Vec<Member>,
    world: usize,
    state: Mutex<State>,
    /// `Some(why)` once aborted.
    aborted: Mutex<Option<String>>,
    /// The rendezvous store, kept for the communicator's life (rank 0 serves it).
    _store: Option<Store>,
}

// SAFETY: the raw NCCL and CUDA handles are used only with `state` locked (one thread at a
// time, as NCCL requires of a communicator), and freed once, in `abort` or `drop`; the
// driver and NCCL allow their handles to be used from any thread.
unsafe impl Send for NcclBackend {}
// SAFETY: as above: every use of a handle is under `state`'s lock.
unsafe impl Sync for NcclBackend {}

impl fmt::Debug for NcclBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NcclBackend").field("world", &self.world).field("members", &self.members).finish()
    }
}

impl NcclBackend {
    /// One member per process (torchrun's layout): rank `rdv.rank` of `rdv.world_size`, on
    /// `cuda:<device>` (default `cuda:LOCAL_RANK`), the unique id exchanged through `store`
    /// under `nccl/<name>/id`, waiting at most `timeout` for it. Returns once every rank
    /// has joined.
    pub fn from_rendezvous(
        rdv: &Rendezvous,
        store: &Store,
        name: &str,
        device: Option<u16>,
        timeout: Duration,
    ) -> Result<NcclBackend, CclError> {
        let lib = lib()?;
        let index = match device {
            Some(d) => d,
            None => u16::try_from(rdv.local_rank)
                .map_err(|_| unavailable(format!("LOCAL_RANK {} is no CUDA device", rdv.local_rank)))?,
        };
        let ctx = context(index)?;
        let (world, rank) = (to_int(rdv.world_size)?, to_int(rdv.rank)?);
        let key = format!("nccl/{name}/id");
        let id = if rdv.rank == 0 {
            let mut id = UniqueId { internal: [0; 128] };
            // SAFETY: `id` is a valid out-pointer of the right size.
            check(lib, unsafe { (lib.get_unique_id)(&mut id) }, "ncclGetUniqueId")?;
            let bytes: Vec<u8> = id.internal.iter().map(|&c| c as u8).collect();
            store.set(&key, &bytes).map_err(unavailable)?;
            id
        } else {
            let bytes = store.get(&key, timeout).map_err(unavailable)?;
            if bytes.len() != 128 {
                return Err(unavailable(format!(
                    "the unique id under {key:?} has {} bytes, not 128",
                    bytes.len()
                )));
            }
            let mut id = UniqueId { internal: [0; 128] };
            for (d, s) in id.internal.iter_mut().zip(&bytes) {
                *d = *s as c_char;
            }
            id
        };
        ctx.bind_to_thread().map_err(driver("binding the context"))?;
        let mut comm: Comm = std::ptr::null_mut();
        // SAFETY: `comm` is a valid out-pointer; the device's context is current, so NCCL
        // makes the communicator on it; `id` came from rank 0's ncclGetUniqueId.
        check(lib, unsafe { (lib.comm_init_rank)(&mut comm, world, id, rank) }, "ncclCommInitRank")?;
        let member = Member { device: DeviceId::cuda(index), rank: rdv.rank };
        Self::finish(lib, rdv.world_size, vec![member], vec![comm], vec![ctx], None)
    }

    /// As [`from_rendezvous`](Self::from_rendezvous), with the rendezvous from the
    /// environment ([`Rendezvous::from_env`]) and its store, waiting at most `timeout` to
    /// reach the store and for the unique id.
    pub fn from_env(name: &str, timeout: Duration) -> Result<NcclBackend, CclError> {
        lib()?;
        let rdv = Rendezvous::from_env().map_err(unavailable)?;
        let store = rdv.store(timeout).map_err(unavailable)?;
        let mut b = Self::from_rendezvous(&rdv, &store, name, None, timeout)?;
        b._store = Some(store);
        Ok(b)
    }

    /// One communicator over several GPUs of this process (`ncclCommInitAll`): rank `r` is
    /// `cuda:devices[r]`.
    pub fn local(devices: &[u16]) -> Result<NcclBackend, CclError> {
        let lib = lib()?;
        if devices.is_empty() {
            return Err(CclError::Invalid("a communicator needs at least one device".into()));
        }
        for (i, d) in devices.iter().enumerate() {
            if devices[..i].contains(d) {
                return Err(CclError::Invalid(format!("cuda:{d} is named twice")));
            }
        }
        let ctxs = devices.iter().map(|&d| context(d)).collect::<Result<Vec<_>, _>>()?;
        let list: Vec<c_int> = devices.iter().map(|&d| c_int::from(d)).collect();
        let mut comms: Vec<Comm> = vec![std::ptr::null_mut(); devices.len()];
        // SAFETY: `comms` has room for one handle per device of `list`, both of the length
        // passed; each device exists (checked by `context`).
        check(
            lib,
            unsafe { (lib.comm_init_all)(comms.as_mut_ptr(), to_int(list.len())?, list.as_ptr()) },
            "ncclCommInitAll",
        )?;
        let members =
            devices.iter().enumerate().map(|(rank, &d)| Member { device: DeviceId::cuda(d), rank }).collect();
        Self::finish(lib, devices.len(), members, comms, ctxs, None)
    }

    /// Make the members' auxiliary streams; on failure, free what
    /// was made (the communicators too).
    fn finish(
        lib: &'static Lib,
        world: usize,
        members: Vec<Member>,
        comms: Vec<Comm>,
        ctxs: Vec<Arc<CudaContext>>,
        store: Option<Store>,
    ) -> Result<NcclBackend, CclError> {
        let backend = NcclBackend {
            lib,
            members,
            world,
            state: Mutex::new(State { comms, locals: Vec::new() }),
            aborted: Mutex::new(None),
            _store: store,
        };
        {
            let mut st = backend.state.lock();
            for (i, ctx) in ctxs.into_iter().enumerate() {
                ctx.bind_to_thread().map_err(driver("binding the context"))?;
                let mut local = Local { ctx, aux: None };
                if i > 0 {
                    let stream = cudarc::driver::result::stream::create(
                        cudarc::driver::result::stream::StreamKind::NonBlocking,
                    )
                    .map_err(driver("cuStreamCreate"));
                    let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING;
                    let events = stream.and_then(|s| {
                        let a = cudarc::driver::result::event::create(flags).map_err(driver("cuEventCreate"));
                        let b = cudarc::driver::result::event::create(flags).map_err(driver("cuEventCreate"));
                        Ok((s, a?, b?))
                    });
                    match events {
                        Ok(aux) => local.aux = Some(aux),
                        Err(e) => {
                            st.locals.push(local);
                            return Err(e);
                        }
                    }
                }
                st.locals.push(local);
            }
        }
        Ok(backend)
    }

    /// The NCCL version loaded ([`probe`]).
    pub fn nccl_version(&self) -> i32 {
        let mut v: c_int = 0;
        // SAFETY: a valid out-pointer.
        let _ = unsafe { (self.lib.get_version)(&mut v) };
        v
    }

    /// Free the communicators with `ncclCommAbort` (`abort`) or `ncclCommDestroy`.
    fn free_comms(&self, st: &mut State, abort: bool) {
        for (comm, local) in st.comms.drain(..).zip(&st.locals) {
            let _ = local.ctx.bind_to_thread();
            // SAFETY: `comm` was made by NCCL and is freed once: drained from `comms`, which
            // `run` reads only under the same lock.
            let r = unsafe {
                if abort {
                    (self.lib.comm_abort)(comm)
                } else {
                    (self.lib.comm_destroy)(comm)
                }
            };
            if let Err(e) = check(self.lib, r, if abort { "ncclCommAbort" } else { "ncclCommDestroy" }) {
                tracing::error!(error = %e, "freeing an NCCL communicator");
            }
        }
    }

    /// Enqueue `call` for every member (the lock held, the communicators live).
    fn enqueue(
        &self,
        st: &State,
        call: &Call,
        parts: &[Part<'_>],
        first: sys::CUstream,
    ) -> Result<(), CclError> {
        let lib = self.lib;
        let dtype = match call.dtype {
            ScalarType::F32 => 7, // ncclFloat32
            ScalarType::I64 => 4, // ncclInt64
        };
        let red = |op: ReduceOp| -> Result<c_int, CclError> {
            Ok(match op {
                ReduceOp::Sum => 0,
                ReduceOp::Max => 2,
                ReduceOp::Min => 3,
                ReduceOp::Mean if call.dtype == ScalarType::F32 => 4, // ncclAvg
                ReduceOp::Mean => return Err(CclError::Invalid("mean of i64 values".into())),
            })
        };
        let addr = |b: &Buf<'_>| match b {
            Buf::Device(d) => Ok(d.addr() as usize as *const c_void),
            Buf::Host(_) => Err(CclError::Invalid("the nccl backend needs device buffers".into())),
        };
        let addr_mut = |b: &BufMut<'_>| match b {
            BufMut::Device(d) => Ok(d.addr() as usize as *mut c_void),
            BufMut::Host(_) => Err(CclError::Invalid("the nccl backend needs device buffers".into())),
        };
        let streams: Vec<sys::CUstream> =
            st.locals.iter().map(|l| l.aux.map_or(first, |(s, _, _)| s)).collect();
        // Members after the first start after what the first member's stream has before.
        for l in &st.locals[1..] {
            let (s, before, _) = l.aux.expect("members after the first have a stream");
            // SAFETY: live handles; waiting for an event of another device's context is
            // allowed by cuStreamWaitEvent.
            unsafe { cudarc::driver::result::event::record(before, first) }
                .map_err(driver("cuEventRecord"))?;
            // SAFETY: as above.
            unsafe { sys::cuStreamWaitEvent(s, before, 0) }.result().map_err(driver("cuStreamWaitEvent"))?;
        }
        if call.op == Collective::Barrier {
            // Each token becomes 1 (an `i64`: the low word 1, the high word 0, little-endian
            // as every CUDA platform is), on its member's stream ahead of the reduction,
            // which sums the tokens into the number of ranks.
            for (i, p) in parts.iter().enumerate() {
                let token = addr_mut(&p.recv)? as usize as sys::CUdeviceptr;
                if i > 0 {
                    st.locals[i].ctx.bind_to_thread().map_err(driver("binding the context"))?;
                }
                // SAFETY: `token` is the member's 8-byte output (`check_parts`), a device
                // allocation of its device, written only by this instruction; the stream is
                // a live stream of that device, whose context is current.
                unsafe {
                    sys::cuMemsetD32Async(token, 1, 1, streams[i])
                        .result()
                        .map_err(driver("cuMemsetD32Async"))?;
                    sys::cuMemsetD32Async(token + 4, 0, 1, streams[i])
                        .result()
                        .map_err(driver("cuMemsetD32Async"))?;
                }
            }
            if parts.len() > 1 {
                st.locals[0].ctx.bind_to_thread().map_err(driver("binding the context"))?;
            }
        }
        let grouped = st.comms.len() > 1;
        if grouped {
            // SAFETY: no precondition.
            check(lib, unsafe { (lib.group_start)() }, "ncclGroupStart")?;
        }
        let mut result = Ok(());
        for (i, p) in parts.iter().enumerate() {
            let (comm, s) = (st.comms[i], streams[i]);
            let r = (|| -> Result<Res, CclError> {
                // SAFETY (every call below): the buffers are device allocations of the
                // member's device holding the bytes `check_parts` verified for this call
                // (send: `count` elements; recv: what the collective writes), kept alive by
                // the kernel until the stream's event after this launch completes; `comm`
                // is live (under the lock); `s` is a live stream of the member's device.
                Ok(match call.op {
                    Collective::AllReduce(op) => unsafe {
                        (lib.all_reduce)(
                            addr(&p.send)?,
                            addr_mut(&p.recv)?,
                            call.count,
                            dtype,
                            red(op)?,
                            comm,
                            s,
                        )
                    },
                    Collective::Broadcast { root } => unsafe {
                        (lib.broadcast)(
                            addr(&p.send)?,
                            addr_mut(&p.recv)?,
                            call.count,
                            dtype,
                            to_int(root)?,
                            comm,
                            s,
                        )
                    },
                    Collective::AllGather => unsafe {
                        (lib.all_gather)(addr(&p.send)?, addr_mut(&p.recv)?, call.count, dtype, comm, s)
                    },
                    Collective::ReduceScatter(op) => unsafe {
                        let n = call.count / self.world;
                        (lib.reduce_scatter)(addr(&p.send)?, addr_mut(&p.recv)?, n, dtype, red(op)?, comm, s)
                    },
                    Collective::Barrier => {
                        let b = addr_mut(&p.recv)?;
                        // SAFETY: `b` is the member's token (one `i64`), reduced in place
                        // (ncclInt64, ncclSum).
                        unsafe { (lib.all_reduce)(b, b, 1, 4, 0, comm, s) }
                    }
                })
            })();
            result = r.and_then(|r| check(lib, r, call.op.name()));
            if result.is_err() {
                break;
            }
        }
        if grouped {
            // SAFETY: no precondition; ends the group started above (also after a failed
            // call, which NCCL then reports here or has reported).
            let end = check(lib, unsafe { (lib.group_end)() }, "ncclGroupEnd");
            result = result.and(end);
        }
        result?;
        // The first member's stream continues once the others are done.
        for l in &st.locals[1..] {
            let (s, _, after) = l.aux.expect("members after the first have a stream");
            // SAFETY: live handles, as above.
            unsafe { cudarc::driver::result::event::record(after, s) }.map_err(driver("cuEventRecord"))?;
            // SAFETY: as above.
            unsafe { sys::cuStreamWaitEvent(first, after, 0) }
                .result()
                .map_err(driver("cuStreamWaitEvent"))?;
        }
        for &comm in &st.comms {
            let mut e: Res = SUCCESS;
            // SAFETY: live communicator; `e` is a valid out-pointer.
            check(lib, unsafe { (lib.comm_get_async_error)(comm, &mut e) }, "ncclCommGetAsyncError")?;
            check(lib, e, "asynchronous NCCL error")?;
        }
        Ok(())
    }
}

fn to_int(n: usize) -> Result<c_int, CclError> {
    c_int::try_from(n).map_err(|_| CclError::Invalid(format!("{n} is out of NCCL's range")))
}

impl Backend for NcclBackend {
    fn kind(&self) -> &'static str {
        BACKEND
    }

    fn world_size(&self) -> usize {
        self.world
    }

    fn members(&self) -> &[Member] {
        &self.members
    }

    /// Enqueue `call` on the current CUDA stream (the first member's collective stream,
    /// module docs, "Streams"); fails with [`CclError::Invalid`] when called outside a launch
    /// on that device's stream. The parts' device ranges are handed to NCCL as they are: each
    /// is a [`DeviceSpan`](super::DeviceSpan), whose `unsafe` constructor's caller vouched
    /// for it (the VM's collective kernel: the tensors' storages, kept alive until the
    /// stream's event after the launch).
    fn run(&self, call: &Call, parts: &mut [Part<'_>]) -> Result<(), CclError> {
        if let Some(why) = self.aborted() {
            return Err(CclError::Aborted(why));
        }
        check_parts(call, self.world, &self.members, parts)?;
        let first = crate::ep::cuda::with_current(|s| {
            s.filter(|s| s.device() == self.members[0].device).map(|s| s.cu_stream())
        })
        .ok_or_else(|| {
            CclError::Invalid(format!(
                "the nccl backend enqueues on the current stream of {}, and none is current",
                self.members[0].device
            ))
        })?;
        let mut st = self.state.lock();
        let result = match self.aborted() {
            Some(why) => Err(CclError::Aborted(why)),
            None if st.comms.is_empty() => Err(CclError::Aborted("the communicator was freed".into())),
            None => self.enqueue(&st, call, parts, first),
        };
        // An abort that came while the call was inside NCCL is completed here.
        if self.aborted().is_some() && !st.comms.is_empty() {
            self.free_comms(&mut st, true);
        }
        result
    }

    fn abort(&self, why: &str) {
        {
            let mut a = self.aborted.lock();
            if a.is_none() {
                *a = Some(why.to_string());
            }
        }
        match self.state.try_lock_for(ABORT_WAIT) {
            Some(mut st) => self.free_comms(&mut st, true),
            None => tracing::error!(
                reason = why,
                "an NCCL call is still running on the host; the communicator is aborted when it returns"
            ),
        }
    }

    fn aborted(&self) -> Option<String> {
        self.aborted.lock().clone()
    }
}

impl Drop for NcclBackend {
    fn drop(&mut self) {
        let mut st = std::mem::replace(self.state.get_mut(), State { comms: Vec::new(), locals: Vec::new() });
        self.free_comms(&mut st, false);
        for l in st.locals {
            let _ = l.ctx.bind_to_thread();
            // SAFETY: each handle was made in `finish` and is freed once, here, when no
            // collective can be enqueued any more (`&mut self`).
            unsafe {
                if let Some((s, a, b)) = l.aux {
                    let _ = cudarc::driver::result::event::destroy(a);
                    let _ = cudarc::driver::result::event::destroy(b);
                    let _ = cudarc::driver::result::stream::destroy(s);
                }
            }
        }
    }
}

/// A one-rank NCCL communicator over one GPU of this process, called directly with no VM in
/// between: the reference side of the NCCL benchmark (`bench::nccl`), on the library and
/// with the error reporting of the backend.
#[cfg(feature = "cli")]
pub(crate) struct DirectComm {
    lib: &'static Lib,
    comm: Comm,
}

#[cfg(feature = "cli")]
impl DirectComm {
    /// `ncclCommInitAll` over `cuda:device` alone. The device's context must be open.
    pub(crate) fn one(device: u16) -> Result<DirectComm, CclError> {
        let lib = lib()?;
        let list = [c_int::from(device)];
        let mut comm: Comm = std::ptr::null_mut();
        // SAFETY: `comm` has room for the one handle of the one device listed.
        check(lib, unsafe { (lib.comm_init_all)(&mut comm, 1, list.as_ptr()) }, "ncclCommInitAll")?;
        Ok(DirectComm { lib, comm })
    }

    /// Enqueue an `ncclAllReduce` (sum) of `count` `f32`s from `send` into `recv` on `stream`.
    ///
    /// # Safety
    /// `send` and `recv` are device allocations of at least `count` `f32`s on this
    /// communicator's device, alive until the call has run on `stream`, a live stream of
    /// that device.
    pub(crate) unsafe fn all_reduce_sum_f32(
        &self,
        send: *const c_void,
        recv: *mut c_void,
        count: usize,
        stream: sys::CUstream,
    ) -> Result<(), CclError> {
        // SAFETY: the contract; `comm` is live until drop. 7 is `ncclFloat32`, 0 `ncclSum`.
        let r = unsafe { (self.lib.all_reduce)(send, recv, count, 7, 0, self.comm, stream) };
        check(self.lib, r, "ncclAllReduce")
    }
}

#[cfg(feature = "cli")]
impl Drop for DirectComm {
    /// Destroy the communicator; its owner has finished the streams it was used on.
    fn drop(&mut self) {
        // SAFETY: `comm` was made by ncclCommInitAll and is destroyed once, here.
        let r = unsafe { (self.lib.comm_destroy)(self.comm) };
        if let Err(e) = check(self.lib, r, "ncclCommDestroy") {
            tracing::warn!(error = %e, "destroying a direct NCCL communicator");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_is_a_typed_error() {
        let names = ["libeagervm-no-such-nccl.so.2".to_string()];
        let e = load(&names).err().expect("no such library");
        assert!(e.contains("libeagervm-no-such-nccl.so.2") && e.contains(ENV_NCCL_LIB), "{e}");
    }

    /// Here (no libnccl, or no GPU) every constructor fails with `Unavailable`, never a
    /// panic; on a machine with both, a one-rank communicator is made.
    #[test]
    fn without_nccl_or_a_gpu_the_backend_is_unavailable() {
        let r = NcclBackend::local(&[0]);
        let usable = probe().is_ok() && crate::ep::cuda::available(0).is_ok();
        match r {
            Ok(b) => {
                assert!(usable);
                assert_eq!(b.world_size(), 1);
            }
            Err(CclError::Unavailable { backend, why }) => {
                assert_eq!(backend, "nccl");
                assert!(!why.is_empty());
                assert!(!usable, "nccl and cuda:0 are usable, yet: {why}");
            }
            Err(e) => panic!("expected Unavailable, got {e:?}"),
        }
        // The rendezvous needs the library first, so a process without it fails the same
        // way whatever its environment.
        if probe().is_err() {
            assert!(matches!(
                NcclBackend::from_env("w", Duration::from_millis(10)),
                Err(CclError::Unavailable { .. })
            ));
        }
    }
}
