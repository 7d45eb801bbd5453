//! `msmemscope`: the command users run (through the `bin/msmemscope` shell wrapper, which also
//! handles `source msmemscope --load-api-env`).

mod api_env;
mod args;
mod attach;
mod compare;
mod failure;
mod forward;
mod host_job;
mod install;
mod job;
mod knobs;
mod launcher;
mod progress;
mod ranks;
mod report;
mod why_empty;

use std::process::ExitCode;

use args::{Command, UsageError};

fn main() -> ExitCode {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    if args::parse_subcommand(&argv).is_some() {
        // The offline subcommands take `-q` anywhere: no progress bars.
        progress::set_quiet(argv[1..].iter().any(|a| a == "-q"));
    }
    match args::parse_subcommand(&argv) {
        Some(Ok(args::Subcommand::Report(dir))) => return report::run(&dir),
        Some(Ok(args::Subcommand::ExportTorchSnapshot(dir))) => return report::run_export(&dir),
        Some(Ok(args::Subcommand::Ranks(options))) => return ranks::run(&options),
        Some(Ok(args::Subcommand::ExportParquet(dir))) => return report::parquet::run(&dir),
        Some(Err(UsageError(line))) => {
            eprintln!("msmemscope: {line}");
            return ExitCode::from(2);
        }
        None => {}
    }
    let command = match args::parse(argv) {
        Ok(command) => command,
        Err(UsageError(line)) => {
            eprintln!("msmemscope: {line}");
            return ExitCode::from(2);
        }
    };
    match command {
        Command::Help(text) | Command::Version(text) => {
            println!("{text}");
            ExitCode::SUCCESS
        }
        Command::ApiEnv(request) => api_env::run(request),
        Command::Launch {
            config,
            program,
            report,
        } => {
            progress::set_quiet(config.log_level == msmemscope_core::config::LogLevel::Error);
            launcher::run(&config, &program, report)
        }
        Command::Attach { pid, command } => attach::run(pid, command),
        Command::Compare { config, inputs } => {
            progress::set_quiet(config.log_level == msmemscope_core::config::LogLevel::Error);
            compare::run(&config, &inputs)
        }
    }
}
