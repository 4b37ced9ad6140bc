//! Fault records: how a kernel of an asynchronous device reports bad data (an index out of
//! range) that it finds only when it runs, after its launch has returned.
//!
//! A synchronous kernel fails its call by returning an error. A kernel launched on an
//! asynchronous stream cannot: its launch returns before it reads its operands. Instead it
//! writes the stream's [`FaultRecord`], a few words of host memory that the device can
//! write (CUDA: pinned host memory mapped into the device's address space; the mock device,
//! whose kernels run on host threads: an ordinary host allocation). On bad data a kernel
//! sets the code word from 0 to its code with a compare-and-swap (the first fault wins) and
//! then stores the offending value, the bound it broke, the dimension and the position; it
//! still never reads or writes outside an operand (the element is skipped or zero, as
//! before).
//!
//! The VM reads the record of a stream only after waiting for the stream to reach the
//! checked launch (`vm::stream_policy`, "checked launches"), when no kernel that may write
//! it is running: [`FaultRecord::take`] returns the fault and resets the record, so that
//! the next launch starts clean.
//!
//! The record's words, as kernels see them (C layout, 32 bytes):
//!
//! | offset | type | field |
//! | --- | --- | --- |
//! | 0 | `u32` | code ([`FaultCode`]); 0: no fault |
//! | 4 | `u32` | dimension |
//! | 8 | `i64` | the offending value |
//! | 16 | `i64` | the bound (a dimension's size, the number of classes) |
//! | 24 | `i64` | the position (the thread's element) |

use std::cell::Cell;
use std::fmt;
use std::sync::atomic::{AtomicI64, AtomicU32, Ordering};

/// What a kernel found wrong, as the code word of a [`FaultRecord`] holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum FaultCode {
    /// An index outside `0..bound` along dimension `dim` (`index_select`, `gather`,
    /// `scatter`, `index_add`, `index`, `index_put`).
    Index = 1,
    /// A class index outside `0..bound` (`one_hot`).
    Class = 2,
    /// A target outside `0..bound` that is not the ignored one (`nll_loss`).
    Target = 3,
}

impl FaultCode {
    /// Every code, in numeric order.
    pub const ALL: [FaultCode; 3] = [FaultCode::Index, FaultCode::Class, FaultCode::Target];

    /// The code of a code word, if it is one.
    pub fn of(word: u32) -> Option<FaultCode> {
        FaultCode::ALL.into_iter().find(|c| *c as u32 == word)
    }
}

/// A fault as a kernel recorded it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataFault {
    /// The code word (a [`FaultCode`] as `u32`, or a code this build does not know).
    pub code: u32,
    /// The dimension the value indexes.
    pub dim: u32,
    /// The offending value.
    pub value: i64,
    /// The bound it broke (a dimension's size, the number of classes).
    pub bound: i64,
    /// The element whose thread found it.
    pub position: i64,
}

impl DataFault {
    /// The message a call of `op` fails with: the CPU kernel's message for the same value.
    pub fn message(&self, op: &str) -> String {
        let (v, b, d) = (self.value, self.bound, self.dim);
        match FaultCode::of(self.code) {
            Some(FaultCode::Index) => {
                format!("{op}: index {v} is out of range for dimension {d} of size {b}")
            }
            Some(FaultCode::Class) => format!("{op}: class index {v} is outside 0..{b} (num_classes={b})"),
            Some(FaultCode::Target) => {
                format!("target {v} is out of bounds: the classes are 0 to {}", b - 1)
            }
            None => format!(
                "{op}: the kernel reported fault code {} (value {v}, bound {b}, dimension {d}, position {})",
                self.code, self.position
            ),
        }
    }
}

/// The words of a record, as kernels write them (the layout in the module docs).
#[repr(C)]
#[derive(Debug, Default)]
pub struct FaultWords {
    code: AtomicU32,
    dim: AtomicU32,
    value: AtomicI64,
    bound: AtomicI64,
    position: AtomicI64,
}

const _: () = assert!(std::mem::size_of::<FaultWords>() == 32);

/// Gives the memory of a record back (the backend's free).
pub type FreeWords = Box<dyn FnOnce(*mut FaultWords) + Send + Sync>;

/// A stream's fault record: [`FaultWords`] in host memory, and the address its device's
/// kernels write them at.
pub struct FaultRecord {
    words: *mut FaultWords,
    device_addr: u64,
    free: Option<FreeWords>,
}

// SAFETY: the words are reached only through atomics (and by device kernels, which the
// record's contract orders before `take`); the pointer stays valid until `drop`.
unsafe impl Send for FaultRecord {}
// SAFETY: as above; every method takes `&self` and touches the words through atomics.
unsafe impl Sync for FaultRecord {}

impl FaultRecord {
    /// A record in ordinary host memory, written at its host address: for devices whose
    /// kernels run on host threads (the mock device).
    pub fn host() -> FaultRecord {
        let words = Box::into_raw(Box::<FaultWords>::default());
        let free: FreeWords = Box::new(|w| {
            // SAFETY: `w` is the record's words, from `Box::into_raw` above, freed once, here.
            drop(unsafe { Box::from_raw(w) })
        });
        // SAFETY: `words` is a live, zeroed `FaultWords` from `Box::into_raw`, its address
        // is where host kernels write it, and the free turns it back into the box.
        unsafe { FaultRecord::from_raw(words, words as u64, free) }
    }

    /// A record over `words`, written by the device at `device_addr`; `free` gives the
    /// memory back when the record drops.
    ///
    /// # Safety
    /// `words` points to zeroed memory of [`FaultWords`]' size and alignment, valid for
    /// reads and writes from the host until `free` is called with it, and `device_addr` is
    /// the same memory as the device's kernels address it.
    pub unsafe fn from_raw(words: *mut FaultWords, device_addr: u64, free: FreeWords) -> FaultRecord {
        FaultRecord { words, device_addr, free: Some(free) }
    }

    fn words(&self) -> &FaultWords {
        // SAFETY: valid until `drop` (the constructor's contract); only atomics are used.
        unsafe { &*self.words }
    }

    /// The address a kernel of the device writes the record at.
    pub fn device_addr(&self) -> u64 {
        self.device_addr
    }

    /// Record `fault` from the host (a kernel running on a host thread), unless a fault is
    /// recorded already: the first one wins. Returns whether this one was recorded.
    pub fn report(&self, fault: DataFault) -> bool {
        let w = self.words();
        if fault.code == 0
            || w.code.compare_exchange(0, fault.code, Ordering::AcqRel, Ordering::Acquire).is_err()
        {
            return false;
        }
        w.dim.store(fault.dim, Ordering::Relaxed);
        w.value.store(fault.value, Ordering::Relaxed);
        w.bound.store(fault.bound, Ordering::Relaxed);
        w.position.store(fault.position, Ordering::Release);
        true
    }

    /// The recorded fault, if any, and the record reset. Call it only when no kernel that
    /// may write the record is running (after waiting for the stream to reach the launch
    /// that is checked), so that the fields read are the ones the winner wrote.
    pub fn take(&self) -> Option<DataFault> {
        let w = self.words();
        let code = w.code.load(Ordering::Acquire);
        if code == 0 {
            return None;
        }
        let fault = DataFault {
            code,
            dim: w.dim.load(Ordering::Acquire),
            value: w.value.load(Ordering::Acquire),
            bound: w.bound.load(Ordering::Acquire),
            position: w.position.load(Ordering::Acquire),
        };
        w.code.store(0, Ordering::Release);
        Some(fault)
    }
}

impl Drop for FaultRecord {
    fn drop(&mut self) {
        if let Some(free) = self.free.take() {
            free(self.words);
        }
    }
}

impl fmt::Debug for FaultRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FaultRecord({:#x})", self.device_addr)
    }
}

thread_local! {
    /// The record of the stream whose work is running on this thread, or null.
    static CURRENT: Cell<*const FaultRecord> = const { Cell::new(std::ptr::null()) };
}

/// Run `f` with the fault record of the stream whose launched work is running on this
/// thread (`None` outside such work, or on a stream without one): how a kernel finds where
/// to report bad data.
pub fn with_current<R>(f: impl FnOnce(Option<&FaultRecord>) -> R) -> R {
    let p = CURRENT.with(Cell::get);
    // SAFETY: `CURRENT` is non-null only inside `running`, with a pointer to a record that
    // outlives that call; it is reset before `running` returns (also on unwinding), and `f`
    // cannot keep the reference (the borrow ends with `f`).
    f(if p.is_null() { None } else { Some(unsafe { &*p }) })
}

/// Report `fault` to the current stream's record ([`with_current`]); false when there is no
/// record, or a fault is recorded already.
pub fn report(fault: DataFault) -> bool {
    with_current(|r| r.is_some_and(|r| r.report(fault)))
}

/// Resets `CURRENT` when dropped (also on unwinding).
struct Restore(*const FaultRecord);

impl Drop for Restore {
    fn drop(&mut self) {
        CURRENT.with(|c| c.set(self.0));
    }
}

/// Run `work` with `record` as the thread's current record (the stream backends call it
/// around launched work).
pub fn running<R>(record: Option<&FaultRecord>, work: impl FnOnce() -> R) -> R {
    let p = record.map_or(std::ptr::null(), |r| r as *const FaultRecord);
    let _restore = Restore(CURRENT.with(|c| c.replace(p)));
    work()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fault(code: FaultCode, value: i64) -> DataFault {
        DataFault { code: code as u32, dim: 1, value, bound: 5, position: 3 }
    }

    #[test]
    fn the_first_fault_wins_and_take_resets() {
        let r = FaultRecord::host();
        assert_eq!(r.take(), None);
        assert!(r.report(fault(FaultCode::Index, 7)));
        assert!(!r.report(fault(FaultCode::Index, 9)));
        assert_eq!(r.take(), Some(fault(FaultCode::Index, 7)));
        assert_eq!(r.take(), None);
        assert!(r.report(fault(FaultCode::Target, -2)));
        assert_eq!(r.take().map(|f| f.value), Some(-2));
    }

    #[test]
    fn messages_are_the_cpu_kernels() {
        assert_eq!(
            fault(FaultCode::Index, 7).message("index_select"),
            "index_select: index 7 is out of range for dimension 1 of size 5"
        );
        assert_eq!(
            fault(FaultCode::Class, 5).message("one_hot"),
            "one_hot: class index 5 is outside 0..5 (num_classes=5)"
        );
        assert_eq!(
            fault(FaultCode::Target, 5).message("nll_loss"),
            "target 5 is out of bounds: the classes are 0 to 4"
        );
        assert!(DataFault { code: 99, ..fault(FaultCode::Index, 1) }.message("op").contains("code 99"));
    }

    #[test]
    fn the_current_record_is_set_only_while_running() {
        let r = FaultRecord::host();
        assert!(!report(fault(FaultCode::Index, 1)));
        running(Some(&r), || {
            assert!(with_current(|c| c.is_some()));
            assert!(report(fault(FaultCode::Index, 2)));
        });
        assert!(with_current(|c| c.is_none()));
        assert_eq!(r.take().map(|f| f.value), Some(2));
    }
}
