//! What every target runs: the stable fuzz test's check of one reader (its source included
//! as is, so both drivers assert the same), in a scratch directory of this process's own.

#[path = "../../crates/core/tests/fuzz_readers/harness.rs"]
#[allow(dead_code)]
mod harness;

pub use harness::TARGETS;

/// Runs `target`'s check on `data`; a broken property panics, which libFuzzer reports with
/// the input.
pub fn run(target: &str, data: &[u8]) {
    // /dev/shm where there is one: the files are rewritten every execution.
    let base = if std::path::Path::new("/dev/shm").is_dir() {
        std::path::PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    let dir = base.join(format!("msmemscope-fuzz-{target}-{}", std::process::id()));
    harness::check(target, data, &dir);
}
