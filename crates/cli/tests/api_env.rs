//! `source msmemscope --load-api-env[=host]` / `--unload-api-env` through the real shell
//! wrapper, in bash and zsh.

use std::path::PathBuf;
use std::process::Command;

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

fn library() -> String {
    let cli = PathBuf::from(env!("CARGO_BIN_EXE_msmemscope-cli"));
    let lib = cli.parent().unwrap().join("libmsmemscope_runtime.so");
    assert!(
        lib.is_file(),
        "{} is missing: run `cargo build --release` first",
        lib.display()
    );
    lib.to_string_lossy().into_owned()
}

/// Runs `script` in `shell` with the wrapper on PATH and the binary the tests were built with.
fn run_in(shell: &str, script: &str, ld_preload: Option<&str>) -> (String, String, i32) {
    let root = repo_root();
    let mut command = Command::new(shell);
    command
        .arg("-c")
        .arg(script)
        .env(
            "PATH",
            format!(
                "{}:{}",
                root.join("bin").display(),
                std::env::var("PATH").unwrap()
            ),
        )
        .env("MSMEMSCOPE_BIN", env!("CARGO_BIN_EXE_msmemscope-cli"))
        .env_remove("MSMEMSCOPE_API_ENV");
    match ld_preload {
        Some(value) => command.env("LD_PRELOAD", value),
        None => command.env_remove("LD_PRELOAD"),
    };
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("cannot run {shell}: {e}"));
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        out.status.code().unwrap_or(-1),
    )
}

const SCRIPT: &str = r#"
source msmemscope --load-api-env=host
echo "loaded=${LD_PRELOAD} kind=${MSMEMSCOPE_API_ENV}"
# A program started with the library preloaded but no launcher runs normally.
echo hello | tr a-z A-Z
source msmemscope --unload-api-env
echo "unloaded=${LD_PRELOAD-<unset>} kind=${MSMEMSCOPE_API_ENV-<unset>}"
"#;

fn check_shell(shell: &str) {
    let lib = library();
    let (stdout, stderr, code) = run_in(shell, SCRIPT, None);
    assert_eq!(code, 0, "{shell} failed: {stderr}");
    assert_eq!(
        stdout,
        format!("loaded={lib} kind=host\nHELLO\nunloaded=<unset> kind=<unset>\n"),
        "{shell}: {stderr}"
    );

    // Existing preloads survive a load/unload round trip, and loading twice adds one entry.
    let script = "source msmemscope --load-api-env; source msmemscope --load-api-env; \
                  echo \"$LD_PRELOAD $MSMEMSCOPE_API_ENV\"; source msmemscope --unload-api-env; \
                  echo \"$LD_PRELOAD\"";
    let (stdout, stderr, code) = run_in(shell, script, Some("libm.so.6"));
    assert_eq!(code, 0, "{shell} failed: {stderr}");
    assert_eq!(
        stdout,
        format!("{lib}:libm.so.6 device\nlibm.so.6\n"),
        "{shell}: {stderr}"
    );
}

#[test]
fn bash_load_and_unload() {
    check_shell("bash");
}

#[test]
fn zsh_load_and_unload() {
    check_shell("zsh");
}

#[test]
fn running_instead_of_sourcing_is_a_usage_error() {
    let (stdout, stderr, code) = run_in("bash", "msmemscope --load-api-env=host", None);
    assert_eq!(code, 2);
    assert_eq!(stdout, "");
    assert_eq!(
        stderr,
        "msmemscope: --load-api-env changes your shell's environment: run it as `source msmemscope --load-api-env`\n"
    );
}

#[test]
fn bad_kind_is_reported_when_sourced_and_nothing_changes() {
    let (stdout, stderr, code) = run_in(
        "bash",
        "source msmemscope --load-api-env=gpu; echo \"status=$? ${LD_PRELOAD-<unset>}\"",
        None,
    );
    assert_eq!(code, 0);
    assert_eq!(stdout, "status=2 <unset>\n");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with("msmemscope: "), "{stderr}");
}
