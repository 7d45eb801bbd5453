//! The layers of `crates/core/src/events` (its `mod.rs` lists them): every module imports only
//! from layers below its own. Read from the source: each `crate::events::X`, `super::X` or
//! `msmemscope_core::events::X` path outside test code names the module X it depends on.

use std::path::{Path, PathBuf};

/// The layer of a module of `events`, by its path below `events/` (first match wins).
fn layer(module: &str) -> Option<u32> {
    const LAYERS: [(&str, u32); 14] = [
        ("abi", 0),
        ("attrs", 0),
        ("row", 1),
        ("source", 2),
        ("fields", 3),
        ("csv", 4),
        ("sqlite", 4),
        // The Parquet file's converter reads every dialect: it sits above them.
        ("parquet/export", 6),
        ("parquet", 4),
        ("original", 5),
        ("reader", 6),
        ("mod", 7),
        ("", 7),
        ("lib", 7),
    ];
    LAYERS
        .iter()
        .find(|(prefix, _)| module == *prefix || module.starts_with(&format!("{prefix}/")))
        .map(|(_, layer)| *layer)
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs")
            && path.file_name().is_some_and(|n| n != "tests.rs")
        {
            out.push(path);
        }
    }
}

/// The module path of a file below `events/` (`csv/read`, `csv` for `csv/mod.rs`).
fn module_of(relative: &Path) -> String {
    let text = relative.with_extension("").to_string_lossy().into_owned();
    text.strip_suffix("/mod")
        .map(str::to_string)
        .unwrap_or(text)
}

/// The `events` modules a file's non-test code names.
fn dependencies(module: &str, text: &str) -> Vec<String> {
    let code = text.split("#[cfg(test)]").next().unwrap_or("");
    let mut found = Vec::new();
    // `super::` from this module: its parent's path.
    let parent: Vec<&str> = module.split('/').collect();
    for line in code.lines() {
        let line = line.trim_start();
        if line.starts_with("//") {
            continue;
        }
        for prefix in ["crate::events::", "msmemscope_core::events::"] {
            for (i, _) in line.match_indices(prefix) {
                let rest = &line[i + prefix.len()..];
                found.push(
                    rest.chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect(),
                );
            }
        }
        for (i, _) in line.match_indices("super::") {
            if i >= 2 && &line[i - 2..i] == "::" {
                continue;
            }
            // Count `super::super::...`.
            let mut rest = &line[i..];
            let mut ups = 0;
            while let Some(r) = rest.strip_prefix("super::") {
                ups += 1;
                rest = r;
            }
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if parent.len() >= ups {
                let mut path: Vec<&str> = parent[..parent.len() - ups].to_vec();
                path.push(&name);
                found.push(path.join("/"));
            }
        }
    }
    found
}

#[test]
fn events_modules_import_only_from_lower_layers() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/events");
    let mut files = Vec::new();
    sources(&root, &mut files);
    assert!(files.len() > 20, "{files:?}");
    // The check itself: a file that imports upward is found.
    let upward_example = dependencies("row", "use crate::events::reader::open;\n");
    assert_eq!(upward_example, ["reader"]);
    let mut upward = Vec::new();
    for file in &files {
        let module = module_of(file.strip_prefix(&root).unwrap());
        let own = layer(&module).unwrap();
        let text = std::fs::read_to_string(file).unwrap();
        for dependency in dependencies(&module, &text) {
            // A module's own submodules and the items of its own folder are its own.
            let top = |m: &str| m.split('/').next().unwrap_or("").to_string();
            if top(&dependency) == top(&module) || dependency.is_empty() {
                continue;
            }
            let Some(theirs) = layer(&dependency) else {
                continue;
            };
            if theirs >= own && module != "mod" {
                upward.push(format!(
                    "{module} (layer {own}) -> {dependency} (layer {theirs})"
                ));
            }
        }
    }
    upward.sort();
    upward.dedup();
    assert!(
        upward.is_empty(),
        "imports from a layer not below:\n{}",
        upward.join("\n")
    );
}
