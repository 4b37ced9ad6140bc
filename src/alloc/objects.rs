//! A bounded pool of memory blocks for objects of one type, shared by every thread.
//!
//! The VM makes a tensor object on the caller's thread for every output of a call, and
//! frees it wherever its last reference drops, usually on a worker or the scheduler, after
//! the tensor's `Release` has run. Through the C allocator that is a free on one thread of
//! what another allocated, and in a loop of small calls the two threads then take turns on
//! the allocator's per-arena lock (glibc's `free` of a chunk from another arena, once the
//! freeing thread's small cache is full). The pool takes the allocator out of that loop: a
//! freed object's block goes onto a bounded lock-free queue (crossbeam's `ArrayQueue`,
//! Vyukov's bounded MPMC queue), and the next object made takes it from there. A push and a
//! pop cost one compare-and-swap each and never block or call into the kernel.
//!
//! The pool holds at most its capacity in blocks; a block freed while it is full goes back
//! to the C allocator, and an object made while it is empty comes from there. Blocks in the
//! pool stay until the process exits (the capacity bounds that memory).
//!
//! # Memory ordering
//!
//! Every write through the old object happens before the block's push (the freeing thread
//! dropped the object first), and `ArrayQueue`'s push and pop are a release/acquire pair on
//! the slot's stamp, so those writes happen before the new owner's writes after its pop.

use std::alloc::Layout;
use std::marker::PhantomData;
use std::mem::MaybeUninit;
use std::ptr::NonNull;

use crossbeam_queue::ArrayQueue;

/// An uninitialised block with room for one `T`, from the global allocator.
struct Block<T>(NonNull<MaybeUninit<T>>);

// SAFETY: a block in the pool is plain memory that no one references: nothing in it is
// shared, so handing it to another thread is moving bytes.
unsafe impl<T> Send for Block<T> {}

/// A bounded pool of blocks for `T` (module docs).
pub(crate) struct ObjectPool<T> {
    free: ArrayQueue<Block<T>>,
    _of: PhantomData<fn() -> T>,
}

impl<T> ObjectPool<T> {
    /// A pool that keeps up to `capacity` (at least one) freed blocks.
    pub(crate) fn new(capacity: usize) -> Self {
        assert!(std::mem::size_of::<T>() > 0, "zero-sized objects need no pool");
        ObjectPool { free: ArrayQueue::new(capacity.max(1)), _of: PhantomData }
    }

    /// Move `value` into a block (a pooled one if there is one) and return the pointer,
    /// which owns the object: give it back with [`free`](Self::free), or free it as a `Box`
    /// would be (the block has `Box<T>`'s layout).
    #[inline]
    pub(crate) fn alloc(&self, value: T) -> NonNull<T> {
        match self.free.pop() {
            Some(Block(p)) => {
                // SAFETY: a pooled block is owned by no one, and has room and alignment for a
                // `T` (it was allocated with `T`'s layout).
                unsafe { p.as_ptr().write(MaybeUninit::new(value)) };
                p.cast()
            }
            None => NonNull::from(Box::leak(Box::new(value))),
        }
    }

    /// Drop the object at `p` and keep its block for the next [`alloc`](Self::alloc) (or
    /// give it to the global allocator if the pool is full).
    ///
    /// # Safety
    /// `p` came from [`alloc`](Self::alloc) of a pool of `T` (any) or from
    /// `Box::<T>::leak`, points to a live object, and nothing will use it again.
    #[inline]
    pub(crate) unsafe fn free(&self, p: NonNull<T>) {
        // SAFETY: the object is live and no one else uses it (the contract).
        unsafe { p.as_ptr().drop_in_place() };
        if let Err(Block(p)) = self.free.push(Block(p.cast())) {
            // SAFETY: the block has `T`'s layout (the contract) and is no longer referenced.
            unsafe { std::alloc::dealloc(p.as_ptr().cast(), Layout::new::<T>()) };
        }
    }

    /// Blocks kept now.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.free.len()
    }

    /// Whether no block is kept now.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.free.is_empty()
    }
}

impl<T> Drop for ObjectPool<T> {
    fn drop(&mut self) {
        while let Some(Block(p)) = self.free.pop() {
            // SAFETY: a pooled block holds no object and has `T`'s layout.
            unsafe { std::alloc::dealloc(p.as_ptr().cast(), Layout::new::<T>()) };
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

    #[test]
    fn blocks_are_reused_and_objects_dropped_once() {
        let drops = Arc::new(AtomicUsize::new(0));
        let pool = ObjectPool::<Obj>::new(2);
        let a = pool.alloc(Obj(drops.clone(), 1));
        // SAFETY: `a` is live and from this pool.
        assert_eq!(unsafe { a.as_ref() }.1, 1);
        // SAFETY: as above; not used again.
        unsafe { pool.free(a) };
        assert_eq!((drops.load(Ordering::Relaxed), pool.len()), (1, 1));
        let b = pool.alloc(Obj(drops.clone(), 2));
        assert_eq!(a, b, "the freed block is taken again");
        assert!(pool.is_empty());
        // SAFETY: `b` is live.
        assert_eq!(unsafe { b.as_ref() }.1, 2);
        // Over capacity: the third block goes back to the global allocator.
        let more: Vec<_> = (0..3).map(|i| pool.alloc(Obj(drops.clone(), i))).collect();
        for p in more.into_iter().chain([b]) {
            // SAFETY: each is live, from this pool, and freed once.
            unsafe { pool.free(p) };
        }
        assert_eq!((drops.load(Ordering::Relaxed), pool.len()), (5, 2));
        // A boxed object may be freed into the pool too.
        let boxed = NonNull::from(Box::leak(Box::new(Obj(drops.clone(), 9))));
        // SAFETY: as the contract allows.
        unsafe { pool.free(boxed) };
        assert_eq!(drops.load(Ordering::Relaxed), 6);
    }

    #[test]
    fn threads_pass_blocks_through_the_pool() {
        let drops = Arc::new(AtomicUsize::new(0));
        let pool = Arc::new(ObjectPool::<Obj>::new(64));
        let (tx, rx) = std::sync::mpsc::channel::<usize>();
        let freer = {
            let pool = pool.clone();
            std::thread::spawn(move || {
                for p in rx {
                    let p = NonNull::new(p as *mut Obj).expect("non-null");
                    // SAFETY: the maker handed over the only pointer to a live object.
                    unsafe { pool.free(p) };
                }
            })
        };
        for i in 0..10_000u64 {
            let p = pool.alloc(Obj(drops.clone(), i));
            // SAFETY: `p` is live; this thread reads it before handing it over.
            assert_eq!(unsafe { p.as_ref() }.1, i);
            tx.send(p.as_ptr() as usize).expect("freer alive");
        }
        drop(tx);
        freer.join().expect("freer");
        assert_eq!(drops.load(Ordering::Relaxed), 10_000);
    }
}
