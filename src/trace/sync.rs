//! The synchronisation rule of traces: when a use of a tensor on one stream needs a
//! statement that orders it after the tensor's last use on another.
//!
//! The validator checks every trace against this rule, and the recorder's writer applies it
//! to the instructions in the order the scheduler admitted them, writing an `after` where
//! nothing else satisfies it. Both go through [`TensorSync`], so every recording satisfies
//! the rule its validator checks.
//!
//! # The rule
//!
//! It is the rule of the builder's soft sync (OneFlow's `SoftSyncStream`), plus the
//! synchronisation the scheduler supplies on its own. When a tensor last used on stream A
//! is used on stream B:
//! - A on the host: nothing is needed (host work is done when it is launched);
//! - an `after B A t..` naming the tensor since that last use: the scheduler ordered the
//!   use (its dependence rules hold B's conflicting instruction until A's is done, or an
//!   earlier device-side wait on B covers it);
//! - A and B on one asynchronous device: a `record A e .. t` after the last use on A, then a
//!   `wait B e` before the use on B;
//! - otherwise: a `record A e .. t` after the last use on A (the host waits for it).
//!
//! # Why the recorder needs `after`
//!
//! A builder decides its soft sync when it builds a call, from each tensor's last stream,
//! which every builder shares. With two builders open at once (a nested `vm.run`, or threads
//! sharing a tensor), their batches reach the scheduler in another order than their calls
//! were built, so a use can be admitted with no soft sync for the stream its tensor was last
//! used on in that order. The scheduler orders it all the same; `after` says so, in the
//! trace, where the VM did it.

use smallvec::SmallVec;

use super::format::TraceDevice;

/// What the rule knows about one tensor: its last use and what synchronises it since.
#[derive(Debug, Clone, Default)]
pub(crate) struct TensorSync {
    /// The stream of its last use, if any.
    last: Option<u32>,
    /// The event recorded on `last` after the last use there, covering the tensor.
    recorded: Option<u64>,
    /// Streams for which the last use is synchronised: they waited on the device for
    /// `recorded`, or an `after` names them.
    visible: SmallVec<[u32; 2]>,
}

/// A use that the rule finds unsynchronised.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Unsynced {
    /// The stream of the tensor's last use.
    pub(crate) source: u32,
    /// That stream's device.
    pub(crate) device: TraceDevice,
    /// Whether the use is on another stream of the same device (a `record`/`wait` pair
    /// would synchronise it; otherwise a lone `record`).
    pub(crate) same_device: bool,
}

impl TensorSync {
    /// The stream of the last use.
    pub(crate) fn last(&self) -> Option<u32> {
        self.last
    }

    /// What a use on `stream` lacks under the rule (module docs); `None` if nothing.
    /// `device` gives a stream's device (`None` for an undeclared one, which the caller
    /// reports on its own: nothing is required of it here).
    pub(crate) fn unsynced(
        &self,
        stream: u32,
        device: impl Fn(u32) -> Option<TraceDevice>,
    ) -> Option<Unsynced> {
        let source = self.last.filter(|&s| s != stream)?;
        let (src, dst) = (device(source)?, device(stream)?);
        if !src.is_async() || self.visible.contains(&stream) {
            return None;
        }
        let same_device = src == dst;
        if !same_device && self.recorded.is_some() {
            return None;
        }
        Some(Unsynced { source, device: src, same_device })
    }

    /// The tensor is used on `stream`: the synchronisation of earlier uses is spent. Returns
    /// the event that covered the previous use, if any (it covers this tensor no longer).
    pub(crate) fn used(&mut self, stream: u32) -> Option<u64> {
        self.last = Some(stream);
        self.visible.clear();
        self.recorded.take()
    }

    /// Event `event` is recorded on `stream`, naming this tensor: it covers the tensor if
    /// the tensor was last used there. Returns whether it does, and the event it replaces.
    pub(crate) fn record(&mut self, stream: u32, event: u64) -> (bool, Option<u64>) {
        if self.last != Some(stream) {
            return (false, None);
        }
        self.visible.clear();
        (true, self.recorded.replace(event))
    }

    /// `stream` waits on the device for `event`: the last use is synchronised for it, if
    /// the event still covers the tensor.
    pub(crate) fn waited(&mut self, stream: u32, event: u64) {
        if self.recorded == Some(event) && !self.visible.contains(&stream) {
            self.visible.push(stream);
        }
    }

    /// `after stream source` names the tensor: its last use, which must be on `source`, is
    /// synchronised for `stream`. Returns whether it was last used on `source`.
    pub(crate) fn after(&mut self, stream: u32, source: u32) -> bool {
        if self.last != Some(source) {
            return false;
        }
        if !self.visible.contains(&stream) {
            self.visible.push(stream);
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::DeviceKind;

    const CPU: TraceDevice = TraceDevice { kind: DeviceKind::Cpu, index: 0 };
    const MOCK0: TraceDevice = TraceDevice { kind: DeviceKind::Mock, index: 0 };
    const MOCK1: TraceDevice = TraceDevice { kind: DeviceKind::Mock, index: 1 };

    /// s0 cpu:0, s1 and s2 on mock:0, s3 on mock:1.
    fn device(s: u32) -> Option<TraceDevice> {
        [CPU, MOCK0, MOCK0, MOCK1].get(s as usize).copied()
    }

    #[test]
    fn each_form_of_synchronisation_satisfies_the_rule() {
        let mut t = TensorSync::default();
        assert!(t.unsynced(1, device).is_none(), "a first use needs nothing");
        t.used(0);
        assert!(t.unsynced(1, device).is_none(), "a host source needs nothing");
        t.used(1);
        let u = t.unsynced(2, device).expect("same device, nothing recorded");
        assert!(u.same_device && u.source == 1 && u.device == MOCK0);
        assert!(t.unsynced(3, device).is_some_and(|u| !u.same_device));
        assert!(t.unsynced(0, device).is_some());
        // A record alone serves the host and other devices; the same device needs the wait.
        assert_eq!(t.record(1, 7), (true, None));
        assert!(t.unsynced(0, device).is_none() && t.unsynced(3, device).is_none());
        assert!(t.unsynced(2, device).is_some());
        t.waited(2, 7);
        assert!(t.unsynced(2, device).is_none());
        // A use spends it all; `after` then synchronises one stream.
        assert_eq!(t.used(2), Some(7));
        assert!(!t.after(1, 1), "the last use is on s2, not s1");
        assert!(t.after(1, 2));
        assert!(t.unsynced(1, device).is_none() && t.unsynced(3, device).is_some());
    }

    #[test]
    fn a_record_on_another_stream_or_a_stale_event_covers_nothing() {
        let mut t = TensorSync::default();
        t.used(1);
        assert_eq!(t.record(2, 3), (false, None));
        t.waited(2, 3);
        assert!(t.unsynced(2, device).is_some());
        assert_eq!(t.record(1, 4), (true, None));
        assert_eq!(t.record(1, 5), (true, Some(4)), "a later record replaces the earlier");
        t.waited(2, 4);
        assert!(t.unsynced(2, device).is_some(), "event 4 no longer covers the tensor");
    }
}
