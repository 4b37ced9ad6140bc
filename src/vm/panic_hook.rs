//! Quiet kernel panics: the panic hook that keeps a panic the VM catches off standard
//! error.
//!
//! A kernel that panics fails its instruction: the panic is caught on the thread that ran
//! it ([`catching`] wraps every such `catch_unwind`) and becomes an [`Error::Panic`] on the
//! tensors the instruction writes, which whoever waits on them gets, with the message. The
//! standard library's hook runs before any of that, at the panic itself, and would print
//! `thread '...' panicked at ...` (and a backtrace under `RUST_BACKTRACE=1`) for a failure
//! the program handles as a value. So the VM installs, once per process, a hook that says
//! nothing for a panic raised inside a [`catching`] scope on the current thread and hands
//! every other panic to the hook that was installed before it: the standard one, or one the
//! program set earlier. A hook the program sets after the VM started replaces this one
//! (and so sees kernel panics too).
//!
//! The scope is a per-thread depth counter, raised and lowered around each catch: once per
//! worker batch and once per instruction launched on an asynchronous stream, never a lock
//! or a system call.
//!
//! [`Error::Panic`]: crate::Error::Panic

use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Once;

thread_local! {
    /// How many [`catching`] scopes the current thread is in.
    static CATCHING: Cell<u32> = const { Cell::new(0) };
}

static INSTALL: Once = Once::new();

/// Install the hook (the first call in the process does; later ones return at once).
pub(crate) fn install() {
    INSTALL.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if CATCHING.with(Cell::get) == 0 {
                previous(info);
            }
        }));
    });
}

/// Run `f`, catching a panic, which the hook keeps quiet (the caller reports it as an
/// error).
#[inline]
pub(crate) fn catching<R>(f: impl FnOnce() -> R) -> std::thread::Result<R> {
    CATCHING.with(|c| c.set(c.get() + 1));
    let r = catch_unwind(AssertUnwindSafe(f));
    CATCHING.with(|c| c.set(c.get() - 1));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_caught_panic_is_returned_and_the_scope_closes() {
        install();
        let r = catching(|| -> u32 { panic!("planted") });
        let payload = r.unwrap_err();
        assert_eq!(payload.downcast_ref::<&str>(), Some(&"planted"));
        assert_eq!(CATCHING.with(Cell::get), 0);
        assert_eq!(catching(|| 7).unwrap(), 7);
    }
}
