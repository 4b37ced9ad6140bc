//! Model checks of the tensor object's reference count (`src/vm/refcount.rs`) under loom.
//!
//! The count is compiled here by path, over the loom facade. Each model gives references to
//! threads that each write a field of the object (a loom cell, so that loom reports any two
//! accesses not ordered by happens-before) and drop their reference; whichever drop is the
//! last "frees" the object, writing every field. The checks: exactly one drop is the last
//! one, and the last one's accesses happen after every other holder's. A model with a
//! relaxed load on the last drop's shortcut checks that loom finds the race it plants.

#[path = "../../src/vm/refcount.rs"]
#[allow(dead_code)]
mod count;

use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;

use crate::common::{check, failure_of};
use count::RefCount;

/// An object with a count and a field per holder, which that holder writes.
struct Object {
    refs: RefCount,
    fields: Vec<UnsafeCell<u64>>,
    /// How many drops were the last one.
    lasts: AtomicUsize,
}

impl Object {
    fn new(holders: usize) -> Self {
        Object {
            refs: RefCount::one(),
            fields: (0..holders).map(|_| UnsafeCell::new(0)).collect(),
            lasts: AtomicUsize::new(0),
        }
    }

    /// Holder `i`'s use of the object, then its drop; the last drop "frees" it, writing
    /// every holder's field.
    fn use_and_drop(&self, i: usize, drop_one: impl Fn(&RefCount) -> bool) {
        // SAFETY (model): holder `i` alone writes field `i` before its drop; loom checks
        // that the free's writes come after.
        self.fields[i].with_mut(|f| unsafe { *f += 1 });
        if drop_one(&self.refs) {
            self.lasts.fetch_add(1, Ordering::Relaxed);
            for f in &self.fields {
                // SAFETY (model): the free; loom reports it if a holder's write is not
                // ordered before it.
                let seen = f.with_mut(|f| unsafe { std::mem::replace(&mut *f, 0) });
                assert_eq!(seen, 1, "a holder's write is not visible to the free");
            }
        }
    }
}

/// `threads` holders (the first made the object, the others got clones of its reference
/// before they started), each dropping its reference with `drop_one`.
fn holders(threads: usize, drop_one: fn(&RefCount) -> bool) {
    let o = Arc::new(Object::new(threads));
    for _ in 1..threads {
        o.refs.add();
    }
    let handles: Vec<_> = (1..threads)
        .map(|i| {
            let o = o.clone();
            thread::spawn(move || o.use_and_drop(i, drop_one))
        })
        .collect();
    o.use_and_drop(0, drop_one);
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(o.lasts.load(Ordering::Relaxed), 1, "not exactly one last drop");
}

#[test]
fn exactly_one_drop_is_the_last_and_it_follows_every_use() {
    check(|| holders(2, RefCount::drop_one));
}

#[test]
fn three_holders() {
    check(|| holders(3, RefCount::drop_one));
}

#[test]
fn a_reference_added_for_another_thread_is_counted() {
    // A holder clones its reference for a thread it starts, then drops its own; the
    // object is handed over to a new owner (`reset_to_one`) by whichever drop is last.
    check(|| {
        let o = Arc::new(Object::new(2));
        let t = {
            let o = o.clone();
            o.refs.add();
            thread::spawn(move || o.use_and_drop(1, RefCount::drop_one))
        };
        o.use_and_drop(0, RefCount::drop_one);
        t.join().unwrap();
        assert_eq!(o.lasts.load(Ordering::Relaxed), 1);
        o.refs.reset_to_one();
        assert!(o.refs.drop_one(), "the new owner's reference is the only one");
    });
}

/// The shortcut with a relaxed load: the last drop's accesses are no longer ordered after
/// the other holder's.
fn planted_drop_one(refs: &RefCount) -> bool {
    refs.planted_relaxed_drop_one()
}

#[test]
fn loom_finds_a_relaxed_shortcut() {
    let message = failure_of(|| check(|| holders(2, planted_drop_one)));
    assert!(message.contains("Causality violation") || message.contains("data race"), "{message}");
}
