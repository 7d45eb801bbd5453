//! Where this installation keeps its parts: the runtime library the launcher preloads and the
//! `msmemscope` Python package (a source tree's `python/`, or the `site-packages` the package
//! was installed into).

use std::path::{Path, PathBuf};

use msmemscope_core::launch_env;

/// Where the runtime library is: `MSMEMSCOPE_RUNTIME_LIB`, else next to this executable (a
/// `target/release` build), else in `../lib` (the installed package: `msmemscope/bin/` holds
/// this executable, `msmemscope/lib/` the library).
pub fn runtime_library() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os("MSMEMSCOPE_RUNTIME_LIB") {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(format!(
                "MSMEMSCOPE_RUNTIME_LIB={} is not a file",
                path.display()
            ))
        };
    }
    let exe =
        std::env::current_exe().map_err(|e| format!("cannot locate msmemscope itself: {e}"))?;
    let dir = exe.parent().unwrap_or(Path::new("/"));
    let beside = dir.join(launch_env::RUNTIME_LIBRARY);
    let installed = dir
        .parent()
        .unwrap_or(dir)
        .join("lib")
        .join(launch_env::RUNTIME_LIBRARY);
    for path in [&beside, &installed] {
        if path.is_file() {
            return Ok(path.clone());
        }
    }
    Err(format!(
        "the runtime library is missing (looked for {} and {}; build it with `cargo build \
         --release`, or reinstall the package)",
        beside.display(),
        installed.display()
    ))
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Layout {
    /// A directory that holds only the package (a source tree's `python/`, or one the user
    /// named): it may go on the target's `PYTHONPATH` as it is.
    SourceTree,
    /// The `site-packages` the package was installed into. It is not put on the target's
    /// `PYTHONPATH`: for another interpreter its other packages would shadow that
    /// interpreter's own (the `sitecustomize` falls back to it by itself, last on `sys.path`).
    Installed,
}

/// The directory holding the `msmemscope` Python package: `MSMEMSCOPE_PYTHON_DIR`, the source
/// tree's `python/` two levels above this executable (`target/release`), or the
/// `site-packages` this executable was installed into (`msmemscope/bin/`).
pub fn python_package_root() -> Option<(PathBuf, Layout)> {
    let exe = std::env::current_exe().ok();
    let ancestor = |n: usize| {
        let mut dir = exe.as_deref()?;
        for _ in 0..n {
            dir = dir.parent()?;
        }
        Some(dir.to_path_buf())
    };
    let candidates = [
        (
            std::env::var_os(launch_env::PYTHON_DIR).map(PathBuf::from),
            Layout::SourceTree,
        ),
        (ancestor(3).map(|d| d.join("python")), Layout::SourceTree),
        (ancestor(3), Layout::Installed),
    ];
    candidates
        .into_iter()
        .filter_map(|(dir, layout)| Some((dir?, layout)))
        .find(|(dir, _)| dir.join("msmemscope").join("__init__.py").is_file())
}
