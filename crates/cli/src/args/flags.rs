//! The command line's option table: which options `--help` lists and in what order, their
//! short letters and arity, and the `--help` and `--version` texts made from it. The names,
//! help lines and accepted values of the options a run shares with `msmemscope.config` are
//! core's (`msmemscope_core::config::OPTIONS`).

use super::*;

/// What an option does, once recognized.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    Help,
    Version,
    Verbose,
    Quiet,
    Compare,
    UnloadApiEnv,
    /// Takes an optional value, only as `--load-api-env=VALUE`.
    LoadApiEnv,
    /// Sets a [`RunConfig`] field; takes a value.
    Config(OptionName),
    InputPath,
    Pid,
    CommandWord,
    /// `--report`: the HTML page after a launch.
    Report,
}

impl Kind {
    pub(super) fn takes_value(self) -> bool {
        matches!(
            self,
            Kind::Config(_) | Kind::InputPath | Kind::Pid | Kind::CommandWord
        )
    }
}

/// One row of the command line's option table: the long name (without `--`), the short letter,
/// the kind, the value placeholder and the help line. Rows of the options the run configuration
/// and the Python API share take all their strings from core's table (`shared`); the rest, the
/// command line's own (`-h`, `--report`, …), are written here.
pub(super) struct OptSpec {
    pub(super) long: Option<&'static str>,
    pub(super) short: Option<char>,
    pub(super) kind: Kind,
    pub(super) placeholder: &'static str,
    pub(super) help: &'static str,
    /// The core option whose accepted values follow the help line and name a missing value.
    pub(super) shared: Option<OptionName>,
}

/// A row of the command line's own.
const fn own(
    long: Option<&'static str>,
    short: Option<char>,
    kind: Kind,
    placeholder: &'static str,
    help: &'static str,
) -> OptSpec {
    OptSpec {
        long,
        short,
        kind,
        placeholder,
        help,
        shared: None,
    }
}

/// A row whose names and help are core's entry of `option`.
const fn shared(option: OptionName, kind: Kind) -> OptSpec {
    let spec = option.spec();
    OptSpec {
        long: Some(option.long()),
        short: None,
        kind,
        placeholder: spec.placeholder,
        help: spec.help,
        shared: Some(option),
    }
}

/// A row that sets a [`RunConfig`] field.
const fn config(option: OptionName) -> OptSpec {
    shared(option, Kind::Config(option))
}

/// Every option, in the order `--help` lists them.
pub(super) const OPTIONS: &[OptSpec] = &[
    own(
        Some("help"),
        Some('h'),
        Kind::Help,
        "",
        "print this help and exit",
    ),
    own(
        Some("version"),
        Some('V'),
        Kind::Version,
        "",
        "print the version and exit",
    ),
    config(OptionName::LogLevel),
    own(
        None,
        Some('v'),
        Kind::Verbose,
        "",
        "same as --log-level=debug",
    ),
    own(
        None,
        Some('q'),
        Kind::Quiet,
        "",
        "same as --log-level=error",
    ),
    config(OptionName::Analysis),
    OptSpec {
        short: Some('o'),
        ..config(OptionName::OutputPath)
    },
    config(OptionName::HostLeakMode),
    config(OptionName::BlockSizeThreshold),
    config(OptionName::SampleRate),
    config(OptionName::SampleBytes),
    config(OptionName::DumpBudget),
    config(OptionName::Events),
    config(OptionName::Level),
    config(OptionName::Steps),
    config(OptionName::CallStack),
    config(OptionName::CollectMode),
    config(OptionName::Device),
    config(OptionName::Watch),
    config(OptionName::Format),
    config(OptionName::DataFormat),
    config(OptionName::Follow),
    config(OptionName::PythonObjects),
    own(
        Some("report"),
        None,
        Kind::Report,
        "",
        "after the run, write msmemscope_report.html into the run directory (as msmemscope report DIR)",
    ),
    own(
        Some("compare"),
        None,
        Kind::Compare,
        "",
        "diff the op or kernel memory of two dumps given by --input-path (with --level)",
    ),
    shared(OptionName::InputPath, Kind::InputPath),
    shared(OptionName::Pid, Kind::Pid),
    own(
        Some("command"),
        None,
        Kind::CommandWord,
        "WORD",
        concat!(
            "with --pid: send one control word and exit (start, stop, step, display config, ",
            "display memory summary, display host_leak summary, help)"
        ),
    ),
    own(
        Some("load-api-env"),
        None,
        Kind::LoadApiEnv,
        "[=host|npu|cuda|all]",
        concat!(
            "with source: preload the runtime library in this shell for the Python API; ",
            "host arms the host heap hooks, npu or cuda (the default) the device hooks, all both"
        ),
    ),
    own(
        Some("unload-api-env"),
        None,
        Kind::UnloadApiEnv,
        "",
        "with source: undo --load-api-env",
    ),
];

/// The first line of `--version`.
pub fn version_text() -> String {
    format!("msmemscope {}", env!("CARGO_PKG_VERSION"))
}

/// The full `--help` text: usage forms, then every option with its accepted values. No final
/// newline: the caller prints it as a line.
pub fn help_text() -> String {
    let mut text = format!(
        "{} - memory analysis of programs and PyTorch jobs\n\n\
         Usage:\n  \
         msmemscope [options] <program> [args...]   run <program> under the tool (also after --)\n  \
         msmemscope --compare --input-path=BASE,COMPARE [--level=op|kernel]\n  \
         msmemscope --pid PID [--command WORD]\n  \
         msmemscope report DIR   one HTML page per run (DIR: a run or the output directory)\n  \
         msmemscope export --format torch-snapshot DIR   the run for PyTorch's memory viewer\n  \
         msmemscope export --format parquet DIR   memscope_dump_*.parquet beside each dump (DuckDB, Spark)\n  \
         msmemscope ranks DIR... [--engine native|duckdb|spark] [--output-format table|csv|json]\n      \
         [--threshold PCT]   one line per rank and device; which ranks stand out\n  \
         source msmemscope --load-api-env[=host|npu|cuda|all]\n  \
         source msmemscope --unload-api-env\n\n\
         Options take their value as --option=value or --option value. Lists are separated by\n\
         ',' or the full-width '\u{FF0C}'. The first argument that is not an option starts the program;\n\
         all arguments after it are the program's own.\n\n\
         Options:\n",
        version_text()
    );
    for spec in OPTIONS {
        let mut names = Vec::new();
        if let Some(short) = spec.short {
            names.push(format!("-{short}"));
        }
        if let Some(long) = spec.long {
            names.push(format!("--{long}"));
        }
        let mut line = format!("  {}", names.join(", "));
        if spec.kind == Kind::LoadApiEnv {
            line.push_str(spec.placeholder);
        } else if !spec.placeholder.is_empty() {
            line.push(' ');
            line.push_str(spec.placeholder);
        }
        // An alias's help points at its option, which lists the values.
        let help = match spec.shared {
            Some(option) if option.canonical() == option => {
                format!("{}: {}", spec.help, option.accepted())
            }
            _ => spec.help.to_owned(),
        };
        text.push_str(&format!("{line}\n      {help}\n"));
    }
    text.push_str("\nIn this build: ");
    text.push_str(AVAILABILITY);
    text
}

pub(super) fn unknown(name: &str) -> UsageError {
    UsageError(format!(
        "unknown option {name}; run msmemscope --help for the accepted options"
    ))
}

pub(super) fn find_long(name: &str) -> Option<&'static OptSpec> {
    OPTIONS.iter().find(|spec| spec.long == Some(name))
}

pub(super) fn find_short(letter: char) -> Option<&'static OptSpec> {
    OPTIONS.iter().find(|spec| spec.short == Some(letter))
}

#[cfg(test)]
mod tests {
    use super::*;
    use msmemscope_core::config::{Reach, OPTIONS as SHARED};

    #[test]
    fn every_shared_option_has_one_row_of_its_kind() {
        for entry in SHARED {
            let option = entry.name;
            let rows: Vec<&OptSpec> = OPTIONS
                .iter()
                .filter(|spec| spec.shared == Some(option))
                .collect();
            assert_eq!(rows.len(), 1, "{} needs exactly one row", entry.cli);
            let kind = match option {
                OptionName::InputPath => Kind::InputPath,
                OptionName::Pid => Kind::Pid,
                _ => Kind::Config(option),
            };
            assert_eq!(rows[0].kind, kind, "{}", entry.cli);
            assert_eq!(entry.reach == Reach::Mode, !matches!(kind, Kind::Config(_)));
            assert_eq!(
                find_long(option.long()).map(|s| s.shared),
                Some(Some(option))
            );
        }
    }

    #[test]
    fn names_are_unique() {
        for (i, a) in OPTIONS.iter().enumerate() {
            for b in &OPTIONS[i + 1..] {
                assert!(a.long.is_none() || a.long != b.long, "{:?} twice", a.long);
                assert!(
                    a.short.is_none() || a.short != b.short,
                    "{:?} twice",
                    a.short
                );
            }
        }
    }
}
