//! eagervm: an eager-execution virtual machine.
//!
//! An eager deep-learning framework issues a long stream of small tensor operations; eagervm
//! runs them asynchronously on CPU and device streams, in an order that respects every
//! read/write dependency, so that copies overlap compute and host work overlaps device work,
//! while every program gives the same result as running its instructions one at a time.
//!
//! # The model
//!
//! - **Front end.** [`VirtualMachine::run`] lends an [`InstructionsBuilder`]
//!   to a closure. Each op call is checked (op, shapes, dtypes, devices) and turned into an
//!   `OpCall` instruction bound to a [`StreamId`] (device + stream type). When a
//!   tensor was last used on another stream, the builder first emits `RecordEvent` +
//!   `StreamWaitEvent` (same device: the device waits) or `RecordEvent` (the host waits), as
//!   OneFlow's `SoftSyncStream` does. Batches go to the scheduler without a lock.
//! - **Scheduler.** One thread owns all dependence state. A write waits for the last write
//!   and every read since; a read waits for the last write (MXNet's rule). Instructions
//!   are named by their stream and position on it: two on one stream need no edge (a stream
//!   dispatches, runs and completes in order); an edge from a `RecordEvent` to its
//!   `StreamWaitEvent` is released at launch; one across streams at completion, unless a
//!   device-side wait already covers it (`src/vm/scheduler.rs`).
//! - **Workers.** One `ThreadCtx` (`src/vm/thread_ctx.rs`) per stream runs instructions: CPU kernels
//!   inline; device work launched on an [`ep::Stream`] with a pooled [`ep::Event`] recorded
//!   after it, whose completion a watcher thread reports. Idle threads sleep under the
//!   protocol of `sync::notify`, model-checked with loom.
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
//! let y = vm.run(|b| {
//!     let r = b.apply(relu, &[&x])?; // on mock:0's compute stream; waits on the device for the copy
//!     b.apply(scale.with(Attrs::scalar(2.0)), &[&r])
//! })?;
//! assert_eq!(y.to_vec::<f32>()?, vec![2.0, 0.0, 6.0]); // read back through mock:0's d2h stream
//! # Ok::<(), eagervm::Error>(())
//! ```
//!
//! The eager front end, [`eager`], puts arrays over this: [`Array`]s are owned handles
//! (`Clone + Send + Sync`) whose methods (`x.matmul(&w)?.relu()?`) return at once while the
//! VM runs the work; `docs/frontend.md` describes it line by line, and `examples/` has
//! programs that run with `cargo run --release --example NAME`.
//!
//! # Layers
//!
//! The modules form layers, each using only those below it: `sync` and [`ep`] (devices) at
//! the bottom, then `alloc`, then [`vm`] (the engine, which knows nothing above it), then
//! `kernels` and [`profile`], then [`framework`] (the only way in: [`VirtualMachine`],
//! tensors, the builder), then [`eager`], then [`trace`] and [`programs`]. A test keeps every
//! arrow pointing down; `docs/architecture.md` ("Layers") draws the picture.
//!
//! # What is public
//!
//! The modules documented here, and the names at the crate root and in [`prelude`], are
//! the API. `alloc`, `sync`, `kernels`, `bench` and `cli` are public only for the
//! `eagervm` binary, the benches and the tests; they are hidden from these docs and may
//! change without notice. The scheduler and the workers are private to [`vm`].
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

// Internals, public only for the binary, the benches and the tests (crate docs, "What is
// public").
#[doc(hidden)]
pub mod alloc;
#[cfg(feature = "cli")]
#[doc(hidden)]
pub mod bench;
#[cfg(feature = "cli")]
#[doc(hidden)]
pub mod cli;
pub mod eager;
pub mod ep;
pub mod framework;
#[doc(hidden)]
pub mod kernels;
// The layering of the modules above, and its check (`docs/architecture.md`, "Layers").
#[cfg(test)]
mod layers;
pub mod profile;
pub mod programs;
// The Python extension module (`docs/python.md`); nothing public for Rust users.
#[cfg(feature = "python")]
mod python;
#[doc(hidden)]
pub mod sync;
pub mod trace;
pub mod vm;

#[doc(inline)]
pub use eager::{Array, Context};
#[doc(inline)]
pub use ep::{DeviceId, StreamType};
#[doc(inline)]
pub use framework::{Attrs, Call, DType, InstructionsBuilder, Op, Tensor, VirtualMachine};
#[doc(inline)]
pub use vm::{Config, Error, Result, StreamId};

/// The names most programs need.
pub mod prelude {
    #[doc(no_inline)]
    pub use crate::eager::{Array, Context};
    #[doc(no_inline)]
    pub use crate::ep::{DeviceId, StreamType};
    #[doc(no_inline)]
    pub use crate::framework::VirtualMachine;
    #[doc(no_inline)]
    pub use crate::framework::{Attrs, Call, DType, InstructionsBuilder, Op, Tensor};
    #[doc(no_inline)]
    pub use crate::vm::{Config, StreamId};
    #[doc(no_inline)]
    pub use crate::{Error, Result};
}

/// The README's Rust example, compiled and run as a doc test so that it stays true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeExample;
