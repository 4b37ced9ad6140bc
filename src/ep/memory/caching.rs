//! The caching device allocator: size-class bins, block splitting and merging, stream-ordered
//! reuse, `shrink`, and one shrink-and-retry before out-of-memory.
//!
//! The bookkeeping is generic over a [`RawMemory`] source, the thing that really hands out
//! device memory (`cuMemAlloc`/`cuMemFree` for CUDA, in `ep::cuda`). Here it is tested on
//! [`HostMemory`], a source made of host allocations with an optional capacity, so every
//! rule below runs without a GPU.
//!
//! The design follows PyTorch's `CUDACachingAllocator` and OneFlow's `BinAllocator`:
//!
//! - **Size classes.** A request is rounded up to a multiple of [`ROUND`] (512 bytes).
//! - **Segments.** The source is asked for whole segments: [`SMALL_SEGMENT`] (2 MiB) for
//!   requests up to [`SMALL_LIMIT`] (1 MiB), otherwise the request rounded up to a multiple of
//!   2 MiB. A segment starts as one block.
//! - **Bins and best fit.** Free blocks sit in an ordered set keyed by (stream, size,
//!   address); a request takes the smallest free block of its stream that fits.
//! - **Split.** A block larger than the request by at least [`ROUND`] is split: the rest
//!   becomes a free block right after it in the same segment.
//! - **Merge.** A freed block merges with its free neighbours of the same segment and the
//!   same stream, so a segment whose blocks are all freed is again one block.
//! - **Stream order.** A block is freed *on a stream* ([`StreamKey`]): the work that used it
//!   was launched on that stream, and may still be running. Later work on the same stream
//!   runs after it (the stream is a FIFO), so the block may be handed to a request of the
//!   same stream at once; never to another stream's request. Blocks freed with
//!   [`StreamKey::IDLE`] (nothing on the device uses them) serve every stream.
//! - **Shrink.** [`CachingAllocator::shrink`] first waits for the device to be idle
//!   ([`RawMemory::synchronize`]), then gives every segment that is wholly free back to the
//!   source, and re-files the remaining free blocks as idle.
//! - **Out of memory.** When the source refuses a new segment, the allocator shrinks and asks
//!   once more; if that fails too, the request fails with [`DeviceAllocError::OutOfMemory`],
//!   which names the request and what is in use and cached. Nothing panics.
//!
//! # Locking
//!
//! One `parking_lot::Mutex` guards all of the bookkeeping. Allocation happens when an
//! instruction first writes a tensor, not per element or per launch, so the lock is cold.
//! The source is called with the lock held: that serialises segment allocation, which the
//! driver serialises anyway.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;

use parking_lot::Mutex;

use super::Block;

/// Every request is rounded up to a multiple of this many bytes (and so is every block).
pub const ROUND: usize = 512;
/// Requests up to this many bytes (after rounding) share small segments.
pub const SMALL_LIMIT: usize = 1 << 20;
/// The size of a small segment.
pub const SMALL_SEGMENT: usize = 2 << 20;
/// Large segments are a multiple of this many bytes.
pub const LARGE_ROUND: usize = 2 << 20;

/// The stream a block was freed on; only requests of that stream may reuse it before the
/// device is next idle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamKey(pub u32);

impl StreamKey {
    /// Freed while nothing on the device used the block: reusable by every stream.
    pub const IDLE: StreamKey = StreamKey(u32::MAX);
}

/// Why a raw source refused memory.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RawMemoryError {
    /// The device has no room for the request.
    #[error("out of memory")]
    OutOfMemory,
    /// Any other failure of the source (a driver error).
    #[error("{0}")]
    Other(String),
}

/// A source of raw device memory: whole segments, freed whole.
///
/// Addresses are plain integers (`CUdeviceptr` for CUDA), never dereferenced by the
/// allocator.
pub trait RawMemory: Send + Sync + fmt::Debug {
    /// A new segment of exactly `bytes` bytes, aligned to at least 512 bytes.
    fn allocate(&self, bytes: usize) -> Result<u64, RawMemoryError>;
    /// Give back a segment obtained from [`RawMemory::allocate`] with the same size. The
    /// allocator calls this only after [`RawMemory::synchronize`], so nothing uses it.
    fn free(&self, addr: u64, bytes: usize);
    /// Wait until every piece of work launched on the device so far has finished.
    fn synchronize(&self) -> Result<(), RawMemoryError>;
}

/// Errors of the caching allocator.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceAllocError {
    /// The device has no room for the request, even after every cached segment was freed.
    #[error(
        "{device}: out of memory allocating {requested} bytes ({in_use} bytes in use, \
         {cached} bytes cached and freed before retrying); free tensors or use a smaller batch"
    )]
    OutOfMemory {
        /// The allocator's device name.
        device: String,
        /// Bytes requested.
        requested: usize,
        /// Bytes of blocks in use when the request failed.
        in_use: usize,
        /// Bytes that were cached (free) before the shrink-and-retry.
        cached: usize,
    },
    /// The source failed for another reason.
    #[error("{device}: allocating {requested} bytes failed: {what}")]
    Source {
        /// The allocator's device name.
        device: String,
        /// Bytes requested.
        requested: usize,
        /// The source's message.
        what: String,
    },
}

/// One block of a segment, as the bookkeeping knows it.
#[derive(Debug, Clone, Copy)]
struct Meta {
    size: usize,
    /// Start address of the segment the block belongs to.
    segment: u64,
    /// `Some(stream)` when free (filed in `free` under that stream), `None` when in use.
    free: Option<StreamKey>,
}

/// A snapshot of a [`CachingAllocator`]'s counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceAllocStats {
    /// Bytes of blocks in use (rounded sizes).
    pub in_use_bytes: usize,
    /// Bytes of free blocks kept for reuse.
    pub cached_bytes: usize,
    /// Number of free blocks kept for reuse.
    pub cached_blocks: usize,
    /// Bytes of all segments held from the source.
    pub reserved_bytes: usize,
    /// Number of segments held.
    pub segments: usize,
    /// Segments obtained from the source so far.
    pub source_allocs: u64,
    /// Segments given back to the source so far.
    pub source_frees: u64,
    /// Requests served without asking the source.
    pub cache_hits: u64,
    /// Requests that found the source full and shrank the cache to retry.
    pub oom_retries: u64,
}

#[derive(Debug, Default)]
struct State {
    /// Every block of every segment, by address.
    blocks: BTreeMap<u64, Meta>,
    /// Free blocks: (stream, size, address).
    free: BTreeSet<(StreamKey, usize, u64)>,
    /// Segments: start address → size.
    segments: BTreeMap<u64, usize>,
    stats: DeviceAllocStats,
}

/// The caching allocator (see the module docs), over a raw source `S`.
pub struct CachingAllocator<S: RawMemory> {
    name: String,
    source: S,
    state: Mutex<State>,
}

impl<S: RawMemory> fmt::Debug for CachingAllocator<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CachingAllocator").field("name", &self.name).field("stats", &self.stats()).finish()
    }
}

/// The size class of a request: `bytes` rounded up to a multiple of [`ROUND`] (at least one
/// [`ROUND`]).
pub fn round_size(bytes: usize) -> usize {
    bytes.max(1).div_ceil(ROUND).saturating_mul(ROUND)
}

/// The segment size the allocator asks the source for to serve a block of `size` bytes.
pub fn segment_size(size: usize) -> usize {
    if size <= SMALL_LIMIT {
        SMALL_SEGMENT
    } else {
        size.div_ceil(LARGE_ROUND).saturating_mul(LARGE_ROUND)
    }
}

impl<S: RawMemory> CachingAllocator<S> {
    /// A new allocator with an empty cache; `name` (`cuda:0`) appears in errors.
    pub fn new(name: &str, source: S) -> Self {
        CachingAllocator { name: name.to_string(), source, state: Mutex::new(State::default()) }
    }

    /// The allocator's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The raw source.
    pub fn source(&self) -> &S {
        &self.source
    }

    /// A block of at least `bytes` bytes for work on `stream`: a cached block of the stream
    /// (or an idle one) if one fits, else a new segment; if the source is full, the cache is
    /// shrunk and the source asked once more.
    pub fn allocate(&self, bytes: usize, stream: StreamKey) -> Result<Block, DeviceAllocError> {
        let size = round_size(bytes);
        let mut st = self.state.lock();
        if size > isize::MAX as usize {
            // Rounding saturated: no source holds it, and asking one would only make it
            // synchronise the device to shrink first.
            return Err(DeviceAllocError::OutOfMemory {
                device: self.name.clone(),
                requested: bytes,
                in_use: st.stats.in_use_bytes,
                cached: st.stats.cached_bytes,
            });
        }
        for key in [stream, StreamKey::IDLE] {
            if let Some(addr) = take_free(&mut st, size, key) {
                st.stats.cache_hits += 1;
                return Ok(self.hand_out(&mut st, addr, size, bytes, key));
            }
        }
        let seg = segment_size(size);
        let addr = match self.source.allocate(seg) {
            Ok(a) => a,
            Err(RawMemoryError::OutOfMemory) => {
                st.stats.oom_retries += 1;
                let cached = st.stats.cached_bytes;
                self.shrink_locked(&mut st).map_err(|what| DeviceAllocError::Source {
                    device: self.name.clone(),
                    requested: bytes,
                    what,
                })?;
                // What is still free after the shrink is idle now: try it before the source.
                if let Some(addr) = take_free(&mut st, size, StreamKey::IDLE) {
                    st.stats.cache_hits += 1;
                    return Ok(self.hand_out(&mut st, addr, size, bytes, StreamKey::IDLE));
                }
                match self.source.allocate(seg) {
                    Ok(a) => a,
                    Err(RawMemoryError::OutOfMemory) => {
                        return Err(DeviceAllocError::OutOfMemory {
                            device: self.name.clone(),
                            requested: bytes,
                            in_use: st.stats.in_use_bytes,
                            cached,
                        })
                    }
                    Err(RawMemoryError::Other(what)) => {
                        return Err(DeviceAllocError::Source {
                            device: self.name.clone(),
                            requested: bytes,
                            what,
                        })
                    }
                }
            }
            Err(RawMemoryError::Other(what)) => {
                return Err(DeviceAllocError::Source { device: self.name.clone(), requested: bytes, what })
            }
        };
        st.stats.source_allocs += 1;
        st.stats.segments += 1;
        st.stats.reserved_bytes += seg;
        st.segments.insert(addr, seg);
        st.blocks.insert(addr, Meta { size: seg, segment: addr, free: None });
        Ok(self.hand_out(&mut st, addr, size, bytes, StreamKey::IDLE))
    }

    /// Mark the (not free) block at `addr` in use for `size` bytes, splitting off the rest,
    /// which stays free under `origin`: the stream the block was free on (idle for a new
    /// segment), since work of that stream may still use the rest.
    fn hand_out(&self, st: &mut State, addr: u64, size: usize, requested: usize, origin: StreamKey) -> Block {
        let meta = *st.blocks.get(&addr).expect("hand_out: a known block");
        debug_assert!(meta.free.is_none() && meta.size >= size);
        if meta.size - size >= ROUND {
            let rest = addr + size as u64;
            st.blocks.insert(rest, Meta { size: meta.size - size, segment: meta.segment, free: None });
            st.blocks.insert(addr, Meta { size, ..meta });
            file_free(st, rest, origin);
        }
        let size = st.blocks[&addr].size;
        st.stats.in_use_bytes += size;
        Block { addr, size, requested }
    }

    /// Give `block` back, freed on `stream` (see the module docs on stream order): it merges
    /// with free neighbours freed on the same stream.
    pub fn free(&self, block: Block, stream: StreamKey) {
        let mut st = self.state.lock();
        let Some(meta) = st.blocks.get(&block.addr).copied() else {
            tracing::error!(allocator = %self.name, addr = block.addr, "free of an unknown block; ignored");
            return;
        };
        if meta.free.is_some() {
            tracing::error!(allocator = %self.name, addr = block.addr, "double free; ignored");
            return;
        }
        st.stats.in_use_bytes -= meta.size;
        file_free(&mut st, block.addr, stream);
    }

    /// Wait for the device to be idle, then give every wholly free segment back to the
    /// source; the free blocks that remain become reusable by every stream. Returns the bytes
    /// given back.
    pub fn shrink(&self) -> Result<usize, DeviceAllocError> {
        let mut st = self.state.lock();
        self.shrink_locked(&mut st).map_err(|what| DeviceAllocError::Source {
            device: self.name.clone(),
            requested: 0,
            what,
        })
    }

    fn shrink_locked(&self, st: &mut State) -> Result<usize, String> {
        self.source.synchronize().map_err(|e| e.to_string())?;
        // Everything is idle: re-file every free block as idle, merging across streams.
        let free: Vec<(StreamKey, usize, u64)> = st.free.iter().copied().collect();
        for (key, size, addr) in free {
            if key == StreamKey::IDLE || !st.free.contains(&(key, size, addr)) {
                continue;
            }
            unfile(st, addr);
            file_free(st, addr, StreamKey::IDLE);
        }
        let mut released = 0;
        let whole: Vec<(u64, usize)> = st
            .segments
            .iter()
            .filter(|(addr, size)| st.blocks.get(addr).is_some_and(|m| m.free.is_some() && m.size == **size))
            .map(|(a, s)| (*a, *s))
            .collect();
        for (addr, size) in whole {
            unfile(st, addr);
            st.blocks.remove(&addr);
            st.segments.remove(&addr);
            self.source.free(addr, size);
            st.stats.segments -= 1;
            st.stats.reserved_bytes -= size;
            st.stats.source_frees += 1;
            released += size;
        }
        Ok(released)
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> DeviceAllocStats {
        self.state.lock().stats
    }

    /// Check the bookkeeping's invariants (blocks tile their segments without overlap, no
    /// two free neighbours of one stream are left unmerged, counters agree); for tests.
    pub fn check_invariants(&self) -> Result<(), String> {
        let st = self.state.lock();
        let mut in_use = 0;
        let mut cached = 0;
        let mut cached_blocks = 0;
        let mut visited = 0;
        for (&seg, &seg_size) in &st.segments {
            let mut at = seg;
            let mut prev_free: Option<StreamKey> = None;
            for (&addr, meta) in st.blocks.range(seg..seg + seg_size as u64) {
                if addr != at {
                    return Err(format!("segment {seg:#x}: gap or overlap at {addr:#x}, expected {at:#x}"));
                }
                if meta.segment != seg {
                    return Err(format!(
                        "block {addr:#x} names segment {:#x}, lies in {seg:#x}",
                        meta.segment
                    ));
                }
                match meta.free {
                    Some(k) => {
                        if prev_free == Some(k) {
                            return Err(format!("block {addr:#x}: unmerged free neighbours"));
                        }
                        if !st.free.contains(&(k, meta.size, addr)) {
                            return Err(format!("free block {addr:#x} not filed"));
                        }
                        cached += meta.size;
                        cached_blocks += 1;
                    }
                    None => in_use += meta.size,
                }
                prev_free = meta.free;
                visited += 1;
                at = addr + meta.size as u64;
            }
            if at != seg + seg_size as u64 {
                return Err(format!("segment {seg:#x}: blocks end at {at:#x}"));
            }
        }
        if st.blocks.len() != visited {
            return Err(format!("{} blocks, {visited} inside segments", st.blocks.len()));
        }
        if st.free.len() != cached_blocks {
            return Err(format!("{} filed free blocks, {cached_blocks} free blocks", st.free.len()));
        }
        let s = &st.stats;
        if (s.in_use_bytes, s.cached_bytes, s.cached_blocks) != (in_use, cached, cached_blocks) {
            return Err(format!(
                "counters (in use {}, cached {} in {}) disagree with blocks ({in_use}, {cached} in {cached_blocks})",
                s.in_use_bytes, s.cached_bytes, s.cached_blocks
            ));
        }
        let reserved: usize = st.segments.values().sum();
        if s.reserved_bytes != reserved || s.segments != st.segments.len() {
            return Err("segment counters disagree".into());
        }
        Ok(())
    }
}

impl<S: RawMemory> Drop for CachingAllocator<S> {
    fn drop(&mut self) {
        let st = self.state.get_mut();
        if st.stats.in_use_bytes > 0 {
            tracing::warn!(allocator = %self.name, bytes = st.stats.in_use_bytes, "dropped with blocks in use");
        }
        if let Err(e) = self.source.synchronize() {
            tracing::error!(allocator = %self.name, error = %e, "cannot synchronize before freeing segments");
        }
        for (&addr, &size) in &st.segments {
            self.source.free(addr, size);
        }
        st.segments.clear();
    }
}

/// Take the smallest free block of `stream` that holds `size` bytes out of the free set
/// (it stays in `blocks`, marked in use).
fn take_free(st: &mut State, size: usize, stream: StreamKey) -> Option<u64> {
    let &(key, found, addr) = st.free.range((stream, size, 0)..=(stream, usize::MAX, u64::MAX)).next()?;
    st.free.remove(&(key, found, addr));
    st.stats.cached_bytes -= found;
    st.stats.cached_blocks -= 1;
    st.blocks.get_mut(&addr).expect("filed blocks exist").free = None;
    Some(addr)
}

/// Remove the free block at `addr` from the free set (it stays in `blocks`, marked in use).
fn unfile(st: &mut State, addr: u64) {
    let meta = st.blocks.get_mut(&addr).expect("unfile: a known block");
    let key = meta.free.take().expect("unfile: a free block");
    st.free.remove(&(key, meta.size, addr));
    st.stats.cached_bytes -= meta.size;
    st.stats.cached_blocks -= 1;
}

/// File the (not free) block at `addr` as free on `stream`, merging it with free neighbours
/// of the same segment and stream.
fn file_free(st: &mut State, mut addr: u64, stream: StreamKey) {
    let mut meta = *st.blocks.get(&addr).expect("file_free: a known block");
    // Merge with the next block.
    let next = addr + meta.size as u64;
    if let Some(n) = st.blocks.get(&next).copied() {
        if n.segment == meta.segment && n.free == Some(stream) {
            unfile(st, next);
            st.blocks.remove(&next);
            meta.size += n.size;
        }
    }
    // Merge with the previous block.
    if let Some((&paddr, &p)) = st.blocks.range(..addr).next_back() {
        if p.segment == meta.segment && p.free == Some(stream) && paddr + p.size as u64 == addr {
            unfile(st, paddr);
            st.blocks.remove(&addr);
            addr = paddr;
            meta.size += p.size;
        }
    }
    meta.free = Some(stream);
    st.blocks.insert(addr, meta);
    st.free.insert((stream, meta.size, addr));
    st.stats.cached_bytes += meta.size;
    st.stats.cached_blocks += 1;
}

/// A [`RawMemory`] source made of host allocations, with an optional capacity: the mock
/// device memory the allocator is tested on (and usable for a host-side staging pool).
#[derive(Debug)]
pub struct HostMemory {
    capacity: Option<usize>,
    state: Mutex<HostMemoryState>,
}

#[derive(Debug, Default)]
struct HostMemoryState {
    used: usize,
    live: BTreeMap<u64, usize>,
    synchronized: u64,
}

/// Alignment of [`HostMemory`] segments.
const HOST_ALIGN: usize = 512;

impl HostMemory {
    /// A source with room for `capacity` bytes of segments in all (`None`: no limit).
    pub fn new(capacity: Option<usize>) -> Arc<HostMemory> {
        Arc::new(HostMemory { capacity, state: Mutex::new(HostMemoryState::default()) })
    }

    /// Bytes of segments currently allocated.
    pub fn used(&self) -> usize {
        self.state.lock().used
    }

    /// Segments currently allocated.
    pub fn live_segments(&self) -> usize {
        self.state.lock().live.len()
    }

    /// How many times [`RawMemory::synchronize`] was called.
    pub fn synchronizations(&self) -> u64 {
        self.state.lock().synchronized
    }
}

impl RawMemory for Arc<HostMemory> {
    fn allocate(&self, bytes: usize) -> Result<u64, RawMemoryError> {
        let mut st = self.state.lock();
        if self.capacity.is_some_and(|cap| st.used.saturating_add(bytes) > cap) {
            return Err(RawMemoryError::OutOfMemory);
        }
        // A size no layout can describe (beyond `isize::MAX`) is more than any memory holds.
        let layout = std::alloc::Layout::from_size_align(bytes.max(1), HOST_ALIGN)
            .map_err(|_| RawMemoryError::OutOfMemory)?;
        // SAFETY: `layout` has a non-zero size.
        let ptr = unsafe { std::alloc::alloc(layout) };
        if ptr.is_null() {
            return Err(RawMemoryError::OutOfMemory);
        }
        st.used += bytes;
        st.live.insert(ptr as u64, bytes);
        Ok(ptr as u64)
    }

    fn free(&self, addr: u64, bytes: usize) {
        let mut st = self.state.lock();
        match st.live.remove(&addr) {
            Some(size) if size == bytes => {
                st.used -= size;
                let layout = std::alloc::Layout::from_size_align(size.max(1), HOST_ALIGN)
                    .expect("the layout was valid at allocation");
                // SAFETY: `addr` came from `std::alloc::alloc` with this layout (same size,
                // checked above) and was removed from `live`, so it is freed exactly once.
                unsafe { std::alloc::dealloc(addr as *mut u8, layout) };
            }
            Some(size) => {
                tracing::error!(addr, size, bytes, "host memory freed with the wrong size; leaked");
            }
            None => tracing::error!(addr, "free of an unknown host segment; ignored"),
        }
    }

    fn synchronize(&self) -> Result<(), RawMemoryError> {
        self.state.lock().synchronized += 1;
        Ok(())
    }
}

impl Drop for HostMemory {
    fn drop(&mut self) {
        let st = self.state.get_mut();
        for (&addr, &size) in &st.live {
            let layout =
                std::alloc::Layout::from_size_align(size.max(1), HOST_ALIGN).expect("valid at allocation");
            // SAFETY: each live segment came from `std::alloc::alloc` with this layout and
            // is freed once, here, as the source goes away.
            unsafe { std::alloc::dealloc(addr as *mut u8, layout) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const A: StreamKey = StreamKey(0);
    const B: StreamKey = StreamKey(1);

    fn alloc(cap: Option<usize>) -> (Arc<HostMemory>, CachingAllocator<Arc<HostMemory>>) {
        let src = HostMemory::new(cap);
        (src.clone(), CachingAllocator::new("test:0", src))
    }

    #[test]
    fn requests_no_memory_holds_are_out_of_memory_not_panics() {
        // Beyond the address space of any process (host memory), and beyond what any size
        // can describe: every one is a typed out-of-memory error, after one shrink at most.
        for bytes in [1usize << 50, isize::MAX as usize, usize::MAX - 1, usize::MAX] {
            let (src, a) = alloc(None);
            let kept = a.allocate(1000, A).unwrap();
            match a.allocate(bytes, A) {
                Err(DeviceAllocError::OutOfMemory { requested, in_use, .. }) => {
                    assert_eq!((requested, in_use), (bytes, 1024), "request of {bytes}")
                }
                other => panic!("request of {bytes}: {other:?}"),
            }
            a.check_invariants().unwrap();
            assert_eq!(src.live_segments(), 1, "the failed request holds nothing");
            a.free(kept, A);
            // A capacity check that cannot overflow either.
            let (_, capped) = alloc(Some(4 << 20));
            let small = capped.allocate(1000, A).unwrap();
            assert!(matches!(capped.allocate(bytes, A), Err(DeviceAllocError::OutOfMemory { .. })));
            capped.free(small, A);
        }
    }

    #[test]
    fn rounding_and_segments() {
        assert_eq!(round_size(0), 512);
        assert_eq!(round_size(1), 512);
        assert_eq!(round_size(512), 512);
        assert_eq!(round_size(513), 1024);
        assert_eq!(segment_size(512), SMALL_SEGMENT);
        assert_eq!(segment_size(SMALL_LIMIT), SMALL_SEGMENT);
        assert_eq!(segment_size(SMALL_LIMIT + 512), 2 << 20);
        assert_eq!(segment_size((2 << 20) + 512), 4 << 20);
    }

    #[test]
    fn split_then_merge_restores_one_block() {
        let (src, a) = alloc(None);
        let x = a.allocate(1000, A).unwrap();
        let y = a.allocate(3000, A).unwrap();
        assert_eq!((x.size, y.size), (1024, 3072));
        assert_eq!(y.addr, x.addr + 1024, "the second block is split off the same segment");
        assert_eq!(src.live_segments(), 1);
        a.check_invariants().unwrap();
        a.free(x, A);
        a.free(y, A);
        a.check_invariants().unwrap();
        let s = a.stats();
        // Both freed on A: merged back with each other, but not with the idle rest.
        assert_eq!((s.cached_blocks, s.in_use_bytes), (2, 0));
        assert_eq!(a.shrink().unwrap(), SMALL_SEGMENT);
        assert_eq!(src.live_segments(), 0);
        a.check_invariants().unwrap();
    }

    #[test]
    fn reuse_is_stream_ordered() {
        let (_src, a) = alloc(None);
        let big = a.allocate(SMALL_LIMIT, A).unwrap(); // half of a small segment
        let rest = a.allocate(SMALL_LIMIT, A).unwrap(); // the other half
        let addr = big.addr;
        a.free(big, A);
        // Stream B may not take A's block while A's work may still use it.
        let other = a.allocate(SMALL_LIMIT, B).unwrap();
        assert_ne!(other.addr, addr);
        // Stream A may.
        let again = a.allocate(SMALL_LIMIT, A).unwrap();
        assert_eq!(again.addr, addr);
        // `rest` came from the idle rest of the segment, `again` from A's freed block.
        assert_eq!(a.stats().cache_hits, 2);
        for b in [rest, other, again] {
            a.free(b, A);
        }
        a.check_invariants().unwrap();
    }

    #[test]
    fn the_rest_of_a_split_block_keeps_its_stream() {
        let (_src, a) = alloc(None);
        let x = a.allocate(SMALL_SEGMENT, A).unwrap(); // the whole segment
        let addr = x.addr;
        a.free(x, A);
        // A takes part of its own freed block; the rest may still be in use by A's work,
        // so B must not get it.
        let part = a.allocate(4096, A).unwrap();
        assert_eq!(part.addr, addr);
        let other = a.allocate(4096, B).unwrap();
        assert!(other.addr >= addr + SMALL_SEGMENT as u64 || other.addr + 4096 <= addr, "B got A's rest");
        a.free(part, A);
        a.free(other, B);
        a.check_invariants().unwrap();
    }

    #[test]
    fn idle_blocks_serve_every_stream() {
        let (_src, a) = alloc(None);
        let x = a.allocate(4096, A).unwrap();
        let addr = x.addr;
        a.free(x, StreamKey::IDLE);
        assert_eq!(a.allocate(4096, B).unwrap().addr, addr);
    }

    #[test]
    fn oom_shrinks_and_retries_once_then_reports() {
        let (src, a) = alloc(Some(4 << 20));
        let x = a.allocate(3 << 20, A).unwrap(); // a 4 MiB segment: the whole capacity
        a.free(x, A);
        // Cached but too small for 5 MiB; the source is full: shrink, retry, still too big.
        let e = a.allocate(5 << 20, B).unwrap_err();
        match e {
            DeviceAllocError::OutOfMemory { requested, in_use, cached, .. } => {
                assert_eq!((requested, in_use, cached), (5 << 20, 0, 4 << 20));
            }
            other => panic!("expected OutOfMemory, got {other:?}"),
        }
        assert_eq!(src.used(), 0, "the shrink gave the cached segment back");
        assert!(src.synchronizations() >= 1);
        // Room again after the shrink: a 2 MiB request succeeds.
        let x = a.allocate(2 << 20, B).unwrap();
        assert_eq!(a.stats().oom_retries, 1);
        a.free(x, B);
        a.check_invariants().unwrap();
    }

    #[test]
    fn oom_retry_reuses_other_streams_blocks_after_sync() {
        let (_src, a) = alloc(Some(2 << 20));
        let x = a.allocate(SMALL_LIMIT, A).unwrap();
        let y = a.allocate(SMALL_LIMIT, A).unwrap();
        let addr = x.addr;
        a.free(x, A);
        // B cannot take A's block directly and the source is full: the retry synchronizes,
        // after which A's block is idle and serves B.
        let z = a.allocate(SMALL_LIMIT, B).unwrap();
        assert_eq!(z.addr, addr);
        assert_eq!(a.stats().oom_retries, 1);
        a.free(y, A);
        a.free(z, B);
        a.check_invariants().unwrap();
    }

    #[test]
    fn double_free_is_ignored() {
        let (_src, a) = alloc(None);
        let x = a.allocate(100, A).unwrap();
        let copy = Block { addr: x.addr, size: x.size, requested: x.requested };
        a.free(x, A);
        a.free(copy, A);
        a.check_invariants().unwrap();
    }

    /// One step of a random allocation program.
    #[derive(Debug, Clone)]
    enum Op {
        Alloc { bytes: usize, stream: u8 },
        Free { pick: usize, stream: u8 },
        Shrink,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            5 => (prop_oneof![1usize..5000, 5000usize..(3 << 20)], 0u8..3)
                .prop_map(|(bytes, stream)| Op::Alloc { bytes, stream }),
            4 => (any::<usize>(), 0u8..3).prop_map(|(pick, stream)| Op::Free { pick, stream }),
            1 => Just(Op::Shrink),
        ]
    }

    fn key(s: u8) -> StreamKey {
        if s == 2 {
            StreamKey::IDLE
        } else {
            StreamKey(u32::from(s))
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        /// Random alloc/free/shrink sequences: live blocks never overlap and hold what was
        /// asked, the bookkeeping stays consistent, freeing everything merges each segment
        /// back to one block, and a final shrink returns every segment.
        #[test]
        fn random_sequences(ops in proptest::collection::vec(op(), 1..120), cap in prop_oneof![Just(None), Just(Some(16usize << 20))]) {
            let (src, a) = alloc(cap);
            let mut live: Vec<Block> = Vec::new();
            for op in ops {
                match op {
                    Op::Alloc { bytes, stream } => match a.allocate(bytes, key(stream)) {
                        Ok(b) => {
                            prop_assert!(b.size >= bytes && b.size % ROUND == 0);
                            for o in &live {
                                let disjoint = b.addr + b.size as u64 <= o.addr || o.addr + o.size as u64 <= b.addr;
                                prop_assert!(disjoint, "{b:?} overlaps {o:?}");
                            }
                            live.push(b);
                        }
                        Err(DeviceAllocError::OutOfMemory { .. }) => prop_assert!(cap.is_some()),
                        Err(e) => prop_assert!(false, "unexpected error {e}"),
                    },
                    Op::Free { pick, stream } => {
                        if !live.is_empty() {
                            let b = live.swap_remove(pick % live.len());
                            a.free(b, key(stream));
                        }
                    }
                    Op::Shrink => {
                        a.shrink().unwrap();
                    }
                }
                a.check_invariants().map_err(TestCaseError::fail)?;
                prop_assert!(cap.is_none_or(|c| src.used() <= c));
            }
            for b in live.drain(..) {
                a.free(b, StreamKey::IDLE);
            }
            a.check_invariants().map_err(TestCaseError::fail)?;
            a.shrink().unwrap();
            let s = a.stats();
            prop_assert_eq!((s.in_use_bytes, s.cached_bytes, s.segments, s.reserved_bytes), (0, 0, 0, 0));
            prop_assert_eq!(src.used(), 0);
        }
    }
}
