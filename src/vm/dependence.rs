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
//! # Naming instructions by stream position
//!
//! Records name instructions by [`InstrRef`]: the stream and the instruction's position on
//! it (1, 2, ...). Every stream dispatches, runs and completes its instructions in order,
//! so three facts follow from a reference alone, without looking the instruction up:
//! - an edge between two instructions of the *same* stream is implied by the stream's order
//!   and is never made;
//! - an instruction is done once its stream's "done through" position has reached it;
//! - of several readers on one stream, a later writer on another stream need only wait for
//!   the *latest*: the earlier ones are done when it is. So a dependence object keeps at
//!   most one reader per stream, and its size is bounded by the number of streams reading
//!   the tensor, whatever the program does.

use std::num::NonZeroU64;

/// A reference to an instruction: its stream (the top [`InstrRef::STREAM_BITS`] bits) and
/// its position on that stream (the rest; positions start at 1, so a reference is never 0).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct InstrRef(NonZeroU64);

impl InstrRef {
    /// Bits that name the stream: a VM has at most 2^12 = 4096 streams.
    pub(crate) const STREAM_BITS: u32 = 12;
    /// The largest position on a stream: 2^52 - 1, over a year of instructions at 10^8 per
    /// second on one stream. The scheduler stops the VM with an error rather than wrap.
    pub(crate) const MAX_SEQ: u64 = (1 << (64 - Self::STREAM_BITS)) - 1;
    /// Most streams a VM may have.
    pub(crate) const MAX_STREAMS: usize = 1 << Self::STREAM_BITS;

    /// Instruction `seq` (1-based) of stream `stream`.
    #[inline]
    pub(crate) fn new(stream: u32, seq: u64) -> Self {
        debug_assert!((stream as usize) < Self::MAX_STREAMS && (1..=Self::MAX_SEQ).contains(&seq));
        let raw = (u64::from(stream) << (64 - Self::STREAM_BITS)) | seq;
        InstrRef(NonZeroU64::new(raw).expect("positions start at 1"))
    }

    /// The stream's index.
    #[inline]
    pub(crate) fn stream(self) -> u32 {
        (self.0.get() >> (64 - Self::STREAM_BITS)) as u32
    }

    /// The position on the stream.
    #[inline]
    pub(crate) fn seq(self) -> u64 {
        self.0.get() & Self::MAX_SEQ
    }

    /// Whether both are on the same stream.
    #[inline]
    fn same_stream(self, other: InstrRef) -> bool {
        (self.0.get() ^ other.0.get()) >> (64 - Self::STREAM_BITS) == 0
    }
}

impl std::fmt::Debug for InstrRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "s{}#{}", self.stream(), self.seq())
    }
}

/// Whether `slot` holds a reader on another stream than `me`'s (not `None`, not `me`'s
/// stream), computed without branches.
#[inline(always)]
fn other_stream(slot: Option<InstrRef>, me: InstrRef) -> bool {
    let (raw, me) = (slot.map_or(0, |r| r.0.get()), me.0.get());
    // An empty slot is taken as `me` itself, with a mask rather than a branch.
    let r = raw | (u64::from(raw == 0).wrapping_neg() & me);
    (r ^ me) >> (64 - InstrRef::STREAM_BITS) != 0
}

/// What the scheduler provides to the rules: ordering one instruction after another of
/// another stream.
pub(crate) trait EdgeSink {
    /// Order `dst` (the instruction being admitted) after `src`, an earlier instruction of
    /// another stream (unless `src` is done, or already waited for on the device).
    fn connect(&mut self, src: InstrRef, dst: InstrRef);
}

/// Reader slots a dependence object keeps in itself; readers on more streams spill.
const INLINE_READERS: usize = 3;

/// The dependence state of one tensor: 56 bytes, within its cache line.
///
/// The layout is fixed (no small-vector union whose length moves with its capacity), so
/// that the common case, every access on record on the accessing instruction's own
/// stream, is a few loads at fixed offsets and one comparison: no edge, and the record
/// overwritten in place.
#[derive(Debug, Default)]
pub(crate) struct DepObject {
    last_write: Option<InstrRef>,
    /// The latest reader on each stream that has read since the last write, filled from the
    /// front: a `None` slot has only `None` slots after it.
    readers: [Option<InstrRef>; INLINE_READERS],
    /// Readers on further streams, once the slots are full (it allocates only then).
    more: Vec<InstrRef>,
}

impl DepObject {
    /// Apply the read rule for instruction `me`.
    #[inline(always)]
    pub(crate) fn read(&mut self, me: InstrRef, sink: &mut impl EdgeSink) {
        if let Some(w) = self.last_write {
            if !w.same_stream(me) {
                sink.connect(w, me);
            }
        }
        // The first slot is free or holds this stream's reader: take it. Decided without a
        // branch on which of the two it is, since that alternates unpredictably in programs
        // that read and write tensors at random, and a mispredicted branch there costs the
        // scheduler a pipeline refill per operand (`docs/performance.md`, "Why the hot paths
        // are shaped so", has the measurement).
        if other_stream(self.readers[0], me) {
            self.read_slow(me)
        } else {
            self.readers[0] = Some(me)
        }
    }

    /// The read rule's bookkeeping when the first slot holds another stream's reader.
    #[cold]
    fn read_slow(&mut self, me: InstrRef) {
        for slot in self.readers[1..].iter_mut() {
            match slot {
                Some(r) if !r.same_stream(me) => {}
                _ => {
                    *slot = Some(me);
                    return;
                }
            }
        }
        match self.more.iter_mut().find(|r| r.same_stream(me)) {
            Some(r) => *r = me,
            None => self.more.push(me),
        }
    }

    /// The read rule for `me` when everything on record is on `me`'s stream or absent (no
    /// edge, and `me` takes the first reader slot): applies it and returns true; otherwise
    /// changes nothing and returns false, and [`read`](Self::read) applies the rule.
    ///
    /// The scheduler's intake tries this first: it needs no [`EdgeSink`], so the loop that
    /// admits a run of instructions on one stream calls nothing while no access on record
    /// is on another stream, and keeps its state in registers.
    #[inline(always)]
    pub(crate) fn read_local(&mut self, me: InstrRef) -> bool {
        let local = !other_stream(self.last_write, me) & !other_stream(self.readers[0], me);
        if local {
            self.readers[0] = Some(me);
        }
        local
    }

    /// The write rule for `me` when everything on record is on `me`'s stream or absent (no
    /// edge; the readers cleared, `me` the last writer): applies it and returns true;
    /// otherwise changes nothing and returns false, and [`write`](Self::write) applies the
    /// rule.
    #[inline(always)]
    pub(crate) fn write_local(&mut self, me: InstrRef) -> bool {
        let local = !other_stream(self.last_write, me)
            & !other_stream(self.readers[0], me)
            & self.readers[1].is_none();
        if local {
            self.readers[0] = None;
            self.last_write = Some(me);
        }
        local
    }

    /// Apply the write rule for instruction `me`.
    #[inline(always)]
    pub(crate) fn write(&mut self, me: InstrRef, sink: &mut impl EdgeSink) {
        if let Some(w) = self.last_write {
            if !w.same_stream(me) {
                sink.connect(w, me);
            }
        }
        // No reader, or one on this stream (the common cases, told apart without a branch
        // as in `read`): clear the first slot; readers elsewhere go the slow way.
        if self.readers[1].is_some() | other_stream(self.readers[0], me) {
            self.write_readers(me, sink)
        } else {
            self.readers[0] = None
        }
        self.last_write = Some(me);
    }

    /// The write rule for readers on other streams, or on more than one stream.
    #[cold]
    fn write_readers(&mut self, me: InstrRef, sink: &mut impl EdgeSink) {
        for &r in self.readers.iter().flatten() {
            if !r.same_stream(me) {
                sink.connect(r, me);
            }
        }
        self.readers = [None; INLINE_READERS];
        if !self.more.is_empty() {
            self.write_more(me, sink);
        }
    }

    /// The write rule for the spilled readers.
    #[cold]
    fn write_more(&mut self, me: InstrRef, sink: &mut impl EdgeSink) {
        for &r in &self.more {
            if !r.same_stream(me) {
                sink.connect(r, me);
            }
        }
        self.more.clear();
    }

    /// A copy of the record.
    #[cfg(test)]
    fn clone_state(&self) -> DepObject {
        DepObject { last_write: self.last_write, readers: self.readers, more: self.more.clone() }
    }

    /// How many readers are on record (one per stream).
    #[cfg(test)]
    fn n_readers(&self) -> usize {
        self.readers.iter().flatten().count() + self.more.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Rec {
        edges: Vec<(InstrRef, InstrRef)>,
    }
    impl EdgeSink for Rec {
        fn connect(&mut self, src: InstrRef, dst: InstrRef) {
            self.edges.push((src, dst));
        }
    }
    fn r(stream: u32, seq: u64) -> InstrRef {
        InstrRef::new(stream, seq)
    }

    #[test]
    fn a_reference_packs_stream_and_position() {
        for (s, q) in [(0, 1), (1, 2), (4095, InstrRef::MAX_SEQ), (7, 1 << 40)] {
            let x = r(s, q);
            assert_eq!((x.stream(), x.seq()), (s, q));
        }
        assert!(r(1, 5).same_stream(r(1, 9)) && !r(1, 5).same_stream(r(2, 5)));
        assert_eq!(std::mem::size_of::<DepObject>(), 56);
        assert_eq!(std::mem::size_of::<Option<InstrRef>>(), 8);
    }

    #[test]
    fn a_slot_is_on_another_stream_only_when_it_holds_one() {
        for me in [r(0, 9), r(5, 9)] {
            assert!(!other_stream(None, me), "an empty slot, {me:?}");
            assert!(!other_stream(Some(InstrRef::new(me.stream(), 3)), me));
        }
        assert!(other_stream(Some(r(0, 3)), r(5, 9)));
        assert!(other_stream(Some(r(5, 3)), r(0, 9)));
        assert!(other_stream(Some(r(4095, InstrRef::MAX_SEQ)), r(4094, 1)));
    }

    #[test]
    fn reads_between_writes_depend_on_the_write_only() {
        let (mut d, mut s) = (DepObject::default(), Rec::default());
        d.write(r(0, 1), &mut s);
        d.read(r(1, 1), &mut s);
        d.read(r(2, 1), &mut s);
        assert_eq!(s.edges, vec![(r(0, 1), r(1, 1)), (r(0, 1), r(2, 1))]);
        d.write(r(3, 1), &mut s);
        assert_eq!(s.edges[2..], [(r(0, 1), r(3, 1)), (r(1, 1), r(3, 1)), (r(2, 1), r(3, 1))]);
        d.read(r(1, 2), &mut s);
        assert_eq!(s.edges[5..], [(r(3, 1), r(1, 2))]);
    }

    #[test]
    fn same_stream_accesses_make_no_edges() {
        let (mut d, mut s) = (DepObject::default(), Rec::default());
        for q in 1..100 {
            d.write(r(4, 3 * q), &mut s);
            d.read(r(4, 3 * q + 1), &mut s);
            d.read(r(4, 3 * q + 2), &mut s);
        }
        assert!(s.edges.is_empty());
    }

    #[test]
    fn a_writer_waits_for_the_latest_reader_of_each_stream() {
        let (mut d, mut s) = (DepObject::default(), Rec::default());
        for q in 1..1000 {
            d.read(r(1, q), &mut s);
            d.read(r(2, q), &mut s);
        }
        assert_eq!(d.n_readers(), 2, "one reader per stream is kept");
        d.write(r(3, 1), &mut s);
        assert_eq!(s.edges, vec![(r(1, 999), r(3, 1)), (r(2, 999), r(3, 1))]);
        // A writer on a reader's own stream waits only for the other stream's reader.
        d.read(r(1, 1000), &mut s);
        d.read(r(2, 1000), &mut s);
        s.edges.clear();
        d.write(r(1, 1001), &mut s);
        assert_eq!(s.edges, vec![(r(3, 1), r(1, 1001)), (r(2, 1000), r(1, 1001))]);
    }

    /// The state of `d` as the rules see it.
    fn state(d: &DepObject) -> (Option<InstrRef>, [Option<InstrRef>; INLINE_READERS], Vec<InstrRef>) {
        (d.last_write, d.readers, d.more.clone())
    }

    #[test]
    fn the_local_rules_apply_exactly_when_the_full_rules_make_no_edge_and_stay_inline() {
        // Every history of up to four accesses over three streams, then each access: the
        // local form either does what the full rule does (which then makes no edge), or
        // changes nothing, and it declines only where the full rule makes an edge or needs
        // a reader slot beyond the first.
        let streams = [0u32, 1, 2];
        let choices: Vec<(u32, bool)> = streams.iter().flat_map(|&st| [(st, false), (st, true)]).collect();
        // Each access: its stream, and whether it writes.
        type History = Vec<(u32, bool)>;
        let (mut histories, mut longest): (Vec<History>, Vec<History>) = (vec![vec![]], vec![vec![]]);
        for _ in 0..4 {
            longest = longest
                .iter()
                .flat_map(|h| choices.iter().map(move |&c| h.iter().copied().chain([c]).collect()))
                .collect();
            histories.extend(longest.iter().cloned());
        }
        let mut local_taken = 0;
        for h in &histories {
            let mut d = DepObject::default();
            let mut sink = Rec::default();
            for (q, &(st, write)) in h.iter().enumerate() {
                let me = r(st, q as u64 + 1);
                if write {
                    d.write(me, &mut sink)
                } else {
                    d.read(me, &mut sink)
                }
            }
            for &st in &streams {
                for write in [false, true] {
                    let me = r(st, 100);
                    let (mut full, mut local) = (d.clone_state(), d.clone_state());
                    let mut edges = Rec::default();
                    if write {
                        full.write(me, &mut edges)
                    } else {
                        full.read(me, &mut edges)
                    }
                    let took = if write { local.write_local(me) } else { local.read_local(me) };
                    if took {
                        local_taken += 1;
                        assert!(
                            edges.edges.is_empty(),
                            "{h:?} then {me:?}: local, yet the rule made an edge"
                        );
                        assert_eq!(state(&local), state(&full), "{h:?} then {me:?}");
                    } else {
                        assert_eq!(state(&local), state(&d), "{h:?} then {me:?}: declined, yet changed");
                        let needs_slow = !edges.edges.is_empty() || full.readers[1].is_some();
                        assert!(needs_slow, "{h:?} then {me:?}: declined a case the fast form covers");
                    }
                }
            }
        }
        assert!(local_taken > 100, "the local forms applied only {local_taken} times");
    }

    #[test]
    fn readers_beyond_the_inline_slots_are_kept_one_per_stream() {
        let (mut d, mut s) = (DepObject::default(), Rec::default());
        d.write(r(0, 1), &mut s);
        for q in 1..=3 {
            for stream in 1..=5 {
                d.read(r(stream, q), &mut s);
            }
        }
        assert_eq!(d.n_readers(), 5, "one reader per stream, two of them spilled");
        assert_eq!(s.edges.len(), 15, "every read follows the write of stream 0");
        s.edges.clear();
        d.write(r(6, 1), &mut s);
        let want: Vec<_> = std::iter::once((r(0, 1), r(6, 1)))
            .chain((1..=5).map(|stream| (r(stream, 3), r(6, 1))))
            .collect();
        assert_eq!(s.edges, want);
        assert_eq!(d.n_readers(), 0);
        // The spilled streams start afresh after the write.
        s.edges.clear();
        d.read(r(5, 4), &mut s);
        d.write(r(6, 2), &mut s);
        assert_eq!(s.edges, vec![(r(6, 1), r(5, 4)), (r(5, 4), r(6, 2))]);
    }
}
