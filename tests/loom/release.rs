//! Model checks of the release rule (`src/framework/release.rs`) under loom.
//!
//! The release rule is compiled here by path, over the loom facade, so its atomics and
//! locks are loom's and every interleaving is explored. A builder thread opens a batch,
//! writes a use of tensor T into it, drops its handle of T, pushes the batch into the inbox
//! and closes it; another thread drops its own handle. Whichever drop is last releases T.
//! Every model checks both properties the module docs argue: the `Release` enters the inbox
//! after every batch that uses T (order), and it does enter it (nothing is forgotten).
//!
//! Explicit releases (`Array::release`) are modelled too: T is marked released on one thread
//! while, on another, a builder, or an eager context that queues the use and builds it at a
//! later flush, checks T's flag after opening its slot and writes the use only if T is live.
//!
//! Two models plant an ordering bug each (a batch closed before it is in the inbox; a flag
//! checked before the slot is opened) and check that loom finds it.

#[path = "../../src/framework/release.rs"]
#[allow(dead_code)]
mod rule;

use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use loom::sync::{Arc, Mutex};
use loom::thread;

use crate::common::{check, failure_of};
use rule::Releases;

/// One VM's release state, its inbox, and tensor T's handle count.
struct World {
    releases: Releases<&'static str>,
    inbox: Mutex<Vec<&'static str>>,
    refs: AtomicUsize,
}

impl World {
    fn new(handles: usize) -> Arc<World> {
        Arc::new(World {
            releases: Releases::default(),
            inbox: Mutex::new(Vec::new()),
            refs: AtomicUsize::new(handles),
        })
    }

    fn push(&self, items: impl IntoIterator<Item = &'static str>) {
        self.inbox.lock().unwrap().extend(items);
    }

    /// Drop one handle of T; the last one releases it (as `Tensor::drop` does).
    fn drop_handle(&self) {
        if self.refs.fetch_sub(1, Ordering::AcqRel) == 1 {
            let ready = self.releases.release("release T");
            self.push(ready);
        }
    }

    /// A builder that uses T in one batch: open, write the use, drop its handle, submit.
    /// `close_first` plants the bug: the batch is closed before it is in the inbox.
    fn builder(&self, batch: &'static str, close_first: bool) {
        let slot = self.releases.register();
        self.releases.open(&slot);
        // ... the instruction that uses T is written into the batch here ...
        self.drop_handle();
        if close_first {
            let ready = self.releases.close(&slot);
            self.push([batch]);
            self.push(ready);
        } else {
            self.push([batch]);
            let ready = self.releases.close(&slot);
            self.push(ready);
        }
        self.releases.unregister(&slot);
    }

    /// A builder that uses T, drops its handle of T while its batch is open and, if that
    /// was the last handle, defers the release (`framework::deferred`): it makes it with
    /// `release_all`, after its batch is in the inbox and closed.
    fn deferring_builder(&self, batch: &'static str) {
        let slot = self.releases.register();
        self.releases.open(&slot);
        // ... the instruction that uses T is written into the batch here ...
        let last = self.refs.fetch_sub(1, Ordering::AcqRel) == 1;
        self.push([batch]);
        let ready = self.releases.close(&slot);
        self.push(ready);
        if last {
            let mut ready = Vec::new();
            self.releases.release_all(["release T"].into_iter(), |t| ready.push(t));
            self.push(ready);
        }
        self.releases.unregister(&slot);
    }

    /// After every thread has finished: T's release is in the inbox, once, after `batches`.
    fn assert_ordered(&self, batches: &[&str]) {
        let inbox = self.inbox.lock().unwrap();
        let at = |x: &str| inbox.iter().position(|y| *y == x);
        let r = at("release T").unwrap_or_else(|| panic!("the release was forgotten: {inbox:?}"));
        assert_eq!(inbox.iter().filter(|y| **y == "release T").count(), 1, "{inbox:?}");
        for b in batches {
            let k = at(b).expect("every batch is submitted");
            assert!(k < r, "the release overtook {b}: {inbox:?}");
        }
    }
}

/// One builder and one other thread hold handles of T; either drop may be the last.
/// `close_first` plants the bug of [`World::builder`].
fn one_builder(close_first: bool) {
    check(move || {
        let w = World::new(2);
        let b = {
            let w = w.clone();
            thread::spawn(move || w.builder("batch A", close_first))
        };
        w.drop_handle();
        b.join().unwrap();
        w.assert_ordered(&["batch A"]);
    });
}

#[test]
fn a_release_follows_the_batch_that_uses_the_tensor() {
    one_builder(false);
}

/// Two builders on two threads use T; the release follows both batches, whichever thread
/// drops last.
#[test]
fn a_release_follows_every_open_batch() {
    check(|| {
        let w = World::new(2);
        let a = {
            let w = w.clone();
            thread::spawn(move || w.builder("batch A", false))
        };
        w.builder("batch B", false);
        a.join().unwrap();
        w.assert_ordered(&["batch A", "batch B"]);
    });
}

/// A builder defers the release of T when its handle is the last, and makes it with
/// `release_all` after submitting its batch, while another builder uses T: the release
/// follows both batches, and is never forgotten, whichever handle drops last.
#[test]
fn a_deferred_release_follows_every_open_batch() {
    check(|| {
        let w = World::new(2);
        let a = {
            let w = w.clone();
            thread::spawn(move || w.builder("batch A", false))
        };
        w.deferring_builder("batch B");
        a.join().unwrap();
        w.assert_ordered(&["batch A", "batch B"]);
    });
}

/// A builder whose batch does not use T opens and closes while T is released elsewhere:
/// the release is never forgotten, whatever the interleaving.
#[test]
fn an_unrelated_batch_never_strands_a_release() {
    check(|| {
        let w = World::new(1);
        let a = {
            let w = w.clone();
            thread::spawn(move || {
                let slot = w.releases.register();
                w.releases.open(&slot);
                w.push(["batch A"]);
                let ready = w.releases.close(&slot);
                w.push(ready);
                w.releases.unregister(&slot);
            })
        };
        w.drop_handle();
        a.join().unwrap();
        w.assert_ordered(&[]);
    });
}

/// The planted bug (closing a batch before it is in the inbox) is caught: loom finds the
/// interleaving in which the release overtakes the batch, which shows that the models
/// above would catch such a bug in the rule itself.
#[test]
fn planted_early_close_is_caught() {
    let message = failure_of(|| one_builder(true));
    assert!(message.contains("overtook"), "the model failed, but not by the planted bug: {message}");
}

/// Explicit release: another thread marks T released and releases it while a builder checks
/// T and, finding it live, writes a use. `check_first` plants the bug of checking T's flag
/// before opening the batch (the order the builder used to have).
fn explicit_release(check_first: bool) {
    check(move || {
        let w = World::new(1);
        let released = Arc::new(AtomicBool::new(false));
        let b = {
            let (w, released) = (w.clone(), released.clone());
            thread::spawn(move || {
                let slot = w.releases.register();
                let live = if check_first {
                    let live = !released.load(Ordering::Relaxed);
                    w.releases.open(&slot);
                    live
                } else {
                    w.releases.open(&slot);
                    !released.load(Ordering::Relaxed)
                };
                // The use is written only if T was found live; the batch goes either way.
                w.push([if live { "batch A" } else { "batch A without T" }]);
                let ready = w.releases.close(&slot);
                w.push(ready);
                w.releases.unregister(&slot);
            })
        };
        released.store(true, Ordering::Relaxed);
        let ready = w.releases.release("release T");
        w.push(ready);
        b.join().unwrap();
        let used = w.inbox.lock().unwrap().contains(&"batch A");
        w.assert_ordered(if used { &["batch A"] } else { &[] });
    });
}

#[test]
fn an_explicit_release_follows_a_use_found_live() {
    explicit_release(false);
}

/// An eager context holds its slot open from before it checks a call it queues until the
/// batch its flush builds is in the inbox: an explicit release made after the check on
/// another thread follows that batch, although the flush no longer checks T.
#[test]
fn an_explicit_release_follows_a_use_a_context_queued() {
    check(|| {
        let w = World::new(1);
        let released = Arc::new(AtomicBool::new(false));
        let c = {
            let (w, released) = (w.clone(), released.clone());
            thread::spawn(move || {
                // Queue: the context's slot opens, then the call is checked.
                let queue = w.releases.register();
                w.releases.open(&queue);
                let live = !released.load(Ordering::Relaxed);
                // Flush: a builder writes the queued call without checking T again.
                let builder = w.releases.register();
                w.releases.open(&builder);
                w.push([if live { "batch C" } else { "batch C without T" }]);
                let ready = w.releases.close(&builder);
                w.push(ready);
                w.releases.unregister(&builder);
                let ready = w.releases.close(&queue);
                w.push(ready);
                w.releases.unregister(&queue);
            })
        };
        released.store(true, Ordering::Relaxed);
        let ready = w.releases.release("release T");
        w.push(ready);
        c.join().unwrap();
        let used = w.inbox.lock().unwrap().contains(&"batch C");
        w.assert_ordered(if used { &["batch C"] } else { &[] });
    });
}

/// The planted bug of [`explicit_release`] (the flag checked before the batch is opened)
/// is caught.
#[test]
fn planted_check_before_open_is_caught() {
    let message = failure_of(|| explicit_release(true));
    assert!(message.contains("overtook"), "the model failed, but not by the planted bug: {message}");
}
