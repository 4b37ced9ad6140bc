//! The stream table: every stream of the engine, fixed when it starts and never written
//! after, so that every thread reads it without a lock.
//!
//! [`StreamTable::open`] opens the devices (`ep::Registry`: `cpu:0`, the mock devices, the
//! CUDA devices asked for) and lays the streams out:
//!
//! - `cpu:0` has one stream of its own, `cpu:0`, of type `Compute` (CPU copies and host
//!   accesses run on it); each mock and CUDA device has `compute`, `h2d` and `d2h`;
//! - then every device, `cpu:0` included, has a `Collective` stream. They come after all
//!   the devices' own streams, so that adding them left every other stream's number as it
//!   was (traces and tests name streams by number).
//!
//! Each stream gets the stream policy of its device (`StreamPolicy::for_device`), its
//! device's allocator (one per device), the executor environment its instructions run in,
//! and the worker that serves it, as `Config::threads` lays the workers out (one per
//! stream, one per device, or one in all). A stream a waiter may run on its own thread is
//! marked here too ([`StreamTable::runs_inline`]).
//!
//! Nobody owns an end of it: it is built on the thread that starts the engine, before any
//! engine thread exists, and only read after.

use std::sync::Arc;

use crate::alloc::HostAllocator;
use crate::ep::{DeviceId, EventPool, Registry, Stream, StreamType};

use super::super::config::{Config, ThreadTopology};
use super::super::dependence::InstrRef;
use super::super::error::{Error, Result};
use super::super::instruction_policy::{ExecEnv, FailureLog};
use super::super::stream::StreamId;
use super::super::stream_policy::kind::StreamPolicy;

/// One entry of the stream table.
pub(crate) struct VmStream {
    pub(crate) id: StreamId,
    pub(crate) device: DeviceId,
    pub(crate) ty: StreamType,
    /// How its instructions run and complete (`vm::stream_policy`), picked from its device.
    pub(crate) policy: StreamPolicy,
    /// Whether another stream of this device can wait for this one's events on the device.
    pub(crate) device_waits: bool,
    pub(crate) ep: Arc<dyn Stream>,
    pub(crate) events: Arc<EventPool>,
    pub(crate) alloc: Arc<HostAllocator>,
    /// Index of the `ThreadCtx` that runs this stream.
    pub(crate) ctx: usize,
    /// `mock:0:h2d`-style name for messages and timelines.
    pub(crate) name: String,
}

impl std::fmt::Debug for VmStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name)
    }
}

/// The stream table (module docs). Dereferences to its streams, in order.
pub(crate) struct StreamTable {
    streams: Vec<VmStream>,
    /// Per worker, the streams it serves.
    workers: Vec<Vec<usize>>,
    /// Per stream, the environment its instructions run in.
    envs: Vec<Arc<ExecEnv>>,
    /// Per stream: whether a waiter may run its instructions on its own thread
    /// (`Engine::submit_for_wait`).
    inline: Vec<bool>,
    registry: Registry,
}

/// The two passes over the devices that build the table.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Pass {
    /// Each device's own streams (compute, copies).
    Own,
    /// Each device's collective stream.
    Collective,
}

impl StreamTable {
    /// Open the devices `config` asks for and lay out their streams (module docs); failures
    /// of their instructions go to `failures`.
    pub(crate) fn open(config: &Config, failures: &Arc<FailureLog>) -> Result<StreamTable> {
        let mut registry = Registry::new(config.mock_devices, &config.mock);
        registry.add_cuda(config.cuda_devices)?;
        let mut streams = Vec::new();
        let mut workers = Workers::new(config.threads);
        let mut allocs: Vec<Arc<HostAllocator>> = Vec::new();
        let levels = {
            let mut l = config.stream_priorities.0.to_vec();
            l.sort_unstable();
            l.dedup();
            l
        };
        for pass in [Pass::Own, Pass::Collective] {
            for (d, entry) in registry.devices().enumerate() {
                let dev = &entry.device;
                let id = dev.id();
                if pass == Pass::Own {
                    allocs.push(HostAllocator::with_faults(
                        &id.to_string(),
                        dev.memory(),
                        config.fault.alloc_faults(),
                    ));
                }
                let types: &[StreamType] = match pass {
                    Pass::Own if id.is_host() => &[StreamType::Compute],
                    Pass::Own => &StreamType::DEVICE,
                    Pass::Collective => &[StreamType::Collective],
                };
                for &ty in types {
                    let index = streams.len();
                    let name = if id.is_host() && ty == StreamType::Compute {
                        id.to_string()
                    } else {
                        format!("{}:{}", id, ty.name())
                    };
                    streams.push(VmStream {
                        id: StreamId(index as u32),
                        device: id,
                        ty,
                        policy: StreamPolicy::for_device(&**dev),
                        device_waits: dev.supports_stream_wait(),
                        ep: dev.create_stream_with_priority(ty, config.stream_priorities.get(ty), &levels)?,
                        events: entry.events.clone(),
                        alloc: allocs[d].clone(),
                        ctx: workers.serve(index, id),
                        name,
                    });
                }
            }
        }
        if streams.len() > InstrRef::MAX_STREAMS {
            return Err(Error::Config(format!(
                "{} streams asked for; a VM runs at most {}",
                streams.len(),
                InstrRef::MAX_STREAMS
            )));
        }
        let envs = streams
            .iter()
            .map(|s| {
                Arc::new(ExecEnv {
                    stream_name: s.name.clone(),
                    alloc: s.alloc.clone(),
                    failures: failures.clone(),
                })
            })
            .collect();
        // A collective could wait for its peers on the caller's thread, out of the
        // watchdog's sight, and the instructions of a stream whose flight records are kept
        // would be missing from them.
        let inline = streams
            .iter()
            .map(|s| {
                s.policy == StreamPolicy::Synchronous
                    && s.ty != StreamType::Collective
                    && !(config.flight_all_streams && config.flight_records > 0)
            })
            .collect();
        Ok(StreamTable { streams, workers: workers.streams, envs, inline, registry })
    }

    /// How many workers serve the streams.
    pub(crate) fn workers(&self) -> usize {
        self.workers.len()
    }

    /// The streams worker `w` serves.
    pub(crate) fn served_by(&self, w: usize) -> &[usize] {
        &self.workers[w]
    }

    /// The environment instructions of stream `s` run in.
    #[inline]
    pub(crate) fn env(&self, s: usize) -> &Arc<ExecEnv> {
        &self.envs[s]
    }

    /// Whether a waiter may run instructions of stream `s` on its own thread.
    #[inline]
    pub(crate) fn runs_inline(&self, s: usize) -> bool {
        self.inline[s]
    }

    /// The host stream, where host accesses and barriers go.
    #[inline]
    pub(crate) fn host(&self) -> StreamId {
        StreamId(0)
    }

    /// Stream `s`, or [`Error::Config`] if there is none such.
    pub(crate) fn stream(&self, s: StreamId) -> Result<&VmStream> {
        self.streams
            .get(s.index())
            .ok_or_else(|| Error::Config(format!("stream {} does not exist in this VM", s.0)))
    }

    /// The stream of type `ty` on `device` (`cpu:0` has one stream for compute and copies,
    /// and a collective stream).
    pub(crate) fn stream_of(&self, device: DeviceId, ty: StreamType) -> Result<StreamId> {
        let ty = if device.is_host() && ty != StreamType::Collective { StreamType::Compute } else { ty };
        // A match, not `ok_or`: the error made and dropped on every lookup cost the eager
        // call path a call of the error's destructor.
        match self.streams.iter().find(|s| s.device == device && s.ty == ty) {
            Some(s) => Ok(s.id),
            None => Err(Error::Device(self.registry.unavailable(device))),
        }
    }

    /// Whether `device` is one of the engine's devices.
    pub(crate) fn check_device(&self, device: DeviceId) -> Result<()> {
        self.registry.get(device).map(|_| ()).map_err(Error::from)
    }

    /// Each device's allocator, once, with the device's name.
    pub(crate) fn allocators(&self) -> Vec<(String, Arc<HostAllocator>)> {
        let mut allocators: Vec<(String, Arc<HostAllocator>)> = Vec::new();
        for s in &self.streams {
            if !allocators.iter().any(|(_, a)| Arc::ptr_eq(a, &s.alloc)) {
                allocators.push((s.device.to_string(), s.alloc.clone()));
            }
        }
        allocators
    }
}

impl std::ops::Deref for StreamTable {
    type Target = [VmStream];
    #[inline(always)]
    fn deref(&self) -> &[VmStream] {
        &self.streams
    }
}

/// The workers being laid out: which streams each serves, as a [`ThreadTopology`] says.
struct Workers {
    topology: ThreadTopology,
    /// Per worker, its streams.
    streams: Vec<Vec<usize>>,
    /// With one worker per device: each device's worker.
    of_device: Vec<(DeviceId, usize)>,
}

impl Workers {
    fn new(topology: ThreadTopology) -> Self {
        Workers { topology, streams: Vec::new(), of_device: Vec::new() }
    }

    /// The worker that serves stream `index` of `device`.
    fn serve(&mut self, index: usize, device: DeviceId) -> usize {
        let w = match self.topology {
            ThreadTopology::PerStream => self.add(),
            ThreadTopology::PerDevice => match self.of_device.iter().find(|(d, _)| *d == device) {
                Some(&(_, w)) => w,
                None => {
                    let w = self.add();
                    self.of_device.push((device, w));
                    w
                }
            },
            ThreadTopology::Single if self.streams.is_empty() => self.add(),
            ThreadTopology::Single => 0,
        };
        self.streams[w].push(index);
        w
    }

    fn add(&mut self) -> usize {
        self.streams.push(Vec::new());
        self.streams.len() - 1
    }
}
