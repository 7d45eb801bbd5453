//! The layers of the workspace's code, read from the source: each `crate::X`, `super::X` or
//! `msmemscope_core::events::X` path outside test code names a module X its file depends on,
//! and a module may depend only on layers below its own.
//! - `crates/core/src/events` (its `mod.rs` lists the layers): no exception.
//! - `crates/runtime/src` (ARCHITECTURE.md lists the layers): no exception; the adapters of the
//!   top layer (ffi, control, lifecycle, marks) may call each other.
//! - `crates/core/src` and `crates/cli/src`, their top-level modules: no two name each other,
//!   directly or through others (no circle).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The layer of `module` in `table` (prefix, layer): the first prefix that is the module or a
/// folder above it.
fn layer_in(table: &[(&str, u32)], module: &str) -> Option<u32> {
    table
        .iter()
        .find(|(prefix, _)| module == *prefix || module.starts_with(&format!("{prefix}/")))
        .map(|(_, layer)| *layer)
}

/// The layer of a module of `events`, by its path below `events/` (first match wins).
fn layer(module: &str) -> Option<u32> {
    const LAYERS: [(&str, u32); 16] = [
        // The names of a dump's files and what a bounded dump covers (its summary read as a
        // regular file, through source): the reader and the Parquet export use it.
        ("parts", 3),
        // How the run that wrote a dump ended (its logs): the reader says it.
        ("run_end", 3),
        ("attrs", 0),
        ("row", 1),
        // The producers' ABI renders a block row's Attr into a row, with what the check keeps.
        ("abi", 2),
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
    layer_in(&LAYERS, module)
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
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
    dependencies_with(
        module,
        text,
        &["crate::events::", "msmemscope_core::events::"],
    )
}

/// [`dependencies`] for paths that start with any of `prefixes` (and `super::`), in the whole
/// file: its code and its test module (`#[cfg(test)] mod tests`, the file's last item by
/// custom), where `super::` is the file's own module.
fn dependencies_with(module: &str, text: &str, prefixes: &[&str]) -> Vec<String> {
    let (mut code, tests) = code_and_test_dependencies(module, text, prefixes);
    code.extend(tests);
    code
}

/// [`dependencies_with`], the code's and the test module's apart.
fn code_and_test_dependencies(
    module: &str,
    text: &str,
    prefixes: &[&str],
) -> (Vec<String>, Vec<String>) {
    let tests_at = text
        .match_indices("#[cfg(test)]")
        .map(|(i, _)| i)
        .find(|&i| {
            text[i + "#[cfg(test)]".len()..]
                .trim_start()
                .starts_with("mod ")
        });
    let (code, tests) = text.split_at(tests_at.unwrap_or(text.len()));
    (
        dependencies_in(module, code, prefixes),
        dependencies_in(&format!("{module}/tests"), tests, prefixes),
    )
}

/// The dependencies of `code`, whose `super::` is `module`'s parent.
fn dependencies_in(module: &str, code: &str, prefixes: &[&str]) -> Vec<String> {
    let mut found = Vec::new();
    // `super::` from this module: its parent's path.
    let parent: Vec<&str> = module.split('/').collect();
    let code: String = code
        .lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    let ident = |text: &str| -> String {
        text.trim_start()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    for prefix in prefixes {
        for (i, _) in code.match_indices(prefix) {
            let rest = &code[i + prefix.len()..];
            if let Some(group) = rest.strip_prefix('{') {
                // `use crate::{a::b, c};`: the first name of each top-level item.
                let (mut depth, mut item_start) = (0, true);
                for (j, c) in group.char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' if depth == 0 => break,
                        '}' => depth -= 1,
                        ',' if depth == 0 => item_start = true,
                        _ if item_start && !c.is_whitespace() => {
                            found.push(ident(&group[j..]));
                            item_start = false;
                        }
                        _ => {}
                    }
                }
            } else {
                found.push(ident(rest));
            }
        }
    }
    for (i, _) in code.match_indices("super::") {
        if i >= 2 && &code[i - 2..i] == "::" {
            continue;
        }
        // Count `super::super::...`.
        let mut rest = &code[i..];
        let mut ups = 0;
        while let Some(r) = rest.strip_prefix("super::") {
            ups += 1;
            rest = r;
        }
        let name = ident(rest);
        if parent.len() >= ups {
            let mut path: Vec<&str> = parent[..parent.len() - ups].to_vec();
            path.push(&name);
            found.push(path.join("/"));
        }
    }
    found
}

/// Every import below `root` (paths starting with one of `prefixes`) that `is_upward` refuses:
/// `module (layer own) -> dependency (layer theirs)`, sorted. Within one folder the table
/// decides too: a file may use its siblings of its own layer (a folder is one module to the
/// rest), and a sibling the table puts higher (`events/parquet/export`) is an upward import;
/// names outside the table (a function reached through `super::`) are not checked. A test
/// module (or a `tests.rs`) may also use the modules `tests_may_use` names for its module, to
/// check it against them; an entry no test uses any more is reported too.
fn upward_imports(
    root: &Path,
    min_files: usize,
    prefixes: &[&str],
    layer: fn(&str) -> Option<u32>,
    is_upward: fn(&str, u32, u32) -> bool,
    tests_may_use: &[(&str, &str)],
) -> Vec<String> {
    let mut files = Vec::new();
    sources(root, &mut files);
    assert!(files.len() > min_files, "{files:?}");
    let top = |m: &str| m.split('/').next().unwrap_or("").to_string();
    let mut upward = Vec::new();
    let mut used_exceptions = BTreeSet::new();
    for file in &files {
        let module = module_of(file.strip_prefix(root).unwrap());
        let own = layer(&module).unwrap_or_else(|| panic!("no layer for {module}"));
        let text = std::fs::read_to_string(file).unwrap();
        let (mut code, mut tests) = code_and_test_dependencies(&module, &text, prefixes);
        if file.file_name().is_some_and(|n| n == "tests.rs") {
            tests.append(&mut code);
        }
        let tested = module.strip_suffix("/tests").unwrap_or(&module).to_string();
        let in_tests = code.len();
        for (i, dependency) in code.into_iter().chain(tests).enumerate() {
            if i >= in_tests {
                if let Some(exception) = tests_may_use.iter().find(|(m, d)| {
                    *m == tested && (dependency == *d || dependency.starts_with(&format!("{d}/")))
                }) {
                    used_exceptions.insert(*exception);
                    continue;
                }
            }
            if dependency.is_empty() {
                continue;
            }
            let Some(theirs) = layer(&dependency) else {
                continue;
            };
            if top(&dependency) == top(&module) && theirs == own {
                continue;
            }
            if is_upward(&module, own, theirs) {
                upward.push(format!(
                    "{module} (layer {own}) -> {dependency} (layer {theirs})"
                ));
            }
        }
    }
    for exception in tests_may_use {
        if !used_exceptions.contains(exception) {
            upward.push(format!(
                "unused exception: {} tests use {}",
                exception.0, exception.1
            ));
        }
    }
    upward.sort();
    upward.dedup();
    upward
}

#[test]
fn events_modules_import_only_from_lower_layers() {
    // The check itself: a file that imports upward is found.
    let upward_example = dependencies("row", "use crate::events::reader::open;\n");
    assert_eq!(upward_example, ["reader"]);
    // A test module is read too, its `super::` being the file's module; a sibling in the same
    // folder is named by its path, which the table may put higher (parquet/export).
    let test_module = "fn f() {}\n#[cfg(test)]\nmod tests {\n    use super::f;\n    use crate::events::reader::open;\n}\n";
    assert_eq!(dependencies("row", test_module), ["reader", "row/f"]);
    assert_eq!(
        dependencies("parquet/writer", "use super::export::run;"),
        ["parquet/export"]
    );
    assert!(layer("parquet/export") > layer("parquet/writer"));
    let upward = upward_imports(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src/events"),
        20,
        &["crate::events::", "msmemscope_core::events::"],
        layer,
        |module, own, theirs| theirs >= own && module != "mod",
        // The producers' block rows are rendered here; its test checks the text with the
        // reader's own Attr check, which the rows must pass.
        // The Parquet tests write a dump with the CSV writer, convert it and read it back:
        // the round trip is what they check.
        &[
            ("abi/block", "reader"),
            ("parquet", "csv"),
            ("parquet", "parquet/export"),
            ("parquet", "reader"),
        ],
    );
    assert!(
        upward.is_empty(),
        "imports from a layer not below:\n{}",
        upward.join("\n")
    );
}

/// The layer of a module of the runtime, by its path below `src/` (first match wins).
fn runtime_layer(module: &str) -> Option<u32> {
    const LAYERS: [(&str, u32); 27] = [
        ("clock", 0),
        ("libc_heap", 0),
        ("hashing", 0),
        ("guard", 0),
        ("spare_fd", 0),
        ("process", 0),
        ("log", 1),
        ("private_alloc", 1),
        ("raw_thread", 1),
        ("forward", 1),
        ("unwind", 2),
        ("python", 3),
        ("sanitizer", 4),
        ("pipeline", 5),
        ("host_leak", 5),
        ("session", 6),
        // The launched run's beginning: the hooks begin it at the first allocation.
        ("launch", 7),
        ("hooks", 8),
        // The adapters: the C ABI, the control channel (with its signals), start and exit,
        // marks. They may call each other.
        ("ffi", 9),
        ("control", 9),
        ("lifecycle", 9),
        ("marks", 9),
        ("lib", 10),
        ("mod", 10),
        ("", 10),
        ("main", 10),
        ("build", 10),
    ];
    layer_in(&LAYERS, module)
}

#[test]
fn runtime_modules_import_only_from_lower_layers() {
    // The check itself: grouped imports and `super::` paths are read.
    assert_eq!(
        dependencies_with(
            "hooks/malloc",
            "use crate::{guard::Entered, session};\nuse super::super::ffi::x;",
            &["crate::"]
        ),
        ["guard", "session", "ffi"]
    );
    // The adapters (layer 9) may call each other; below them a layer calls only lower ones.
    let upward = upward_imports(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("../runtime/src"),
        40,
        &["crate::"],
        runtime_layer,
        |_, own, theirs| theirs > own || (theirs == own && own < 9),
        &[],
    );
    assert!(
        upward.is_empty(),
        "imports from a layer not below:\n{}",
        upward.join("\n")
    );
}

/// The top-level modules of the crate in `src` and the top-level modules each one's code
/// names (the crate root, which declares them all, left out).
fn module_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    sources(src, &mut files);
    let top = |m: &str| m.split('/').next().unwrap_or("").to_string();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let module = module_of(file.strip_prefix(src).unwrap());
        let own = top(&module);
        if matches!(own.as_str(), "lib" | "main") {
            continue;
        }
        let text = std::fs::read_to_string(file).unwrap();
        let named = graph.entry(own.clone()).or_default();
        for dependency in dependencies_with(&module, &text, &["crate::"]) {
            let theirs = top(&dependency);
            if theirs != own && !theirs.is_empty() {
                named.insert(theirs);
            }
        }
    }
    graph
}

/// A circle of modules that name each other, if the graph has one.
fn circle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut found = path[at..].to_vec();
            found.push(node.to_string());
            return Some(found);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(found) = visit(next, graph, path, done) {
                return Some(found);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut Vec::new(), &mut done))
}

#[test]
fn core_and_cli_modules_form_no_circle() {
    // The check itself: a circle of three is found.
    let example: BTreeMap<String, BTreeSet<String>> = [("a", "b"), ("b", "c"), ("c", "a")]
        .into_iter()
        .map(|(from, to)| (from.to_string(), BTreeSet::from([to.to_string()])))
        .collect();
    assert_eq!(circle(&example).unwrap(), ["a", "b", "c", "a"]);
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    for src in [manifest.join("src"), manifest.join("../cli/src")] {
        let graph = module_graph(&src);
        assert!(graph.len() > 10, "{graph:?}");
        if let Some(found) = circle(&graph) {
            panic!(
                "{}: modules in a circle: {}",
                src.display(),
                found.join(" -> ")
            );
        }
    }
}
