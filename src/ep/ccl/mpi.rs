//! The MPI collective backend: host tensors, one rank per process, over the `mpi` crate
//! (cargo feature `mpi`).
//!
//! [`MpiBackend::world`] makes a communicator over every process of the job that `mpirun`
//! (or any MPI launcher) started: its one local member is `cpu:0`, its rank and size are
//! the process's in `MPI_COMM_WORLD`. It runs on a duplicate of `MPI_COMM_WORLD` (so its
//! collectives never match a program's own MPI calls) whose error handler is
//! `MPI_ERRORS_RETURN`, so that MPI's errors come back as [`CclError::Backend`] values
//! instead of ending the process. A process started without a launcher is a world of one
//! rank (MPI's singleton start), where every collective is a copy.
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use eagervm::ep::ccl::{mpi::MpiBackend, ReduceOp};
//! let vm = eagervm::VirtualMachine::new(eagervm::vm::Config::default())?;
//! let comm = vm.communicator("world", Arc::new(MpiBackend::world()?))?;
//! let x = vm.from_slice(&[1.0f32, 2.0], &[2], eagervm::ep::DeviceId::CPU)?;
//! let sum = vm.run(|b| b.all_reduce(&comm, &[&x], ReduceOp::Sum))?;
//! println!("{:?}", sum[0].to_vec::<f32>()?);
//! # Ok(()) }
//! ```
//!
//! # Initialisation and finalisation
//!
//! MPI may be initialised once per process. The first [`MpiBackend::world`] initialises it
//! (with `MPI_THREAD_MULTIPLE`: the VM calls MPI from its collective stream's thread, and a
//! program may call it from others) and keeps the `mpi` crate's `Universe` in a
//! process-wide cell; `MPI_Finalize` runs when the process exits (an `atexit` handler, so
//! both a return from `main` and `std::process::exit` finalise). If the program initialised
//! MPI itself (with `mpi::initialize_with_threading(Threading::Multiple)`), the backend uses
//! that and leaves finalisation to it. After a communicator was aborted while a collective was in flight (or MPI failed one), the exit handler
//! does not finalise: `MPI_Finalize` could wait for the dead peer, and the job is broken
//! anyway (`mpirun` then reports that the process exited without finalising).
//!
//! # Aborting, and a dead peer
//!
//! Every collective is started nonblocking (`MPI_Iallreduce`, `MPI_Ibcast`,
//! `MPI_Iallgather`, `MPI_Ireduce_scatter_block`, `MPI_Ibarrier`) and its completion
//! polled with `MPI_Test`: yielding for the first [`Polling::yield_for`], then sleeping,
//! with a backoff from 50 µs to [`Polling::max_sleep`]. Between polls it checks whether the
//! communicator was [aborted](Backend::abort); if so the collective returns
//! [`CclError::Aborted`], and so does every later one at once. MPI offers no way to cancel a
//! started collective: its request is left outstanding, and the buffers MPI may still read
//! and write are leaked, never freed (they are owned staging buffers, not the tensors', so
//! the tensors are released as usual). A dead peer makes MPI (OpenMPI 4 without its
//! fault-tolerance extensions) wait for ever; the VM's watchdog aborts the communicator after
//! its timeout, which turns the wait into an error on the collective's outputs
//! (`docs/distributed.md`).
//!
//! # Costs
//!
//! Each collective copies its input into a staging buffer and its result out of one (the
//! price of abortability: the tensors' memory must be free to reuse once the kernel
//! returns). The buffers are kept and reused by the next call. MPI makes progress only inside
//! MPI calls, so a collective progresses at each poll (`docs/performance.md`, "Collectives
//! over MPI", has the figures).

use std::ffi::{c_int, c_void};
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use mpi::ffi;
use mpi::Threading;
use parking_lot::Mutex;

use super::reduce::finish;
use super::{
    check_parts, Backend, Buf, BufMut, Call, CclError, Collective, Member, Part, ReduceOp, ScalarType,
};
use crate::ep::DeviceId;

/// Where MPI stands in this process. Every MPI call of this module is made holding this
/// lock, so that none runs concurrently with (or after) the finalisation at exit.
enum Phase {
    /// Not initialised by this module yet.
    Start,
    /// Initialised with `MPI_THREAD_MULTIPLE`; `Some` when this module initialised it and
    /// finalises it at exit, `None` when the program did.
    Ready(Option<mpi::environment::Universe>),
    /// MPI cannot be used here (why).
    Unusable(String),
    /// Finalised.
    Finalized,
}

static MPI: Mutex<Phase> = Mutex::new(Phase::Start);

/// Set once a collective of this module was left outstanding (aborted, or failed in MPI):
/// then the exit handler does not finalise (module docs).
static LEFT_OUTSTANDING: AtomicBool = AtomicBool::new(false);

fn unavailable(why: impl Into<String>) -> CclError {
    CclError::Unavailable { backend: "mpi", why: why.into() }
}

/// Initialise MPI if nobody has, under `MPI`'s lock.
fn initialise(phase: &mut Phase) -> Result<(), CclError> {
    if let Phase::Start = phase {
        *phase = if mpi::environment::is_finalized() {
            Phase::Finalized
        } else if mpi::environment::is_initialized() {
            match mpi::environment::threading_support() {
                Threading::Multiple => Phase::Ready(None),
                t => Phase::Unusable(format!(
                    "MPI was initialised with {t:?} threading; the VM needs Threading::Multiple"
                )),
            }
        } else {
            match mpi::initialize_with_threading(Threading::Multiple) {
                Some((universe, Threading::Multiple)) => {
                    // SAFETY: `finalize_at_exit` is an `extern "C" fn()` that never unwinds;
                    // registering it has no other precondition.
                    let rc = unsafe { libc::atexit(finalize_at_exit) };
                    if rc != 0 {
                        tracing::warn!("mpi: could not register MPI_Finalize at exit");
                    }
                    Phase::Ready(Some(universe))
                }
                Some((universe, t)) => {
                    // Keep it (and finalise at exit): MPI cannot be initialised again.
                    let why = format!("this MPI library provides {t:?} threading; the VM needs Multiple");
                    *phase = Phase::Ready(Some(universe));
                    // SAFETY: as above.
                    unsafe { libc::atexit(finalize_at_exit) };
                    return Err(unavailable(why));
                }
                None => Phase::Unusable("MPI could not be initialised".into()),
            }
        };
    }
    match phase {
        Phase::Ready(_) => {
            if mpi::environment::threading_support() == Threading::Multiple {
                Ok(())
            } else {
                Err(unavailable("this MPI library does not provide Threading::Multiple"))
            }
        }
        Phase::Unusable(why) => Err(unavailable(why.clone())),
        Phase::Finalized => Err(unavailable("MPI has been finalised in this process")),
        Phase::Start => unreachable!("set above"),
    }
}

/// Run `f` (MPI calls) under the lock, if MPI is initialised and not finalised.
fn with_mpi<R>(f: impl FnOnce() -> R) -> Result<R, CclError> {
    let phase = MPI.lock();
    match &*phase {
        Phase::Ready(_) => Ok(f()),
        Phase::Finalized => Err(unavailable("MPI has been finalised in this process")),
        Phase::Start | Phase::Unusable(_) => Err(unavailable("MPI is not initialised")),
    }
}

/// The exit handler: finalise MPI if this module initialised it, no communicator was
/// aborted, and no MPI call of this module is under way (it waits 200 ms at most for one).
extern "C" fn finalize_at_exit() {
    let Some(mut phase) = MPI.try_lock_for(Duration::from_millis(200)) else {
        return;
    };
    if LEFT_OUTSTANDING.load(Ordering::Acquire) {
        return;
    }
    if let Phase::Ready(Some(_)) = &*phase {
        // Dropping the universe calls MPI_Finalize.
        *phase = Phase::Finalized;
    }
}

/// The text of MPI error code `rc`.
fn error_text(rc: c_int) -> String {
    let mut buf = [0 as std::ffi::c_char; ffi::MPI_MAX_ERROR_STRING as usize + 1];
    let mut len: c_int = 0;
    // SAFETY: `buf` holds MPI_MAX_ERROR_STRING characters, as MPI_Error_string requires, and
    // `len` is a valid out-pointer. It may be called at any time, even before MPI_Init.
    let ok = unsafe { ffi::MPI_Error_string(rc, buf.as_mut_ptr(), &mut len) };
    if ok != ffi::MPI_SUCCESS as c_int {
        return format!("MPI error {rc}");
    }
    let len = (len.max(0) as usize).min(buf.len());
    let bytes: Vec<u8> = buf[..len].iter().map(|&c| c as u8).collect();
    format!("{} (MPI error {rc})", String::from_utf8_lossy(&bytes))
}

fn check(rc: c_int, what: &str) -> Result<(), CclError> {
    if rc == ffi::MPI_SUCCESS as c_int {
        Ok(())
    } else {
        Err(CclError::Backend { backend: "mpi", what: format!("{what}: {}", error_text(rc)) })
    }
}

/// How a collective waits for completion: `MPI_Test` in a loop, yielding the thread between
/// polls for `yield_for`, then sleeping 50 µs, doubling up to `max_sleep`. Never a busy spin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Polling {
    /// How long to poll with `std::thread::yield_now` between tests before sleeping.
    pub yield_for: Duration,
    /// The longest sleep between two tests (also the longest an abort waits to be seen).
    pub max_sleep: Duration,
}

impl Default for Polling {
    /// 50 µs of yielding, then sleeps of 50 µs doubling up to 200 µs: MPI progresses a
    /// collective only inside MPI calls, so a long sleep stalls a large one between its
    /// steps (`docs/performance.md`, "Collectives over MPI").
    fn default() -> Self {
        Polling { yield_for: Duration::from_micros(50), max_sleep: Duration::from_micros(200) }
    }
}

/// The MPI communicator handle, shareable between threads.
#[derive(Clone, Copy)]
struct Comm(ffi::MPI_Comm);

// SAFETY: an MPI communicator handle is a process-wide name for MPI state, valid on every
// thread; MPI is initialised with MPI_THREAD_MULTIPLE (checked before any handle is made),
// so it may be used from any thread, and this module makes every call under `MPI`'s lock.
unsafe impl Send for Comm {}
// SAFETY: as for `Send`: the handle is never mutated, only passed to MPI.
unsafe impl Sync for Comm {}

/// Staging buffers of one communicator, reused from one collective to the next. `u64`
/// storage, so that MPI's reductions read and write aligned elements.
#[derive(Default)]
struct Stage {
    send: Vec<u64>,
    recv: Vec<u64>,
}

/// `v` resized to hold at least `bytes` bytes, as a byte slice of exactly `bytes`.
fn bytes_of(v: &mut Vec<u64>, bytes: usize) -> &mut [u8] {
    let words = bytes.div_ceil(8);
    if v.len() < words {
        v.resize(words, 0);
    }
    // SAFETY: `v` holds at least `bytes` initialised bytes (`words * 8 >= bytes`); any bytes
    // are valid `u8`s, and `u8` needs no more alignment than `u64`. The slice borrows `v`
    // mutably, so nothing else reaches the memory while it lives.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), bytes) }
}

/// A communicator over the processes of an MPI job, one rank per process, whose local
/// member is `cpu:0` (module docs).
pub struct MpiBackend {
    comm: Comm,
    rank: usize,
    size: usize,
    members: [Member; 1],
    polling: Polling,
    /// Held for the whole of a collective: one at a time, in call order.
    stage: Mutex<Stage>,
    /// `Some(why)` once aborted.
    state: Mutex<Option<String>>,
    aborted: AtomicBool,
    /// Set once a collective was left outstanding on it.
    left_outstanding: AtomicBool,
}

impl MpiBackend {
    /// A communicator over every process of the job (`MPI_COMM_WORLD`, duplicated), with
    /// errors returned as values. Initialises MPI on its first call in the process.
    ///
    /// Collective: every rank must call it, in the same order relative to its other
    /// communicators. Fails with [`CclError::Unavailable`] where MPI cannot be used (it was
    /// finalised, or initialised without `Threading::Multiple`), and with
    /// [`CclError::Backend`] if MPI refuses the duplicate.
    pub fn world() -> Result<MpiBackend, CclError> {
        let mut phase = MPI.lock();
        initialise(&mut phase)?;
        let mut dup = std::mem::MaybeUninit::<ffi::MPI_Comm>::uninit();
        // SAFETY: MPI is initialised with MPI_THREAD_MULTIPLE and not finalised (checked
        // above, under the lock); `RSMPI_COMM_WORLD` is a valid communicator; `dup` is a
        // valid out-pointer, written on success.
        let rc = unsafe { ffi::MPI_Comm_dup(ffi::RSMPI_COMM_WORLD, dup.as_mut_ptr()) };
        check(rc, "MPI_Comm_dup")?;
        // SAFETY: MPI_Comm_dup succeeded, so it wrote `dup`.
        let comm = unsafe { dup.assume_init() };
        // SAFETY: `comm` is a valid communicator, and RSMPI_ERRORS_RETURN a predefined error
        // handler.
        let rc = unsafe { ffi::MPI_Comm_set_errhandler(comm, ffi::RSMPI_ERRORS_RETURN) };
        check(rc, "MPI_Comm_set_errhandler")?;
        let (mut rank, mut size): (c_int, c_int) = (0, 0);
        // SAFETY: `comm` is valid, and the out-pointers are valid `c_int`s.
        check(unsafe { ffi::MPI_Comm_rank(comm, &mut rank) }, "MPI_Comm_rank")?;
        // SAFETY: as above.
        check(unsafe { ffi::MPI_Comm_size(comm, &mut size) }, "MPI_Comm_size")?;
        drop(phase);
        let rank = usize::try_from(rank).map_err(|_| unavailable("a negative rank"))?;
        let size = usize::try_from(size).map_err(|_| unavailable("a negative size"))?;
        Ok(MpiBackend {
            comm: Comm(comm),
            rank,
            size,
            members: [Member { device: DeviceId::CPU, rank }],
            polling: Polling::default(),
            stage: Mutex::new(Stage::default()),
            state: Mutex::new(None),
            aborted: AtomicBool::new(false),
            left_outstanding: AtomicBool::new(false),
        })
    }

    /// `self`, waiting for its collectives as `polling` says.
    pub fn with_polling(mut self, polling: Polling) -> MpiBackend {
        self.polling = polling;
        self
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// How it waits for its collectives.
    pub fn polling(&self) -> Polling {
        self.polling
    }

    /// Mark the communicator broken (aborted, or out of step after an MPI error).
    fn fail(&self, why: &str) {
        let mut state = self.state.lock();
        if state.is_none() {
            *state = Some(why.to_string());
        }
        self.aborted.store(true, Ordering::Release);
    }

    /// Start `call` on the staging buffers; returns its request.
    fn start(
        &self,
        call: &Call,
        stage: &mut Stage,
        send: &[u8],
        recv_len: usize,
    ) -> Result<ffi::MPI_Request, CclError> {
        let count = c_int::try_from(call.count).map_err(|_| {
            CclError::Invalid(format!(
                "{} of {} elements: MPI counts stop at {}",
                call.op.name(),
                call.count,
                c_int::MAX
            ))
        })?;
        let dtype = match call.dtype {
            // SAFETY (both): reading an immutable predefined handle exported by the MPI shim.
            ScalarType::F32 => unsafe { ffi::RSMPI_FLOAT },
            ScalarType::I64 => unsafe { ffi::RSMPI_INT64_T },
        };
        let op_of = |r: ReduceOp| -> Result<ffi::MPI_Op, CclError> {
            // SAFETY (all): reading immutable predefined handles.
            Ok(match r {
                ReduceOp::Sum => unsafe { ffi::RSMPI_SUM },
                ReduceOp::Mean if call.dtype == ScalarType::F32 => unsafe { ffi::RSMPI_SUM },
                ReduceOp::Mean => return Err(CclError::Invalid("mean of integers: use f32".into())),
                ReduceOp::Max => unsafe { ffi::RSMPI_MAX },
                ReduceOp::Min => unsafe { ffi::RSMPI_MIN },
            })
        };
        bytes_of(&mut stage.send, send.len()).copy_from_slice(send);
        if let Collective::Broadcast { .. } = call.op {
            // One buffer, sent from the root and received everywhere else.
            bytes_of(&mut stage.recv, recv_len).copy_from_slice(send);
        } else {
            bytes_of(&mut stage.recv, recv_len);
        }
        let red = match call.op {
            Collective::AllReduce(r) | Collective::ReduceScatter(r) => Some(op_of(r)?),
            _ => None,
        };
        let sp = stage.send.as_ptr().cast::<c_void>();
        let rp = stage.recv.as_mut_ptr().cast::<c_void>();
        let comm = self.comm.0;
        let world = self.size as c_int;
        // SAFETY: reading an immutable predefined handle (the value MPI writes on success).
        let mut req = unsafe { ffi::RSMPI_REQUEST_NULL };
        // SAFETY (every call below): MPI is initialised with MPI_THREAD_MULTIPLE and not
        // finalised (`with_mpi` holds the lock and checks); `comm` is this backend's valid
        // communicator; `dtype` and `op` are predefined handles; `sp` points to at least
        // `send.len()` = count·size bytes and `rp` to at least `recv_len` bytes, the sizes
        // `check_parts` matched to the collective (count elements for all_reduce and
        // broadcast, world·count for all_gather, count/world for reduce_scatter); both are
        // the staging buffers, which stay allocated, unmoved and untouched by Rust until the
        // request completes, or for ever if it never does (`run` leaks them then). `req` is
        // a valid out-pointer.
        let rc = with_mpi(|| unsafe {
            match (call.op, red) {
                (Collective::AllReduce(_), Some(op)) => {
                    ffi::MPI_Iallreduce(sp, rp, count, dtype, op, comm, &mut req)
                }
                (Collective::ReduceScatter(_), Some(op)) => {
                    ffi::MPI_Ireduce_scatter_block(sp, rp, count / world, dtype, op, comm, &mut req)
                }
                (Collective::AllGather, _) => {
                    ffi::MPI_Iallgather(sp, count, dtype, rp, count, dtype, comm, &mut req)
                }
                (Collective::Broadcast { root }, _) => {
                    ffi::MPI_Ibcast(rp, count, dtype, root as c_int, comm, &mut req)
                }
                (Collective::Barrier, _) => ffi::MPI_Ibarrier(comm, &mut req),
                (Collective::AllReduce(_) | Collective::ReduceScatter(_), None) => {
                    unreachable!("a reduction has an op")
                }
            }
        })?;
        check(rc, call.op.name())?;
        Ok(req)
    }

    /// Wait for `req`: `Ok` once complete; `Err` if the communicator is aborted first, or
    /// MPI fails (the request is then left outstanding).
    fn wait(&self, req: &mut ffi::MPI_Request) -> Result<(), CclError> {
        let start = Instant::now();
        let mut sleep = Duration::from_micros(50);
        loop {
            let mut done: c_int = 0;
            // SAFETY: MPI is initialised with MPI_THREAD_MULTIPLE and not finalised (checked
            // under the lock); `req` is an active request of this communicator, which only
            // this thread (holding the stage lock) tests; `done` is a valid out-pointer and
            // RSMPI_STATUS_IGNORE a valid status argument.
            let rc = with_mpi(|| unsafe { ffi::MPI_Test(req, &mut done, ffi::RSMPI_STATUS_IGNORE) })?;
            check(rc, "MPI_Test")?;
            if done != 0 {
                return Ok(());
            }
            if self.aborted.load(Ordering::Acquire) {
                return Err(CclError::Aborted(self.aborted().unwrap_or_default()));
            }
            if start.elapsed() < self.polling.yield_for {
                std::thread::yield_now();
            } else {
                std::thread::sleep(sleep);
                sleep = (sleep * 2).min(self.polling.max_sleep);
            }
        }
    }
}

impl fmt::Debug for MpiBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MpiBackend")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("polling", &self.polling)
            .field("aborted", &self.aborted())
            .finish()
    }
}

impl Backend for MpiBackend {
    fn kind(&self) -> &'static str {
        "mpi"
    }

    fn world_size(&self) -> usize {
        self.size
    }

    fn members(&self) -> &[Member] {
        &self.members
    }

    fn run(&self, call: &Call, parts: &mut [Part<'_>]) -> Result<(), CclError> {
        if let Some(why) = self.aborted() {
            return Err(CclError::Aborted(why));
        }
        check_parts(call, self.size, &self.members, parts)?;
        let part = &mut parts[0];
        let (Buf::Host(send), BufMut::Host(recv)) = (&part.send, &mut part.recv) else {
            return Err(CclError::Invalid(format!(
                "the mpi backend works on host buffers; {} gave a device buffer",
                part.device
            )));
        };
        let mut guard = self.stage.lock();
        let mut stage = std::mem::take(&mut *guard);
        let outcome = self.start(call, &mut stage, send, recv.len()).and_then(|mut req| {
            self.wait(&mut req).inspect_err(|e| {
                // The request is still active: MPI may read and write the staging buffers at
                // any later time, so they must never be freed or reused. Leak them.
                if !matches!(e, CclError::Aborted(_)) {
                    self.fail(&format!("{} #{} failed: {e}", call.op.name(), call.seq));
                }
                self.left_outstanding.store(true, Ordering::Release);
                LEFT_OUTSTANDING.store(true, Ordering::Release);
                std::mem::forget(std::mem::take(&mut stage));
            })
        });
        if outcome.is_ok() && call.op == Collective::Barrier {
            recv.copy_from_slice(&(self.size as i64).to_ne_bytes());
        } else if outcome.is_ok() {
            let out = &mut bytes_of(&mut stage.recv, recv.len())[..];
            if let Collective::AllReduce(op) | Collective::ReduceScatter(op) = call.op {
                finish(out, call.dtype, op, self.size);
            }
            recv.copy_from_slice(out);
        }
        *guard = stage;
        outcome
    }

    fn abort(&self, why: &str) {
        self.fail(why);
    }

    fn aborted(&self) -> Option<String> {
        self.state.lock().clone()
    }
}

impl Drop for MpiBackend {
    fn drop(&mut self) {
        if self.left_outstanding.load(Ordering::Acquire) {
            // A request is still active on it: leave the communicator to the process.
            return;
        }
        let mut comm = self.comm.0;
        // SAFETY: no request of this communicator is active (every collective completed, or
        // `left_outstanding` would be set); MPI is initialised and not finalised (checked under the
        // lock); `comm` is a valid communicator handle this backend owns.
        let _ = with_mpi(|| unsafe { ffi::MPI_Comm_free(&mut comm) });
    }
}
