//! What `eagervm analyze` does with a trace's graph: write it as DOT, and render it to SVG
//! with graphviz `dot` within a time bound.
//!
//! `dot` reads the graph on its standard input and writes the SVG on its standard output,
//! so that this module writes every file itself and reports a failed write (a full disk)
//! with the file's name. The child runs in a process group of its own; when it has not
//! finished within the bound, the whole group is killed (a `dot` started by a wrapper
//! script dies with it) and the error says how long it ran and what to do.

use std::ffi::OsStr;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Why rendering a graph failed.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    /// The graphviz program could not be started.
    #[error("graphviz `{program}` could not be run ({source}): install graphviz (e.g. `apt-get install graphviz`), or write the graph with --dot FILE and render it elsewhere")]
    NotInstalled {
        /// The program.
        program: String,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
    /// It ran longer than the bound and was killed.
    #[error("graphviz `{program}` did not finish within {} s and was stopped: draw fewer nodes (--max-nodes), or allow more time (--render-timeout SECS)", timeout.as_secs_f64())]
    TimedOut {
        /// The program.
        program: String,
        /// The bound.
        timeout: Duration,
    },
    /// It exited with an error.
    #[error("graphviz `{program}` failed ({status}): {stderr}")]
    Failed {
        /// The program.
        program: String,
        /// Its exit status.
        status: String,
        /// What it printed on standard error.
        stderr: String,
    },
    /// A file could not be written, or the pipe to the child failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file (or the program, for a pipe).
        path: PathBuf,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
}

/// The default bound on `dot`'s time.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// Write `bytes` to `path`, naming the file in the error (a full disk, a missing folder).
pub fn write_file(path: &Path, bytes: &[u8]) -> Result<(), RenderError> {
    std::fs::write(path, bytes).map_err(|source| RenderError::Io { path: path.to_path_buf(), source })
}

/// Render the DOT `dot` to SVG in `svg` with the graphviz program `program` (`dot` on the
/// `PATH` for the command line), killing it after `timeout`.
pub fn render_svg(program: &OsStr, dot: &str, svg: &Path, timeout: Duration) -> Result<(), RenderError> {
    let name = program.to_string_lossy().into_owned();
    let mut cmd = Command::new(program);
    cmd.arg("-Tsvg").stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    #[cfg(unix)]
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let mut child =
        cmd.spawn().map_err(|source| RenderError::NotInstalled { program: name.clone(), source })?;
    let (Some(mut stdin), Some(mut stdout), Some(mut stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        kill_group(&mut child);
        let source = std::io::Error::other("a pipe to the child is missing");
        return Err(RenderError::Io { path: PathBuf::from(name), source });
    };
    let started = Instant::now();
    let (status, out, err) = std::thread::scope(|scope| {
        // Feeding and draining from threads of their own: a child that neither reads nor
        // exits must not block this one, which keeps the time.
        let feed = scope.spawn(move || {
            // A child that exits without reading everything closes the pipe; its status says why.
            let _ = stdin.write_all(dot.as_bytes());
        });
        let out = scope.spawn(move || {
            let mut v = Vec::new();
            stdout.read_to_end(&mut v).map(|_| v)
        });
        let err = scope.spawn(move || {
            let mut v = Vec::new();
            let _ = stderr.read_to_end(&mut v);
            v
        });
        let status = wait_bounded(&mut child, timeout);
        if !matches!(status, Ok(Some(_))) {
            kill_group(&mut child);
        }
        let _ = feed.join();
        let out = out.join().unwrap_or_else(|_| Ok(Vec::new()));
        let err = err.join().unwrap_or_default();
        (status, out, err)
    });
    let status = match status {
        Ok(Some(s)) => s,
        Ok(None) => return Err(RenderError::TimedOut { program: name, timeout }),
        Err(source) => return Err(RenderError::Io { path: PathBuf::from(name), source }),
    };
    if !status.success() {
        let stderr = String::from_utf8_lossy(&err).trim().to_string();
        return Err(RenderError::Failed { program: name, status: status.to_string(), stderr });
    }
    let out = out.map_err(|source| RenderError::Io { path: PathBuf::from(&name), source })?;
    tracing::debug!(elapsed = ?started.elapsed(), bytes = out.len(), "graphviz rendered the graph");
    write_file(svg, &out)
}

/// Wait for `child` up to `timeout`: its status, or `None` if it is still running. Polls
/// with sleeps growing to 50 ms (a render takes seconds; nothing spins).
fn wait_bounded(
    child: &mut std::process::Child,
    timeout: Duration,
) -> std::io::Result<Option<std::process::ExitStatus>> {
    let deadline = Instant::now() + timeout;
    let mut nap = Duration::from_millis(1);
    loop {
        if let Some(s) = child.try_wait()? {
            return Ok(Some(s));
        }
        let now = Instant::now();
        if now >= deadline {
            return Ok(None);
        }
        std::thread::sleep(nap.min(deadline - now));
        nap = (nap * 2).min(Duration::from_millis(50));
    }
}

/// Kill `child` and everything in its process group, and reap it.
fn kill_group(child: &mut std::process::Child) {
    #[cfg(unix)]
    if let Ok(pgid) = libc::pid_t::try_from(child.id()) {
        // SAFETY: `kill` takes plain integers and touches no memory of ours; the child is
        // not yet reaped (no `wait` has returned its status), so its pid, which is also its
        // process group's id (`process_group(0)`), cannot have been reused.
        unsafe {
            libc::kill(-pgid, libc::SIGKILL);
        }
    }
    let _ = child.kill();
    let _ = child.wait();
}
