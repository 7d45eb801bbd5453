//! `msmemscope`: the command users run (through the `bin/msmemscope` shell wrapper, which also
//! handles `source msmemscope --load-api-env`).

mod api_env;
mod args;
mod attach;
mod compare;
mod launcher;

use std::process::ExitCode;

use args::{Command, UsageError};

fn main() -> ExitCode {
    let command = match args::parse(std::env::args_os().skip(1).collect()) {
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
        Command::Launch { config, program } => launcher::run(&config, &program),
        Command::Attach { pid, command } => attach::run(pid, command),
        Command::Compare { config, inputs } => compare::run(&config, &inputs),
    }
}
