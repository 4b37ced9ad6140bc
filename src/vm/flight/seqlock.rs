//! A single-writer slot of `W` words, tagged, that other threads read without a lock and
//! without ever seeing a torn value (a sequence lock whose sequence is the tag).
//!
//! One thread writes the slot ([`Slot::write`], [`Slot::set`]); any thread may read it
//! ([`Slot::read`]). Tags are the positions of a stream, which only grow, so a slot's tag
//! never comes back to a value it had: a reader that finds the same tag before and after
//! its loads read the words of that tag's one write.
//!
//! # Memory ordering
//!
//! The writer first stores the tag [`EMPTY`] (`Relaxed`), then a `Release` fence, then the
//! words (`Relaxed`), then the new tag (`Release`). The reader loads the tag (`Acquire`),
//! the words (`Relaxed`), an `Acquire` fence, and the tag again (`Relaxed`). If the reader
//! saw a word of a later write, the fence pair orders the writer's `EMPTY` (or later) tag
//! before the reader's second load, which then differs from the first; if the first load
//! saw the new tag, the `Release`/`Acquire` pair makes every word of that write visible.
//! This is the atomic-only sequence lock of Boehm ("Can seqlocks get along with programming
//! language memory models?", 2012), model-checked in `tests/loom/seqlock.rs`.
//!
//! [`Slot::set`] changes one word of the current write without a new tag: a reader sees
//! the word's old or new value, each of which belongs to the tag it read.

use crate::sync::{fence, AtomicU64, Ordering};

/// The tag of a slot that holds nothing (tags are stream positions, which start at 1).
pub(crate) const EMPTY: u64 = 0;

/// A tagged slot of `W` words (module docs).
pub(crate) struct Slot<const W: usize> {
    tag: AtomicU64,
    words: [AtomicU64; W],
}

impl<const W: usize> Default for Slot<W> {
    fn default() -> Self {
        Slot { tag: AtomicU64::new(EMPTY), words: std::array::from_fn(|_| AtomicU64::new(0)) }
    }
}

impl<const W: usize> Slot<W> {
    /// Fill the slot with `words` under `tag` (the writer thread only; `tag` is not
    /// [`EMPTY`] and is larger than every tag written before).
    #[inline]
    pub(crate) fn write(&self, tag: u64, words: [u64; W]) {
        self.tag.store(EMPTY, Ordering::Relaxed);
        fence(Ordering::Release);
        for (w, v) in self.words.iter().zip(words) {
            w.store(v, Ordering::Relaxed);
        }
        self.tag.store(tag, Ordering::Release);
    }

    /// Set word `i` of the slot if it holds `tag` (the writer thread only).
    #[inline]
    pub(crate) fn set(&self, tag: u64, i: usize, v: u64) {
        // The writer is the only thread that stores the tag: this load reads its own store.
        if self.tag.load(Ordering::Relaxed) == tag {
            self.words[i].store(v, Ordering::Relaxed);
        }
    }

    /// The tag the slot holds now (any thread; [`EMPTY`] while it is being written).
    #[inline]
    pub(crate) fn tag(&self) -> u64 {
        self.tag.load(Ordering::Acquire)
    }

    /// The slot's tag and words, if a write was complete and unchanged while they were
    /// read (any thread). `None` when the slot is empty or being rewritten.
    pub(crate) fn read(&self) -> Option<(u64, [u64; W])> {
        let tag = self.tag.load(Ordering::Acquire);
        if tag == EMPTY {
            return None;
        }
        let words = std::array::from_fn(|i| self.words[i].load(Ordering::Relaxed));
        fence(Ordering::Acquire);
        (self.tag.load(Ordering::Relaxed) == tag).then_some((tag, words))
    }
}
