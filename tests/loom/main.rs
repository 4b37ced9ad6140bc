//! Model checks of eagervm's synchronisation protocols under loom.
//!
//! Run with:
//!
//! ```text
//! RUSTFLAGS="--cfg loom" cargo test --release --test loom
//! ```
//!
//! The crate is not compiled here. The synchronisation facade (`src/sync`) is, by path, and
//! under `--cfg loom` its primitives are loom's; so are the modules under check, which take
//! nothing from the crate but the facade and are compiled by path inside their models'
//! modules: the sleep/wake protocol of `sync::notify` ([`notify`]), the release rule of
//! `src/framework/release.rs` ([`release`]) and the back-pressure handshake of
//! `src/vm/back_pressure.rs` ([`back_pressure`]), the flight recorder's slot,
//! `src/vm/flight/seqlock.rs` ([`seqlock`]), and the tensor object's reference count,
//! `src/vm/refcount.rs` ([`refcount`]); and the engine assembled from its parts
//! (`src/vm/engine/`: the inbox with its claim, the completion channel, the worker queue,
//! the scheduler's loop; and `src/vm/rendezvous.rs`), with a scheduler, a worker, a waiter
//! that may run its own batch and a release ([`engine`]). loom explores every interleaving
//! of their atomics, fences, locks and condition variables up to a preemption bound
//! ([`common`]). Each has models with a planted bug, which check that loom finds it.
//!
//! Without `--cfg loom` this binary is empty.
#![cfg(loom)]

#[path = "../../src/sync/mod.rs"]
#[allow(dead_code, unreachable_pub, unused_imports)]
mod sync;

#[allow(dead_code, unreachable_pub)]
mod vm;

mod back_pressure;
mod common;
mod engine;
mod notify;
mod refcount;
mod release;
mod seqlock;
mod views;
