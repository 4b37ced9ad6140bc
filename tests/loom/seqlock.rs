//! Model checks of the flight recorder's slot (`src/vm/flight/seqlock.rs`) under loom.
//!
//! The slot is compiled here by path, over the loom facade. One thread writes a slot twice
//! (tags 1 and 2, every word equal to its tag) and sets a word of the second write; another
//! reads it. Every read that returns must return the words of one complete write under its
//! tag: never a mix of two writes, never a tag with another write's words. A model with a
//! planted bug (the writer does not empty the tag before its stores) checks that loom finds
//! the torn read.

#[path = "../../src/vm/flight/seqlock.rs"]
#[allow(dead_code)]
mod seqlock;

use loom::sync::atomic::{fence, AtomicU64, Ordering};
use loom::sync::Arc;
use loom::thread;

use crate::common::{check, failure_of};
use seqlock::Slot;

/// A read is whole: every word is its tag (the set word may be 7 under tag 2).
fn whole(tag: u64, words: [u64; 2]) -> bool {
    words[0] == tag && (words[1] == tag || (tag == 2 && words[1] == 7))
}

#[test]
fn a_read_is_never_torn() {
    check(|| {
        let slot = Arc::new(Slot::<2>::default());
        let w = slot.clone();
        let writer = thread::spawn(move || {
            w.write(1, [1, 1]);
            w.write(2, [2, 2]);
            w.set(2, 1, 7);
        });
        if let Some((tag, words)) = slot.read() {
            assert!(whole(tag, words), "torn read: tag {tag}, words {words:?}");
        }
        writer.join().unwrap();
        let (tag, words) = slot.read().expect("the writer is done");
        assert_eq!((tag, words), (2, [2, 7]));
    });
}

/// The slot without its first step: the tag is not emptied before the words change.
#[derive(Default)]
struct Planted {
    tag: AtomicU64,
    words: [AtomicU64; 2],
}

impl Planted {
    fn write(&self, tag: u64, words: [u64; 2]) {
        fence(Ordering::Release);
        for (w, v) in self.words.iter().zip(words) {
            w.store(v, Ordering::Relaxed);
        }
        self.tag.store(tag, Ordering::Release);
    }

    fn read(&self) -> Option<(u64, [u64; 2])> {
        let tag = self.tag.load(Ordering::Acquire);
        if tag == 0 {
            return None;
        }
        let words = [self.words[0].load(Ordering::Relaxed), self.words[1].load(Ordering::Relaxed)];
        fence(Ordering::Acquire);
        (self.tag.load(Ordering::Relaxed) == tag).then_some((tag, words))
    }
}

#[test]
fn loom_finds_a_torn_read_in_the_planted_slot() {
    let message = failure_of(|| {
        check(|| {
            let slot = Arc::new(Planted::default());
            let w = slot.clone();
            let writer = thread::spawn(move || {
                w.write(1, [1, 1]);
                w.write(2, [2, 2]);
            });
            if let Some((tag, words)) = slot.read() {
                assert!(whole(tag, words), "torn read: tag {tag}, words {words:?}");
            }
            writer.join().unwrap();
        })
    });
    assert!(message.contains("torn read"), "{message}");
}
