//! An unbounded multi-producer queue, through the facade.
//!
//! In normal builds it is crossbeam's lock-free `SegQueue`, whose `push` publishes an item
//! with release ordering and whose `pop` acquires it, so a consumer that pops an item sees
//! everything its producer wrote before pushing it. loom does not model crossbeam's
//! atomics, so under `--cfg loom` it is a `VecDeque` behind loom's mutex, which gives the
//! same guarantee (the lock's release and acquisition order the push before the pop) and
//! lets the models explore every order of pushes and pops.
//!
//! The engine's channels use it: the inbox (callers → the scheduler), the completion
//! channel (workers and watchers → the scheduler) and the queues of the workers and
//! watchers (`vm::engine`), so that the loom model of the assembled engine runs them as
//! they are.

#[cfg(not(loom))]
mod imp {
    /// An unbounded queue (crossbeam's `SegQueue`).
    #[derive(Debug)]
    pub struct Queue<T>(crossbeam_queue::SegQueue<T>);

    impl<T> Queue<T> {
        /// An empty queue.
        pub fn new() -> Self {
            Queue(crossbeam_queue::SegQueue::new())
        }

        /// Append `item` (any thread).
        #[inline]
        pub fn push(&self, item: T) {
            self.0.push(item);
        }

        /// Take the oldest item, if any.
        #[inline]
        pub fn pop(&self) -> Option<T> {
            self.0.pop()
        }

        /// Whether the queue holds nothing (a reading: an item may arrive right after).
        #[inline]
        pub fn is_empty(&self) -> bool {
            self.0.is_empty()
        }
    }
}

#[cfg(loom)]
mod imp {
    use std::collections::VecDeque;

    /// An unbounded queue: a `VecDeque` behind loom's mutex.
    #[derive(Debug)]
    pub struct Queue<T>(loom::sync::Mutex<VecDeque<T>>);

    impl<T> Queue<T> {
        /// An empty queue.
        pub fn new() -> Self {
            Queue(loom::sync::Mutex::new(VecDeque::new()))
        }

        /// Append `item` (any thread).
        pub fn push(&self, item: T) {
            self.0.lock().unwrap().push_back(item);
        }

        /// Take the oldest item, if any.
        pub fn pop(&self) -> Option<T> {
            self.0.lock().unwrap().pop_front()
        }

        /// Whether the queue holds nothing.
        pub fn is_empty(&self) -> bool {
            self.0.lock().unwrap().is_empty()
        }
    }
}

pub use imp::Queue;

impl<T> Default for Queue<T> {
    fn default() -> Self {
        Queue::new()
    }
}
