//! The engine's parts that the model of the assembled engine (`engine.rs` beside `main.rs`)
//! runs, compiled by path at the module paths they have in the crate (`crate::vm::...`), so
//! that they name each other as they do there.

#[path = "../../../src/vm/back_pressure.rs"]
pub(crate) mod back_pressure;
pub(crate) mod engine;
#[path = "../../../src/vm/rendezvous.rs"]
pub(crate) mod rendezvous;
