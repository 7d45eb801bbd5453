//! `source msmemscope --load-api-env[=host]` / `--unload-api-env`. A program cannot change its
//! parent shell's environment, so the sourced wrapper runs this binary with
//! `MSMEMSCOPE_SOURCED=1` and evaluates the shell code it prints.

use std::process::ExitCode;

use crate::args::{ApiEnvKind, ApiEnvRequest};
use crate::install::runtime_library;

/// Set by `bin/msmemscope` when it was sourced.
const SOURCED: &str = "MSMEMSCOPE_SOURCED";
/// Tells a preloaded runtime which hooks the user asked for.
pub const API_ENV: &str = "MSMEMSCOPE_API_ENV";
const NVTX: &str = msmemscope_core::launch_env::NVTX_INJECTION;

pub fn run(request: ApiEnvRequest) -> ExitCode {
    if std::env::var_os(SOURCED).is_none() {
        let word = match request {
            ApiEnvRequest::Load(_) => "--load-api-env",
            ApiEnvRequest::Unload => "--unload-api-env",
        };
        eprintln!("msmemscope: {word} changes your shell's environment: run it as `source msmemscope {word}`");
        return ExitCode::from(2);
    }
    let library = match runtime_library() {
        Ok(path) => path.to_string_lossy().into_owned(),
        Err(line) => {
            eprintln!("msmemscope: {line}");
            return ExitCode::from(1);
        }
    };
    let current = std::env::var("LD_PRELOAD").unwrap_or_default();
    print!("{}", shell_code(request, &library, &current));
    ExitCode::SUCCESS
}

/// The shell code for bash and zsh. Pure, so it is tested without a shell.
pub fn shell_code(request: ApiEnvRequest, library: &str, current: &str) -> String {
    let others: Vec<&str> = current
        .split([':', ' '])
        .filter(|entry| !entry.is_empty() && *entry != library)
        .collect();
    match request {
        ApiEnvRequest::Load(kind) => {
            let kind = match kind {
                ApiEnvKind::Host => "host",
                ApiEnvKind::Device => "device",
                ApiEnvKind::All => "all",
            };
            let mut entries = vec![library];
            entries.extend(others);
            let mut code = format!(
                "export LD_PRELOAD={}\nexport {API_ENV}={kind}\n",
                quote(&entries.join(":"))
            );
            if kind != "host" {
                // Device-side runs also take NVTX marks.
                code.push_str(&format!("export {NVTX}={}\n", quote(library)));
            }
            code
        }
        ApiEnvRequest::Unload => {
            let mut code = if others.is_empty() {
                "unset LD_PRELOAD\n".to_string()
            } else {
                format!("export LD_PRELOAD={}\n", quote(&others.join(":")))
            };
            code.push_str(&format!("unset {API_ENV}\n"));
            code.push_str(&format!("unset {NVTX}\n"));
            code
        }
    }
}

/// Single-quotes a value for POSIX shells.
fn quote(value: &str) -> String {
    format!("'{}'", value.replace('\'', "'\\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_prepends_once() {
        let code = shell_code(
            ApiEnvRequest::Load(ApiEnvKind::Host),
            "/x/lib.so",
            "/a.so:/x/lib.so",
        );
        assert_eq!(
            code,
            "export LD_PRELOAD='/x/lib.so:/a.so'\nexport MSMEMSCOPE_API_ENV=host\n"
        );
    }

    #[test]
    fn unload_keeps_others_or_unsets() {
        // LD_PRELOAD entries may be separated by colons or spaces.
        let code = shell_code(ApiEnvRequest::Unload, "/x/lib.so", "/x/lib.so:/a.so /b.so");
        assert_eq!(
            code,
            "export LD_PRELOAD='/a.so:/b.so'\nunset MSMEMSCOPE_API_ENV\nunset NVTX_INJECTION64_PATH\n"
        );
        let code = shell_code(ApiEnvRequest::Unload, "/x/lib.so", "/x/lib.so");
        assert_eq!(
            code,
            "unset LD_PRELOAD\nunset MSMEMSCOPE_API_ENV\nunset NVTX_INJECTION64_PATH\n"
        );
    }

    #[test]
    fn device_load_sets_the_nvtx_injection() {
        let code = shell_code(ApiEnvRequest::Load(ApiEnvKind::Device), "/x/lib.so", "");
        assert_eq!(
            code,
            "export LD_PRELOAD='/x/lib.so'\nexport MSMEMSCOPE_API_ENV=device\nexport NVTX_INJECTION64_PATH='/x/lib.so'\n"
        );
    }

    #[test]
    fn quotes_single_quotes() {
        assert_eq!(quote("a'b"), "'a'\\''b'");
    }
}
