//! A bounded pool of memory blocks for objects of one type, shared by every thread.
//!
//! The VM makes a tensor object on the caller's thread for every output of a call, and
//! frees it wherever its last reference drops, usually on a worker or the scheduler, after
//! the tensor's `Release` has run. Through the C allocator that is a free on one thread of
//! what another allocated, and in a loop of small calls the two threads then take turns on
//! the allocator's per-arena lock (glibc's `free` of a chunk from another arena, once the
//! freeing thread's small cache is full). The pool takes the allocator out of that loop.
//!
//! Each thread keeps a stack of free blocks of its own ([`Local`], a thread-local the
//! pool's user declares): a thread takes blocks from its stack and frees blocks onto it
//! with no atomic instruction. Blocks move between threads in *batches* of [`BATCH`]: a
//! thread whose stack holds `2 * BATCH` blocks moves `BATCH` of them, as one vector, onto a
//! bounded lock-free queue of full batches, and a thread whose stack is empty takes a whole
//! batch from there; the emptied vectors go back on a second queue, to carry the next batch
//! without allocating. A batch costs a compare-and-swap on each queue (crossbeam's
//! `ArrayQueue`, Vyukov's bounded MPMC queue), which never blocks or calls into the kernel,
//! so in a loop where one thread makes the objects and another frees them each thread pays
//! two per `BATCH` objects rather than one per object. This is the transfer cache of
//! tcmalloc between its per-thread caches, reduced to one size.
//!
//! The pool holds at most its capacity in blocks in full batches, and each thread at most
//! `2 * BATCH` on its stack, handed back (to the queue, or to the C allocator if it is full)
//! when the thread exits; a batch that finds the queue full goes back to the C allocator,
//! and an object made while the thread's stack and the queue are empty comes from there.
//! Blocks in the queue stay until the process exits (the capacity bounds that memory).
//!
//! # Memory ordering
//!
//! Every write through an old object happens before its block is freed onto a stack (the
//! freeing thread dropped the object first). A block in a thread's stack is only taken
//! again by that thread (program order); a block that changes thread travels in a batch,
//! and `ArrayQueue`'s push and pop are a release/acquire pair on the slot's stamp, so the
//! writes before the push happen before the new owner's writes after its pop.

use std::alloc::Layout;
use std::cell::RefCell;
use std::marker::PhantomData;
use std::mem::MaybeUninit;
use std::ptr::NonNull;

use crossbeam_queue::ArrayQueue;

/// Blocks that move between threads at once.
pub(crate) const BATCH: usize = 64;

/// An uninitialised block with room for one `T`, from the global allocator.
pub(crate) struct Block<T>(NonNull<MaybeUninit<T>>);

// SAFETY: a block in the pool is plain memory that no one references: nothing in it is
// shared, so handing it to another thread is moving bytes.
unsafe impl<T> Send for Block<T> {}

impl<T> Block<T> {
    /// Give the block back to the global allocator.
    ///
    /// # Safety
    /// The block holds no live object and came from the global allocator with `T`'s layout.
    unsafe fn dealloc(self) {
        // SAFETY: the contract.
        unsafe { std::alloc::dealloc(self.0.as_ptr().cast(), Layout::new::<T>()) };
    }
}

/// A bounded pool of blocks for `T` (module docs).
pub(crate) struct ObjectPool<T> {
    /// Batches of exactly [`BATCH`] free blocks.
    full: ArrayQueue<Vec<Block<T>>>,
    /// Empty vectors with room for a batch, to carry the next one.
    empty: ArrayQueue<Vec<Block<T>>>,
    _of: PhantomData<fn() -> T>,
}

/// A thread's stack of free blocks of a pool of `T` (module docs), for a `thread_local!`:
///
/// ```ignore
/// thread_local! { static LOCAL: Local<T> = const { Local::new() }; }
/// ```
///
/// At the thread's exit its blocks go back to the pool it took them from.
pub(crate) struct Local<T: 'static> {
    inner: RefCell<Stack<T>>,
}

/// What a [`Local`] holds.
struct Stack<T: 'static> {
    /// The pool the blocks go back to, set by the first block that comes here.
    pool: Option<&'static ObjectPool<T>>,
    blocks: Vec<Block<T>>,
}

impl<T: 'static> Local<T> {
    /// An empty stack, for a `thread_local!`'s `const` initialiser.
    pub(crate) const fn new() -> Self {
        Local { inner: RefCell::new(Stack { pool: None, blocks: Vec::new() }) }
    }
}

impl<T: 'static> Drop for Local<T> {
    /// At thread exit: the stack's blocks back to the pool.
    fn drop(&mut self) {
        let Stack { pool, blocks } = self.inner.get_mut();
        match pool {
            Some(pool) => pool.give_back(std::mem::take(blocks)),
            None => debug_assert!(blocks.is_empty(), "blocks without a pool"),
        }
    }
}

impl<T: 'static> ObjectPool<T> {
    /// A pool that keeps up to `capacity` freed blocks in full batches (at least one batch).
    pub(crate) fn new(capacity: usize) -> Self {
        assert!(std::mem::size_of::<T>() > 0, "zero-sized objects need no pool");
        let batches = capacity.div_ceil(BATCH).max(1);
        ObjectPool { full: ArrayQueue::new(batches), empty: ArrayQueue::new(batches), _of: PhantomData }
    }

    /// Make the object `make` returns in `block` (one [`take`](Self::take) gave), or in a
    /// new block from the global allocator if it gave none, and return the pointer, which
    /// owns the object: give it back with [`free`](Self::free), or free it as a `Box` would
    /// be (the block has `Box<T>`'s layout). (The block is found before the object is made,
    /// so that the object can be written straight into it rather than copied there.)
    #[inline(always)]
    pub(crate) fn place(&self, block: Option<Block<T>>, make: impl FnOnce() -> T) -> NonNull<T> {
        match block {
            Some(Block(p)) => {
                // SAFETY: a pooled block is owned by no one, and has room and alignment for a
                // `T` (it was allocated with `T`'s layout).
                unsafe { p.as_ptr().write(MaybeUninit::new(make())) };
                p.cast()
            }
            None => NonNull::from(Box::leak(Box::new(make()))),
        }
    }

    /// A block for a new object from `local`, this thread's stack, refilled with a batch if
    /// it is empty; `None` if there is none (then [`place`](Self::place) asks the global
    /// allocator).
    #[inline]
    pub(crate) fn take(&'static self, local: &Local<T>) -> Option<Block<T>> {
        let mut l = local.inner.try_borrow_mut().ok()?;
        if let Some(b) = l.blocks.pop() {
            // The next object's block, most likely freed by another thread: ask for its
            // lines now, so that making that object does not wait for them.
            if let Some(next) = l.blocks.last() {
                super::prefetch_for_write(next.0.as_ptr(), std::mem::size_of::<T>().div_ceil(64));
            }
            return Some(b);
        }
        let batch = self.full.pop()?;
        let emptied = std::mem::replace(&mut l.blocks, batch);
        l.pool = Some(self);
        // The emptied vector carries a later batch; dropped if there are enough already.
        let _ = self.empty.push(emptied);
        l.blocks.pop()
    }

    /// Drop the object at `p` and keep its block in `local`, this thread's stack (module
    /// docs), or give it to the global allocator when `local` is `None` (the thread is
    /// exiting).
    ///
    /// # Safety
    /// `p` came from [`alloc`](Self::alloc) of a pool of `T` (any) or from
    /// `Box::<T>::leak`, points to a live object, and nothing will use it again.
    #[inline]
    pub(crate) unsafe fn free(&'static self, local: Option<&Local<T>>, p: NonNull<T>) {
        // SAFETY: the object is live and no one else uses it (the contract).
        unsafe { p.as_ptr().drop_in_place() };
        let block = Block(p.cast());
        let Some(mut l) = local.and_then(|l| l.inner.try_borrow_mut().ok()) else {
            // SAFETY: the block has `T`'s layout (the contract) and holds no object now.
            return unsafe { block.dealloc() };
        };
        if l.blocks.len() >= 2 * BATCH {
            let mut batch = self.empty.pop().unwrap_or_default();
            let from = l.blocks.len() - BATCH;
            batch.extend(l.blocks.drain(from..));
            if let Err(batch) = self.full.push(batch) {
                self.give_back(batch);
            }
        }
        l.pool = Some(self);
        l.blocks.push(block);
    }

    /// Blocks a thread no longer keeps: into full batches while the queue takes them, the
    /// rest to the global allocator.
    fn give_back(&self, mut blocks: Vec<Block<T>>) {
        while blocks.len() >= BATCH {
            let batch = blocks.split_off(blocks.len() - BATCH);
            if let Err(batch) = self.full.push(batch) {
                blocks.extend(batch);
                break;
            }
        }
        for b in blocks {
            // SAFETY: a free block holds no object and has `T`'s layout.
            unsafe { b.dealloc() };
        }
    }

    /// Blocks kept in full batches now.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.full.len() * BATCH
    }
}

impl<T> Drop for ObjectPool<T> {
    fn drop(&mut self) {
        while let Some(batch) = self.full.pop() {
            for b in batch {
                // SAFETY: a pooled block holds no object and has `T`'s layout.
                unsafe { b.dealloc() };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// Counts its drops.
    #[repr(align(64))]
    struct Obj(Arc<AtomicUsize>, u64);

    impl Drop for Obj {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    thread_local! {
        static LOCAL: Local<Obj> = const { Local::new() };
    }

    /// A pool for one test (leaked: a pool is a `static`).
    fn pool(capacity: usize) -> &'static ObjectPool<Obj> {
        Box::leak(Box::new(ObjectPool::new(capacity)))
    }

    fn alloc(pool: &'static ObjectPool<Obj>, o: Obj) -> NonNull<Obj> {
        pool.place(LOCAL.with(|l| pool.take(l)), || o)
    }

    /// # Safety
    /// As for `ObjectPool::free`.
    unsafe fn free(pool: &'static ObjectPool<Obj>, p: NonNull<Obj>) {
        // SAFETY: the caller's contract.
        LOCAL.with(|l| unsafe { pool.free(Some(l), p) })
    }

    #[test]
    fn a_block_freed_on_a_thread_is_taken_again_there_and_objects_dropped_once() {
        let drops = Arc::new(AtomicUsize::new(0));
        let pool = pool(4 * BATCH);
        let a = alloc(pool, Obj(drops.clone(), 1));
        // SAFETY: `a` is live and from this pool.
        assert_eq!(unsafe { a.as_ref() }.1, 1);
        // SAFETY: as above; not used again.
        unsafe { free(pool, a) };
        assert_eq!(drops.load(Ordering::Relaxed), 1);
        let b = alloc(pool, Obj(drops.clone(), 2));
        assert_eq!(a, b, "the freed block is taken again");
        // SAFETY: `b` is live.
        assert_eq!(unsafe { b.as_ref() }.1, 2);
        // Without the thread's stack (a thread exiting), straight to the global allocator.
        // SAFETY: `b` is live, from this pool, and freed once.
        unsafe { pool.free(None, b) };
        let boxed = NonNull::from(Box::leak(Box::new(Obj(drops.clone(), 9))));
        // SAFETY: a boxed object may be freed into the pool too.
        unsafe { free(pool, boxed) };
        assert_eq!(drops.load(Ordering::Relaxed), 3);
    }

    #[test]
    fn blocks_cross_threads_in_batches_and_the_queue_stays_bounded() {
        let drops = Arc::new(AtomicUsize::new(0));
        let pool = pool(2 * BATCH);
        // Made here, freed on another thread: that thread's stack fills, and batches come
        // back here through the queue.
        let made: Vec<usize> =
            (0..10 * BATCH as u64).map(|i| alloc(pool, Obj(drops.clone(), i)).as_ptr() as usize).collect();
        std::thread::spawn(move || {
            for p in made {
                let p = NonNull::new(p as *mut Obj).expect("non-null");
                // SAFETY: the maker handed over the only pointer to a live object.
                unsafe { free(pool, p) };
            }
            // The stack keeps at most two batches until the thread exits.
        })
        .join()
        .expect("freer");
        assert_eq!(drops.load(Ordering::Relaxed), 10 * BATCH);
        assert_eq!(pool.len(), 2 * BATCH, "the queue holds its capacity, the rest was freed");
        // Those batches serve the next objects made here.
        let again: Vec<_> = (0..2 * BATCH as u64).map(|i| alloc(pool, Obj(drops.clone(), i))).collect();
        assert_eq!(pool.len(), 0);
        for p in again {
            // SAFETY: each is live, from this pool, and freed once.
            unsafe { free(pool, p) };
        }
        assert_eq!(drops.load(Ordering::Relaxed), 12 * BATCH);
    }

    #[test]
    fn threads_pass_blocks_through_the_pool() {
        let drops = Arc::new(AtomicUsize::new(0));
        let pool = pool(64);
        let (tx, rx) = std::sync::mpsc::channel::<usize>();
        let freer = std::thread::spawn(move || {
            for p in rx {
                let p = NonNull::new(p as *mut Obj).expect("non-null");
                // SAFETY: the maker handed over the only pointer to a live object.
                unsafe { free(pool, p) };
            }
        });
        for i in 0..10_000u64 {
            let p = alloc(pool, Obj(drops.clone(), i));
            // SAFETY: `p` is live; this thread reads it before handing it over.
            assert_eq!(unsafe { p.as_ref() }.1, i);
            tx.send(p.as_ptr() as usize).expect("freer alive");
        }
        drop(tx);
        freer.join().expect("freer");
        assert_eq!(drops.load(Ordering::Relaxed), 10_000);
    }
}
