//! The integration tests: one test binary, one module per area. A test's name is its
//! module path, so `cargo test --release --test integration lifecycle::` runs one area
//! (`docs/testing.md`). The loom models are a test binary of their own (`tests/loom/`).

// The `eagervm` binary is built only with the `cli` feature.
#[cfg(feature = "cli")]
mod cli;
// `eagervm::bench` is the command line's, built with `cli`.
#[cfg(feature = "cli")]
mod bench;
#[cfg(feature = "cli")]
mod cli_interactive;
#[cfg(feature = "cli")]
mod cli_preflight;
mod collectives;
mod common;
mod cuda;
mod data_parallel;
mod eager;
mod eager_views;
mod errors;
mod faults;
mod flight;
mod fuzz;
mod inline_wait;
mod kernels;
mod lifecycle;
mod mxnet_engine;
#[cfg(feature = "cuda")]
mod nccl;
mod planted_bug;
// `eagervm plot` and graph rendering are part of the `cli` feature.
#[cfg(feature = "cli")]
mod plot;
mod priorities;
mod profile;
mod programs;
mod registry;
mod serializability;
mod shutdown;
mod timeline;
mod trace_analyze;
mod trace_format;
mod trace_record;
mod trace_shipped;
mod trace_views;
mod unzeroed;
mod views;
