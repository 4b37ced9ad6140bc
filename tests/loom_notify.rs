//! Model checks of the sleep/wake and shutdown protocols (`src/sync/notify.rs`).
//! Run with: RUSTFLAGS="--cfg loom" cargo test --release --test loom_notify
#![cfg(loom)]

#[path = "../src/sync/mod.rs"]
#[allow(dead_code, unreachable_pub)]
mod sync;

use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;
use sync::notify::Notifier;

#[test]
fn a_published_item_always_wakes_the_consumer() {
    loom::model(|| {
        let n = Arc::new(Notifier::new());
        let items = Arc::new(AtomicUsize::new(0));
        let (n2, i2) = (n.clone(), items.clone());
        let producer = thread::spawn(move || {
            i2.fetch_add(1, Ordering::Release);
            n2.notify();
        });
        n.wait(1, || items.load(Ordering::Acquire) == 1);
        producer.join().unwrap();
    });
}

#[test]
fn shutdown_always_ends_a_sleeping_consumer() {
    loom::model(|| {
        let n = Arc::new(Notifier::new());
        let stop = Arc::new(AtomicBool::new(false));
        let (n2, s2) = (n.clone(), stop.clone());
        let consumer = thread::spawn(move || loop {
            if s2.load(Ordering::Acquire) {
                break;
            }
            n2.wait(1, || s2.load(Ordering::Acquire));
        });
        stop.store(true, Ordering::Release);
        n.notify();
        consumer.join().unwrap();
    });
}
