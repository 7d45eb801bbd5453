//! The errors every command reports the same way: one line, `msmemscope: <message>`, and the
//! exit status that says whose fault it was (2: the user's input; 1: the system).

use std::fmt;
use std::process::ExitCode;

use msmemscope_core::config::ConfigError;
use msmemscope_core::events::reader::ReadError;

/// A command-line mistake: one line, printed by `main` as `msmemscope: <line>` with exit status 2.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UsageError(pub String);

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<ConfigError> for UsageError {
    fn from(error: ConfigError) -> UsageError {
        UsageError(error.to_string())
    }
}

/// Why an offline command (report, export, ranks, compare) stopped: the message, and whether
/// the user's input is to blame (exit status 2) or the system (1).
#[derive(Debug)]
pub struct Failure {
    pub message: String,
    pub usage: bool,
}

impl Failure {
    pub fn input(message: impl Into<String>) -> Failure {
        Failure {
            message: message.into(),
            usage: true,
        }
    }

    pub fn io(message: impl Into<String>) -> Failure {
        Failure {
            message: message.into(),
            usage: false,
        }
    }

    pub fn exit(self) -> ExitCode {
        eprintln!("msmemscope: {}", self.message);
        ExitCode::from(if self.usage { 2 } else { 1 })
    }
}

impl From<ReadError> for Failure {
    fn from(e: ReadError) -> Failure {
        Failure {
            usage: !matches!(e, ReadError::Io { .. }),
            message: e.to_string(),
        }
    }
}

impl From<UsageError> for Failure {
    fn from(e: UsageError) -> Failure {
        Failure::input(e.0)
    }
}
