//! What the fixtures need and where they are: tests/fixtures/, the runtime library next to the
//! CLI, the project's Python; and building them with gcc (or g++) into a directory of this test
//! process.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock};

use super::{release_dir, repo, BIN};

/// The runtime library's file name, as it lies next to the CLI and in a target's maps.
pub const RUNTIME_LIB: &str = "libmsmemscope_runtime.so";

/// The runtime library next to the CLI (where the launcher finds it); fails the test with what
/// to do when it is missing.
pub fn runtime_lib() -> PathBuf {
    let lib = release_dir().join(RUNTIME_LIB);
    assert!(
        lib.is_file(),
        "{} is missing next to {BIN}: run `cargo build --release` first",
        lib.display()
    );
    lib
}

/// A file under tests/fixtures/.
pub fn fixture_src(name: &str) -> PathBuf {
    repo().join("tests/fixtures").join(name)
}

/// The project's Python (`.venv`, made by scripts/setup.sh, with `nvtx` and `torch`); a clear
/// failure when it is missing.
pub fn venv_python() -> PathBuf {
    let python = repo().join(".venv/bin/python");
    assert!(
        python.is_file(),
        "{} is missing: run scripts/setup.sh (it creates .venv with nvtx and torch)",
        python.display()
    );
    python
}

/// `{temp}/msmemscope-e2e-{pid}/{name}`: where the programs built once per test process from
/// tests/fixtures/ go, one directory per `name` (each caller its own, so that no build writes
/// a file another test runs). The root is readable by all (the attach security test's client
/// runs as `nobody`) and outlives the process (statics are never dropped); roots left by
/// earlier test processes, no longer running, are removed when it is made.
pub fn build_dir(name: &str) -> PathBuf {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    let root = ROOT.get_or_init(|| {
        let temp = std::env::temp_dir();
        for e in std::fs::read_dir(&temp).into_iter().flatten().flatten() {
            let file_name = e.file_name().to_string_lossy().into_owned();
            let Some(pid) = file_name.strip_prefix("msmemscope-e2e-") else {
                continue;
            };
            let Ok(pid) = pid.parse::<i32>() else {
                continue;
            };
            // SAFETY: signal 0 only checks whether the process exists.
            let gone = unsafe { libc::kill(pid, 0) } != 0
                && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
            if gone {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
        let root = temp.join(format!("msmemscope-e2e-{}", std::process::id()));
        std::fs::create_dir_all(&root).expect("create the fixture build root");
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
        root
    });
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).expect("create a fixture build dir");
    dir
}

/// Runs `compiler args` (gcc or g++), failing the test with its stderr.
pub fn compile(compiler: &str, args: &[&str]) {
    let out = Command::new(compiler)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {compiler} (needed to build the C fixtures): {e}"));
    assert!(
        out.status.success(),
        "{compiler} {:?} failed:\n{}",
        args,
        String::from_utf8_lossy(&out.stderr)
    );
}

pub fn gcc(args: &[&str]) {
    compile("gcc", args);
}

/// `gcc FLAGS tests/fixtures/{src} -o {build_dir(dir)}/{out} LIBS`, once per test process (the
/// first caller builds, any other waits for it); checks first that the runtime library is where
/// the CLI looks for it. Returns the built file.
pub fn built_once(dir: &str, src: &str, out: &str, flags: &[&str], libs: &[&str]) -> PathBuf {
    type Built = Mutex<BTreeMap<PathBuf, Arc<OnceLock<PathBuf>>>>;
    static BUILT: Built = Mutex::new(BTreeMap::new());
    let prog = build_dir(dir).join(out);
    let once = BUILT
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry(prog.clone())
        .or_default()
        .clone();
    once.get_or_init(|| {
        runtime_lib();
        let src = fixture_src(src);
        let mut args = flags.to_vec();
        args.extend([src.to_str().unwrap(), "-o", prog.to_str().unwrap()]);
        args.extend_from_slice(libs);
        gcc(&args);
        prog.clone()
    })
    .clone()
}
