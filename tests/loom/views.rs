//! Model checks of the handshake between a new view of an owner and an explicit release of
//! the owner (`src/vm/views.rs`) under loom.
//!
//! The module is compiled here by path, over the loom facade. One thread makes a view of the
//! owner (it counts itself, then reads the owner's `released` flag); another releases the
//! owner explicitly (it sets the flag, then reads the count). The check: the release never
//! finds no view (and frees the storage now) while a view it did not see was made. A model
//! with the view's fence made relaxed plants the bug and must fail.

#[path = "../../src/vm/views.rs"]
#[allow(dead_code)]
mod handshake;

use loom::sync::atomic::{AtomicBool, Ordering};
use loom::sync::Arc;
use loom::thread;

use crate::common::{check, failure_of};
use handshake::{Release, ViewCount};

struct Owner {
    views: ViewCount,
    released: AtomicBool,
    /// Set by a view that was made (and so reads the storage).
    viewed: AtomicBool,
}

fn race(enter: fn(&ViewCount, &AtomicBool) -> bool) {
    let o = Arc::new(Owner {
        views: ViewCount::default(),
        released: AtomicBool::new(false),
        viewed: AtomicBool::new(false),
    });
    let v = o.clone();
    let viewer = thread::spawn(move || {
        if enter(&v.views, &v.released) {
            v.viewed.store(true, Ordering::Relaxed);
        }
    });
    let outcome = o.views.release(&o.released);
    viewer.join().unwrap();
    if outcome == Release::Now {
        assert!(!o.viewed.load(Ordering::Relaxed), "the storage was freed under a view made meanwhile");
    }
}

#[test]
fn a_release_never_frees_a_storage_a_new_view_uses() {
    check(|| race(ViewCount::enter));
}

#[test]
fn a_view_without_its_fence_is_caught() {
    let message = failure_of(|| check(|| race(ViewCount::enter_unfenced)));
    assert!(message.contains("freed under a view"), "{message}");
}
