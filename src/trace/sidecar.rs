//! Where a host write's `file=` slice is read from.
//!
//! The recorder writes large host writes to one sidecar beside the trace, named after it
//! (`pipeline.trace` → `pipeline.trace.bin`), and each `access ... file=` names that file.
//! A trace copied or renamed together with its sidecar (`cp a.trace b.trace; cp a.trace.bin
//! b.trace.bin`) still names the old sidecar. So a `file=` value is resolved, relative to
//! the trace's folder, as:
//!
//! 1. the trace's own sidecar, `<this trace's file name>.bin`, when the value is a bare file
//!    name ending in `.bin` (the only names the recorder writes), is not that name already,
//!    and that file exists;
//! 2. otherwise the named file.
//!
//! The slice's checksum, which the trace states, is checked whichever file it is read from.

use std::path::{Path, PathBuf};

use super::format::Trace;

/// The file a `file=` value of `trace` names (see the module docs).
pub(crate) fn resolve(trace: &Trace, named: &str) -> PathBuf {
    let as_named = trace.dir.join(named);
    let bare = Path::new(named).file_name().is_some_and(|n| n == Path::new(named).as_os_str());
    let Some(own) = own_sidecar(trace) else { return as_named };
    if !bare || !named.ends_with(".bin") || Path::new(named).file_name() == own.file_name() {
        return as_named;
    }
    if own.is_file() {
        own
    } else {
        as_named
    }
}

/// `<this trace's file name>.bin` in its folder (`None` for a trace built in memory).
fn own_sidecar(trace: &Trace) -> Option<PathBuf> {
    let name = Path::new(&trace.file).file_name()?;
    if trace.file.starts_with('<') {
        return None;
    }
    let mut own = name.to_os_string();
    own.push(".bin");
    Some(trace.dir.join(own))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trace_at(file: &str, dir: &Path) -> Trace {
        Trace { file: file.into(), dir: dir.to_path_buf(), ..Trace::default() }
    }

    #[test]
    fn a_copied_trace_reads_its_own_sidecar_when_it_has_one() {
        let dir = std::env::temp_dir().join(format!("eagervm-sidecar-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let t = trace_at(&dir.join("b.trace").display().to_string(), &dir);
        // No b.trace.bin yet: the named file.
        assert_eq!(resolve(&t, "a.trace.bin"), dir.join("a.trace.bin"));
        std::fs::write(dir.join("b.trace.bin"), b"x").unwrap();
        assert_eq!(resolve(&t, "a.trace.bin"), dir.join("b.trace.bin"));
        assert_eq!(resolve(&t, "b.trace.bin"), dir.join("b.trace.bin"));
        // Names with a folder, and names the recorder never writes, are taken as they are.
        assert_eq!(resolve(&t, "sub/a.trace.bin"), dir.join("sub/a.trace.bin"));
        assert_eq!(resolve(&t, "data.raw"), dir.join("data.raw"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
