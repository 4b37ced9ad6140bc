//! The mock execution provider: an asynchronous, CUDA-like device made of host threads.
//!
//! # What it models
//!
//! The mock device behaves like a GPU as seen through the CUDA runtime's stream and event
//! API, so that every asynchronous path of the VM (events, device-side waits, completion
//! watching) runs, and any missing synchronisation shows up, on a machine without a GPU:
//!
//! - A [`MockStream`] is a FIFO of work run by one device thread of its own (named like
//!   `mock0-compute`), as a CUDA stream is a FIFO of kernels. [`Stream::launch`] enqueues
//!   and returns at once; the work runs later, after everything launched before it on the
//!   same stream, possibly after a configured launch delay and random jitter
//!   ([`MockConfig`]), which is what makes races in the caller visible.
//! - A [`MockEvent`] follows `cudaEventRecord` / `cudaEventQuery` / `cudaEventSynchronize`
//!   / `cudaStreamWaitEvent`: [`Stream::record`] enqueues a marker; the event is complete
//!   once the marker of its *latest* recording (as of the question) has been reached, and is
//!   complete if it was never recorded; [`Event::wait`] blocks the host until then; and
//!   [`Stream::wait_event`] makes the stream's later work wait, on the device, for the
//!   recording that was latest at the time of the call (later recordings do not move that
//!   target), while the host goes on. Events may be recorded and waited for on any stream of
//!   the device, and on the host, and they are reused (the VM pools them).
//! - [`Stream::synchronize`] is `cudaStreamSynchronize`: the host sleeps until everything
//!   launched so far has run.
//!
//! Nothing here spins for long: device threads wait for work as every idle loop of the VM
//! does (the short wait of [`Backoff::for_this_machine`], then sleep on a [`Notifier`]), and
//! waiting hosts sleep on condition variables from [`crate::sync`]. Simulated work time
//! (launch delay, jitter) is spent asleep (a timed wait), as a real device would spend it
//! away from the host; once the VM shuts down ([`Stream::end_simulated_time`]) the wait in
//! progress ends and no more is spent, so that dropping a VM with delayed work queued runs
//! that work at once instead of waiting out one delay per item.
//!
//! # Events: counters
//!
//! Each event keeps, under one lock, the number of recordings made so far (`recorded`,
//! monotonic: the `n`-th recording is recording `n`, and its marker carries `n`) and which
//! recordings have been reached. A wait (host or device) captures `recorded` at the time of
//! the call and sleeps until that recording is reached, so reuse of an event never confuses
//! an old waiter with a new recording. Taking `recorded` and enqueueing the marker happen
//! under the event's lock, so a waiter never captures a recording whose marker is not yet
//! on its stream: every device-side wait therefore targets a marker enqueued before it, and
//! streams waiting on each other can never form a cycle.
//!
//! Recordings on one stream are reached in order; recordings of one event made on different
//! streams may be reached out of order, and each is tracked on its own.
//!
//! # Threads
//!
//! The device owns no thread; each stream owns one. Dropping the last handle to a stream
//! enqueues a stop marker behind everything already launched, so the thread drains its queue,
//! exits and is joined before the drop returns (if the last handle is dropped by work
//! running on that very stream, the thread exits on its own right after). Panics in launched
//! work are caught, logged, and the stream keeps going: the VM catches and reports its own
//! kernels' panics, so one reaching the device thread is a bug to log, not a reason to stop.

use std::any::Any;
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::thread::{JoinHandle, ThreadId};
use std::time::{Duration, Instant};

use crossbeam_queue::SegQueue;

use super::fault::{self, FaultRecord};
use super::{Device, DeviceId, EpError, Event, Stream, StreamType};
use crate::sync::notify::{Backoff, Notifier};
use crate::sync::{AtomicU64, AtomicUsize, Condvar, Mutex, Ordering};

/// The environment variable [`MockConfig::from_env`] reads the launch delay from, in
/// microseconds.
pub const ENV_DELAY_US: &str = "EAGERVM_MOCK_DELAY_US";
/// The environment variable [`MockConfig::from_env`] reads the jitter from, in microseconds.
pub const ENV_JITTER_US: &str = "EAGERVM_MOCK_JITTER_US";

/// How a mock device spends simulated time on each launched work item.
///
/// The default runs work as soon as the device thread gets to it (no delay, no jitter).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MockConfig {
    /// A fixed delay the device thread waits before running each launched work item, as a
    /// GPU spends time on a kernel while the host has moved on. Zero by default.
    pub launch_delay: Duration,
    /// Random extra delay per launched work item, at most this long. When it is non-zero,
    /// about one item in 16 sleeps for a time drawn uniformly from `[0, jitter]`, and the
    /// other items yield the device thread 0 to 3 times; both perturb the interleaving of
    /// streams with each other and with the host, the yields at almost no cost. Zero (the
    /// default) disables jitter.
    pub jitter: Duration,
    /// Seed of the jitter's pseudo-random numbers. Each stream thread draws from its own
    /// generator, seeded from this, the device index, the stream type and the number of
    /// streams the device created before it.
    pub seed: u64,
}

impl MockConfig {
    /// A configuration for tests: no fixed delay and a small jitter (50 µs), so that most
    /// items only yield a few times and about one in 16 sleeps for tens of microseconds.
    /// Interleavings get shaken without making tests slow.
    pub fn jittery() -> Self {
        MockConfig { launch_delay: Duration::ZERO, jitter: Duration::from_micros(50), seed: 0x5EED }
    }

    /// The default configuration, with the launch delay and jitter taken from
    /// `EAGERVM_MOCK_DELAY_US` and `EAGERVM_MOCK_JITTER_US` (whole microseconds) where they
    /// are set. A malformed value is ignored with a warning.
    pub fn from_env() -> Self {
        MockConfig::default().with_lookup(|name| match std::env::var(name) {
            Ok(v) => Some(v),
            Err(std::env::VarError::NotPresent) => None,
            Err(std::env::VarError::NotUnicode(v)) => {
                tracing::warn!("ignoring {name}={v:?}: not valid unicode");
                None
            }
        })
    }

    /// `self` with the fields that `lookup` (an environment) sets overridden.
    fn with_lookup(mut self, lookup: impl Fn(&str) -> Option<String>) -> Self {
        let micros = |name: &str| -> Option<Duration> {
            let raw = lookup(name)?;
            match raw.trim().parse::<u64>() {
                Ok(us) => Some(Duration::from_micros(us)),
                Err(e) => {
                    tracing::warn!("ignoring {name}={raw:?}: expected whole microseconds ({e})");
                    None
                }
            }
        };
        if let Some(d) = micros(ENV_DELAY_US) {
            self.launch_delay = d;
        }
        if let Some(d) = micros(ENV_JITTER_US) {
            self.jitter = d;
        }
        self
    }
}

/// A mock asynchronous device (`mock:N`): it creates [`MockStream`]s, each run by a device
/// thread of its own, and [`MockEvent`]s.
pub struct MockDevice {
    id: DeviceId,
    config: MockConfig,
    /// Streams created so far (varies the jitter seed of each stream).
    created: AtomicU64,
    /// Device threads of this device's streams that have not exited yet.
    live: crate::sync::Arc<AtomicUsize>,
}

impl MockDevice {
    /// The mock device `mock:index`, spending simulated time as `config` says.
    pub fn new(index: u16, config: MockConfig) -> MockDevice {
        MockDevice {
            id: DeviceId::mock(index),
            config,
            created: AtomicU64::new(0),
            live: crate::sync::Arc::new(AtomicUsize::new(0)),
        }
    }

    /// Its configuration.
    pub fn config(&self) -> &MockConfig {
        &self.config
    }

    /// How many device threads of this device's streams are running now. A stream's thread
    /// is counted from its creation until it has exited, which has happened by the time
    /// dropping the stream's last handle returns.
    pub fn running_threads(&self) -> usize {
        self.live.load(Ordering::Acquire)
    }
}

impl fmt::Debug for MockDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MockDevice")
            .field("id", &self.id)
            .field("config", &self.config)
            .field("running_threads", &self.running_threads())
            .finish()
    }
}

impl Device for MockDevice {
    fn id(&self) -> DeviceId {
        self.id
    }

    fn is_async(&self) -> bool {
        true
    }

    fn supports_stream_wait(&self) -> bool {
        true
    }

    fn create_stream(&self, ty: StreamType) -> Result<std::sync::Arc<dyn Stream>, EpError> {
        let nth = self.created.fetch_add(1, Ordering::Relaxed);
        Ok(std::sync::Arc::new(MockStream::spawn(self, ty, nth)?))
    }

    fn create_event(&self) -> Result<std::sync::Arc<dyn Event>, EpError> {
        Ok(std::sync::Arc::new(MockEvent::new(self.id)))
    }
}

/// What a device thread does next.
enum Task {
    /// Run launched work (after the configured delay).
    Run(Box<dyn FnOnce() + Send>),
    /// Mark recording `target` of `event` as reached.
    Record { event: crate::sync::Arc<EventState>, target: u64 },
    /// Sleep until recording `target` of `event` has been reached.
    Wait { event: crate::sync::Arc<EventState>, target: u64 },
    /// Exit the thread (enqueued last, by the drop of the stream's last handle).
    Stop,
}

/// What a stream's handle shares with its device thread.
struct StreamQueue {
    tasks: SegQueue<Task>,
    notifier: Notifier,
    clock: SimClock,
    /// The stream's fault record, current while its work runs (`ep::fault`).
    faults: FaultRecord,
}

/// The simulated time of one stream: what its device thread sleeps for each launched item,
/// until [`Stream::end_simulated_time`] ends it.
///
/// `parking_lot` directly rather than [`crate::sync`]: a timed wait models nothing the model
/// checker explores (the VM never waits for simulated time to pass, only for work to be
/// done), and the facade has no timed wait.
#[derive(Default)]
struct SimClock {
    ended: parking_lot::Mutex<bool>,
    woken: parking_lot::Condvar,
}

impl SimClock {
    /// Sleep for `d`, or until simulated time ends, whichever comes first.
    fn sleep(&self, d: Duration) {
        let deadline = Instant::now() + d;
        let mut ended = self.ended.lock();
        while !*ended {
            if self.woken.wait_until(&mut ended, deadline).timed_out() {
                return;
            }
        }
    }

    /// End simulated time: the sleep in progress returns, and later ones return at once.
    fn end(&self) {
        *self.ended.lock() = true;
        self.woken.notify_all();
    }
}

impl StreamQueue {
    /// Enqueue a task and wake the device thread if it sleeps.
    fn push(&self, task: Task) {
        self.tasks.push(task);
        self.notifier.notify();
    }
}

/// A stream of a [`MockDevice`]: a FIFO of work run by a device thread of its own.
///
/// Dropping the last handle drains the queue, stops the thread and joins it.
pub struct MockStream {
    device: DeviceId,
    ty: StreamType,
    queue: crate::sync::Arc<StreamQueue>,
    /// Recorded and waited for by [`Stream::synchronize`].
    sync_event: MockEvent,
    thread: Option<JoinHandle<()>>,
    thread_id: ThreadId,
}

impl MockStream {
    /// Start the device thread of a new stream of `device`, the `nth` it creates.
    fn spawn(device: &MockDevice, ty: StreamType, nth: u64) -> Result<MockStream, EpError> {
        let queue = crate::sync::Arc::new(StreamQueue {
            tasks: SegQueue::new(),
            notifier: Notifier::new(),
            clock: SimClock::default(),
            faults: FaultRecord::host(),
        });
        let seed = device
            .config
            .seed
            .wrapping_add(u64::from(device.id.index) << 32)
            .wrapping_add((ty as u64) << 24)
            .wrapping_add(nth);
        let mut worker = DeviceThread {
            device: device.id,
            ty,
            queue: queue.clone(),
            config: device.config.clone(),
            rng: SplitMix64(seed),
        };
        let live = LiveGuard::enter(device.live.clone());
        let thread = std::thread::Builder::new()
            .name(format!("mock{}-{}", device.id.index, ty.name()))
            .spawn(move || {
                let _live = live;
                worker.run();
            })
            .map_err(|e| EpError::Device {
                device: device.id,
                what: format!("cannot start a {} stream thread: {e}", ty.name()),
            })?;
        Ok(MockStream {
            device: device.id,
            ty,
            queue,
            sync_event: MockEvent::new(device.id),
            thread_id: thread.thread().id(),
            thread: Some(thread),
        })
    }

    /// The mock event behind `event`, or an error naming what went wrong.
    fn mock_event<'e>(&self, event: &'e dyn Event, what: &str) -> Result<&'e MockEvent, EpError> {
        event.as_any().downcast_ref::<MockEvent>().ok_or_else(|| EpError::Device {
            device: self.device,
            what: format!("cannot {what} {event:?}: not a mock event"),
        })
    }

    /// Record `event` on this stream: take the next recording number and enqueue its marker
    /// under the event's lock (see the module docs), then wake the device thread.
    fn record_mock(&self, event: &MockEvent) -> u64 {
        let target = {
            let mut progress = event.state.progress.lock();
            progress.recorded += 1;
            let target = progress.recorded;
            self.queue.tasks.push(Task::Record { event: event.state.clone(), target });
            target
        };
        self.queue.notifier.notify();
        target
    }

    /// Whether the calling thread is this stream's device thread.
    fn on_device_thread(&self) -> bool {
        std::thread::current().id() == self.thread_id
    }
}

impl fmt::Debug for MockStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MockStream")
            .field("device", &self.device)
            .field("type", &self.ty)
            .field("queued", &self.queue.tasks.len())
            .finish()
    }
}

impl Stream for MockStream {
    fn device(&self) -> DeviceId {
        self.device
    }

    fn stream_type(&self) -> StreamType {
        self.ty
    }

    fn launch(&self, work: Box<dyn FnOnce() + Send>) -> Result<(), EpError> {
        self.queue.push(Task::Run(work));
        Ok(())
    }

    /// Record `event` after everything launched so far. The event must belong to this
    /// stream's device (as `cudaEventRecord` requires).
    fn record(&self, event: &dyn Event) -> Result<(), EpError> {
        let event = self.mock_event(event, "record")?;
        if event.state.device != self.device {
            return Err(EpError::Device {
                device: self.device,
                what: format!(
                    "cannot record an event of {} on a stream of {}",
                    event.state.device, self.device
                ),
            });
        }
        self.record_mock(event);
        Ok(())
    }

    /// Make later work wait, on the device, for the recording of `event` that is the latest
    /// at the time of this call. Events of other mock devices may be waited for (as with
    /// `cudaStreamWaitEvent`); an event of another backend may be waited for only when it is
    /// already complete (a CPU event always is).
    fn wait_event(&self, event: &dyn Event) -> Result<(), EpError> {
        let Some(event) = event.as_any().downcast_ref::<MockEvent>() else {
            if event.query() {
                return Ok(());
            }
            return Err(EpError::Device {
                device: self.device,
                what: format!("cannot wait on the device for {event:?}: not a mock event"),
            });
        };
        let target = {
            let progress = event.state.progress.lock();
            if progress.is_reached(progress.recorded) {
                // Nothing to wait for: the wait would pass at once.
                return Ok(());
            }
            progress.recorded
        };
        self.queue.push(Task::Wait { event: event.state.clone(), target });
        Ok(())
    }

    /// Block the host until everything launched so far has run. Calling it from work
    /// running on this stream is an error (it would wait for itself).
    fn synchronize(&self) -> Result<(), EpError> {
        if self.on_device_thread() {
            return Err(EpError::Device {
                device: self.device,
                what: format!("{} stream synchronized from its own device thread", self.ty.name()),
            });
        }
        let target = self.record_mock(&self.sync_event);
        self.sync_event.state.wait_for(target);
        Ok(())
    }

    fn end_simulated_time(&self) {
        self.queue.clock.end();
    }

    /// Written by kernels running on the stream's device thread ([`fault::report`]).
    fn faults(&self) -> Option<&FaultRecord> {
        Some(&self.queue.faults)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Drop for MockStream {
    fn drop(&mut self) {
        // Everything launched through this handle is queued before the stop marker, and no
        // other handle exists to launch more, so the thread drains its queue, then exits.
        self.queue.push(Task::Stop);
        let Some(thread) = self.thread.take() else {
            return;
        };
        if self.on_device_thread() {
            // The last handle was dropped by work running on this stream: the thread exits
            // on its own once this work returns; joining it here would wait for ourselves.
            return;
        }
        if thread.join().is_err() {
            tracing::error!(device = %self.device, stream = self.ty.name(), "mock stream thread panicked");
        }
    }
}

/// Which recordings of an event have been reached, and how many were made.
#[derive(Debug, Default)]
struct Progress {
    /// Recordings made so far; recording `n` carries target `n`.
    recorded: u64,
    /// Every recording up to this one has been reached.
    reached: u64,
    /// Recordings above `reached + 1` reached out of order (recorded on other streams).
    /// Empty unless one event is recorded on several streams at once.
    ahead: Vec<u64>,
}

impl Progress {
    fn is_reached(&self, target: u64) -> bool {
        target <= self.reached || self.ahead.contains(&target)
    }

    fn mark_reached(&mut self, target: u64) {
        if target == self.reached + 1 {
            self.reached = target;
            while let Some(i) = self.ahead.iter().position(|&t| t == self.reached + 1) {
                self.ahead.swap_remove(i);
                self.reached += 1;
            }
        } else if target > self.reached && !self.ahead.contains(&target) {
            self.ahead.push(target);
        }
    }
}

/// The shared state of an event: its progress, and a condition variable notified whenever
/// a recording is reached.
struct EventState {
    device: DeviceId,
    progress: Mutex<Progress>,
    reached_cv: Condvar,
}

impl EventState {
    /// Sleep until recording `target` has been reached.
    fn wait_for(&self, target: u64) {
        let mut progress = self.progress.lock();
        while !progress.is_reached(target) {
            self.reached_cv.wait(&mut progress);
        }
    }

    /// Mark recording `target` as reached and wake everyone waiting on this event.
    fn mark_reached(&self, target: u64) {
        self.progress.lock().mark_reached(target);
        self.reached_cv.notify_all();
    }
}

/// An event of a [`MockDevice`], with CUDA event semantics (see the module docs).
///
/// Its counters never reset, so an event can be recorded and waited for any number of
/// times; every wait targets the recording that was the latest when the wait was made.
pub struct MockEvent {
    state: crate::sync::Arc<EventState>,
}

impl MockEvent {
    fn new(device: DeviceId) -> MockEvent {
        MockEvent {
            state: crate::sync::Arc::new(EventState {
                device,
                progress: Mutex::new(Progress::default()),
                reached_cv: Condvar::new(),
            }),
        }
    }

    /// The device it belongs to.
    pub fn device(&self) -> DeviceId {
        self.state.device
    }

    /// How many times it has been recorded.
    pub fn times_recorded(&self) -> u64 {
        self.state.progress.lock().recorded
    }
}

impl fmt::Debug for MockEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let progress = self.state.progress.lock();
        f.debug_struct("MockEvent")
            .field("device", &self.state.device)
            .field("recorded", &progress.recorded)
            .field("reached", &progress.reached)
            .finish()
    }
}

impl Event for MockEvent {
    /// Whether the latest recording (as of this call) has been reached; true if never
    /// recorded. Once true, the effects of the work before that recording are visible.
    fn query(&self) -> bool {
        let progress = self.state.progress.lock();
        progress.is_reached(progress.recorded)
    }

    /// Sleep until the latest recording as of this call has been reached. Must not be
    /// called from work running on the stream that holds that recording (it would wait for
    /// itself).
    fn wait(&self) -> Result<(), EpError> {
        let target = self.state.progress.lock().recorded;
        self.state.wait_for(target);
        Ok(())
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Counts a device thread as live from stream creation until the thread exits.
struct LiveGuard(crate::sync::Arc<AtomicUsize>);

impl LiveGuard {
    fn enter(live: crate::sync::Arc<AtomicUsize>) -> LiveGuard {
        live.fetch_add(1, Ordering::AcqRel);
        LiveGuard(live)
    }
}

impl Drop for LiveGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The loop of a stream's device thread.
struct DeviceThread {
    device: DeviceId,
    ty: StreamType,
    queue: crate::sync::Arc<StreamQueue>,
    config: MockConfig,
    rng: SplitMix64,
}

impl DeviceThread {
    fn run(&mut self) {
        let backoff = Backoff::for_this_machine();
        loop {
            let Some(task) = self.queue.tasks.pop() else {
                let tasks = &self.queue.tasks;
                self.queue.notifier.wait(backoff, || !tasks.is_empty());
                continue;
            };
            match task {
                Task::Run(work) => {
                    self.simulate_work_time();
                    let faults = Some(&self.queue.faults);
                    if let Err(payload) = fault::running(faults, || catch_unwind(AssertUnwindSafe(work))) {
                        tracing::error!(
                            device = %self.device,
                            stream = self.ty.name(),
                            "work launched on a mock stream panicked: {}",
                            panic_message(payload.as_ref())
                        );
                    }
                }
                Task::Record { event, target } => event.mark_reached(target),
                Task::Wait { event, target } => event.wait_for(target),
                Task::Stop => return,
            }
        }
    }

    /// Spend the configured launch delay and jitter before a work item.
    fn simulate_work_time(&mut self) {
        if !self.config.launch_delay.is_zero() {
            self.queue.clock.sleep(self.config.launch_delay);
        }
        if self.config.jitter.is_zero() {
            return;
        }
        let r = self.rng.next_u64();
        if r % 16 == 0 {
            let max_ns = u64::try_from(self.config.jitter.as_nanos()).unwrap_or(u64::MAX);
            let ns = (r >> 4) % max_ns.saturating_add(1);
            if ns > 0 {
                self.queue.clock.sleep(Duration::from_nanos(ns));
            }
        } else {
            for _ in 0..(r >> 4) % 4 {
                std::thread::yield_now();
            }
        }
    }
}

/// The message of a panic payload, if it has one.
fn panic_message(payload: &(dyn Any + Send)) -> &str {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s
    } else {
        "(non-string panic payload)"
    }
}

/// The splitmix64 generator (Steele, Lea and Flood), enough to draw jitter.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use super::*;
    use crate::ep::cpu::CpuDevice;

    /// A host-side gate that launched work can block on (a simulated long kernel).
    #[derive(Default)]
    struct Gate {
        open: Mutex<bool>,
        cv: Condvar,
    }

    impl Gate {
        /// A closed gate. The returned handle opens it when dropped, so that a failing test
        /// unblocks its streams (declare it after them, so that it is dropped first) instead
        /// of hanging in their drop.
        fn closed() -> GateHandle {
            GateHandle(Arc::new(Gate::default()))
        }
        fn open(&self) {
            *self.open.lock() = true;
            self.cv.notify_all();
        }
        fn pass(&self) {
            let mut open = self.open.lock();
            while !*open {
                self.cv.wait(&mut open);
            }
        }
    }

    /// Owns a [`Gate`] and opens it on drop; `share` lends it to launched work.
    struct GateHandle(Arc<Gate>);

    impl GateHandle {
        fn share(&self) -> Arc<Gate> {
            self.0.clone()
        }
    }

    impl std::ops::Deref for GateHandle {
        type Target = Gate;
        fn deref(&self) -> &Gate {
            &self.0
        }
    }

    impl Drop for GateHandle {
        fn drop(&mut self) {
            self.0.open();
        }
    }

    /// Poll `cond` every millisecond for up to five seconds.
    fn eventually(mut cond: impl FnMut() -> bool) -> bool {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if cond() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        cond()
    }

    fn device(config: MockConfig) -> MockDevice {
        MockDevice::new(0, config)
    }

    #[test]
    fn device_properties() {
        let dev = MockDevice::new(3, MockConfig::default());
        assert_eq!(dev.id(), DeviceId::mock(3));
        assert!(dev.is_async());
        assert!(dev.supports_stream_wait());
        let s = dev.create_stream(StreamType::H2D).unwrap();
        assert_eq!(s.device(), DeviceId::mock(3));
        assert_eq!(s.stream_type(), StreamType::H2D);
        assert!(s.as_any().downcast_ref::<MockStream>().is_some());
        let name = Arc::new(Mutex::new(None));
        let n = name.clone();
        s.launch(Box::new(move || *n.lock() = std::thread::current().name().map(String::from))).unwrap();
        s.synchronize().unwrap();
        assert_eq!(name.lock().as_deref(), Some("mock3-h2d"));
        let e = dev.create_event().unwrap();
        assert_eq!(e.as_any().downcast_ref::<MockEvent>().unwrap().device(), DeviceId::mock(3));
    }

    #[test]
    fn launches_run_in_fifo_order() {
        let dev = device(MockConfig::jittery());
        let s = dev.create_stream(StreamType::Compute).unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        for i in 0..2000 {
            let seen = seen.clone();
            s.launch(Box::new(move || seen.lock().push(i))).unwrap();
        }
        s.synchronize().unwrap();
        assert_eq!(*seen.lock(), (0..2000).collect::<Vec<_>>());
    }

    #[test]
    fn launch_returns_before_the_work_runs() {
        let delay = Duration::from_millis(20);
        let dev = device(MockConfig { launch_delay: delay, ..MockConfig::default() });
        let s = dev.create_stream(StreamType::Compute).unwrap();
        let ran = Arc::new(AtomicBool::new(false));
        let r = ran.clone();
        let start = Instant::now();
        s.launch(Box::new(move || r.store(true, Ordering::Relaxed))).unwrap();
        let returned = start.elapsed();
        // The device thread sleeps `delay` before running the work, so it cannot have run
        // unless that much time has passed (a busy machine may preempt us that long).
        assert!(!ran.load(Ordering::Relaxed) || start.elapsed() >= delay);
        assert!(returned < delay, "launch blocked for {returned:?}");
        s.synchronize().unwrap();
        assert!(ran.load(Ordering::Relaxed));
        assert!(start.elapsed() >= delay);
    }

    #[test]
    fn record_query_wait() {
        let dev = device(MockConfig::default());
        let s = dev.create_stream(StreamType::Compute).unwrap();
        let e = dev.create_event().unwrap();
        // Never recorded: complete.
        assert!(e.query());
        e.wait().unwrap();

        let gate = Gate::closed();
        let done = Arc::new(AtomicBool::new(false));
        let (g, d) = (gate.share(), done.clone());
        s.launch(Box::new(move || {
            g.pass();
            d.store(true, Ordering::Relaxed);
        }))
        .unwrap();
        s.record(e.as_ref()).unwrap();
        assert!(!e.query(), "recorded behind blocked work, yet complete");
        gate.open();
        e.wait().unwrap();
        assert!(e.query());
        // The work before the recording is visible once the event is complete.
        assert!(done.load(Ordering::Relaxed));
        let mock = e.as_any().downcast_ref::<MockEvent>().unwrap();
        assert_eq!(mock.times_recorded(), 1);
    }

    #[test]
    fn query_turns_true_without_a_host_wait() {
        let dev = device(MockConfig { launch_delay: Duration::from_millis(2), ..MockConfig::default() });
        let s = dev.create_stream(StreamType::D2H).unwrap();
        let e = dev.create_event().unwrap();
        s.launch(Box::new(|| {})).unwrap();
        s.record(e.as_ref()).unwrap();
        assert!(eventually(|| e.query()));
    }

    #[test]
    fn stream_wait_event_orders_work_across_streams() {
        let dev = device(MockConfig::jittery());
        let a = dev.create_stream(StreamType::Compute).unwrap();
        let b = dev.create_stream(StreamType::D2H).unwrap();
        let reused = dev.create_event().unwrap();
        // Plain (relaxed) memory: only the event may order B's read after A's write.
        let value = Arc::new(AtomicU64::new(0));
        let bad = Arc::new(AtomicUsize::new(0));
        for i in 1..=300u64 {
            // Alternate a reused event and a fresh one.
            let fresh;
            let e = if i % 2 == 0 {
                reused.as_ref()
            } else {
                fresh = dev.create_event().unwrap();
                fresh.as_ref()
            };
            let v = value.clone();
            a.launch(Box::new(move || {
                // A slow item: yield a few times before writing.
                for _ in 0..(i % 5) {
                    std::thread::yield_now();
                }
                v.store(i, Ordering::Relaxed);
            }))
            .unwrap();
            a.record(e).unwrap();
            b.wait_event(e).unwrap();
            let (v, bad) = (value.clone(), bad.clone());
            b.launch(Box::new(move || {
                if v.load(Ordering::Relaxed) < i {
                    bad.fetch_add(1, Ordering::Relaxed);
                }
            }))
            .unwrap();
        }
        b.synchronize().unwrap();
        a.synchronize().unwrap();
        assert_eq!(bad.load(Ordering::Relaxed), 0, "stream B ran ahead of the event it waited for");
        assert_eq!(value.load(Ordering::Relaxed), 300);
    }

    #[test]
    fn stream_wait_event_does_not_block_the_host() {
        let dev = device(MockConfig::default());
        let a = dev.create_stream(StreamType::Compute).unwrap();
        let b = dev.create_stream(StreamType::H2D).unwrap();
        let e = dev.create_event().unwrap();
        let gate = Gate::closed();
        let g = gate.share();
        a.launch(Box::new(move || g.pass())).unwrap();
        a.record(e.as_ref()).unwrap();
        b.wait_event(e.as_ref()).unwrap(); // returns although A is blocked
        let ran = Arc::new(AtomicBool::new(false));
        let r = ran.clone();
        b.launch(Box::new(move || r.store(true, Ordering::Relaxed))).unwrap();
        std::thread::sleep(Duration::from_millis(10));
        assert!(!ran.load(Ordering::Relaxed), "B ran past a wait for an unreached event");
        gate.open();
        b.synchronize().unwrap();
        assert!(ran.load(Ordering::Relaxed));
    }

    #[test]
    fn event_reuse_waits_target_the_recording_at_call_time() {
        let dev = device(MockConfig::default());
        let a = dev.create_stream(StreamType::Compute).unwrap();
        let b = dev.create_stream(StreamType::D2H).unwrap();
        let e = dev.create_event().unwrap();
        let (gate1, gate2) = (Gate::closed(), Gate::closed());

        // Recording 1, behind gate 1; B waits for it.
        let g = gate1.share();
        a.launch(Box::new(move || g.pass())).unwrap();
        a.record(e.as_ref()).unwrap();
        b.wait_event(e.as_ref()).unwrap();
        let b_ran = Arc::new(AtomicBool::new(false));
        let r = b_ran.clone();
        b.launch(Box::new(move || r.store(true, Ordering::Relaxed))).unwrap();

        // Recording 2, behind gate 2: it must not hold up B's wait for recording 1.
        let g = gate2.share();
        a.launch(Box::new(move || g.pass())).unwrap();
        a.record(e.as_ref()).unwrap();
        assert!(!e.query());

        gate1.open();
        assert!(eventually(|| b_ran.load(Ordering::Relaxed)), "B's wait moved to a later recording");
        // Recording 2 is the latest: the event is not complete until it is reached.
        assert!(!e.query());
        gate2.open();
        e.wait().unwrap();
        assert!(e.query());

        // Record again, wait again: counters keep going across reuse.
        a.record(e.as_ref()).unwrap();
        e.wait().unwrap();
        b.wait_event(e.as_ref()).unwrap();
        b.synchronize().unwrap();
        assert!(e.query());
        assert_eq!(e.as_any().downcast_ref::<MockEvent>().unwrap().times_recorded(), 3);
    }

    #[test]
    fn event_recorded_on_two_streams_tracks_each_recording() {
        let dev = device(MockConfig::default());
        let a = dev.create_stream(StreamType::Compute).unwrap();
        let b = dev.create_stream(StreamType::H2D).unwrap();
        let c = dev.create_stream(StreamType::D2H).unwrap();
        let e = dev.create_event().unwrap();
        let gate = Gate::closed();
        let g = gate.share();
        a.launch(Box::new(move || g.pass())).unwrap();
        a.record(e.as_ref()).unwrap(); // recording 1, blocked
        c.wait_event(e.as_ref()).unwrap(); // targets recording 1
        let c_ran = Arc::new(AtomicBool::new(false));
        let r = c_ran.clone();
        c.launch(Box::new(move || r.store(true, Ordering::Relaxed))).unwrap();
        b.record(e.as_ref()).unwrap(); // recording 2, reached at once
        assert!(eventually(|| e.query()), "latest recording reached, event not complete");
        std::thread::sleep(Duration::from_millis(5));
        assert!(!c_ran.load(Ordering::Relaxed), "C's wait was released by a later recording");
        gate.open();
        c.synchronize().unwrap();
        assert!(c_ran.load(Ordering::Relaxed));
    }

    #[test]
    fn concurrent_records_and_waits_never_deadlock() {
        let dev = Arc::new(device(MockConfig::jittery()));
        let streams: Vec<_> = StreamType::ALL.iter().map(|&t| dev.create_stream(t).unwrap()).collect();
        let events: Vec<_> = (0..2).map(|_| dev.create_event().unwrap()).collect();
        std::thread::scope(|scope| {
            for t in 0..3 {
                let (streams, events) = (&streams, &events);
                scope.spawn(move || {
                    for i in 0..300usize {
                        let e = events[(i + t) % 2].as_ref();
                        streams[(i + t) % 3].record(e).unwrap();
                        streams[(i + 2 * t + 1) % 3].wait_event(e).unwrap();
                        streams[i % 3].launch(Box::new(|| {})).unwrap();
                    }
                });
            }
        });
        for s in &streams {
            s.synchronize().unwrap();
        }
        for e in &events {
            e.wait().unwrap();
            assert!(e.query());
        }
    }

    #[test]
    fn panics_in_launched_work_do_not_kill_the_stream() {
        let dev = device(MockConfig::default());
        let s = dev.create_stream(StreamType::Compute).unwrap();
        let count = Arc::new(AtomicUsize::new(0));
        for i in 0..10 {
            let c = count.clone();
            s.launch(Box::new(move || {
                if i % 3 == 0 {
                    panic!("planted panic {i}");
                }
                c.fetch_add(1, Ordering::Relaxed);
            }))
            .unwrap();
        }
        s.synchronize().unwrap();
        assert_eq!(count.load(Ordering::Relaxed), 6);
        assert_eq!(dev.running_threads(), 1);
    }

    #[test]
    fn dropping_streams_drains_and_joins_their_threads() {
        let dev = device(MockConfig::jittery());
        let count = Arc::new(AtomicUsize::new(0));
        for round in 0..50 {
            let streams: Vec<_> = StreamType::ALL.iter().map(|&t| dev.create_stream(t).unwrap()).collect();
            assert_eq!(dev.running_threads(), StreamType::ALL.len());
            let e = dev.create_event().unwrap();
            for s in &streams {
                for _ in 0..4 {
                    let c = count.clone();
                    s.launch(Box::new(move || {
                        c.fetch_add(1, Ordering::Relaxed);
                    }))
                    .unwrap();
                }
            }
            // Leave device-side waits and records pending at the drop.
            streams[0].record(e.as_ref()).unwrap();
            streams[1].wait_event(e.as_ref()).unwrap();
            drop(streams);
            assert_eq!(dev.running_threads(), 0, "a stream thread outlived its stream");
            assert_eq!(
                count.load(Ordering::Relaxed),
                (round + 1) * 4 * StreamType::ALL.len(),
                "queued work was lost"
            );
            assert!(e.query());
        }
        // A launch delay does not hold the drop up beyond the queued work.
        let slow = device(MockConfig { launch_delay: Duration::from_millis(1), ..MockConfig::default() });
        let s = slow.create_stream(StreamType::Compute).unwrap();
        let c = count.clone();
        s.launch(Box::new(move || {
            c.fetch_add(1, Ordering::Relaxed);
        }))
        .unwrap();
        drop(s);
        assert_eq!(slow.running_threads(), 0);
        assert_eq!(count.load(Ordering::Relaxed), 50 * 4 * StreamType::ALL.len() + 1);
    }

    #[test]
    fn last_handle_dropped_on_its_own_thread() {
        let dev = device(MockConfig::default());
        let s = dev.create_stream(StreamType::Compute).unwrap();
        let s2 = s.clone();
        let gate = Gate::closed();
        let g = gate.share();
        s.launch(Box::new(move || {
            g.pass();
            drop(s2);
        }))
        .unwrap();
        drop(s);
        gate.open();
        assert!(eventually(|| dev.running_threads() == 0));
    }

    #[test]
    fn synchronize_from_own_thread_is_an_error() {
        let dev = device(MockConfig::default());
        let s = dev.create_stream(StreamType::Compute).unwrap();
        let result = Arc::new(Mutex::new(None));
        let (s2, r) = (s.clone(), result.clone());
        s.launch(Box::new(move || *r.lock() = Some(s2.synchronize()))).unwrap();
        s.synchronize().unwrap();
        assert!(matches!(*result.lock(), Some(Err(EpError::Device { .. }))));
    }

    #[test]
    fn foreign_and_other_device_events() {
        let dev = device(MockConfig::default());
        let other = MockDevice::new(1, MockConfig::default());
        let s = dev.create_stream(StreamType::Compute).unwrap();
        let cpu_event = CpuDevice::new().create_event().unwrap();
        assert!(s.record(cpu_event.as_ref()).is_err());
        // A CPU event is always complete, so there is nothing to wait for.
        s.wait_event(cpu_event.as_ref()).unwrap();
        let foreign = other.create_event().unwrap();
        assert!(s.record(foreign.as_ref()).is_err());
        // Waiting for another mock device's event is fine (cudaStreamWaitEvent allows it).
        let os = other.create_stream(StreamType::Compute).unwrap();
        os.record(foreign.as_ref()).unwrap();
        s.wait_event(foreign.as_ref()).unwrap();
        s.synchronize().unwrap();
        assert!(foreign.query());
    }

    #[test]
    fn jitter_stays_cheap() {
        let dev = device(MockConfig::jittery());
        let s = dev.create_stream(StreamType::Compute).unwrap();
        let start = Instant::now();
        for _ in 0..1000 {
            s.launch(Box::new(|| {})).unwrap();
        }
        s.synchronize().unwrap();
        // ~60 sleeps of tens of microseconds; generous bound for a busy machine.
        assert!(start.elapsed() < Duration::from_secs(2), "took {:?}", start.elapsed());
    }

    #[test]
    fn config_from_env_lookup() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string())
        };
        let base = MockConfig { seed: 7, ..MockConfig::default() };
        assert_eq!(base.clone().with_lookup(env(&[])), base);
        let c = base.clone().with_lookup(env(&[(ENV_DELAY_US, "250"), (ENV_JITTER_US, " 40 ")]));
        assert_eq!(c.launch_delay, Duration::from_micros(250));
        assert_eq!(c.jitter, Duration::from_micros(40));
        assert_eq!(c.seed, 7);
        // Malformed values are ignored, well-formed ones still apply.
        let c = base.clone().with_lookup(env(&[(ENV_DELAY_US, "1.5ms"), (ENV_JITTER_US, "3")]));
        assert_eq!(c.launch_delay, Duration::ZERO);
        assert_eq!(c.jitter, Duration::from_micros(3));
        let c = base.clone().with_lookup(env(&[(ENV_DELAY_US, "-1"), (ENV_JITTER_US, "")]));
        assert_eq!(c, base);
    }

    #[test]
    fn progress_tracks_out_of_order_recordings() {
        let mut p = Progress { recorded: 4, ..Progress::default() };
        assert!(p.is_reached(0));
        p.mark_reached(2);
        assert!(p.is_reached(2) && !p.is_reached(1));
        p.mark_reached(4);
        p.mark_reached(1);
        assert_eq!(p.reached, 2);
        assert!(!p.is_reached(3) && p.is_reached(4));
        p.mark_reached(3);
        assert_eq!((p.reached, p.ahead.len()), (4, 0));
    }

    #[test]
    fn splitmix_is_deterministic_and_jitter_seeds_differ() {
        let (mut a, mut b) = (SplitMix64(1), SplitMix64(1));
        let xs: Vec<_> = (0..8).map(|_| a.next_u64()).collect();
        assert_eq!(xs, (0..8).map(|_| b.next_u64()).collect::<Vec<_>>());
        let mut c = SplitMix64(2);
        assert_ne!(xs[0], c.next_u64());
    }
}
