//! Model checks of the assembled engine under loom: its inbox, completion channel, worker
//! queue, scheduler loop and host-access rendezvous, compiled by path as they are
//! (`src/vm/engine/`, `src/vm/rendezvous.rs`), put together as `Engine::start` puts them
//! together, with a toy dispatch in place of the dependence rules.
//!
//! The toy engine has one stream and one worker: its scheduler hands every batch it
//! receives to the worker in order, and the worker runs each batch's instructions and
//! reports the batch done, which retires it. An instruction adds to a tensor, reads it into
//! a rendezvous, or frees it; a tensor is a loom cell, so loom fails the model if two
//! instructions that touch it, on whichever threads they run, are not ordered, and an
//! instruction that finds its tensor freed fails it too.
//!
//! - [`the_assembled_engine_runs_every_batch_once_in_order`]: a scheduler, one worker, a
//!   waiter that hands over a batch ending in a read and may run it on its own thread (the
//!   inline claim), and a release submitted without back-pressure, which may run on its
//!   thread too, while a batch submitted before them is in flight; then the handle's drop
//!   (close, drain, stop the worker, leave). Every batch runs once, after the batches
//!   submitted before it; the waiter gets its value; the program numbers the scheduler and
//!   the claimant give out cover each instruction once.
//! - [`a_dead_engine_answers_every_waiter`]: the engine dies while a waiter submits a read:
//!   the waiter is answered, with the value or with nothing, and never left waiting.
//!
//! Two planted models check that the models can fail: a release that runs on its thread
//! without claiming the inbox, and a scheduler that stops without leaving the inbox (a batch
//! submitted after that would wait forever).

use std::sync::{Arc, Mutex as StdMutex};

use loom::cell::UnsafeCell;
use loom::thread;

use crate::common::{check, check_bounded, failure_of};
use crate::sync::notify::{Backoff, Notifier};
use crate::vm::engine::completions::Completions;
use crate::vm::engine::inbox::{Handed, Inbox, Observer, SchedulerEnd, Submission};
use crate::vm::engine::scheduler_loop::{self, Dispatch};
use crate::vm::engine::worker_queue::WorkerQueue;
use crate::vm::rendezvous::Rendezvous;

/// What a freed tensor holds.
const FREED: u64 = u64::MAX;

/// No re-checks before a sleep: the models explore sleeps and wake-ups, not spins.
const NOW: Backoff = Backoff::NONE;

/// A tensor: a value in a cell that loom watches.
struct Tensor(UnsafeCell<u64>);

impl Tensor {
    fn new() -> Arc<Tensor> {
        Arc::new(Tensor(UnsafeCell::new(0)))
    }

    /// The value, once every thread is done with it.
    fn value(&self) -> u64 {
        // SAFETY: loom checks that this read is ordered after every write.
        self.0.with(|p| unsafe { *p })
    }
}

/// The sending side of a read's rendezvous: dropped unanswered, it answers nothing (as
/// `vm::instruction::SlotSender` does).
struct Sender(Arc<Rendezvous<u64>>);

impl Drop for Sender {
    fn drop(&mut self) {
        self.0.abandon();
    }
}

/// An instruction of the toy engine.
enum Op {
    /// Add to the tensor.
    Add(Arc<Tensor>, u64),
    /// Read the tensor into a rendezvous.
    Read(Arc<Tensor>, Sender),
    /// Free the tensor (a `Release`): nothing may touch it after.
    Free(Arc<Tensor>),
}

/// A batch of instructions, in program order.
struct Batch(Vec<Op>);

impl Submission for Batch {
    fn len(&self) -> usize {
        self.0.len()
    }

    fn abandon(&mut self) {
        self.0.retain(|op| matches!(op, Op::Free(_)));
    }
}

/// Run a batch's instructions in order, on this thread.
fn run(batch: Batch) {
    for op in batch.0 {
        match op {
            // SAFETY (each access): loom checks that it is ordered with every other access
            // to the cell, and fails the model where it is not.
            Op::Add(t, k) => t.0.with_mut(|p| unsafe {
                assert_ne!(*p, FREED, "a tensor used after its release");
                *p += k;
            }),
            Op::Read(t, s) => {
                let v = t.0.with(|p| unsafe { *p });
                assert_ne!(v, FREED, "a tensor read after its release");
                s.0.fulfil(v);
            }
            Op::Free(t) => t.0.with_mut(|p| unsafe {
                assert_ne!(*p, FREED, "a tensor released twice");
                *p = FREED;
            }),
        }
    }
}

/// No observer is attached in the models.
struct NoObserver;

impl Observer<Batch> for NoObserver {
    fn submitted(&mut self, _: &Batch) {}
}

/// The toy engine's parts, as `Parts` holds them.
struct Engine {
    inbox: Inbox<Batch, NoObserver>,
    completions: Completions<usize>,
    worker: WorkerQueue<Batch>,
    /// Every batch's first program number and length, as the scheduler or a claimant gave
    /// them out.
    numbers: StdMutex<Vec<(u64, usize)>>,
}

/// Assemble the toy engine: the scheduler's bell, the channels that ring it, one worker.
fn assemble() -> (Arc<Engine>, SchedulerEnd) {
    let bell = Arc::new(Notifier::new());
    let (inbox, end) = Inbox::new(64, 32, bell.clone());
    let engine = Engine {
        inbox,
        completions: Completions::new(2, bell),
        worker: WorkerQueue::new(),
        numbers: StdMutex::new(Vec::new()),
    };
    (Arc::new(engine), end)
}

/// The toy scheduler: every batch goes to the one worker, in the order received.
struct Toy<'a> {
    engine: &'a Engine,
    outgoing: Option<Batch>,
    retired: usize,
}

impl Dispatch<Batch, usize> for Toy<'_> {
    fn complete(&mut self, n: usize) {
        self.retired += n;
    }

    fn completed(&mut self, _: usize) {}

    fn receive(&mut self, batch: Batch, first: u64) {
        self.engine.numbers.lock().unwrap().push((first, batch.len()));
        match &mut self.outgoing {
            Some(out) => out.0.extend(batch.0),
            None => self.outgoing = Some(batch),
        }
    }

    fn flush(&mut self) -> usize {
        if let Some(batch) = self.outgoing.take() {
            self.engine.worker.push(batch);
        }
        std::mem::take(&mut self.retired)
    }
}

/// The scheduler thread, as `scheduler_main` runs it: start the worker, run the loop, stop
/// and join the worker, leave the inbox (unless `leaves` is false: the planted bug).
fn start_scheduler(engine: &Arc<Engine>, mut end: SchedulerEnd, leaves: bool) -> thread::JoinHandle<()> {
    let engine = engine.clone();
    thread::spawn(move || {
        let worker = {
            let engine = engine.clone();
            thread::spawn(move || {
                engine.worker.serve(NOW, |batch| {
                    let n = batch.len();
                    run(batch);
                    let mut done = engine.completions.take();
                    done.push(n);
                    engine.completions.report(done);
                })
            })
        };
        let mut toy = Toy { engine: &engine, outgoing: None, retired: 0 };
        scheduler_loop::run(&engine.inbox, &mut end, &engine.completions, NOW, &mut toy);
        engine.worker.stop();
        worker.join().unwrap();
        if leaves {
            engine.inbox.leave(end);
        }
    })
}

/// Hand `batch` over as `engine::submit::hand_off` does: if the inbox is claimed for this
/// thread, number the batch through the claim, run it here and end the claim.
fn hand_off(engine: &Engine, batch: Batch, bounded: bool) {
    match engine.inbox.hand_off(batch, bounded) {
        Handed::Claimed(mut claim, batch) => {
            let first = engine.inbox.number(&mut claim, batch.len());
            engine.numbers.lock().unwrap().push((first, batch.len()));
            run(batch);
            engine.inbox.end_claim(claim);
        }
        Handed::Submitted => {}
        Handed::Dead(batch) => engine.inbox.bury(batch),
    }
}

/// Submit `batch` as `engine::submit::submit` does.
fn submit(engine: &Engine, batch: Batch) {
    match engine.inbox.submit(batch) {
        Ok(now) => engine.inbox.throttle(now),
        Err(batch) => engine.inbox.bury(batch),
    }
}

/// The first model (module docs); `planted`: the release runs on its thread without
/// claiming the inbox.
fn assembled_model(planted: bool) {
    // Five threads (this one, the scheduler, the worker, the waiter, the release): the
    // exploration grows so fast with the bound that CI runs it at 1, which catches both
    // planted bugs; docs/testing.md says when to run it deeper (`LOOM_MAX_PREEMPTIONS=2`).
    check_bounded(1, move || {
        let (engine, end) = assemble();
        let (t1, t2) = (Tensor::new(), Tensor::new());
        // In flight when the others start: it uses the tensor the release frees.
        submit(&engine, Batch(vec![Op::Add(t1.clone(), 1)]));
        let scheduler = start_scheduler(&engine, end, true);
        let waiter = {
            let (engine, t2) = (engine.clone(), t2.clone());
            thread::spawn(move || {
                let slot = Arc::new(Rendezvous::default());
                let batch = Batch(vec![Op::Add(t2.clone(), 1), Op::Read(t2, Sender(slot.clone()))]);
                hand_off(&engine, batch, true);
                assert_eq!(slot.wait(NOW), Some(1), "the waiter reads what its batch wrote");
            })
        };
        let release = {
            let (engine, t1) = (engine.clone(), t1.clone());
            thread::spawn(move || {
                let batch = Batch(vec![Op::Free(t1)]);
                if planted {
                    run(batch);
                } else if engine.inbox.in_flight() == 0 {
                    // `submit_unbounded` on an idle engine.
                    hand_off(&engine, batch, false);
                } else {
                    match engine.inbox.submit(batch) {
                        Ok(_) => {}
                        Err(batch) => engine.inbox.bury(batch),
                    }
                }
            })
        };
        waiter.join().unwrap();
        release.join().unwrap();
        // The handle's drop.
        engine.inbox.close();
        scheduler.join().unwrap();
        assert_eq!(t1.value(), FREED);
        assert_eq!(t2.value(), 1);
        let mut numbers = engine.numbers.lock().unwrap().clone();
        numbers.sort_unstable();
        let mut next = 1;
        for (first, n) in numbers {
            assert_eq!(first, next, "program numbers given out twice or skipped");
            next += n as u64;
        }
        assert_eq!(next, 5, "every instruction numbered once");
    });
}

#[test]
fn the_assembled_engine_runs_every_batch_once_in_order() {
    assembled_model(false);
}

#[test]
fn planted_release_without_the_claim_is_caught() {
    let message = failure_of(|| assembled_model(true));
    assert!(
        message.contains("Causality") || message.contains("after its release"),
        "the model failed, but not by a race: {message}"
    );
}

/// The second model (module docs); `leaves`: whether the scheduler leaves the inbox when it
/// stops.
fn death_model(leaves: bool) {
    check(move || {
        let (engine, end) = assemble();
        let t = Tensor::new();
        let scheduler = start_scheduler(&engine, end, leaves);
        let waiter = {
            let (engine, t) = (engine.clone(), t.clone());
            thread::spawn(move || {
                let slot = Arc::new(Rendezvous::default());
                submit(&engine, Batch(vec![Op::Read(t, Sender(slot.clone()))]));
                // Answered: the value if the read ran, nothing if it was buried.
                assert!(matches!(slot.wait(NOW), Some(0) | None));
            })
        };
        engine.inbox.kill();
        waiter.join().unwrap();
        scheduler.join().unwrap();
    });
}

#[test]
fn a_dead_engine_answers_every_waiter() {
    death_model(true);
}

#[test]
fn planted_scheduler_that_does_not_leave_is_caught() {
    let message = failure_of(|| death_model(false));
    assert!(
        message.to_lowercase().contains("deadlock"),
        "the model failed, but not by a deadlock: {message}"
    );
}
