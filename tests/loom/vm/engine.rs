//! `src/vm/engine/`'s protocol files, by path.

#[path = "../../../src/vm/engine/completions.rs"]
pub(crate) mod completions;
#[path = "../../../src/vm/engine/inbox.rs"]
pub(crate) mod inbox;
#[path = "../../../src/vm/engine/scheduler_loop.rs"]
pub(crate) mod scheduler_loop;
#[path = "../../../src/vm/engine/worker_queue.rs"]
pub(crate) mod worker_queue;
