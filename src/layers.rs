//! The layers of the crate and the one check that keeps their arrows pointing down.
//!
//! Each top-level module sits in one layer; a module may name (`crate::x`, in code or in
//! doc links) only modules of lower layers, never one of its own layer or above.
//! `docs/architecture.md` ("Layers") draws the same table. The test reads every source
//! file under `src/` and fails, naming the file and line, on an arrow back up.

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

#[cfg(test)]
mod tests {
    use super::*;
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
