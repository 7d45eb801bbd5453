//! The option table: every option's names, arity and help line, and the `--help` and
//! `--version` texts made from it.

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

/// One row of the option table: the long name (without `--`), the short letter, the kind, the
/// value placeholder and the help text (empty help: described by `OptionName::accepted`).
pub(super) struct OptSpec {
    pub(super) long: Option<&'static str>,
    pub(super) short: Option<char>,
    pub(super) kind: Kind,
    pub(super) placeholder: &'static str,
    pub(super) help: &'static str,
}

pub(super) const fn opt(
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
    }
}

/// Every option, in the order `--help` lists them.
pub(super) const OPTIONS: &[OptSpec] = &[
    opt(
        Some("help"),
        Some('h'),
        Kind::Help,
        "",
        "print this help and exit",
    ),
    opt(
        Some("version"),
        Some('V'),
        Kind::Version,
        "",
        "print the version and exit",
    ),
    opt(
        Some("log-level"),
        None,
        Kind::Config(OptionName::LogLevel),
        "LEVEL",
        "log verbosity (default info): ",
    ),
    opt(
        None,
        Some('v'),
        Kind::Verbose,
        "",
        "same as --log-level=debug",
    ),
    opt(
        None,
        Some('q'),
        Kind::Quiet,
        "",
        "same as --log-level=error",
    ),
    opt(
        Some("analysis"),
        None,
        Kind::Config(OptionName::Analysis),
        "LIST",
        "analyses to run (default leaks): ",
    ),
    opt(
        Some("output-path"),
        Some('o'),
        Kind::Config(OptionName::OutputPath),
        "PATH",
        "directory of the results (default ./memscopeDumpResults): ",
    ),
    opt(
        Some("host-leak-mode"),
        None,
        Kind::Config(OptionName::HostLeakMode),
        "MODE",
        "host-leaks report (default summary; event adds block_detail_N.csv): ",
    ),
    opt(
        Some("block-size-threshold"),
        None,
        Kind::Config(OptionName::BlockSizeThreshold),
        "N",
        "host-leaks tracks only allocations of at least N bytes (default 0, all): ",
    ),
    opt(
        Some("sample-rate"),
        None,
        Kind::Config(OptionName::SampleRate),
        "N",
        "host-leaks tracks about 1 in N allocations (default 1, all): ",
    ),
    opt(
        Some("sample-bytes"),
        None,
        Kind::Config(OptionName::SampleBytes),
        "N",
        "host-leaks samples about one block per N bytes allocated, reporting estimates (default 0, exact; 524288 for services and long jobs): ",
    ),
    opt(
        Some("dump-budget"),
        None,
        Kind::Config(OptionName::DumpBudget),
        "SIZE",
        "most bytes a process's event dump keeps (default 256MiB; past it the first, the newest, the peak's, the leaks' and OOM steps stay, every step summarized): ",
    ),
    opt(
        Some("events"),
        None,
        Kind::Config(OptionName::Events),
        "LIST",
        "events to record (default alloc,free,launch): ",
    ),
    opt(
        Some("level"),
        None,
        Kind::Config(OptionName::Level),
        "LEVEL",
        "record ATen ops (op, the default) or kernel launches (kernel): ",
    ),
    opt(
        Some("steps"),
        None,
        Kind::Config(OptionName::Steps),
        "LIST",
        "record only these steps; switches the analyses off: ",
    ),
    opt(
        Some("call-stack"),
        None,
        Kind::Config(OptionName::CallStack),
        "LIST",
        "record C and/or Python call stacks (default off): ",
    ),
    opt(
        Some("collect-mode"),
        None,
        Kind::Config(OptionName::CollectMode),
        "MODE",
        "when recording starts (default immediate): ",
    ),
    opt(
        Some("device"),
        None,
        Kind::Config(OptionName::Device),
        "LIST",
        "devices to record (default cpu,cuda): ",
    ),
    opt(
        Some("watch"),
        None,
        Kind::Config(OptionName::Watch),
        "SPEC",
        "checksum (full-content: dump) watched blocks around ops from start to end: ",
    ),
    opt(
        Some("format"),
        None,
        Kind::Config(OptionName::Format),
        "FORMAT",
        "dump file format (default csv; parquet is written as CSV while the program runs and \
         converted when it ends): ",
    ),
    opt(
        Some("data-format"),
        None,
        Kind::Config(OptionName::DataFormat),
        "FORMAT",
        "alias of --format",
    ),
    opt(
        Some("follow"),
        None,
        Kind::Config(OptionName::Follow),
        "WHICH",
        "trace the processes the program starts too, each in its own run directory \
         (default exec): ",
    ),
    opt(
        Some("python-objects"),
        None,
        Kind::Config(OptionName::PythonObjects),
        "ON|OFF",
        "host leaks: account Python objects too, CPython's own allocators (default on): ",
    ),
    opt(
        Some("report"),
        None,
        Kind::Report,
        "",
        "after the run, write msmemscope_report.html into the run directory (as msmemscope report DIR)",
    ),
    opt(
        Some("compare"),
        None,
        Kind::Compare,
        "",
        "diff the op or kernel memory of two dumps given by --input-path (with --level)",
    ),
    opt(
        Some("input-path"),
        None,
        Kind::InputPath,
        "BASE,COMPARE",
        "the two dumps of --compare: ",
    ),
    opt(
        Some("pid"),
        None,
        Kind::Pid,
        "PID",
        "attach to a running process that has the runtime library loaded: ",
    ),
    opt(
        Some("command"),
        None,
        Kind::CommandWord,
        "WORD",
        concat!(
            "with --pid: send one control word and exit (start, stop, step, display config, ",
            "display memory summary, display host_leak summary, help)"
        ),
    ),
    opt(
        Some("load-api-env"),
        None,
        Kind::LoadApiEnv,
        "[=host|npu|cuda|all]",
        concat!(
            "with source: preload the runtime library in this shell for the Python API; ",
            "host arms the host heap hooks, npu or cuda (the default) the device hooks, all both"
        ),
    ),
    opt(
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
        let accepted = match spec.kind {
            Kind::Config(option) => option.accepted(),
            Kind::InputPath => OptionName::InputPath.accepted(),
            Kind::Pid => OptionName::Pid.accepted(),
            _ => "",
        };
        let help = if spec.help.ends_with(": ") {
            format!("{}{accepted}", spec.help)
        } else {
            spec.help.to_owned()
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
