//! Size classes: the block sizes a [`HostAllocator`](super::HostAllocator) hands out, and
//! the blocks themselves.
//!
//! A request of `n > 0` bytes gets a block of [`HostAllocator::size_class`]`(n)` bytes:
//!
//! - up to 4 KiB: the next power of two, at least 64 (64, 128, 256, ..., 4096);
//! - above 4 KiB: for `2^k < n <= 2^(k+1)`, the next multiple of `2^k / 4`, which gives four
//!   classes per power of two (5 KiB, 6 KiB, 7 KiB, 8 KiB, 10 KiB, 12 KiB, ...) and wastes
//!   less than a quarter of the block.
//!
//! Requests up to `isize::MAX / 2 + 1` bytes (2^62 on 64-bit targets) have a class; larger
//! ones are out of memory. Every block is 64-byte aligned (a cache line, and enough for
//! every element type) and comes zeroed from the system (`alloc_zeroed`).
//!
//! [`HostAllocator::size_class`]: super::HostAllocator::size_class

use std::alloc::{alloc_zeroed, Layout};
use std::ptr::NonNull;

/// Alignment of every block, in bytes.
pub(super) const ALIGN: usize = 64;

/// log2 of the smallest class (64 bytes).
const MIN_SHIFT: u32 = 6;
/// log2 of the largest power-of-two-only class (4 KiB); above it classes are finer.
pub(super) const FINE_SHIFT: u32 = 12;
/// Classes per power of two above 4 KiB.
const SUB_STEPS: usize = 4;
/// log2 of the largest class: the largest request that has a class is `1 << MAX_SHIFT`.
const MAX_SHIFT: u32 = usize::BITS - 2;
/// The largest request that has a size class.
pub(super) const MAX_BYTES: usize = 1 << MAX_SHIFT;
/// Classes 64, 128, ..., 4096.
pub(super) const POW2_CLASSES: usize = (FINE_SHIFT - MIN_SHIFT + 1) as usize;
/// Number of size classes: the power-of-two ones, then four per power of two up to
/// `MAX_BYTES`.
pub(super) const NUM_CLASSES: usize = POW2_CLASSES + (MAX_SHIFT - FINE_SHIFT) as usize * SUB_STEPS;

/// The index and size of the class that serves a request of `bytes` (1..=`MAX_BYTES`).
///
/// Rule: up to 4 KiB, the next power of two (at least 64); above, with `2^k < bytes <=
/// 2^(k+1)`, the next multiple of `2^k / 4`. Classes are numbered in increasing size.
pub(super) fn class_of(bytes: usize) -> (usize, usize) {
    debug_assert!(bytes > 0 && bytes <= MAX_BYTES);
    if bytes <= 1 << FINE_SHIFT {
        let size = bytes.next_power_of_two().max(1 << MIN_SHIFT);
        ((size.trailing_zeros() - MIN_SHIFT) as usize, size)
    } else {
        // 2^k < bytes <= 2^(k+1), k >= FINE_SHIFT.
        let k = usize::BITS - 1 - (bytes - 1).leading_zeros();
        let base = 1usize << k;
        let step = base / SUB_STEPS;
        let sub = (bytes - base).div_ceil(step); // 1..=SUB_STEPS
        let index = POW2_CLASSES + (k - FINE_SHIFT) as usize * SUB_STEPS + (sub - 1);
        (index, base + sub * step)
    }
}

/// The size of class `class` (inverse of [`class_of`]).
pub(super) fn class_size(class: usize) -> usize {
    if class < POW2_CLASSES {
        1 << (MIN_SHIFT as usize + class)
    } else {
        let fine = class - POW2_CLASSES;
        let base = 1usize << (FINE_SHIFT as usize + fine / SUB_STEPS);
        base + (fine % SUB_STEPS + 1) * (base / SUB_STEPS)
    }
}

/// The layout of a block of a class of `size` bytes.
pub(super) fn block_layout(size: usize) -> Layout {
    // Sizes come from `class_of`, so they are at most `MAX_BYTES`, a multiple of 64, and far
    // below `isize::MAX`: the layout is always valid.
    Layout::from_size_align(size, ALIGN).expect("size classes have valid layouts")
}

/// A fresh zeroed block of `layout` from the system, or `None` if it refuses (never its
/// out-of-memory handler, which aborts). Zeroed, not merely allocated, even where its
/// storage's writer overwrites it: a block is later handed out again as its earlier storage
/// left it (`request`, "Unzeroed blocks"), which is sound only because every byte of it was
/// initialised here.
pub(super) fn system_block(layout: Layout) -> Option<NonNull<u8>> {
    // SAFETY: `layout` has a non-zero size (classes are at least 64 bytes).
    NonNull::new(unsafe { alloc_zeroed(layout) })
}

/// A 64-byte-aligned type, so that `NonNull::<Align64>::dangling()` is a well-aligned
/// non-null address for empty storages.
#[repr(C, align(64))]
struct Align64([u8; ALIGN]);

/// A well-aligned, non-null address that owns no memory: the start of an empty storage.
pub(super) fn dangling() -> NonNull<u8> {
    NonNull::<Align64>::dangling().cast()
}

/// A free block's address. Its owner is the free list that holds it.
pub(super) struct Block(pub(super) NonNull<u8>);

// SAFETY: a `Block` is the sole owner of the memory it points to (it was allocated by the
// global allocator, which any thread may free, and nothing else refers to it while it is
// on a free list), so moving it to another thread is moving plain owned memory.
unsafe impl Send for Block {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn class_rule() {
        let cases = [
            (1, 64),
            (64, 64),
            (65, 128),
            (1000, 1024),
            (4096, 4096),
            (4097, 5120),
            (5120, 5120),
            (5121, 6144),
            (8192, 8192),
            (8193, 10240),
            (1 << 20, 1 << 20),
            ((1 << 20) + 1, (1 << 20) + (1 << 18)),
            (MAX_BYTES, MAX_BYTES),
        ];
        for (bytes, size) in cases {
            assert_eq!(class_of(bytes).1, size, "request of {bytes}");
        }
        assert_eq!(class_of(MAX_BYTES).0, NUM_CLASSES - 1);
    }

    #[test]
    fn class_indices_are_dense_and_increasing() {
        let mut sizes = Vec::new();
        for class in 0..NUM_CLASSES {
            let size = class_size(class);
            assert_eq!(class_of(size), (class, size));
            assert_eq!(class_of(size - size / 8 + 1).0, class, "just below {size}");
            sizes.push(size);
        }
        assert!(sizes.windows(2).all(|w| w[0] < w[1]));
        // Above 4 KiB a block wastes less than a quarter of itself.
        for bytes in (4097..200_000).step_by(97) {
            let size = class_of(bytes).1;
            assert!(size >= bytes && (size - bytes) * 4 < size, "{bytes} -> {size}");
        }
    }

    #[test]
    fn empty_storages_start_at_an_aligned_address() {
        assert_eq!(dangling().as_ptr() as usize % ALIGN, 0);
    }
}
