//! VM configuration: devices, thread topology, water marks, batching, synchronous mode.
//! Every knob is described in `docs/tuning.md`.

use crate::alloc::AllocFaults;
use crate::ep::mock::MockConfig;
use crate::ep::StreamType;
use crate::sync::notify::{default_yields, Backoff, DEFAULT_SPIN};
use crate::sync::{AtomicU64, Ordering};
use crate::vm::env::{Env, EnvError};
use crate::vm::{Error, Result};

/// How streams map to `ThreadCtx` worker threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ThreadTopology {
    /// One worker per stream (per device and stream type). The default.
    #[default]
    PerStream,
    /// One worker per device, serving all of its streams.
    PerDevice,
    /// A single worker for every stream.
    Single,
}

/// Deliberate faults, for tests that check the tests (a property test must catch a VM
/// that skips synchronisation) and for tests of the VM's answer to failures it cannot
/// cause on demand (out of memory). Off by default; never enable in production.
#[derive(Debug, Default)]
pub struct FaultInjection {
    /// Skip the device-side wait of every n-th `StreamWaitEvent` (0: never).
    pub skip_stream_wait_every: u64,
    /// Behave as if the system refused to start the watcher threads of asynchronous
    /// streams (tests the VM's answer to a missing thread).
    pub refuse_watcher_threads: bool,
    /// Make the storage of about one tensor in this many fail to allocate, on every
    /// device's allocator, as if the device were out of memory (0: never). Which tensors
    /// is a hash of the tensor's id and [`fail_alloc_seed`](Self::fail_alloc_seed)
    /// ([`FaultInjection::fails_alloc`]); a chosen tensor's every allocation fails, so an
    /// instruction that would allocate it stores `Error::Alloc` on its outputs.
    pub fail_alloc_one_in: u64,
    /// Seeds the choice of [`fail_alloc_one_in`](Self::fail_alloc_one_in).
    pub fail_alloc_seed: u64,
    /// Give every view a dependence object of its own instead of its storage's, as if the
    /// edges between accesses of one storage through different views were dropped (tests the
    /// tests: the serialisability tests must catch it).
    pub split_view_dependences: bool,
    count: AtomicU64,
}

impl Clone for FaultInjection {
    fn clone(&self) -> Self {
        FaultInjection {
            skip_stream_wait_every: self.skip_stream_wait_every,
            refuse_watcher_threads: self.refuse_watcher_threads,
            fail_alloc_one_in: self.fail_alloc_one_in,
            fail_alloc_seed: self.fail_alloc_seed,
            split_view_dependences: self.split_view_dependences,
            count: AtomicU64::new(0),
        }
    }
}

impl FaultInjection {
    /// The allocation failures the allocators inject.
    pub fn alloc_faults(&self) -> AllocFaults {
        AllocFaults { one_in: self.fail_alloc_one_in, seed: self.fail_alloc_seed }
    }

    /// Whether the storage of the tensor with id `tensor` fails to allocate under
    /// [`fail_alloc_one_in`](Self::fail_alloc_one_in) (what a test's reference needs).
    pub fn fails_alloc(&self, tensor: u64) -> bool {
        self.alloc_faults().fails(tensor)
    }

    /// Whether this `StreamWaitEvent` should skip its wait.
    pub(crate) fn skip_stream_wait(&self) -> bool {
        let every = self.skip_stream_wait_every;
        every != 0 && (self.count.fetch_add(1, Ordering::Relaxed) + 1) % every == 0
    }
}

/// The priority of each stream type (MXNet's op priority, CUDA's stream priority): higher
/// runs first where streams compete. `docs/tuning.md` ("Stream priorities") says what it
/// changes and what it cannot.
///
/// - On a CUDA device, each stream is created with a CUDA stream priority: the types of the
///   highest value get the device's greatest priority, one lower the next, and so on, down
///   to the device's least (`cuCtxGetStreamPriorityRange`); every type at 0 or below, and
///   the lowest value, get the least (CUDA's default).
/// - Where one worker serves several streams ([`ThreadTopology::PerDevice`], `Single`), the
///   scheduler hands the instructions it releases in one loop to the worker stream by
///   stream, the higher-priority streams' first, so the worker runs them first.
///
/// Default: the collective streams 1, the others 0 (a collective, which other ranks wait
/// for, goes ahead of local work).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamPriorities(pub [i32; 4]);

impl Default for StreamPriorities {
    fn default() -> Self {
        StreamPriorities([0, 0, 0, 1])
    }
}

impl StreamPriorities {
    /// The environment variable that sets them ([`parse`](Self::parse)'s format).
    pub const ENV: &'static str = "EAGERVM_STREAM_PRIORITIES";

    /// The priority of streams of type `ty`.
    #[inline]
    pub fn get(&self, ty: StreamType) -> i32 {
        self.0[ty as usize]
    }

    /// `self` with streams of type `ty` at `priority`.
    pub fn with(mut self, ty: StreamType, priority: i32) -> Self {
        self.0[ty as usize] = priority;
        self
    }

    /// Whether every type has the same priority (the scheduler then never reorders).
    pub fn uniform(&self) -> bool {
        self.0.iter().all(|&p| p == self.0[0])
    }

    /// Parse `type=priority` pairs separated by commas (`collective=1,compute=0`; types as
    /// [`StreamType::name`] spells them); types not named keep their default. A malformed
    /// item, an unknown type or a priority out of `-MAX..=MAX`
    /// ([`bounds::MAX_STREAM_PRIORITY`]) is an [`Error::Config`] naming the item.
    pub fn parse(s: &str) -> Result<StreamPriorities> {
        let mut p = StreamPriorities::default();
        let bad = |item: &str, why: &str| {
            Err(Error::Config(format!(
                "{}: `{item}`: {why} (expected e.g. `collective=1,compute=0`)",
                Self::ENV
            )))
        };
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let Some((ty, value)) = item.split_once('=') else { return bad(item, "not `type=priority`") };
            let Some(ty) = StreamType::ALL.into_iter().find(|t| t.name() == ty.trim()) else {
                return bad(item, "no such stream type (compute, h2d, d2h, collective)");
            };
            let Ok(v) = value.trim().parse::<i32>() else {
                return bad(item, "the priority is not an integer");
            };
            p = p.with(ty, v);
        }
        p.validate()?;
        Ok(p)
    }

    fn validate(&self) -> Result<()> {
        let max = bounds::MAX_STREAM_PRIORITY;
        for ty in StreamType::ALL {
            let v = self.get(ty);
            if !(-max..=max).contains(&v) {
                return Err(Error::Config(format!(
                    "stream_priorities: {} at {v}, outside -{max}..={max} (docs/tuning.md)",
                    ty.name()
                )));
            }
        }
        Ok(())
    }
}

/// Configuration of a VM (`VirtualMachine::new` takes one).
#[derive(Debug, Clone)]
pub struct Config {
    /// Number of mock asynchronous devices (`mock:0` ..). Default 0.
    pub mock_devices: u16,
    /// Timing of the mock devices.
    pub mock: MockConfig,
    /// Number of CUDA devices (`cuda:0` ..). Default 0. Asking for more than the machine
    /// has (or for any without the driver, or in a build without the `cuda` feature) makes
    /// `VirtualMachine::new` return [`EpError::CudaUnavailable`](crate::ep::EpError).
    pub cuda_devices: u16,
    /// Streams per worker thread.
    pub threads: ThreadTopology,
    /// Above this many instructions in flight, a caller that submits more blocks...
    pub high_water: usize,
    /// ...until the count falls to this many.
    pub low_water: usize,
    /// The builder hands its instructions to the scheduler every this many.
    pub batch_size: usize,
    /// Run every instruction on the caller, one at a time, in program order (like MXNet's
    /// `NaiveEngine`): no scheduler or worker threads. For debugging.
    pub synchronous: bool,
    /// Re-checks with a spin-loop hint an idle scheduler or worker makes before it starts
    /// yielding ([`Backoff::spins`]).
    pub spin: u32,
    /// Re-checks with a yield of the thread it then makes before it sleeps
    /// ([`Backoff::yields`]). Default [`default_yields`]: 16 where the process may run on
    /// at most four CPUs, none where it may run on more.
    pub yields: u32,
    /// On an asynchronous stream (mock, CUDA), record an event at least every this many
    /// launches; the launches in between are retired by the next event, at the latest the
    /// one recorded behind the last launch of each batch a worker receives. Default
    /// [`DEFAULT_EVENT_INTERVAL`]. `1` records one per instruction: an asynchronous device
    /// fault is then attributed to the exact instruction, at the cost of an event and a
    /// watcher wake-up per launch.
    pub event_interval: u32,
    /// On an asynchronous stream (mock, CUDA), check each call whose kernel may find bad
    /// data only when it runs (an index out of range: `OpKernel::checks_data`): the worker
    /// waits for the device to run the call and reads the stream's fault record, so the
    /// call fails as it does on the CPU (`docs/cuda.md`, "Errors"). Costs one host wait per
    /// such call. `false` skips the check: such a call then succeeds, the bad element
    /// given 0 or skipped. Default `true`.
    pub check_data: bool,
    /// Deliberate faults, for testing the tests.
    pub fault: FaultInjection,
    /// Open a profiling session when the VM starts (the timeline observer, `observe::timeline`); take the
    /// profile with `VirtualMachine::stop_profiling`. Not available in synchronous mode.
    pub profile: bool,
    /// The most bytes one tensor may hold: `vm.empty`, `vm.from_slice`, the builder (every
    /// output a call would create) and the eager front end refuse a larger tensor with
    /// [`Error::TooLarge`] before anything runs, as the trace validator refuses a larger
    /// declaration. Default [`default_max_tensor_bytes`]: half the machine's physical
    /// memory. At least 1, at most `isize::MAX` (the most one allocation may hold).
    pub max_tensor_bytes: u64,
    /// Instructions the flight recorder keeps per stream (`vm::flight`): the last this many
    /// admitted, with op, operands, state and times. 0 keeps none (the watchdog then still
    /// finds stuck streams, but its dump names no instruction). Default
    /// [`DEFAULT_FLIGHT_RECORDS`](crate::vm::flight::DEFAULT_FLIGHT_RECORDS). Not kept in
    /// synchronous mode.
    pub flight_records: usize,
    /// Whether the flight recorder keeps slots on every stream, not only on the collective
    /// streams (their watermarks are kept on every stream either way, which is all the
    /// watchdog needs to find a stuck one). Off by default: slots cost a few nanoseconds per
    /// instruction, which the no-op workloads of `eagervm bench` feel (`docs/tuning.md`).
    /// `EAGERVM_FLIGHT_ALL_STREAMS=1`.
    pub flight_all_streams: bool,
    /// How long an instruction may stay in flight, with its stream making no progress,
    /// before the watchdog logs it, dumps the flight record and, for a collective, aborts its
    /// communicator (`vm::watchdog`). `None` starts no watchdog. Default
    /// [`DEFAULT_WATCHDOG_TIMEOUT`] (PyTorch's NCCL timeout); no watchdog runs in
    /// synchronous mode.
    pub watchdog_timeout: Option<std::time::Duration>,
    /// Where the watchdog writes the flight record. Default (`None`):
    /// `<temp dir>/eagervm-flight-<pid>.txt`.
    pub flight_dump: Option<std::path::PathBuf>,
    /// The priority of each stream type ([`StreamPriorities`]; env
    /// `EAGERVM_STREAM_PRIORITIES`).
    pub stream_priorities: StreamPriorities,
}

/// The default [`Config::watchdog_timeout`]: 10 minutes, PyTorch's default NCCL timeout. A
/// collective whose peer died waits for ever without one; no healthy instruction stays in
/// flight that long with its stream making no progress, and where one might (a very long
/// kernel), the watchdog only logs and dumps it: it aborts collectives only.
pub const DEFAULT_WATCHDOG_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

/// Bounds of the sizes in [`Config`] that `VirtualMachine::new`
/// checks (`docs/tuning.md`): far beyond any useful setting, and short of the values that
/// would exhaust memory or threads before the first instruction ran.
pub mod bounds {
    use std::time::Duration;

    /// The largest `batch_size`: the builder reserves room for a batch up front, and a batch
    /// of more instructions starts no work sooner.
    pub const MAX_BATCH_SIZE: usize = 1 << 20;
    /// The largest `high_water` (instructions in flight; each holds memory until it retires).
    pub const MAX_HIGH_WATER: usize = 1 << 30;
    /// The largest `spin` (re-checks before an idle thread yields).
    pub const MAX_SPIN: u32 = 1 << 16;
    /// The largest `yields` (re-checks before an idle thread sleeps).
    pub const MAX_YIELDS: u32 = 1 << 16;
    /// The largest `event_interval` (launches between completion events).
    pub const MAX_EVENT_INTERVAL: u32 = 1 << 20;
    /// The most devices besides the host (`mock_devices + cuda_devices`): each has three
    /// streams and a VM numbers at most 4096 streams, `cpu:0`'s included.
    pub const MAX_DEVICES: usize = (crate::vm::dependence::InstrRef::MAX_STREAMS - 1) / 3;
    /// The largest `max_tensor_bytes`: no allocation may be larger.
    pub const MAX_TENSOR_BYTES: u64 = isize::MAX as u64;
    /// The most `flight_records` (slots per stream, about 120 bytes each).
    pub const MAX_FLIGHT_RECORDS: usize = 1 << 16;
    /// The shortest `watchdog_timeout`.
    pub const MIN_WATCHDOG_TIMEOUT: Duration = Duration::from_millis(1);
    /// The longest `mock.launch_delay` and `mock.jitter`, each spent per launched item.
    pub const MAX_MOCK_DELAY: Duration = Duration::from_secs(60);
    /// The largest priority of a stream type, and minus the smallest.
    pub const MAX_STREAM_PRIORITY: i32 = 1000;
}

/// The default [`Config::max_tensor_bytes`]: half the machine's physical memory, read once
/// per process (`sysconf(_SC_PHYS_PAGES) * sysconf(_SC_PAGESIZE)`), or
/// [`FALLBACK_MAX_TENSOR_BYTES`] where that cannot be read. Half, because a program that
/// asks for one tensor larger than that has no room left for its inputs, and the first
/// write of the tensor would fail or push the machine into swap; a container's memory limit
/// (a cgroup) is not read.
pub fn default_max_tensor_bytes() -> u64 {
    static CAP: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *CAP.get_or_init(|| match physical_memory() {
        Some(bytes) => (bytes / 2).clamp(1, bounds::MAX_TENSOR_BYTES),
        None => FALLBACK_MAX_TENSOR_BYTES,
    })
}

/// [`default_max_tensor_bytes`] where the physical memory cannot be read: 8 GiB.
pub const FALLBACK_MAX_TENSOR_BYTES: u64 = 8 << 30;

/// The machine's physical memory in bytes, if the system says.
fn physical_memory() -> Option<u64> {
    #[cfg(unix)]
    {
        // SAFETY: sysconf reads a system constant; it has no preconditions.
        let (pages, page) =
            unsafe { (libc::sysconf(libc::_SC_PHYS_PAGES), libc::sysconf(libc::_SC_PAGESIZE)) };
        let (pages, page) = (u64::try_from(pages).ok()?, u64::try_from(page).ok()?);
        pages.checked_mul(page).filter(|&b| b > 0)
    }
    #[cfg(not(unix))]
    None
}

/// The default [`Config::event_interval`]: one event per 1024 launches on an asynchronous
/// stream, besides the one behind each worker batch (so with the default `batch_size`,
/// about one per batch). Each event wakes the stream's watcher, the scheduler (its report)
/// and, on CUDA, a driver thread, which together cost many times the CPU time of a small
/// kernel's launch; so events are kept rare enough that their wake-ups stay a small share
/// of each launch's cost. `docs/tuning.md` (`event_interval`) and `docs/cuda.md`
/// ("Events") have the measurements of several intervals.
pub const DEFAULT_EVENT_INTERVAL: u32 = 1024;

impl Default for Config {
    fn default() -> Self {
        Config {
            mock_devices: 0,
            mock: MockConfig::default(),
            cuda_devices: 0,
            threads: ThreadTopology::PerStream,
            high_water: 1 << 16,
            low_water: 1 << 14,
            batch_size: 1024,
            synchronous: false,
            spin: DEFAULT_SPIN,
            yields: default_yields(),
            event_interval: DEFAULT_EVENT_INTERVAL,
            check_data: true,
            fault: FaultInjection::default(),
            profile: false,
            max_tensor_bytes: default_max_tensor_bytes(),
            flight_records: crate::vm::flight::DEFAULT_FLIGHT_RECORDS,
            flight_all_streams: false,
            watchdog_timeout: Some(DEFAULT_WATCHDOG_TIMEOUT),
            flight_dump: None,
            stream_priorities: StreamPriorities::default(),
        }
    }
}

impl Config {
    /// The default configuration with the environment's overrides, read strictly: the first
    /// `EAGERVM_*` variable set to a value the library cannot use is an [`EnvError`] naming
    /// it, its value and what it accepts. The variables ([`env::VARS`](crate::vm::env::VARS)):
    /// `EAGERVM_SYNC=1` (synchronous mode), `EAGERVM_PROFILE=1` (profile from the start),
    /// `EAGERVM_MOCK_DEVICES=N`, `EAGERVM_CUDA_DEVICES=N`, `EAGERVM_BATCH`, `EAGERVM_SPIN`,
    /// `EAGERVM_YIELDS`, `EAGERVM_EVENT_INTERVAL`, `EAGERVM_HIGH_WATER`, `EAGERVM_LOW_WATER`,
    /// `EAGERVM_MAX_TENSOR_BYTES`, `EAGERVM_FLIGHT_RECORDS`, `EAGERVM_FLIGHT_ALL_STREAMS`,
    /// `EAGERVM_WATCHDOG_TIMEOUT_MS` (0: no watchdog), `EAGERVM_FLIGHT_DUMP`,
    /// `EAGERVM_STREAM_PRIORITIES`, the mock device's timing (`EAGERVM_MOCK_DELAY_US`,
    /// `EAGERVM_MOCK_JITTER_US`), and, checked here though read where they are used,
    /// `EAGERVM_CUDA_LOCK_MIN_BYTES`, `EAGERVM_CUDA_DRIVER_LIB` and `EAGERVM_NCCL_LIB`
    /// (`docs/tuning.md`, "Environment variables"). An unset or empty variable keeps the
    /// default. Values within their type but out of [`bounds`] are left to
    /// `VirtualMachine::new`, which refuses them with `Error::Config`.
    pub fn try_from_env() -> std::result::Result<Self, EnvError> {
        Self::try_from_lookup(|name| std::env::var_os(name))
    }

    /// [`try_from_env`](Self::try_from_env) with the variables from `get` (a test's, or an
    /// embedding program's, environment).
    pub fn try_from_lookup(
        get: impl Fn(&str) -> Option<std::ffi::OsString>,
    ) -> std::result::Result<Self, EnvError> {
        let mut c = Config::default();
        c.apply_env(&Env::new(&get), &mut Err)?;
        Ok(c)
    }

    /// As [`try_from_env`](Self::try_from_env), but a variable with a bad value is logged (a
    /// `tracing` warning carrying its [`EnvError`]) and its field keeps the default, for a
    /// program that would rather run than stop on one. The command line and the Python
    /// package use `try_from_env`, and refuse.
    pub fn from_env() -> Self {
        let mut c = Config::default();
        let get = |name: &str| std::env::var_os(name);
        let mut warn = |e: EnvError| {
            tracing::warn!(error = %e, "ignoring {}", e.var);
            Ok(())
        };
        // Cannot fail: `warn` turns every error into a warning.
        let _ = c.apply_env(&Env::new(&get), &mut warn);
        c
    }

    /// Apply each variable that `env` sets; a bad one goes to `bad`, which either returns
    /// it (stop) or logs it (go on with the next).
    fn apply_env(
        &mut self,
        env: &Env<'_>,
        bad: &mut dyn FnMut(EnvError) -> std::result::Result<(), EnvError>,
    ) -> std::result::Result<(), EnvError> {
        const U16: &str = "a whole number from 0 to 65535";
        const U32: &str = "a whole number from 0 to 4294967295";
        const U32_1: &str = "a whole number from 1 to 4294967295";
        const USIZE: &str = "a whole number of 0 or more";
        const BYTES: &str = "a whole number of bytes, 1 or more";
        const MICROS: &str = "whole microseconds";
        const MILLIS: &str = "whole milliseconds (0: no watchdog)";
        const LIB: &str = "a library name or path";
        macro_rules! set {
            ($r:expr, |$v:ident| $apply:expr) => {
                match $r {
                    Ok(Some($v)) => $apply,
                    Ok(None) => {}
                    Err(e) => bad(e)?,
                }
            };
        }
        set!(env.bool("EAGERVM_SYNC"), |v| self.synchronous = v);
        set!(env.bool("EAGERVM_PROFILE"), |v| self.profile = v);
        set!(env.bool("EAGERVM_CHECK_DATA"), |v| self.check_data = v);
        set!(env.int("EAGERVM_MOCK_DEVICES", 0u16, U16), |v| self.mock_devices = v);
        set!(env.int("EAGERVM_CUDA_DEVICES", 0u16, U16), |v| self.cuda_devices = v);
        set!(env.int("EAGERVM_BATCH", 1usize, "a whole number of 1 or more"), |v| self.batch_size = v);
        set!(env.int("EAGERVM_SPIN", 0u32, U32), |v| self.spin = v);
        set!(env.int("EAGERVM_YIELDS", 0u32, U32), |v| self.yields = v);
        set!(env.int("EAGERVM_EVENT_INTERVAL", 1u32, U32_1), |v| self.event_interval = v);
        set!(env.int("EAGERVM_HIGH_WATER", 0usize, USIZE), |v| self.high_water = v);
        set!(env.int("EAGERVM_LOW_WATER", 0usize, USIZE), |v| self.low_water = v);
        set!(env.int("EAGERVM_MAX_TENSOR_BYTES", 1u64, BYTES), |v| self.max_tensor_bytes = v);
        set!(env.int("EAGERVM_FLIGHT_RECORDS", 0usize, USIZE), |v| self.flight_records = v);
        set!(env.bool("EAGERVM_FLIGHT_ALL_STREAMS"), |v| self.flight_all_streams = v);
        set!(env.int("EAGERVM_WATCHDOG_TIMEOUT_MS", 0u64, MILLIS), |ms| {
            self.watchdog_timeout = (ms > 0).then(|| std::time::Duration::from_millis(ms))
        });
        if let Some(p) = env.path("EAGERVM_FLIGHT_DUMP") {
            self.flight_dump = Some(p.into());
        }
        const PRIORITIES: &str = "`type=priority` pairs separated by commas, e.g. `collective=1,compute=0`";
        set!(env.text(StreamPriorities::ENV, PRIORITIES), |v| match StreamPriorities::parse(&v) {
            Ok(p) => self.stream_priorities = p,
            Err(e) => bad(EnvError {
                var: StreamPriorities::ENV,
                value: v,
                why: e.to_string(),
                accepted: PRIORITIES,
            })?,
        });
        let us = std::time::Duration::from_micros;
        set!(env.int(crate::ep::mock::ENV_DELAY_US, 0u64, MICROS), |v| self.mock.launch_delay = us(v));
        set!(env.int(crate::ep::mock::ENV_JITTER_US, 0u64, MICROS), |v| self.mock.jitter = us(v));
        // Read where they are used (once per process, or when a library is opened); checked
        // here so that a bad value is refused before any work rather than ignored there.
        set!(env.int(crate::alloc::pin::ENV_LOCK_MIN_BYTES, 0usize, USIZE), |_v| {});
        set!(env.text(crate::ep::cuda::ENV_DRIVER_LIB, LIB), |_v| {});
        set!(env.text("EAGERVM_NCCL_LIB", LIB), |_v| {});
        // The CPU kernels' thread count, read a layer above this one.
        set!(env.int("EAGERVM_KERNEL_THREADS", 1usize, "a whole number of threads, 1 or more"), |_v| {});
        Ok(())
    }

    /// How an idle scheduler or worker waits for work before it sleeps: `spin` spins, then
    /// `yields` yields.
    pub fn backoff(&self) -> Backoff {
        Backoff { spins: self.spin, yields: self.yields }
    }

    /// Builder-style: this many mock devices.
    pub fn with_mock_devices(mut self, n: u16, mock: MockConfig) -> Self {
        self.mock_devices = n;
        self.mock = mock;
        self
    }

    /// Builder-style: this many CUDA devices.
    pub fn with_cuda_devices(mut self, n: u16) -> Self {
        self.cuda_devices = n;
        self
    }

    pub(crate) fn validate(&self) -> Result<()> {
        if self.low_water >= self.high_water {
            return Err(Error::Config(format!(
                "low_water ({}) must be below high_water ({})",
                self.low_water, self.high_water
            )));
        }
        if self.profile && self.synchronous {
            return Err(Error::Config(
                "profile needs the scheduler thread, and synchronous mode has none: set one of them only"
                    .into(),
            ));
        }
        if self.batch_size == 0 {
            return Err(Error::Config("batch_size must be at least 1".into()));
        }
        use bounds::*;
        let over = |field: &str, value: &dyn std::fmt::Display, max: &dyn std::fmt::Display| {
            Err(Error::Config(format!(
                "{field} ({value}) must be at most {max} (docs/tuning.md lists the bounds)"
            )))
        };
        if self.batch_size > MAX_BATCH_SIZE {
            return over("batch_size", &self.batch_size, &MAX_BATCH_SIZE);
        }
        if self.high_water > MAX_HIGH_WATER {
            return over("high_water", &self.high_water, &MAX_HIGH_WATER);
        }
        if self.spin > MAX_SPIN {
            return over("spin", &self.spin, &MAX_SPIN);
        }
        if self.yields > MAX_YIELDS {
            return over("yields", &self.yields, &MAX_YIELDS);
        }
        if self.event_interval > MAX_EVENT_INTERVAL {
            return over("event_interval", &self.event_interval, &MAX_EVENT_INTERVAL);
        }
        let devices = usize::from(self.mock_devices) + usize::from(self.cuda_devices);
        if devices > MAX_DEVICES {
            let value = format!("{} + {}", self.mock_devices, self.cuda_devices);
            return over("mock_devices + cuda_devices", &value, &MAX_DEVICES);
        }
        if self.max_tensor_bytes == 0 {
            return Err(Error::Config("max_tensor_bytes must be at least 1".into()));
        }
        if self.max_tensor_bytes > MAX_TENSOR_BYTES {
            return over("max_tensor_bytes", &self.max_tensor_bytes, &MAX_TENSOR_BYTES);
        }
        if self.flight_records > MAX_FLIGHT_RECORDS {
            return over("flight_records", &self.flight_records, &MAX_FLIGHT_RECORDS);
        }
        if self.watchdog_timeout.is_some_and(|t| t < MIN_WATCHDOG_TIMEOUT) {
            return Err(Error::Config(format!(
                "watchdog_timeout must be at least {MIN_WATCHDOG_TIMEOUT:?} (None: no watchdog)"
            )));
        }
        let shown = |d: std::time::Duration| format!("{d:?}");
        if self.mock.launch_delay > MAX_MOCK_DELAY {
            return over("mock.launch_delay", &shown(self.mock.launch_delay), &shown(MAX_MOCK_DELAY));
        }
        if self.mock.jitter > MAX_MOCK_DELAY {
            return over("mock.jitter", &shown(self.mock.jitter), &shown(MAX_MOCK_DELAY));
        }
        self.stream_priorities.validate()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sync::notify::Backoff;

    #[test]
    fn the_list_of_variables_names_the_stream_priorities() {
        assert!(crate::vm::env::VARS.contains(&StreamPriorities::ENV));
    }

    #[test]
    fn stream_priorities_parse_and_are_checked() {
        let p = StreamPriorities::parse("collective=5, compute=-2").unwrap();
        assert_eq!(p, StreamPriorities([-2, 0, 0, 5]));
        assert_eq!(StreamPriorities::parse("").unwrap(), StreamPriorities::default());
        assert_eq!(StreamPriorities::default().get(StreamType::Collective), 1);
        assert!(!StreamPriorities::default().uniform());
        assert!(StreamPriorities([3; 4]).uniform());
        for bad in ["collective", "network=1", "h2d=x", "d2h=1001", "compute=-1001"] {
            match StreamPriorities::parse(bad) {
                Err(Error::Config(m)) => assert!(m.contains("stream") || m.contains(bad), "{bad}: {m}"),
                other => panic!("{bad}: {other:?}"),
            }
        }
        let c = Config { stream_priorities: StreamPriorities([0, 0, 0, 2000]), ..Config::default() };
        assert!(matches!(c.validate(), Err(Error::Config(m)) if m.contains("collective")));
    }

    fn from(vars: &[(&str, &str)]) -> std::result::Result<Config, EnvError> {
        Config::try_from_lookup(|k| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| (*v).into()))
    }

    #[test]
    fn environment_values_are_read_strictly() {
        let c = from(&[
            ("EAGERVM_SYNC", "TRUE"),
            ("EAGERVM_MOCK_DEVICES", " 3 "),
            ("EAGERVM_WATCHDOG_TIMEOUT_MS", "0"),
            ("EAGERVM_MOCK_DELAY_US", "250"),
            ("EAGERVM_FLIGHT_ALL_STREAMS", "0"),
            ("EAGERVM_BATCH", ""),
        ])
        .unwrap();
        assert!(c.synchronous && !c.flight_all_streams);
        assert_eq!((c.mock_devices, c.watchdog_timeout, c.batch_size), (3, None, 1024));
        assert_eq!(c.mock.launch_delay, std::time::Duration::from_micros(250));
        for (var, value, says) in [
            ("EAGERVM_SYNC", "yes", "1, 0, true or false"),
            ("EAGERVM_MOCK_DEVICES", "abc", "from 0 to 65535"),
            ("EAGERVM_MOCK_DEVICES", "70000", "from 0 to 65535"),
            ("EAGERVM_BATCH", "0", "1 or more"),
            ("EAGERVM_EVENT_INTERVAL", "-1", "from 1 to"),
            ("EAGERVM_MAX_TENSOR_BYTES", "1e9", "bytes"),
            ("EAGERVM_MOCK_JITTER_US", "5ms", "microseconds"),
            ("EAGERVM_STREAM_PRIORITIES", "gpu=1", "no such stream type"),
            ("EAGERVM_CUDA_LOCK_MIN_BYTES", "lots", "whole number"),
            ("EAGERVM_KERNEL_THREADS", "0", "1 or more"),
        ] {
            let e = from(&[(var, value)]).unwrap_err();
            assert_eq!((e.var, e.value.as_str()), (var, value));
            let text = e.to_string();
            assert!(text.contains(var) && text.contains(value) && text.contains(says), "{text}");
        }
    }

    #[test]
    fn the_default_backoff_is_this_machines() {
        assert_eq!(Config::default().backoff(), Backoff::for_this_machine());
    }
}
