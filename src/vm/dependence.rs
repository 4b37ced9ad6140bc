//! Dependence objects: the per-tensor record of who accessed it last.
//!
//! This is MXNet's `ThreadedVar` idea (a version chain of reads and writes per variable)
//! kept by a single owner, as OneFlow's VM does: only the scheduler thread touches a
//! [`DepObject`], so it needs no lock and no atomic.
//!
//! The rules, applied to each operand of each instruction in program order:
//! - a **read** gets an edge from the last writer, and joins the readers;
//! - a **write** gets an edge from the last writer and from every reader since, then
//!   becomes the last writer and clears the readers.
//!
//! Records name instructions by [`InstrRef`] (slot plus generation). A slot's generation
//! changes when its instruction retires, so a stale record is recognised in O(1) as
//! "already finished" and needs no unlinking: retirement never touches dependence objects.
//! A reader list that grows while nothing writes (a weight read by every step) is pruned of
//! retired readers whenever it doubles, so it stays proportional to the live readers.

use smallvec::SmallVec;

/// A reference to an instruction in the scheduler's slab: slot and generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct InstrRef {
    pub(crate) slot: u32,
    pub(crate) gen: u32,
}

/// What the scheduler provides to the rules: creating an edge and telling live from retired.
pub(crate) trait EdgeSink {
    /// Order `dst` after `src` (if `src` has not yet reached the point that makes the edge
    /// unnecessary).
    fn connect(&mut self, src: InstrRef, dst: u32);
    /// Whether `r` still names a live instruction.
    fn is_live(&self, r: InstrRef) -> bool;
}

/// Readers at or below this many are kept without pruning.
const PRUNE_FLOOR: usize = 16;

/// The dependence state of one tensor.
#[derive(Debug, Default)]
pub(crate) struct DepObject {
    last_write: Option<InstrRef>,
    readers: SmallVec<[InstrRef; 4]>,
    /// Reader count above which the list is next pruned.
    prune_at: usize,
}

impl DepObject {
    /// Apply the read rule for instruction `me`.
    #[inline]
    pub(crate) fn read(&mut self, me: InstrRef, sink: &mut impl EdgeSink) {
        if let Some(w) = self.last_write {
            sink.connect(w, me.slot);
        }
        if self.readers.len() >= self.prune_at.max(PRUNE_FLOOR) {
            self.readers.retain(|r| sink.is_live(*r));
            self.prune_at = 2 * self.readers.len();
        }
        self.readers.push(me);
    }

    /// Apply the write rule for instruction `me`.
    #[inline]
    pub(crate) fn write(&mut self, me: InstrRef, sink: &mut impl EdgeSink) {
        if let Some(w) = self.last_write {
            sink.connect(w, me.slot);
        }
        for r in self.readers.drain(..) {
            if r != me {
                sink.connect(r, me.slot);
            }
        }
        self.prune_at = 0;
        self.last_write = Some(me);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Rec {
        edges: Vec<(u32, u32)>,
        dead: Vec<u32>,
    }
    impl EdgeSink for Rec {
        fn connect(&mut self, src: InstrRef, dst: u32) {
            self.edges.push((src.slot, dst));
        }
        fn is_live(&self, r: InstrRef) -> bool {
            !self.dead.contains(&r.slot)
        }
    }
    fn r(slot: u32) -> InstrRef {
        InstrRef { slot, gen: 0 }
    }

    #[test]
    fn reads_between_writes_depend_on_the_write_only() {
        let (mut d, mut s) = (DepObject::default(), Rec::default());
        d.write(r(1), &mut s);
        d.read(r(2), &mut s);
        d.read(r(3), &mut s);
        assert_eq!(s.edges, vec![(1, 2), (1, 3)]);
        d.write(r(4), &mut s);
        assert_eq!(s.edges[2..], [(1, 4), (2, 4), (3, 4)]);
        d.read(r(5), &mut s);
        assert_eq!(s.edges[5..], [(4, 5)]);
    }

    #[test]
    fn reader_list_is_pruned_of_retired_readers() {
        let (mut d, mut s) = (DepObject::default(), Rec::default());
        for i in 0..1000 {
            d.read(r(i), &mut s);
            if i > 2 {
                s.dead.push(i - 2);
            }
        }
        assert!(d.readers.len() <= 2 * PRUNE_FLOOR, "{} readers kept", d.readers.len());
        // Every live reader is still recorded, so a write orders after it.
        d.write(r(5000), &mut s);
        assert!(s.edges.contains(&(999, 5000)) && s.edges.contains(&(998, 5000)));
    }
}
