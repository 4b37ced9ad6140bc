//! Deferred host frees: host memory released while work is being enqueued on an
//! asynchronous device stream is returned only when the stream reaches that point.
//!
//! A device backend whose `Stream::launch` runs the VM's closure on the calling thread and
//! returns before the device has done the work (CUDA) must not let host memory freed by
//! that closure (a `Release` of a host tensor that a pending device-to-host copy still
//! writes) go back to the cache at once. While such a launch runs, the backend installs a
//! collector on its thread with [`collect`]; every host block freed on that thread in the
//! meantime is handed to it instead of the cache, and the backend enqueues the returned
//! [`Deferred`] list behind the launched work (for CUDA, in a host function on the stream).
//! Dropping a [`Deferred`] returns its block. Outside [`collect`], frees are immediate.

use std::cell::RefCell;

/// A host block whose return to its allocator waits until this value drops.
pub struct Deferred(pub(crate) Box<dyn FnOnce() + Send>);

impl Drop for Deferred {
    fn drop(&mut self) {
        let f = std::mem::replace(&mut self.0, Box::new(|| {}));
        f();
    }
}

impl std::fmt::Debug for Deferred {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Deferred")
    }
}

thread_local! {
    /// The collector of the launch running on this thread, if any.
    static SINK: RefCell<Option<Vec<Deferred>>> = const { RefCell::new(None) };
}

/// Run `f` with a collector installed on this thread; return what `f` returned and the
/// host frees it made, still pending. Nested calls collect into the innermost.
pub fn collect<R>(f: impl FnOnce() -> R) -> (R, Vec<Deferred>) {
    let outer = SINK.with(|s| s.borrow_mut().replace(Vec::new()));
    // Restore the outer collector even if `f` panics.
    struct Restore(Option<Option<Vec<Deferred>>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            if let Some(outer) = self.0.take() {
                let mine = SINK.with(|s| std::mem::replace(&mut *s.borrow_mut(), outer));
                drop(mine);
            }
        }
    }
    let mut guard = Restore(Some(outer));
    let r = f();
    let outer = guard.0.take().expect("restored once");
    let mine = SINK.with(|s| std::mem::replace(&mut *s.borrow_mut(), outer));
    (r, mine.unwrap_or_default())
}

/// Whether a collector is installed on this thread (cheap; checked before boxing a free).
/// None is while the thread's locals are being destroyed (a storage freed by another
/// thread-local's destructor).
pub(crate) fn active() -> bool {
    SINK.try_with(|s| s.try_borrow().map(|s| s.is_some()).unwrap_or(false)).unwrap_or(false)
}

/// Free now, or hand to this thread's collector if one is installed.
pub(crate) fn offer(free: impl FnOnce() + Send + 'static) {
    let rejected = SINK.with(|s| match s.try_borrow_mut() {
        Ok(mut sink) => match sink.as_mut() {
            Some(v) => {
                v.push(Deferred(Box::new(free)));
                None
            }
            None => Some(free),
        },
        // Re-entered while the collector is borrowed: free now.
        Err(_) => Some(free),
    });
    if let Some(f) = rejected {
        f();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use super::*;

    /// A free that counts itself.
    fn counted(freed: &Arc<AtomicUsize>) -> impl FnOnce() + Send + 'static {
        let freed = freed.clone();
        move || {
            freed.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn frees_inside_collect_wait_for_the_list() {
        let freed = Arc::new(AtomicUsize::new(0));
        assert!(!active());
        let (inside, pending) = collect(|| {
            offer(counted(&freed));
            active()
        });
        assert!(inside, "no collector installed during collect");
        assert_eq!(pending.len(), 1);
        assert_eq!(freed.load(Ordering::SeqCst), 0, "freed before the list dropped");
        drop(pending);
        assert_eq!(freed.load(Ordering::SeqCst), 1);
        // Outside a collector, immediate.
        assert!(!active());
        offer(counted(&freed));
        assert_eq!(freed.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn nested_collectors_collect_into_the_innermost() {
        let freed = Arc::new(AtomicUsize::new(0));
        let ((inner, after_inner), outer) = collect(|| {
            let ((), inner) = collect(|| offer(counted(&freed)));
            offer(counted(&freed));
            (inner.len(), active())
        });
        assert_eq!((inner, outer.len()), (1, 1));
        assert!(after_inner, "the outer collector was not restored");
        // The inner list was dropped inside the outer call: its free has run.
        assert_eq!(freed.load(Ordering::SeqCst), 1);
        drop(outer);
        assert_eq!(freed.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn collector_is_restored_after_a_panic() {
        let r = std::panic::catch_unwind(|| collect(|| panic!("planted")));
        assert!(r.is_err());
        assert!(!active(), "a collector leaked past the panic");
        let freed = Arc::new(AtomicUsize::new(0));
        offer(counted(&freed));
        assert_eq!(freed.load(Ordering::SeqCst), 1);
    }
}
