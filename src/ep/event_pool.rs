//! A per-device pool of events.
//!
//! The VM takes an event when an instruction records one and gives it back when the
//! instruction retires, so that steady-state execution creates no events (creating a CUDA
//! event costs a driver call; OneFlow pools them the same way).
//!
//! An event may be lent on after it is given back: a `StreamWaitEvent` that was dispatched
//! holds a clone of the `Arc` until it has launched its wait. [`EventPool::take`] therefore
//! hands out only events that nobody else holds (`Arc::strong_count == 1`): holders only
//! ever drop their clones, never make new ones, so a count of one cannot grow again behind
//! the pool's back.

use std::sync::Arc;

use crossbeam_queue::SegQueue;

use super::{Device, EpError, Event};

/// Events of one device, ready to be recorded again.
#[derive(Debug)]
pub struct EventPool {
    device: Arc<dyn Device>,
    free: SegQueue<Arc<dyn Event>>,
}

impl EventPool {
    /// An empty pool for `device`.
    pub fn new(device: Arc<dyn Device>) -> Self {
        EventPool { device, free: SegQueue::new() }
    }

    /// An event nobody else holds: a pooled one if there is one, else a new one.
    pub fn take(&self) -> Result<Arc<dyn Event>, EpError> {
        // Bounded: look at each pooled event at most once per call.
        for _ in 0..self.free.len() {
            match self.free.pop() {
                Some(ev) if Arc::strong_count(&ev) == 1 => return Ok(ev),
                Some(ev) => self.free.push(ev),
                None => break,
            }
        }
        self.device.create_event()
    }

    /// Give an event back for reuse.
    pub fn give(&self, event: Arc<dyn Event>) {
        self.free.push(event);
    }

    /// How many events are pooled now.
    pub fn len(&self) -> usize {
        self.free.len()
    }

    /// Whether no event is pooled now.
    pub fn is_empty(&self) -> bool {
        self.free.is_empty()
    }
}
