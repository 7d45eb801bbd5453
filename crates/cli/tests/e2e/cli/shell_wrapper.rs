//! `bin/msmemscope`, the POSIX shell wrapper installed as the `msmemscope` command:
//! `source msmemscope --load-api-env[=host]` / `--unload-api-env` through it in bash and zsh,
//! and executed without a shell in between.

use std::process::Command;

use crate::util::{repo, runtime_lib, BIN};

fn library() -> String {
    runtime_lib().to_string_lossy().into_owned()
}

/// Runs `script` in `shell` with the wrapper on PATH and the binary the tests were built with.
fn run_in(shell: &str, script: &str, ld_preload: Option<&str>) -> (String, String, i32) {
    let root = repo();
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
        .env("MSMEMSCOPE_BIN", BIN)
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

#[test]
fn the_installed_command_can_be_executed_without_a_shell() {
    // No shell in between: the kernel needs the #! line (else "Exec format error").
    let run = Command::new(repo().join("bin/msmemscope"))
        .arg("--help")
        .env("MSMEMSCOPE_BIN", BIN)
        .output()
        .expect("exec bin/msmemscope directly");
    assert_eq!(run.status.code(), Some(0), "{run:?}");
    assert!(String::from_utf8_lossy(&run.stdout).contains("msmemscope"));
}
