//! What a tensor names its engine by.
//!
//! [`EngineRef`] is a number that no other engine of the process ever has, so that checking
//! a tensor's engine is one comparison of words, and making or freeing a tensor counts
//! nothing on its engine. (A counted reference per tensor did: the caller's thread added to
//! the engine's count for each output, and the worker that freed the tensor took it away
//! again, so the count's line crossed between their cores twice per call;
//! `docs/performance.md`, "The call path".) The table that finds a live engine by its
//! number, and the engine's entry in it, are the engine's (`vm::engine`): this file names
//! nothing, so that the tensor object can name its engine without naming the engine's parts.

/// An engine's name (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct EngineRef(u64);

/// The next [`EngineRef`]'s number (never reused: 2^64 engines outlast any process). The
/// standard library's atomic, not the `sync` facade's: a process-wide counter that no
/// model checks, and a `static` (loom's atomics are not made in constant expressions).
static NEXT_ENGINE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

impl EngineRef {
    /// No engine's name (numbers start at 1): for objects of unit tests that belong to none.
    #[cfg(test)]
    pub(crate) const NONE: EngineRef = EngineRef(0);

    /// A name no engine of the process has had.
    pub(crate) fn fresh() -> EngineRef {
        EngineRef(NEXT_ENGINE.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
    }
}
