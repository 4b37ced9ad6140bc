//! The layers of the crate and the one check that keeps their arrows pointing down.
//!
//! Each top-level module sits in one layer; a module may name (`crate::x`, in code or in
//! doc links) only modules of lower layers, never one of its own layer or above.
//! `docs/architecture.md` ("Layers") draws the same table. The test reads every source
//! file under `src/` and fails, naming the file and line, on an arrow back up.
//!
//! Inside the folders of [`NO_CIRCLES`], the files are layered too: the code of one file
//! (not its docs, not its tests) names its siblings (`super::x`, `crate::alloc::x`) without
//! a circle, so that each file can be read knowing only the files it names. An item named
//! through a module that re-exports it (`super::Engine`, which `vm/mod.rs` takes from
//! `vm/engine/mod.rs`, which defines it) names the file it comes from. A folder's `mod.rs`
//! declaring and dispatching to its own files is not an arrow: to the files outside it, a
//! folder is one module.

/// Top-level modules, lowest layer first; the modules of one entry are siblings that do
/// not name each other.
pub(crate) const LAYERS: &[&[&str]] = &[
    &["sync"],
    &["ep"],
    &["alloc"],
    &["vm"],
    &["kernels", "profile"],
    &["framework"],
    &["eager"],
    &["trace", "programs"],
    &["bench"],
    &["cli", "python"],
];

/// Top-level modules whose files name each other without a circle (module docs).
pub(crate) const NO_CIRCLES: &[&str] = &["alloc", "python", "vm"];

/// The layer of top-level module `name`, if it has one.
fn layer_of(name: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&name))
}

/// The top-level modules `line` names through `crate::` paths (`crate::a::…`,
/// `crate::{a, b::…}`), excluding macro paths (`$crate`).
fn named_modules(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(i) = rest.find("crate::") {
        let before = &rest[..i];
        let after = &rest[i + "crate::".len()..];
        rest = after;
        if before.ends_with('$') || before.ends_with(|c: char| c.is_alphanumeric() || c == '_') {
            continue;
        }
        if let Some(group) = after.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for item in group[..end].split(',') {
                let name: String =
                    item.trim().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                out.push(name);
            }
        } else {
            out.push(after.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect());
        }
    }
    out
}

/// The paths (`["dlpack", "ffi"]`, relative to the top-level module) that the code of
/// `line`, in the module at `here` under top-level module `top`, names through `super::` or
/// `crate::top::` paths: each path's leading lowercase segments and the item after them, if
/// any (`["host", "HostAllocator"]`), which the caller resolves to the file that defines it.
fn named_siblings(line: &str, top: &str, here: &[String]) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    // The leading lowercase segments, then the first other identifier (an item), if any.
    let ident = |s: &str| -> Vec<String> {
        let mut segs = Vec::new();
        for seg in s.split("::") {
            let name: String = seg
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            if name.is_empty() {
                let item: String = seg.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                if !item.is_empty() {
                    segs.push(item);
                }
                break;
            }
            let whole = name.len() == seg.len();
            segs.push(name);
            if !whole {
                break;
            }
        }
        segs
    };
    let code = line.split("//").next().unwrap_or("");
    let crate_prefix = format!("crate::{top}::");
    let mut i = 0;
    while i < code.len() {
        let rest = &code[i..];
        let before = code[..i].chars().next_back();
        let boundary = !before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':' || c == '$');
        let (base, after) = if boundary && rest.starts_with("super::") {
            let mut base = Some(here.to_vec());
            let mut after = rest;
            while let Some(r) = after.strip_prefix("super::") {
                // Above the top-level module (`pop` of the empty path): not a sibling.
                base = base.and_then(|mut b| b.pop().map(|_| b));
                after = r;
            }
            (base, after)
        } else if boundary && rest.starts_with(&crate_prefix) {
            (Some(Vec::new()), &rest[crate_prefix.len()..])
        } else {
            i += rest.chars().next().map_or(1, char::len_utf8);
            continue;
        };
        i = code.len() - after.len();
        let Some(base) = base else { continue };
        // A group, at once (`super::{a, b}`) or after a path (`super::a::{B, C}`).
        let path_len =
            after.find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':')).unwrap_or(after.len());
        let (base, after) = match after[..path_len].strip_suffix("::") {
            Some(prefix) if after[path_len..].starts_with('{') => {
                let mut b = base;
                b.extend(ident(prefix));
                (b, &after[path_len..])
            }
            _ => (base, after),
        };
        let items: Vec<&str> = match after.strip_prefix('{') {
            Some(group) => {
                group[..group.find('}').unwrap_or(group.len())].split(',').map(str::trim).collect()
            }
            None => vec![after],
        };
        for item in items {
            let mut path = base.clone();
            path.extend(ident(item));
            out.push(path);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, BTreeSet};
    use std::path::{Path, PathBuf};

    fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("readable source folder") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                rust_files(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }

    #[test]
    fn every_top_level_module_has_a_layer() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        for entry in std::fs::read_dir(&src).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_stem().unwrap().to_str().unwrap().to_string();
            if ["lib", "main", "layers", "bin"].contains(&name.as_str()) {
                continue;
            }
            assert!(layer_of(&name).is_some(), "src/{name} is in no layer of `LAYERS`");
        }
    }

    #[test]
    fn no_module_names_one_of_its_layer_or_above() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        let mut arrows_up = Vec::new();
        let mut arrows = 0;
        for file in &files {
            let rel = file.strip_prefix(&src).unwrap();
            let top = rel.components().next().unwrap().as_os_str().to_str().unwrap();
            let top = top.strip_suffix(".rs").unwrap_or(top);
            let Some(mine) = layer_of(top) else { continue };
            let text = std::fs::read_to_string(file).unwrap();
            for (n, line) in text.lines().enumerate() {
                for name in named_modules(line) {
                    // Root items (`crate::Error`, `crate::VirtualMachine`) are re-exports:
                    // their home module is named where they are defined.
                    let Some(theirs) = layer_of(&name) else { continue };
                    if name == top {
                        continue;
                    }
                    arrows += 1;
                    if theirs >= mine {
                        arrows_up.push(format!("src/{}:{}: {top} names {name}", rel.display(), n + 1));
                    }
                }
            }
        }
        assert!(arrows > 100, "the check found only {arrows} arrows: is it reading the sources?");
        assert!(arrows_up.is_empty(), "arrows back up:\n{}", arrows_up.join("\n"));
    }

    /// The module path of `file` under the folder `dir` of a top-level module.
    fn module_path(dir: &Path, file: &Path) -> Vec<String> {
        let rel = file.strip_prefix(dir).unwrap().with_extension("");
        let mut path: Vec<String> =
            rel.components().map(|c| c.as_os_str().to_str().unwrap().to_string()).collect();
        if path.last().is_some_and(|l| l == "mod") {
            path.pop();
        }
        path
    }

    /// The items module `here` (whose code is `code`) re-exports, `use`s or declares, each
    /// with the path it comes from, relative to the top-level module: `use x::{A, B};` and
    /// `use x::A;` (also `pub`, `pub(crate)`), relative to `here`, `super::` or `crate::top::`.
    fn imports(code: &str, top: &str, here: &[String]) -> BTreeMap<String, Vec<String>> {
        let mut out = BTreeMap::new();
        let flat: String =
            code.lines().filter(|l| !l.trim_start().starts_with("//")).collect::<Vec<_>>().join(" ");
        for stmt in flat.split(';') {
            let Some(at) = stmt.find("use ") else { continue };
            let before = stmt[..at].trim();
            if !(before.is_empty()
                || before.ends_with("pub")
                || before.ends_with(')')
                || before.ends_with('}'))
            {
                continue;
            }
            let body = stmt[at + 4..].trim();
            let (prefix, items): (&str, Vec<&str>) = match body.find("::{") {
                Some(i) => {
                    let group = body[i + 3..].trim_end_matches('}');
                    (&body[..i], group.split(',').map(str::trim).collect())
                }
                None => match body.rfind("::") {
                    Some(i) => (&body[..i], vec![&body[i + 2..]]),
                    None => continue,
                },
            };
            let base: Option<Vec<String>> = if let Some(rest) = prefix.strip_prefix(&format!("crate::{top}"))
            {
                Some(
                    rest.trim_start_matches("::")
                        .split("::")
                        .filter(|s| !s.is_empty())
                        .map(String::from)
                        .collect(),
                )
            } else if prefix.starts_with("super") {
                let mut b = here.to_vec();
                let mut segs = prefix.split("::").peekable();
                let mut ok = true;
                while segs.peek() == Some(&"super") {
                    segs.next();
                    ok &= b.pop().is_some();
                }
                b.extend(segs.map(String::from));
                ok.then_some(b)
            } else if prefix.starts_with(|c: char| c.is_ascii_lowercase())
                && !prefix.starts_with("crate")
                && !prefix.starts_with("std")
                && !prefix.starts_with("self")
            {
                // A child module's item (`use engine::Parts` in `vm/mod.rs`); an outside
                // crate's path never resolves to one of the folder's modules.
                let mut b = here.to_vec();
                b.extend(prefix.split("::").map(String::from));
                Some(b)
            } else {
                None
            };
            let Some(base) = base else { continue };
            for item in items {
                let name = item.split(" as ").last().unwrap_or(item).trim();
                let source = item.split(" as ").next().unwrap_or(item).trim();
                if name.is_empty() || name == "self" || name == "*" {
                    continue;
                }
                let mut path = base.clone();
                path.push(source.to_string());
                out.insert(name.to_string(), path);
            }
        }
        out
    }

    /// The arrows between the files of top-level module `top`: each file's module path and
    /// the files its code names.
    fn sibling_arrows(top: &str) -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src").join(top);
        let mut files = Vec::new();
        rust_files(&dir, &mut files);
        let modules: BTreeSet<Vec<String>> = files.iter().map(|f| module_path(&dir, f)).collect();
        let code_of = |file: &PathBuf| -> String {
            let text = std::fs::read_to_string(file).unwrap();
            text.split("#[cfg(test)]\nmod tests").next().unwrap().to_string()
        };
        let reexports: BTreeMap<Vec<String>, BTreeMap<String, Vec<String>>> = files
            .iter()
            .map(|f| {
                let here = module_path(&dir, f);
                let map = imports(&code_of(f), top, &here);
                (here, map)
            })
            .collect();
        // The file that defines what `path` names: the longest module prefix of it, followed
        // through that module's imports while the segment after it is one of them.
        let resolve = |mut path: Vec<String>| -> Vec<String> {
            for _ in 0..16 {
                let mut m = path.clone();
                while !m.is_empty() && !modules.contains(&m) {
                    m.pop();
                }
                let next = path.get(m.len());
                match next.and_then(|n| reexports.get(&m).and_then(|r| r.get(n))) {
                    Some(to) if *to != path => {
                        let mut p = to.clone();
                        p.extend(path[m.len() + 1..].iter().cloned());
                        path = p;
                    }
                    _ => return m,
                }
            }
            path
        };
        let mut arrows = BTreeMap::new();
        for file in &files {
            let here = module_path(&dir, file);
            let code = code_of(file);
            let mut named = BTreeSet::new();
            for line in code.lines().filter(|l| !l.trim_start().starts_with("//")) {
                for path in named_siblings(line, top, &here) {
                    let path = resolve(path);
                    // The folder's own `mod.rs` (items it defines itself) and the file itself
                    // are not arrows between siblings.
                    if !path.is_empty() && path != here {
                        named.insert(path);
                    }
                }
            }
            arrows.insert(here, named);
        }
        arrows
    }

    /// A circle among `arrows`, as the files on it, if there is one.
    fn find_circle(arrows: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Option<Vec<String>> {
        fn visit<'a>(
            at: &'a Vec<String>,
            arrows: &'a BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
            done: &mut BTreeSet<&'a Vec<String>>,
            stack: &mut Vec<&'a Vec<String>>,
        ) -> Option<Vec<String>> {
            if let Some(i) = stack.iter().position(|s| *s == at) {
                return Some(stack[i..].iter().chain([&at]).map(|p| p.join("/")).collect());
            }
            if !done.insert(at) {
                return None;
            }
            stack.push(at);
            for next in arrows.get(at).into_iter().flatten() {
                if let Some(c) = visit(next, arrows, done, stack) {
                    return Some(c);
                }
            }
            stack.pop();
            None
        }
        let mut done = BTreeSet::new();
        arrows.keys().find_map(|k| visit(k, arrows, &mut done, &mut Vec::new()))
    }

    #[test]
    fn no_file_circle_in_the_folders_that_forbid_one() {
        for top in NO_CIRCLES {
            let arrows = sibling_arrows(top);
            let count: usize = arrows.values().map(BTreeSet::len).sum();
            assert!(
                count > 5,
                "the check found only {count} arrows in src/{top}: is it reading the sources?"
            );
            if let Some(circle) = find_circle(&arrows) {
                panic!("a circle of files in src/{top}: {}", circle.join(" -> "));
            }
        }
    }

    #[test]
    fn a_circle_of_files_is_found() {
        let p = |s: &str| s.split('/').map(String::from).collect::<Vec<_>>();
        let mut arrows = BTreeMap::new();
        arrows.insert(p("host"), BTreeSet::from([p("size_class")]));
        arrows.insert(p("size_class"), BTreeSet::new());
        assert_eq!(find_circle(&arrows), None);
        arrows.insert(p("thread_cache"), BTreeSet::from([p("host")]));
        arrows.insert(p("host"), BTreeSet::from([p("size_class"), p("thread_cache")]));
        assert_eq!(find_circle(&arrows), Some(vec!["host".into(), "thread_cache".into(), "host".into()]));
    }

    #[test]
    fn sibling_paths_are_read_as_the_compiler_reads_them() {
        let here = |s: &str| s.split('/').map(String::from).collect::<Vec<_>>();
        let p = |s: &str| if s.is_empty() { Vec::new() } else { here(s) };
        assert_eq!(
            named_siblings("use super::host::HostAllocator;", "alloc", &here("storage")),
            [p("host/HostAllocator")]
        );
        assert_eq!(
            named_siblings("use super::{lend, thread_cache};", "alloc", &here("storage")),
            [p("lend"), p("thread_cache")]
        );
        assert_eq!(
            named_siblings("use crate::python::shared::Shared;", "python", &here("dlpack/export")),
            [p("shared/Shared")]
        );
        assert_eq!(
            named_siblings("use super::ffi::DL_CUDA;", "python", &here("dlpack/export")),
            [p("dlpack/ffi/DL_CUDA")]
        );
        assert_eq!(
            named_siblings("super::super::wait::wait(py)", "python", &here("dlpack/export")),
            [p("wait/wait")]
        );
        assert_eq!(
            named_siblings(
                "use super::super::engine::{Parts, VmStream};",
                "vm",
                &here("stream_policy/event")
            ),
            [p("engine/Parts"), p("engine/VmStream")]
        );
        // An item of the folder's root module: the root and the item.
        assert_eq!(
            named_siblings("use super::{Engine, StreamPolicy};", "vm", &here("scheduler")),
            [p("Engine"), p("StreamPolicy")]
        );
        // Above the top-level module, or in a comment: nothing.
        assert!(named_siblings("use super::super::scheduler::X;", "vm", &here("stream_policy")).is_empty());
        assert!(named_siblings("x(); // see super::host", "alloc", &here("storage")).is_empty());
    }

    #[test]
    fn a_re_export_is_followed_to_where_it_comes_from() {
        let here = |s: &str| s.split('/').map(String::from).collect::<Vec<_>>();
        let code = "pub(crate) use engine::{Engine, EngineRef as Named};\npub use stream::StreamId;\n\
                    use super::super::x::Y;\nuse crate::vm::flight::{self, Flight};\nuse std::sync::Arc;";
        let m = imports(code, "vm", &[]);
        assert_eq!(m.get("Engine"), Some(&here("engine/Engine")));
        assert_eq!(m.get("Named"), Some(&here("engine/EngineRef")));
        assert_eq!(m.get("StreamId"), Some(&here("stream/StreamId")));
        assert_eq!(m.get("Flight"), Some(&here("flight/Flight")));
        assert!(!m.contains_key("Y") && !m.contains_key("Arc") && !m.contains_key("self"), "{m:?}");
        let m = imports("pub use super::dtype::{DType, Element};", "vm", &here("tensor"));
        assert_eq!(m.get("DType"), Some(&here("dtype/DType")));
    }

    #[test]
    fn the_device_vocabulary_names_nothing_in_the_crate() {
        let leaf = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/ep/types.rs");
        let text = std::fs::read_to_string(leaf).unwrap();
        let named: Vec<String> = text.lines().flat_map(named_modules).collect();
        assert!(named.is_empty(), "ep::types names {named:?}");
    }

    #[test]
    fn paths_are_read_as_the_compiler_reads_them() {
        assert_eq!(named_modules("use crate::vm::{Engine, Error};"), ["vm"]);
        assert_eq!(named_modules("use crate::{alloc::Storage, ep::DeviceId};"), ["alloc", "ep"]);
        assert_eq!(named_modules("$crate::vm::DType::F32 => crate::ep::X"), ["ep"]);
        assert_eq!(named_modules("/// see [`x`](crate::trace::Recorder)"), ["trace"]);
        assert!(named_modules("use eagervm::vm::Config;").is_empty());
    }
}
