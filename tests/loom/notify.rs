//! Model checks of the sleep/wake and shutdown protocols of [`Notifier`] under loom.
//!
//! Only the synchronisation facade is under check here: under `--cfg loom` its primitives
//! are loom's, so loom explores every interleaving of the notifier's fences, flag and lock.
//! A lost wake-up shows up as a deadlock, which loom reports by failing the model; the last
//! model plants such a bug on purpose and checks that loom finds it.

use std::collections::VecDeque;

use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use loom::sync::{Arc, Condvar, Mutex};
use loom::thread;

use crate::common::{check, failure_of};
use crate::sync::notify::{Backoff, Notifier};

/// Re-checks before sleeping: few, to keep the state space small, but one of each kind so
/// that the spin and yield paths are explored too.
const SPIN: Backoff = Backoff { spins: 1, yields: 1 };

/// A work queue with its notifier, as the VM's idle loops use them.
#[derive(Default)]
struct Inbox {
    items: Mutex<VecDeque<usize>>,
    notifier: Notifier,
    stop: AtomicBool,
}

impl Inbox {
    fn push(&self, item: usize) {
        self.items.lock().unwrap().push_back(item);
        self.notifier.notify();
    }

    fn pop(&self) -> Option<usize> {
        self.items.lock().unwrap().pop_front()
    }

    fn has_items(&self) -> bool {
        !self.items.lock().unwrap().is_empty()
    }
}

/// One producer publishes a counter, then notifies; the consumer sleeps until it sees it.
#[test]
fn one_producer_wakes_the_consumer() {
    check(|| {
        let notifier = Arc::new(Notifier::new());
        let published = Arc::new(AtomicUsize::new(0));
        let producer = {
            let (notifier, published) = (notifier.clone(), published.clone());
            thread::spawn(move || {
                published.store(1, Ordering::Release);
                notifier.notify();
            })
        };
        notifier.wait(SPIN, || published.load(Ordering::Acquire) == 1);
        producer.join().unwrap();
    });
}

/// The same through a locked queue, with the consumer sleeping at once (no spin).
#[test]
fn one_producer_queue_no_spin() {
    check(|| {
        let inbox = Arc::new(Inbox::default());
        let producer = {
            let inbox = inbox.clone();
            thread::spawn(move || inbox.push(7))
        };
        inbox.notifier.wait(Backoff::NONE, || inbox.has_items());
        assert_eq!(inbox.pop(), Some(7));
        producer.join().unwrap();
    });
}

/// Two producers; the consumer sleeps between items until it has both.
#[test]
fn two_producers_both_items_arrive() {
    check(|| {
        let inbox = Arc::new(Inbox::default());
        let producers: Vec<_> = (1..=2)
            .map(|i| {
                let inbox = inbox.clone();
                thread::spawn(move || inbox.push(i))
            })
            .collect();
        let mut sum = 0;
        let mut got = 0;
        while got < 2 {
            inbox.notifier.wait(SPIN, || inbox.has_items());
            while let Some(i) = inbox.pop() {
                sum += i;
                got += 1;
            }
        }
        assert_eq!(sum, 3);
        for p in producers {
            p.join().unwrap();
        }
    });
}

/// The consumer loop of a device thread or worker: wait for work or stop, drain, exit on
/// stop. Returns how many items it handled.
fn consumer_loop(inbox: &Inbox) -> usize {
    let mut handled = 0;
    loop {
        inbox.notifier.wait(SPIN, || inbox.has_items() || inbox.stop.load(Ordering::Acquire));
        // Read the flag before draining: anything published before the stop is drained.
        let stopping = inbox.stop.load(Ordering::Acquire);
        while inbox.pop().is_some() {
            handled += 1;
        }
        if stopping {
            return handled;
        }
    }
}

/// Shutdown: one thread publishes an item, then sets the stop flag and notifies. The
/// consumer always exits, after handling the item, and is joinable.
#[test]
fn shutdown_after_work_drains_and_exits() {
    check(|| {
        let inbox = Arc::new(Inbox::default());
        let consumer = {
            let inbox = inbox.clone();
            thread::spawn(move || consumer_loop(&inbox))
        };
        inbox.push(1);
        inbox.stop.store(true, Ordering::Release);
        inbox.notifier.notify();
        assert_eq!(consumer.join().unwrap(), 1);
    });
}

/// Shutdown racing a producer: the stop comes from another thread than the work. The
/// consumer must exit whatever the interleaving.
#[test]
fn shutdown_racing_a_producer_exits() {
    check(|| {
        let inbox = Arc::new(Inbox::default());
        let consumer = {
            let inbox = inbox.clone();
            thread::spawn(move || consumer_loop(&inbox))
        };
        let producer = {
            let inbox = inbox.clone();
            thread::spawn(move || inbox.push(1))
        };
        inbox.stop.store(true, Ordering::Release);
        inbox.notifier.notify();
        let handled = consumer.join().unwrap();
        producer.join().unwrap();
        assert!(handled <= 1);
    });
}

/// A notifier with the classic bug: the consumer checks for work before it announces that
/// it will sleep, with no fence between, so a producer can publish and find nobody asleep
/// in between, and the consumer then sleeps through the only wake-up it would get.
#[derive(Default)]
struct BrokenNotifier {
    sleeping: AtomicBool,
    lock: Mutex<()>,
    cv: Condvar,
}

impl BrokenNotifier {
    fn notify(&self) {
        if self.sleeping.load(Ordering::SeqCst) {
            let _g = self.lock.lock().unwrap();
            self.sleeping.store(false, Ordering::SeqCst);
            self.cv.notify_one();
        }
    }

    fn wait(&self, ready: impl Fn() -> bool) {
        if ready() {
            return;
        }
        // The bug: between the check above and the flag below, a producer may publish and
        // call `notify`, which sees nobody asleep.
        let mut g = self.lock.lock().unwrap();
        self.sleeping.store(true, Ordering::SeqCst);
        while self.sleeping.load(Ordering::SeqCst) {
            g = self.cv.wait(g).unwrap();
        }
    }
}

/// The planted bug is caught: loom finds the interleaving that loses the wake-up (and
/// reports it as a deadlock), which shows that the models above would catch one too.
#[test]
fn planted_lost_wakeup_is_caught() {
    let message = failure_of(|| {
        check(|| {
            let notifier = Arc::new(BrokenNotifier::default());
            let published = Arc::new(AtomicBool::new(false));
            let producer = {
                let (notifier, published) = (notifier.clone(), published.clone());
                thread::spawn(move || {
                    published.store(true, Ordering::SeqCst);
                    notifier.notify();
                })
            };
            notifier.wait(|| published.load(Ordering::SeqCst));
            producer.join().unwrap();
        });
    });
    assert!(message.contains("deadlock"), "the model failed, but not by a lost wake-up: {message}");
}
