//! The `msmemscope` command line: argv → [`Command`].
//!
//! Hand-written rather than clap because the seed's grammar needs exact control that clap makes
//! awkward: the target program starts at the first non-option argument and owns everything after
//! it (`msmemscope --analysis=host-leaks ./prog --analysis=x` passes `--analysis=x` to `prog`),
//! `--load-api-env` takes an optional value only in its `=` form, and every error must be exactly
//! one line (clap prints usage blocks).
//!
//! Parsing runs in fixed stages, so the error a user sees does not depend on luck:
//! 1. syntax, in argv order: unknown options, missing values, `-h`/`-V` (which win at once);
//! 2. every value, in argv order, through the shared checks of `msmemscope_core::config`;
//! 3. how the modes combine (`--compare` needs `--input-path`, `--pid` excludes a program…);
//! 4. the cross-option rules of a launch (`--steps` versus `--analysis`, events per analysis…);
//! 5. [`refuse_unavailable`]: what this build cannot run yet.

use msmemscope_core::config::{
    parse_input_paths, parse_pid, resolve, set_option, ConfigError, GivenOptions, LogLevel,
    OptionName, RunConfig,
};
use std::ffi::{OsStr, OsString};
use std::fmt;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

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

/// Which hooks `--load-api-env` prepares. The seed has two hook libraries, so its users write
/// `=host` or `=npu`; here one runtime library holds all hooks, and the kind tells it which to
/// arm (the seed's `=npu` and our `=cuda` mean the device side).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApiEnvKind {
    /// `=host`: the host heap (malloc family) hooks, for `analysis=["host-leaks"]`.
    Host,
    /// No value, `=npu` or `=cuda`: the device-memory and framework hooks, the seed's default.
    Device,
    /// `=all`: both.
    All,
}

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

/// What an option does, once recognized.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
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
    fn takes_value(self) -> bool {
        matches!(
            self,
            Kind::Config(_) | Kind::InputPath | Kind::Pid | Kind::CommandWord
        )
    }
}

/// One row of the option table: the long name (without `--`), the short letter, the kind, the
/// value placeholder and the help text (empty help: described by `OptionName::accepted`).
struct OptSpec {
    long: Option<&'static str>,
    short: Option<char>,
    kind: Kind,
    placeholder: &'static str,
    help: &'static str,
}

const fn opt(
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
const OPTIONS: &[OptSpec] = &[
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

/// One option occurrence after the syntax pass.
struct Occurrence {
    kind: Kind,
    /// As the user spelled it (`--data-format`, `-o`), for messages.
    spelled: String,
    value: Option<OsString>,
}

/// The result of the syntax pass.
enum Scan {
    /// The options in argv order and the program, if any.
    Done(Scanned),
    /// `-h`: answer with the help at once.
    Help,
    /// `-V`: answer with the version at once.
    Version,
}

/// Options in argv order and the program (empty when none was given).
struct Scanned {
    options: Vec<Occurrence>,
    program: Vec<OsString>,
}

fn unknown(name: &str) -> UsageError {
    UsageError(format!(
        "unknown option {name}; run msmemscope --help for the accepted options"
    ))
}

fn find_long(name: &str) -> Option<&'static OptSpec> {
    OPTIONS.iter().find(|spec| spec.long == Some(name))
}

fn find_short(letter: char) -> Option<&'static OptSpec> {
    OPTIONS.iter().find(|spec| spec.short == Some(letter))
}

/// Stage 1: splits argv into options and the program. `-h` and `-V` end parsing early and win
/// over bad values anywhere, so `msmemscope --level=x --help` helps rather than scolds (but an
/// unknown option before them is reported: its arity, and so the rest of argv, is unknown).
fn scan(args: Vec<OsString>) -> Result<Scan, UsageError> {
    let mut options = Vec::new();
    let mut args = args.into_iter();
    let mut program = Vec::new();
    while let Some(arg) = args.next() {
        let bytes = arg.as_bytes();
        if bytes == b"--" {
            program.extend(args);
            break;
        }
        if bytes.len() < 2 || bytes[0] != b'-' {
            program.push(arg);
            program.extend(args);
            break;
        }
        // Option names are ASCII; a value (after `=`) may be any bytes, such as a path.
        let (spec, spelled, inline) = if let Some(rest) = bytes.strip_prefix(b"--") {
            let (name, value) = match rest.iter().position(|b| *b == b'=') {
                Some(at) => (&rest[..at], Some(&rest[at + 1..])),
                None => (rest, None),
            };
            let name = String::from_utf8_lossy(name);
            let spelled = format!("--{name}");
            let spec = find_long(&name).ok_or_else(|| unknown(&spelled))?;
            (spec, spelled, value)
        } else {
            let letter = char::from(bytes[1]);
            let rest = &bytes[2..];
            let spec = find_short(letter)
                .filter(|spec| spec.kind.takes_value() || rest.is_empty())
                .ok_or_else(|| unknown(&String::from_utf8_lossy(bytes)))?;
            let value = match rest {
                [] => None,
                [b'=', value @ ..] => Some(value),
                value => Some(value),
            };
            (spec, format!("-{letter}"), value)
        };
        let inline = inline.map(|v| OsStr::from_bytes(v).to_os_string());
        if inline.is_some() && !spec.kind.takes_value() && spec.kind != Kind::LoadApiEnv {
            return Err(UsageError(format!("{spelled} takes no value")));
        }
        match spec.kind {
            Kind::Help => return Ok(Scan::Help),
            Kind::Version => return Ok(Scan::Version),
            _ => {}
        }
        let value = if spec.kind.takes_value() {
            match inline.or_else(|| args.next()) {
                Some(value) => Some(value),
                None => return Err(missing_value(spec.kind, &spelled)),
            }
        } else {
            inline
        };
        options.push(Occurrence {
            kind: spec.kind,
            spelled,
            value,
        });
    }
    Ok(Scan::Done(Scanned { options, program }))
}

/// A value as repeated in a message: at most 80 characters of it.
fn cut(value: &str) -> String {
    const SHOWN: usize = 80;
    match value.char_indices().nth(SHOWN) {
        Some((end, _)) => format!("{}…", &value[..end]),
        None => value.to_owned(),
    }
}

fn missing_value(kind: Kind, spelled: &str) -> UsageError {
    let accepted = match kind {
        Kind::Config(option) => option.accepted(),
        Kind::InputPath => OptionName::InputPath.accepted(),
        Kind::Pid => OptionName::Pid.accepted(),
        _ => "a control word such as start, stop, step or \"display host_leak summary\"",
    };
    UsageError(format!(
        "{spelled} needs a value: accepted values are {accepted}"
    ))
}

/// A value as UTF-8. Everything lands in `config.json` or a control message, both UTF-8, so a
/// non-UTF-8 value is refused here rather than mangled later.
fn utf8<'a>(value: &'a OsStr, spelled: &str) -> Result<&'a str, UsageError> {
    value
        .to_str()
        .ok_or_else(|| UsageError(format!("invalid {spelled}: the value is not valid UTF-8")))
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

/// Stages 2–4: values, modes, cross-option rules.
fn build(scanned: Scanned) -> Result<(Command, GivenOptions), UsageError> {
    let Scanned { options, program } = scanned;
    let mut config = RunConfig::default();
    let mut given = GivenOptions::new();
    let mut input_paths = None;
    let mut pid = None;
    let mut command_word = None;
    let mut compare = false;
    let mut report = false;
    let mut api_env = Vec::new();

    for occurrence in &options {
        let spelled = occurrence.spelled.as_str();
        let value = occurrence.value.as_deref();
        match (occurrence.kind, value) {
            (Kind::Config(option), Some(value)) => {
                set_option(&mut config, option, utf8(value, spelled)?)?;
                given.insert(option);
            }
            (Kind::Verbose | Kind::Quiet, _) => {
                config.log_level = if occurrence.kind == Kind::Verbose {
                    LogLevel::Debug
                } else {
                    LogLevel::Error
                };
                given.insert(OptionName::LogLevel);
            }
            (Kind::InputPath, Some(value)) => {
                input_paths = Some(parse_input_paths(utf8(value, spelled)?)?)
            }
            (Kind::Pid, Some(value)) => pid = Some(parse_pid(utf8(value, spelled)?)?),
            (Kind::CommandWord, Some(value)) => {
                let word = utf8(value, spelled)?;
                if word.trim().is_empty() {
                    return Err(UsageError(format!(
                        "invalid {spelled} \"{word}\": the control word is empty"
                    )));
                }
                command_word = Some(word.to_owned());
            }
            (Kind::Compare, _) => compare = true,
            (Kind::Report, _) => report = true,
            (Kind::LoadApiEnv, value) => {
                let kind = match value.map(|v| utf8(v, spelled)).transpose()? {
                    None | Some("npu" | "cuda") => ApiEnvKind::Device,
                    Some("host") => ApiEnvKind::Host,
                    Some("all") => ApiEnvKind::All,
                    Some(other) => {
                        return Err(UsageError(format!(
                        "invalid --load-api-env \"{}\": accepted values are host, npu, cuda, all",
                        other.escape_debug()
                    )))
                    }
                };
                api_env.push(ApiEnvRequest::Load(kind));
            }
            (Kind::UnloadApiEnv, _) => api_env.push(ApiEnvRequest::Unload),
            // Help and Version end the scan; value-taking kinds always carry a value.
            (Kind::Help | Kind::Version, _)
            | (Kind::Config(_) | Kind::InputPath | Kind::Pid | Kind::CommandWord, None) => {}
        }
    }

    if let Some(&request) = api_env.first() {
        let name = |r: ApiEnvRequest| match r {
            ApiEnvRequest::Load(_) => "--load-api-env",
            ApiEnvRequest::Unload => "--unload-api-env",
        };
        if let Some(other) = api_env.iter().find(|r| name(**r) != name(request)) {
            return Err(UsageError(format!(
                "{} cannot be combined with {}",
                name(request),
                name(*other)
            )));
        }
        let other_option = options
            .iter()
            .find(|o| !matches!(o.kind, Kind::LoadApiEnv | Kind::UnloadApiEnv));
        if let Some(other) = other_option {
            return Err(UsageError(format!(
                "{} cannot be combined with {}; it only edits the environment of the shell that sources msmemscope",
                name(request),
                other.spelled
            )));
        }
        if let Some(first) = program.first() {
            let first = first.to_string_lossy();
            let hint = if matches!(&*first, "host" | "npu" | "cuda" | "all") {
                format!("; did you mean --load-api-env={first}?")
            } else {
                String::new()
            };
            return Err(UsageError(format!(
                "{} takes no program, got \"{}\"{hint}",
                name(request),
                first.escape_debug()
            )));
        }
        return Ok((Command::ApiEnv(*api_env.last().unwrap_or(&request)), given));
    }

    if report && (pid.is_some() || compare) {
        return Err(UsageError(format!(
            "--report writes the page of the run it launches and cannot be combined with {}; for existing results run msmemscope report DIR",
            if compare { "--compare" } else { "--pid" }
        )));
    }
    if command_word.is_some() && pid.is_none() {
        return Err(UsageError("--command needs --pid PID".to_owned()));
    }
    if let Some(pid) = pid {
        if compare {
            return Err(UsageError(
                "--pid cannot be combined with --compare".to_owned(),
            ));
        }
        // The process's options were set when it started: one given here would be ignored.
        if let Some(ignored) = options
            .iter()
            .find(|o| matches!(o.kind, Kind::Config(_) | Kind::InputPath) || o.kind == Kind::Report)
        {
            return Err(UsageError(format!(
                "{} is not used with --pid: the running process keeps the options it started with",
                ignored.spelled
            )));
        }
        if let Some(word) = command_word.as_deref() {
            let word = word.trim();
            if !msmemscope_core::control_frame::COMMAND_WORDS.contains(&word) {
                return Err(UsageError(format!(
                    "unknown --command word {:?}; accepted: {}",
                    cut(word),
                    msmemscope_core::control_frame::COMMAND_WORDS.join(", ")
                )));
            }
        }
        if let Some(first) = program.first() {
            return Err(UsageError(format!(
                "--pid attaches to a running process and cannot be combined with launching \"{}\"",
                first.to_string_lossy().escape_debug()
            )));
        }
        return Ok((
            Command::Attach {
                pid,
                command: command_word,
            },
            given,
        ));
    }
    if compare {
        let Some(inputs) = input_paths else {
            return Err(UsageError(
                "--compare needs --input-path BASE,COMPARE".to_owned(),
            ));
        };
        if let Some(first) = program.first() {
            return Err(UsageError(format!(
                "--compare reads two dumps and cannot be combined with launching \"{}\"",
                first.to_string_lossy().escape_debug()
            )));
        }
        return Ok((Command::Compare { config, inputs }, given));
    }
    if input_paths.is_some() {
        return Err(UsageError("--input-path needs --compare".to_owned()));
    }
    if program.is_empty() {
        return Err(UsageError(
            "no program to launch; usage: msmemscope [options] <program> [args...]; run msmemscope --help for the accepted options"
                .to_owned(),
        ));
    }
    resolve(&mut config, &given)?;
    Ok((
        Command::Launch {
            config,
            program,
            report,
        },
        given,
    ))
}

// --- report / export subcommands (offline, on a finished run) -------------------------------

/// `msmemscope report DIR` and `msmemscope export --format torch-snapshot|parquet DIR`: the
/// first argument is the subcommand's word (a program named so runs as `msmemscope -- report`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Subcommand {
    Report(PathBuf),
    ExportTorchSnapshot(PathBuf),
    Ranks(crate::ranks::Options),
    /// A Parquet file beside each dump of the run(s) in DIR.
    ExportParquet(PathBuf),
}

/// The subcommand argv starts with, if any.
pub fn parse_subcommand(args: &[OsString]) -> Option<Result<Subcommand, UsageError>> {
    let word = args.first()?.to_str()?;
    // `-q` (no progress bars) is taken anywhere after the word, and read by the caller.
    let rest: Vec<OsString> = args[1..].iter().filter(|a| *a != "-q").cloned().collect();
    let rest = &rest[..];
    match word {
        "report" => Some(match rest {
            [dir] if !dir.as_bytes().starts_with(b"-") => Ok(Subcommand::Report(PathBuf::from(dir))),
            [] => Err(UsageError(
                "report needs a directory: msmemscope report DIR (a run directory or the output directory holding runs)".to_owned(),
            )),
            _ => Err(UsageError(format!(
                "report takes one directory and no options, got {}; usage: msmemscope report DIR",
                quoted(rest)
            ))),
        }),
        "export" => Some(parse_export(rest)),
        "ranks" => Some(crate::ranks::parse(rest).map(Subcommand::Ranks)),
        _ => None,
    }
}

fn quoted(args: &[OsString]) -> String {
    args.iter()
        .map(|a| format!("\"{}\"", a.to_string_lossy().escape_debug()))
        .collect::<Vec<_>>()
        .join(" ")
}

fn parse_export(rest: &[OsString]) -> Result<Subcommand, UsageError> {
    const USAGE: &str = "usage: msmemscope export --format torch-snapshot|parquet DIR";
    const ACCEPTED: &str = "accepted values are torch-snapshot, parquet";
    let mut format = None;
    let mut dir = None;
    let mut args = rest.iter();
    while let Some(arg) = args.next() {
        let bytes = arg.as_bytes();
        if bytes == b"--format" {
            let value = args
                .next()
                .ok_or_else(|| UsageError(format!("export --format needs a value: {ACCEPTED}")))?;
            format = Some(value.clone());
        } else if let Some(value) = bytes.strip_prefix(b"--format=") {
            format = Some(OsStr::from_bytes(value).to_owned());
        } else if bytes.starts_with(b"-") || dir.is_some() {
            return Err(UsageError(format!(
                "export does not take {}; {USAGE}",
                quoted(std::slice::from_ref(arg))
            )));
        } else {
            dir = Some(PathBuf::from(arg));
        }
    }
    let make: fn(PathBuf) -> Subcommand = match format.as_ref().map(|f| f.as_bytes()) {
        None => {
            return Err(UsageError(format!(
                "export needs --format torch-snapshot or parquet; {USAGE}"
            )))
        }
        Some(b"torch-snapshot") => Subcommand::ExportTorchSnapshot,
        Some(b"parquet") => Subcommand::ExportParquet,
        Some(_) => {
            return Err(UsageError(format!(
                "invalid export --format \"{}\": {ACCEPTED}",
                format.unwrap_or_default().to_string_lossy().escape_debug()
            )))
        }
    };
    dir.map(make)
        .ok_or_else(|| UsageError(format!("export needs a directory; {USAGE}")))
}

/// What this build can run, stated in `--help`; edited together with [`refuse_unavailable`].
const AVAILABILITY: &str = "--analysis=host-leaks, the event dump (--analysis=none) and the \
leaks, decompose, oom and inefficient analyses launch with every dump option; --pid attaches to a \
running process; --compare diffs two dumps; --watch checksums (or dumps) watched blocks before and \
after every op of its range.";

/// The capability gate: everything this build parses and validates but cannot run yet. It is
/// the last stage, so a bad value is always reported as such first. Each later feature deletes
/// its lines here (and updates [`AVAILABILITY`]).
fn refuse_unavailable(command: &Command) -> Result<(), UsageError> {
    let config = match command {
        Command::Help(_)
        | Command::Version(_)
        | Command::ApiEnv(_)
        | Command::Attach { .. }
        | Command::Compare { .. } => return Ok(()),
        Command::Launch { config, .. } => config,
    };
    // Every analysis runs in this build, and --watch.
    let _ = config;
    Ok(())
}

#[cfg(test)]
mod tests {
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
