//! The parts of an engine that its threads share, put together: what the scheduler, the
//! workers, the watchers and the watchdog hold (one counted handle each, so that the parts
//! outlive every engine thread), and what the engine's handle reaches through.
//!
//! Each part keeps its state to itself and says in its own file which thread owns which
//! end:
//!
//! | part | file | who writes, who reads |
//! | --- | --- | --- |
//! | the stream table | `engine/streams.rs` | built at start-up, then only read |
//! | the inbox | `engine/inbox.rs` | callers submit; the scheduler receives; a waiter may claim it |
//! | the completion channel | `engine/completions.rs` | workers and watchers report; the scheduler drains |
//! | the worker queues | `engine/worker_queue.rs` | the scheduler pushes; each worker serves its own |
//! | the batch pool | here | builders take empty batches; workers and the scheduler give them back |
//! | the failure log | `vm/instruction_policy/mod.rs` | every executor records; `sync` takes |
//! | the flight recorder | `vm/flight/` | the scheduler and workers write; the watchdog and `flight_record` read |
//! | the timeline observer | `vm/observe/timeline.rs` | the engine threads record while a session is open; the profiler drains |
//! | the communicators | here | the front end adds; the watchdog reads and aborts |
//!
//! The parts are put together once, by `Engine::start` (`vm::engine`), and never replaced.

use std::sync::Arc;

use crate::sync::queue::Queue;
use crate::sync::{AtomicU64, Mutex, Ordering};

use super::super::config::Config;
use super::super::error::Error;
use super::super::flight::Flight;
use super::super::instruction::Batch;
use super::super::instruction_policy::FailureLog;
use super::super::observe::{SubmitObserver, Submitted, Timeline};
use super::super::report::Completion;
use super::completions::Completions;
use super::inbox::{Inbox, Observer, Submission};
use super::streams::StreamTable;
use super::worker_queue::WorkerQueue;

/// The engine's inbox: batches of instructions, shown to the submit observer.
pub(crate) type EngineInbox = Inbox<Batch, Box<dyn SubmitObserver>>;

/// The parts (module docs).
pub(crate) struct Parts {
    pub(crate) config: Config,
    pub(crate) streams: StreamTable,
    pub(crate) inbox: EngineInbox,
    pub(crate) completions: Completions<Completion>,
    /// One per `ThreadCtx` worker, in the stream table's worker order.
    pub(crate) workers: Box<[WorkerQueue<Batch>]>,
    pub(crate) failures: Arc<FailureLog>,
    pub(crate) flight: Flight,
    /// The timeline observer (`observe::timeline`); records nothing unless a session is open.
    pub(crate) timeline: Timeline,
    /// Emptied batches, for builders to fill again.
    batches: Queue<Batch>,
    /// The communicators made on this engine, by name: what the watchdog aborts.
    communicators: Mutex<Vec<CommEntry>>,
    /// The next program number of an instruction run in synchronous mode, where callers
    /// number their own (concurrently: there is no inbox consumer to do it).
    synchronous_program: AtomicU64,
}

/// A communicator made on an engine: what the watchdog reads and aborts.
#[derive(Clone)]
pub(crate) struct CommEntry {
    /// Its name.
    pub(crate) name: Arc<str>,
    /// Its backend.
    pub(crate) backend: Arc<dyn crate::ep::ccl::Backend>,
    /// How many collectives of it have been issued so far.
    pub(crate) issued: Arc<dyn Fn() -> u64 + Send + Sync>,
}

impl Submission for Batch {
    #[inline(always)]
    fn len(&self) -> usize {
        Batch::len(self)
    }

    fn abandon(&mut self) {
        Batch::abandon(self);
    }
}

impl Observer<Batch> for Box<dyn SubmitObserver> {
    fn submitted(&mut self, batch: &Batch) {
        SubmitObserver::submitted(&mut **self, Submitted::new(batch));
    }
}

impl Parts {
    /// Put the parts together.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        config: Config,
        streams: StreamTable,
        inbox: EngineInbox,
        completions: Completions<Completion>,
        failures: Arc<FailureLog>,
        flight: Flight,
        timeline: Timeline,
    ) -> Parts {
        let workers = (0..streams.workers()).map(|_| WorkerQueue::new()).collect();
        Parts {
            config,
            streams,
            inbox,
            completions,
            workers,
            failures,
            flight,
            timeline,
            batches: Queue::new(),
            communicators: Mutex::new(Vec::new()),
            synchronous_program: AtomicU64::new(1),
        }
    }

    /// The program number of an instruction run now in synchronous mode.
    #[inline]
    pub(crate) fn next_synchronous(&self) -> u64 {
        self.synchronous_program.fetch_add(1, Ordering::Relaxed)
    }

    /// An empty batch (pooled: workers hand back the batches they have run and emptied).
    #[inline]
    pub(crate) fn take_batch(&self) -> Batch {
        self.batches.pop().unwrap_or_else(|| Batch::with_capacity(self.config.batch_size))
    }

    /// Give an emptied batch back to the pool.
    #[inline]
    pub(crate) fn recycle(&self, batch: Batch) {
        debug_assert!(batch.is_empty());
        if batch.has_capacity() {
            self.batches.push(batch);
        }
    }

    /// Record a failure that no tensor carries (a device that refused a launch, a call the
    /// front end refused after accepting it); the next `sync` reports it.
    pub(crate) fn record_failure(&self, e: Error) {
        tracing::error!(error = %e, "failure outside any tensor");
        self.failures.record_external(e);
    }

    /// The engine cannot run (a thread it needs could not start, a stream ran out of
    /// positions): record why, so that `sync` reports it, and kill the inbox.
    pub(crate) fn fail(&self, why: String) {
        tracing::error!(%why, "the VM cannot run");
        self.failures.record_external(Error::Config(why));
        self.inbox.kill();
    }

    /// Note a communicator made on this engine, so that the watchdog can abort it. Fails
    /// with [`Error::Collective`] if the name is taken.
    pub(crate) fn add_communicator(&self, entry: CommEntry) -> Result<(), Error> {
        let mut comms = self.communicators.lock();
        if comms.iter().any(|c| c.name == entry.name) {
            return Err(Error::Collective {
                comm: entry.name.to_string(),
                detail: "a communicator of this name exists".into(),
            });
        }
        comms.push(entry);
        Ok(())
    }

    /// The communicators made on this engine, in the order they were made.
    pub(crate) fn communicators(&self) -> Vec<CommEntry> {
        self.communicators.lock().clone()
    }
}
