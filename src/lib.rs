//! eagervm: an eager-execution virtual machine.
//!
//! An eager deep-learning framework issues a long stream of small tensor operations; eagervm
//! runs them asynchronously on CPU and device streams, in an order that respects every
//! read/write dependency, so that copies overlap compute and host work overlaps device work,
//! while every program gives the same result as running its instructions one at a time.
//!
//! # The model
//!
//! - **Front end.** [`VirtualMachine::run`] lends an [`InstructionsBuilder`](framework::InstructionsBuilder)
//!   to a closure. Each op call is checked (op, shapes, dtypes, devices) and turned into an
//!   `OpCall` instruction bound to a [`StreamId`](vm::StreamId) (device + stream type). When a
//!   tensor was last used on another stream, the builder first emits `RecordEvent` +
//!   `StreamWaitEvent` (same device: the device waits) or `RecordEvent` (the host waits), as
//!   OneFlow's `SoftSyncStream` does. Batches go to the scheduler without a lock.
//! - **Scheduler.** One thread owns all dependence state. A write waits for the last write
//!   and every read since; a read waits for the last write (MXNet's rule). Instructions
//!   are named by their stream and position on it: two on one stream need no edge (a stream
//!   dispatches, runs and completes in order); an edge from a `RecordEvent` to its
//!   `StreamWaitEvent` is released at launch; one across streams at completion, unless a
//!   device-side wait already covers it. See [`vm::scheduler`].
//! - **Workers.** One [`ThreadCtx`](vm::thread_ctx) per stream runs instructions: CPU kernels
//!   inline; device work launched on an [`ep::Stream`] with a pooled [`ep::Event`] recorded
//!   after it, whose completion a watcher thread reports. Idle threads sleep under the
//!   protocol of [`sync::notify`], model-checked with loom.
//! - **Devices.** [`ep::cpu`] (synchronous), [`ep::mock`] (an asynchronous device made of
//!   host threads, with launch delay and jitter, so that every event path runs without a GPU)
//!   and [`ep::cuda`] (NVIDIA GPUs through cudarc, loaded at run time; cargo feature `cuda`,
//!   on by default: without it, or without a driver or GPU, a `cuda:N` device is a typed
//!   error, [`ep::EpError::CudaUnavailable`]).
//! - **Traces.** [`trace`] records the instruction stream a VM receives as a readable text
//!   file ([`trace::Recorder`], attached to any program without changing it), and parses,
//!   validates (every problem with its line and column), replays (as recorded, or with the
//!   synchronisation derived again on another device layout) and analyses it (critical
//!   path, available parallelism, DOT). `docs/trace-format.md` is the reference; the
//!   `eagervm` command line (`record`, `replay`, `validate`, `analyze`, `docs/cli.md`) drives it.
//! - **Errors are values.** A kernel that fails or panics stores an [`Error`] on the tensors it
//!   writes; readers skip and carry it; [`Tensor::wait`](framework::Tensor::wait) and
//!   [`Tensor::to_vec`](framework::Tensor::to_vec) return it; [`VirtualMachine::sync`] reports
//!   failures since the last sync. The VM keeps running.
//!
//! ```
//! use eagervm::prelude::*;
//! use eagervm::ep::mock::MockConfig;
//!
//! let vm = VirtualMachine::new(Config::default().with_mock_devices(1, MockConfig::default()))?;
//! let dev = DeviceId::mock(0);
//! let x = vm.from_slice(&[1.0f32, -2.0, 3.0], &[3], dev)?; // copied in on mock:0's h2d stream
//! let (relu, scale) = (vm.op("relu")?, vm.op("scale")?);
//! let s = vm.compute_stream(dev)?;
//! let y = vm.run(|b| {
//!     let r = b.call(relu, &[&x], Attrs::default(), s)?; // waits on the device for the copy
//!     b.call(scale, &[&r], Attrs::scalar(2.0), s)
//! })?;
//! assert_eq!(y.to_vec::<f32>()?, vec![2.0, 0.0, 6.0]); // read back through mock:0's d2h stream
//! # Ok::<(), eagervm::Error>(())
//! ```
//!
//! # Layers
//!
//! The modules form layers, each using only those below it: [`sync`] and [`ep`] (devices) at
//! the bottom, then [`alloc`], then [`vm`] (the engine, which knows nothing above it), then
//! [`kernels`] and [`profile`], then [`framework`] (the only way in: [`VirtualMachine`],
//! tensors, the builder), then [`eager`], then [`trace`] and [`programs`]. A test keeps every
//! arrow pointing down; `docs/architecture.md` ("Layers") draws the picture.
//!
//! [`profile`] records a timeline of every instruction on every stream (Chrome/Perfetto
//! trace). `docs/architecture.md` has the full picture; `docs/profiling.md` the timeline;
//! `docs/tuning.md` the knobs; `docs/errors.md` every error; `docs/trace-format.md` the
//! trace format; `docs/cli.md` the command line; `docs/cuda.md` the CUDA backend.
//!
//! # Cargo features
//!
//! - `cuda` (default): the CUDA backend, loaded at run time (`docs/cuda.md`).
//! - `cli` (default): the `eagervm` binary and the parts of the library only it uses, `cli`
//!   and `bench`, with clap and indicatif. `default-features = false` builds the library
//!   without them; [`programs`], the built-in example programs, stays either way.
//! - `python` (off): the Python extension module, built by maturin (`pyproject.toml`,
//!   `docs/python.md`); needs a Python interpreter at build time.
#![warn(missing_docs, unreachable_pub)]

pub mod alloc;
// The command line's own parts: only the binary, its tests and the benches use them.
#[cfg(feature = "cli")]
pub mod bench;
#[cfg(feature = "cli")]
pub mod cli;
pub mod eager;
pub mod ep;
pub mod framework;
pub mod kernels;
// The layering of the modules above, and its check (`docs/architecture.md`, "Layers").
#[cfg(test)]
mod layers;
pub mod profile;
pub mod programs;
// The Python extension module (`docs/python.md`); nothing public for Rust users.
#[cfg(feature = "python")]
mod python;
pub mod sync;
pub mod trace;
pub mod vm;

pub use framework::VirtualMachine;
pub use vm::Config;
pub use vm::{Error, Result};

/// The names most programs need.
pub mod prelude {
    pub use crate::ep::{DeviceId, StreamType};
    pub use crate::framework::VirtualMachine;
    pub use crate::framework::{Attrs, DType, InstructionsBuilder, Tensor};
    pub use crate::vm::{Config, StreamId};
    pub use crate::{Error, Result};
}
