//! Soft sync: before an instruction on one stream uses tensors last used on another, the
//! synchronisation of the two streams.
//!
//! Following OneFlow's `SoftSyncStream`, every tensor remembers the stream that last used
//! it (a view's storage: its owner remembers). When a call uses it on another stream, the
//! builder first emits, per source stream:
//! - both streams on one device that supports device-side waits: a `RecordEvent` on the
//!   source stream (reading the tensors) and a `StreamWaitEvent` on the target stream, so
//!   that the target waits on the device and the host never blocks;
//! - an asynchronous source stream otherwise (device → host or another device): a
//!   `RecordEvent` on the source stream, which the host-side consumer waits for;
//! - a synchronous source (the CPU): nothing, its work is done when it is launched.
//!
//! The scheduler's dependence rules alone already make every program correct; soft sync
//! lets the device do the waiting where it can.

use std::sync::atomic::Ordering;

use smallvec::SmallVec;

use crate::vm::tensor::{TensorInner, NO_STREAM};
use crate::vm::StreamId;

use super::InstructionsBuilder;

/// Tensors a call uses that were last used on one other stream: that stream's index and the
/// tensors.
type SyncGroup<'t> = (u32, SmallVec<[&'t TensorInner; 4]>);

impl InstructionsBuilder<'_> {
    /// Soft sync before an instruction on `stream` that uses `tensors` (module docs): emit
    /// the synchronisation for the storages of those last used on other streams, and mark
    /// them all used on `stream`. A view's storage is its owner's: the owner keeps the
    /// storage's last stream, the view its own (where its `Release` goes).
    #[inline]
    pub(super) fn sync_operands<'t>(
        &mut self,
        stream: StreamId,
        tensors: impl Iterator<Item = &'t TensorInner> + Clone,
    ) {
        let me = stream.0;
        let mut foreign = false;
        for t in tensors.clone() {
            let o = t.owner();
            let last = o.last_stream.load(Ordering::Relaxed);
            if last != me {
                foreign |= last != NO_STREAM;
                if !foreign {
                    o.last_stream.store(me, Ordering::Relaxed);
                }
            }
            if t.is_view() {
                t.last_stream.store(me, Ordering::Relaxed);
            }
        }
        if foreign {
            self.soft_sync(stream, tensors.clone().map(TensorInner::owner));
            for t in tensors {
                t.owner().last_stream.store(me, Ordering::Relaxed);
            }
        }
    }

    /// Emit the synchronisation for storages (their owners, `tensors`) last used on other
    /// streams (module docs).
    #[cold]
    fn soft_sync<'t>(&mut self, me: StreamId, tensors: impl Iterator<Item = &'t TensorInner>) {
        let mut groups: SmallVec<[SyncGroup<'_>; 2]> = SmallVec::new();
        for t in tensors {
            let last = t.last_stream.load(Ordering::Relaxed);
            if last == me.0 || last == NO_STREAM {
                continue;
            }
            match groups.iter_mut().find(|(s, _)| *s == last) {
                Some((_, g)) => {
                    if !g.iter().any(|x| std::ptr::eq(*x, t)) {
                        g.push(t)
                    }
                }
                None => groups.push((last, SmallVec::from_iter([t]))),
            }
        }
        self.open_if_idle();
        for (src, reads) in groups {
            // Both are streams of this VM: `me` passed `check` (or is the host stream), and
            // `src` is the `last_stream` of a tensor of this VM, set by one of its builders
            // (a tensor of another VM is refused before it gets here).
            let (s, t) = (&self.streams()[src as usize], &self.streams()[me.index()]);
            let (device_waits, asynchronous) =
                (s.device == t.device && s.device_waits, s.policy.is_asynchronous());
            let id = self.vm.next_event_id();
            // SAFETY: the caller holds a handle of each tensor while it builds (a view's
            // handle keeps its owner), and a `Release` of one is submitted only after the
            // batch being built.
            if device_waits {
                unsafe { self.batch.push_record_event(id, StreamId(src), reads.into_iter()) };
                self.batch.push_stream_wait(id, me);
            } else if asynchronous {
                unsafe { self.batch.push_record_event(id, StreamId(src), reads.into_iter()) };
            }
        }
    }
}
