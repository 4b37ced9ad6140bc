//! Ctrl-C (SIGINT) for the commands that can stop early and still report: the first one
//! sets a flag that the command's [`Progress`](crate::trace::Progress) reads (a replay
//! then stops submitting, waits for what it submitted, prints its partial summary and
//! writes its partial timeline); a second one exits at once with
//! [`exit::INTERRUPTED`].
//!
//! Both are signal-hook's async-signal-safe actions, run in the handler itself: setting an
//! atomic flag, and `_exit` if the flag was already set. The handler for the exit is
//! registered first, so that it sees the flag as the first signal left it.
//!
//! Commands that do not install it keep the default disposition: SIGINT ends them at once
//! (a shell reports status 130).

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use signal_hook::consts::SIGINT;

use super::{exit, CliError};

/// Install the two-stage Ctrl-C handler; the flag it returns is set by the first SIGINT.
pub fn install() -> Result<Arc<AtomicBool>, CliError> {
    let flag = Arc::new(AtomicBool::new(false));
    let io = |e: std::io::Error| CliError::Io(format!("installing the SIGINT handler: {e}"));
    signal_hook::flag::register_conditional_shutdown(SIGINT, i32::from(exit::INTERRUPTED), Arc::clone(&flag))
        .map_err(io)?;
    signal_hook::flag::register(SIGINT, Arc::clone(&flag)).map_err(io)?;
    Ok(flag)
}
