//! The `msmemscope` command line: argv → [`Command`].
//!
//! Hand-written rather than clap because the original msMemScope's grammar needs exact control that
//! clap makes awkward: the target program starts at the first non-option argument and owns
//! everything after it (`msmemscope --analysis=host-leaks ./prog --analysis=x` passes
//! `--analysis=x` to `prog`), `--load-api-env` takes an optional value only in its `=` form, and
//! every error must be exactly one line (clap prints usage blocks).
//!
//! Parsing runs in fixed stages, so the error a user sees does not depend on luck:
//! 1. syntax, in argv order: unknown options, missing values, `-h`/`-V` (which win at once);
//! 2. every value, in argv order, through the shared checks of `msmemscope_core::config`;
//! 3. how the modes combine (`--compare` needs `--input-path`, `--pid` excludes a program…);
//! 4. the cross-option rules of a launch (`--steps` versus `--analysis`, events per analysis…);
//! 5. [`refuse_unavailable`]: what this build cannot run yet.

use msmemscope_core::config::{
    parse_input_paths, parse_pid, resolve, set_option, GivenOptions, LogLevel, OptionName,
    RunConfig,
};
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

mod build;
mod flags;
mod scan;
mod subcommand;

pub use crate::failure::UsageError;
use build::{build, refuse_unavailable, AVAILABILITY};
pub use flags::version_text;
use flags::{find_long, find_short, help_text, unknown, Kind, OptSpec};
use scan::{cut, scan, utf8, Scan, Scanned};
pub use subcommand::{parse_subcommand, Subcommand};

/// What the command line asks for.
#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    /// Print this text on stdout and exit 0.
    Help(String),
    /// Print this text (`msmemscope 0.1.0`) on stdout and exit 0.
    Version(String),
    /// Run `program[0]` with arguments `program[1..]` under the tool.
    Launch {
        config: RunConfig,
        program: Vec<OsString>,
        /// `--report`: write the run's HTML page when the target has exited.
        report: bool,
    },
    /// `source msmemscope --load-api-env[=…]` or `--unload-api-env`.
    ApiEnv(ApiEnvRequest),
    /// `--compare --input-path=base,compare`: diff two dumps offline.
    Compare {
        config: RunConfig,
        inputs: [PathBuf; 2],
    },
    /// `--pid PID [--command "…"]`: talk to a running process; one word, or interactive when
    /// `command` is `None`.
    Attach { pid: i32, command: Option<String> },
}

/// The environment edit that the sourced `msmemscope` wrapper performs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApiEnvRequest {
    /// `--load-api-env[=host|npu|cuda|all]`: preload the runtime library in the user's shell.
    Load(ApiEnvKind),
    /// `--unload-api-env`: take it out again.
    Unload,
}

/// Which hooks `--load-api-env` prepares. The original msMemScope has two hook libraries, so its
/// users write `=host` or `=npu`; here one runtime library holds all hooks, and the kind tells it
/// which to arm (its `=npu` and our `=cuda` mean the device side).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApiEnvKind {
    /// `=host`: the host heap (malloc family) hooks, for `analysis=["host-leaks"]`.
    Host,
    /// No value, `=npu` or `=cuda`: the device-memory and framework hooks, the original
    /// msMemScope's default.
    Device,
    /// `=all`: both.
    All,
}

/// Parses the arguments after argv\[0\].
pub fn parse(args: Vec<OsString>) -> Result<Command, UsageError> {
    let scanned = match scan(args)? {
        Scan::Done(scanned) => scanned,
        Scan::Help => return Ok(Command::Help(help_text())),
        Scan::Version => return Ok(Command::Version(version_text())),
    };
    let (command, _given) = build(scanned)?;
    refuse_unavailable(&command)?;
    Ok(command)
}

#[cfg(test)]
mod tests {
    use super::flags::OPTIONS;
    use super::*;
    use msmemscope_core::config::{Analysis, DataFormat, EventKind, HostLeakMode};

    fn parse_strs(args: &[&str]) -> Result<Command, UsageError> {
        parse(args.iter().map(OsString::from).collect())
    }

    fn error(args: &[&str]) -> String {
        parse_strs(args).expect_err("must be refused").0
    }

    /// Parses without the capability gate, to check what later builds will run.
    fn built(args: &[&str]) -> Result<Command, UsageError> {
        let args = args.iter().map(OsString::from).collect();
        match scan(args)? {
            Scan::Done(scanned) => build(scanned).map(|(command, _)| command),
            Scan::Help | Scan::Version => panic!("help and version are tested through parse"),
        }
    }

    fn launch(args: &[&str]) -> (RunConfig, Vec<OsString>) {
        match parse_strs(args) {
            Ok(Command::Launch {
                config, program, ..
            }) => (config, program),
            other => panic!("expected a launch, got {other:?}"),
        }
    }

    fn os(items: &[&str]) -> Vec<OsString> {
        items.iter().map(OsString::from).collect()
    }

    #[test]
    fn host_leaks_launch_with_both_value_forms() {
        let (config, program) = launch(&[
            "--analysis=host-leaks",
            "--host-leak-mode",
            "event",
            "--block-size-threshold=1024",
            "--sample-rate",
            "3",
            "-o",
            "out dir",
            "-v",
            "./prog",
            "--analysis=x",
            "-o",
        ]);
        assert_eq!(config.analysis, vec![Analysis::HostLeaks]);
        assert_eq!(config.host_leak_mode, HostLeakMode::Event);
        assert_eq!(config.block_size_threshold, 1024);
        assert_eq!((config.sample_rate_requested, config.sample_rate), (3, 4));
        assert_eq!(config.output_path, PathBuf::from("out dir"));
        assert_eq!(config.log_level, LogLevel::Debug);
        assert_eq!(program, os(&["./prog", "--analysis=x", "-o"]));
    }

    #[test]
    fn offline_subcommands_take_q_anywhere() {
        let dir = PathBuf::from("runs");
        for argv in [["report", "-q", "runs"], ["report", "runs", "-q"]] {
            assert_eq!(
                parse_subcommand(&os(&argv)),
                Some(Ok(Subcommand::Report(dir.clone())))
            );
        }
        assert_eq!(
            parse_subcommand(&os(&["export", "-q", "--format=parquet", "runs"])),
            Some(Ok(Subcommand::ExportParquet(dir)))
        );
        assert!(matches!(
            parse_subcommand(&os(&["report", "--quiet", "runs"])),
            Some(Err(_))
        ));
    }

    #[test]
    fn program_after_double_dash_and_short_forms() {
        let (config, program) = launch(&[
            "--analysis",
            "host-leaks",
            "-oout",
            "-q",
            "--",
            "-weird",
            "a",
        ]);
        assert_eq!(config.output_path, PathBuf::from("out"));
        assert_eq!(config.log_level, LogLevel::Error);
        assert_eq!(program, os(&["-weird", "a"]));
        let (config, _) = launch(&["--analysis=host-leaks", "-o=x", "--log-level=warning", "p"]);
        assert_eq!(config.output_path, PathBuf::from("x"));
        assert_eq!(config.log_level, LogLevel::Warning);
        let (config, _) = launch(&["--analysis=host-leaks", "--sample-rate=2147483648", "p"]);
        assert_eq!(
            (config.sample_rate_requested, config.sample_rate),
            (1 << 31, 1 << 30)
        );
    }

    #[test]
    fn help_and_version() {
        let Ok(Command::Help(text)) = parse_strs(&["--level=bogus", "--help"]) else {
            panic!("help expected");
        };
        for option in OPTIONS {
            if let Some(long) = option.long {
                assert!(text.contains(&format!("--{long}")), "help lacks --{long}");
            }
        }
        for accepted in [
            "debug, info, warning, error",
            "op, kernel",
            "csv, db, parquet",
            "summary, event",
        ] {
            assert!(text.contains(accepted), "help lacks {accepted}");
        }
        assert!(text.contains(msmemscope_core::config::DEFAULT_OUTPUT_PATH));
        assert_eq!(parse_strs(&["-h"]), Ok(Command::Help(help_text())));
        assert_eq!(
            parse_strs(&["-V"]),
            Ok(Command::Version("msmemscope 0.1.0".to_owned()))
        );
        assert_eq!(
            parse_strs(&["--version", "--foo"]),
            Ok(Command::Version("msmemscope 0.1.0".to_owned()))
        );
        // After the program, --help is the program's.
        let (_, program) = launch(&["--analysis=host-leaks", "prog", "--help"]);
        assert_eq!(program, os(&["prog", "--help"]));
    }

    #[test]
    fn unknown_options_and_missing_values() {
        assert_eq!(
            error(&["--foo", "prog"]),
            "unknown option --foo; run msmemscope --help for the accepted options"
        );
        assert_eq!(
            error(&["--foo=bar"]),
            "unknown option --foo; run msmemscope --help for the accepted options"
        );
        assert_eq!(
            error(&["-vq"]),
            "unknown option -vq; run msmemscope --help for the accepted options"
        );
        assert_eq!(
            error(&["--level"]),
            "--level needs a value: accepted values are op, kernel"
        );
        assert_eq!(error(&["--help=yes"]), "--help takes no value");
        assert_eq!(error(&["--compare=1"]), "--compare takes no value");
    }

    #[test]
    fn bad_values_name_the_option() {
        assert_eq!(
            error(&["--level=foo", "prog"]),
            "invalid --level \"foo\": accepted values are op, kernel"
        );
        assert_eq!(
            error(&["--data-format", "xml", "prog"]),
            "invalid --data-format \"xml\": accepted values are csv, db, parquet"
        );
        assert!(error(&["--steps=1,2,3,4,5,6", "p"]).starts_with("invalid --steps \"1,2,3,4,5,6\""));
        assert!(error(&["--analysis=host-leaks,leaks", "p"])
            .contains("host-leaks cannot be combined with other analyses"));
        assert!(error(&["--watch=aten::add", "p"]).contains("the end op is missing"));
        assert!(error(&["--sample-rate=0", "p"]).starts_with("invalid --sample-rate \"0\""));
        assert!(error(&["--pid=-3"]).starts_with("invalid --pid \"-3\""));
        assert!(error(&["--compare", "--input-path=a"]).starts_with("invalid --input-path \"a\""));
        // A bad value is reported before the capability gate would refuse the option.
        assert!(error(&["--events=bogus", "p"]).starts_with("invalid --events"));
    }

    #[test]
    fn cross_option_rules() {
        assert_eq!(
            error(&["--steps=1", "--analysis=leaks", "p"]),
            "--steps=1 switches the analyses off and cannot be combined with --analysis=leaks"
        );
        assert_eq!(
            error(&["--events=launch", "p"]),
            "--analysis=leaks needs alloc and free events, which are missing from --events=launch"
        );
        assert_eq!(
            error(&["--analysis=host-leaks", "--watch=a,b", "p"]),
            "--analysis=host-leaks cannot be combined with --watch=a,b"
        );
        let Ok(Command::Launch { config, .. }) = built(&["--events=launch", "--analysis=oom", "p"])
        else {
            panic!("launch expected");
        };
        assert_eq!(
            config.events,
            vec![EventKind::Alloc, EventKind::Free, EventKind::Launch]
        );
        let Ok(Command::Launch { config, .. }) = built(&["--steps=2，1", "p"]) else {
            panic!("launch expected");
        };
        assert_eq!((config.steps, config.analysis), (vec![1, 2], vec![]));
    }

    #[test]
    fn modes() {
        assert_eq!(
            built(&[
                "--compare",
                "--input-path",
                "a.csv，b.csv",
                "--level=kernel"
            ])
            .map(|c| match c {
                Command::Compare { inputs, config } => (inputs, config.level),
                other => panic!("{other:?}"),
            }),
            Ok((
                [PathBuf::from("a.csv"), PathBuf::from("b.csv")],
                msmemscope_core::config::Level::Kernel
            ))
        );
        assert_eq!(
            built(&["--pid", "42", "--command", "display host_leak summary"]),
            Ok(Command::Attach {
                pid: 42,
                command: Some("display host_leak summary".to_owned())
            })
        );
        assert_eq!(
            built(&["--pid=42"]),
            Ok(Command::Attach {
                pid: 42,
                command: None
            })
        );
        assert_eq!(
            error(&["--compare"]),
            "--compare needs --input-path BASE,COMPARE"
        );
        assert_eq!(error(&["--input-path=a,b"]), "--input-path needs --compare");
        assert_eq!(error(&["--command=start"]), "--command needs --pid PID");
        assert_eq!(
            error(&["--pid=1", "--compare", "--input-path=a,b"]),
            "--pid cannot be combined with --compare"
        );
        assert_eq!(
            error(&["--pid=1", "prog"]),
            "--pid attaches to a running process and cannot be combined with launching \"prog\""
        );
        assert_eq!(
            error(&["--compare", "--input-path=a,b", "prog"]),
            "--compare reads two dumps and cannot be combined with launching \"prog\""
        );
        assert!(error(&[]).starts_with("no program to launch"));
        assert!(error(&["--analysis=host-leaks"]).starts_with("no program to launch"));
        assert!(error(&["--analysis=host-leaks", "--"]).starts_with("no program to launch"));
    }

    #[test]
    fn api_env() {
        use ApiEnvKind::*;
        assert_eq!(
            parse_strs(&["--load-api-env"]),
            Ok(Command::ApiEnv(ApiEnvRequest::Load(Device)))
        );
        assert_eq!(
            parse_strs(&["--load-api-env=npu"]),
            Ok(Command::ApiEnv(ApiEnvRequest::Load(Device)))
        );
        assert_eq!(
            parse_strs(&["--load-api-env=cuda"]),
            Ok(Command::ApiEnv(ApiEnvRequest::Load(Device)))
        );
        assert_eq!(
            parse_strs(&["--load-api-env=host"]),
            Ok(Command::ApiEnv(ApiEnvRequest::Load(Host)))
        );
        assert_eq!(
            parse_strs(&["--load-api-env=all"]),
            Ok(Command::ApiEnv(ApiEnvRequest::Load(All)))
        );
        assert_eq!(
            parse_strs(&["--unload-api-env"]),
            Ok(Command::ApiEnv(ApiEnvRequest::Unload))
        );
        assert_eq!(
            error(&["--load-api-env=gpu"]),
            "invalid --load-api-env \"gpu\": accepted values are host, npu, cuda, all"
        );
        assert_eq!(
            error(&["--load-api-env", "host"]),
            "--load-api-env takes no program, got \"host\"; did you mean --load-api-env=host?"
        );
        assert_eq!(
            error(&["--load-api-env", "--unload-api-env"]),
            "--load-api-env cannot be combined with --unload-api-env"
        );
        assert!(error(&["--unload-api-env", "-v"])
            .starts_with("--unload-api-env cannot be combined with -v;"));
    }

    #[test]
    fn capability_gate() {
        // --watch passes the gate.
        assert!(matches!(
            parse_strs(&["--watch=aten::add.Tensor:1,aten::mul.Tensor", "prog"]),
            Ok(Command::Launch { .. })
        ));
        // --compare passes the gate.
        assert!(matches!(
            parse_strs(&["--compare", "--input-path=a,b"]),
            Ok(Command::Compare { .. })
        ));
        // --pid passes the gate.
        assert_eq!(
            parse_strs(&["--pid=7", "--command=help"]),
            Ok(Command::Attach {
                pid: 7,
                command: Some("help".to_owned())
            })
        );
        // The event dump launches, with the default analysis or none.
        let (config, _) = launch(&["prog"]);
        assert_eq!(config.analysis, vec![Analysis::Leaks]);
        let (config, _) = launch(&["--analysis=none", "--format=db", "--steps=1,2", "prog"]);
        assert_eq!(config.format, DataFormat::Db);
        assert_eq!(config.steps, vec![1, 2]);
        // Host-leaks refuses the dump's options rather than ignore them.
        assert_eq!(
            error(&["--analysis=host-leaks", "--events=alloc,free", "prog"]),
            "--analysis=host-leaks records host heap blocks, not the event dump, and does not take --events"
        );
    }
}
