//! The names of the options and the one error type of their values.
//!
//! The same value check serves the command line (`--level op`) and, later, Python's
//! `msmemscope.config(level="op")`. An error therefore carries *which* option was wrong as an
//! [`OptionName`], and the caller picks the spelling the user typed with [`NameStyle`]:
//! `invalid --level "foo": …` on the command line, `invalid level "foo": …` in a Python exception.

use std::collections::BTreeSet;
use std::fmt::Write as _;

/// How an error message spells option names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NameStyle {
    /// `--level`, `--analysis=leaks`: what a command-line user typed.
    Cli,
    /// `level`, `analysis="leaks"`: what a `msmemscope.config(**kw)` caller typed.
    Python,
}

/// Every option whose value is checked here, independent of how it is spelled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum OptionName {
    LogLevel,
    Events,
    Level,
    Steps,
    CallStack,
    CollectMode,
    Device,
    Analysis,
    Watch,
    OutputPath,
    Format,
    /// The original msMemScope's alias of [`OptionName::Format`]; kept apart so errors repeat the
    /// user's spelling.
    DataFormat,
    HostLeakMode,
    BlockSizeThreshold,
    SampleRate,
    /// `--sample-bytes N`: host-leak sampling by bytes, one sample per N bytes allocated on
    /// average (0: exact).
    SampleBytes,
    /// `--input-path a,b` of `--compare`; not part of a [`RunConfig`](crate::config::RunConfig).
    InputPath,
    /// `--pid PID` of the attach client; not part of a [`RunConfig`](crate::config::RunConfig).
    Pid,
    /// `--follow exec|none`: which processes of the job the launcher's run traces. Launcher
    /// only (not a `msmemscope.config` key: a program's own API run traces itself).
    Follow,
    /// `--python-objects on|off`: whether a host-leak window accounts CPython's own allocators.
    PythonObjects,
    /// `--dump-budget SIZE|unlimited`: the most bytes a process's event dump keeps on disk.
    DumpBudget,
}

impl OptionName {
    /// Every option that sets a field of [`RunConfig`](crate::config::RunConfig).
    pub const CONFIG: [OptionName; 18] = [
        OptionName::LogLevel,
        OptionName::Events,
        OptionName::Level,
        OptionName::Steps,
        OptionName::CallStack,
        OptionName::CollectMode,
        OptionName::Device,
        OptionName::Analysis,
        OptionName::Watch,
        OptionName::OutputPath,
        OptionName::Format,
        OptionName::DataFormat,
        OptionName::HostLeakMode,
        OptionName::BlockSizeThreshold,
        OptionName::SampleRate,
        OptionName::SampleBytes,
        OptionName::PythonObjects,
        OptionName::DumpBudget,
    ];

    /// The long command-line spelling, with its leading `--`.
    pub const fn cli(self) -> &'static str {
        match self {
            OptionName::LogLevel => "--log-level",
            OptionName::Events => "--events",
            OptionName::Level => "--level",
            OptionName::Steps => "--steps",
            OptionName::CallStack => "--call-stack",
            OptionName::CollectMode => "--collect-mode",
            OptionName::Device => "--device",
            OptionName::Analysis => "--analysis",
            OptionName::Watch => "--watch",
            OptionName::OutputPath => "--output-path",
            OptionName::Format => "--format",
            OptionName::DataFormat => "--data-format",
            OptionName::HostLeakMode => "--host-leak-mode",
            OptionName::BlockSizeThreshold => "--block-size-threshold",
            OptionName::SampleRate => "--sample-rate",
            OptionName::SampleBytes => "--sample-bytes",
            OptionName::InputPath => "--input-path",
            OptionName::Pid => "--pid",
            OptionName::Follow => "--follow",
            OptionName::PythonObjects => "--python-objects",
            OptionName::DumpBudget => "--dump-budget",
        }
    }

    /// The `msmemscope.config(**kw)` key: the long option without `--`, `-` replaced by `_`.
    pub const fn python_key(self) -> &'static str {
        match self {
            OptionName::LogLevel => "log_level",
            OptionName::Events => "events",
            OptionName::Level => "level",
            OptionName::Steps => "steps",
            OptionName::CallStack => "call_stack",
            OptionName::CollectMode => "collect_mode",
            OptionName::Device => "device",
            OptionName::Analysis => "analysis",
            OptionName::Watch => "watch",
            OptionName::OutputPath => "output_path",
            OptionName::Format => "format",
            OptionName::DataFormat => "data_format",
            OptionName::HostLeakMode => "host_leak_mode",
            OptionName::BlockSizeThreshold => "block_size_threshold",
            OptionName::SampleRate => "sample_rate",
            OptionName::SampleBytes => "sample_bytes",
            OptionName::InputPath => "input_path",
            OptionName::Pid => "pid",
            OptionName::Follow => "follow",
            OptionName::PythonObjects => "python_objects",
            OptionName::DumpBudget => "dump_budget",
        }
    }

    /// The name in the given style.
    pub const fn name(self, style: NameStyle) -> &'static str {
        match style {
            NameStyle::Cli => self.cli(),
            NameStyle::Python => self.python_key(),
        }
    }

    /// The option a `msmemscope.config(**kw)` key sets; `None` for keys that configure no run
    /// (`pid`, `input_path`) and for unknown keys, so the Python side can reject them by name.
    pub fn from_python_key(key: &str) -> Option<OptionName> {
        OptionName::CONFIG
            .into_iter()
            .find(|o| o.python_key() == key)
    }

    /// What the option accepts, in words; shared by error messages and `--help`.
    pub const fn accepted(self) -> &'static str {
        match self {
            OptionName::LogLevel => "debug, info, warning, error",
            OptionName::Events => "a list of alloc, free, launch, access (access implies alloc and free), or none alone",
            OptionName::Level => "op, kernel",
            OptionName::Steps => "1 to 5 positive step numbers separated by commas, e.g. 1,3",
            OptionName::CallStack => "c[:N], python[:N] separated by commas, depth N from 0 to 1000 (N left out: 50); host-leak stacks keep at most 20 C and 32 Python frames (Python frames on by default there, 20)",
            OptionName::CollectMode => "immediate, deferred",
            OptionName::Device => "a list of cpu, cuda, cuda:N (npu and npu:N are aliases of cuda and cuda:N)",
            OptionName::Analysis => "a list of leaks, decompose, inefficient, oom[:K] (K from 1 to 1000, default 10); or host-leaks alone; or none alone",
            OptionName::Watch => "start[:outid],end[,full-content] where start and end are op names and outid an output index",
            OptionName::OutputPath => "a non-empty directory path",
            OptionName::Format | OptionName::DataFormat => "csv, db, parquet",
            OptionName::HostLeakMode => "summary, event",
            OptionName::BlockSizeThreshold => "a byte count from 0 to 18446744073709551615",
            OptionName::SampleRate => "a positive integer, rounded up to a power of two and clipped to 1073741824 (2^30)",
            OptionName::SampleBytes => "a byte count from 0 (exact, every block) to 1099511627776 (2^40): the mean number of bytes allocated between two samples, e.g. 524288",
            OptionName::InputPath => "exactly two paths separated by a comma, e.g. base.csv,compare.csv",
            OptionName::Pid => "a positive process id",
            OptionName::Follow => "exec (every process the program starts with exec is traced too), none (only the program)",
            OptionName::PythonObjects => "on (host leaks include Python objects, CPython's own allocators), off (only the C heap)",
            OptionName::DumpBudget => "a size of at least 1MiB (bytes, or with K, M, G, KiB, MiB, GiB: 256MiB, 2G), or unlimited (keep every row)",
        }
    }
}

/// One option with (optionally) its value, as named inside an error message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Setting {
    pub option: OptionName,
    /// The value in the option's own syntax (`leaks`, `alloc,launch`); `None` names the option alone.
    pub value: Option<String>,
}

impl Setting {
    pub fn new(option: OptionName, value: impl Into<String>) -> Setting {
        Setting {
            option,
            value: Some(value.into()),
        }
    }

    pub fn bare(option: OptionName) -> Setting {
        Setting {
            option,
            value: None,
        }
    }

    /// `--analysis=leaks` or `analysis="leaks"`. Escapes control characters so the message
    /// stays on one line whatever the user typed.
    fn render(&self, style: NameStyle, out: &mut String) {
        out.push_str(self.option.name(style));
        if let Some(value) = &self.value {
            match style {
                NameStyle::Cli => {
                    out.push('=');
                    push_escaped(out, value);
                }
                NameStyle::Python => {
                    out.push_str("=\"");
                    push_escaped(out, value);
                    out.push('"');
                }
            }
        }
    }
}

/// At most this many characters of a value are repeated in a message: a 120 kB value would
/// bury the line that says what is wrong with it.
pub const SHOWN_VALUE_CHARS: usize = 80;

/// Appends `value` with every non-printable character escaped; printable non-ASCII (such as
/// the full-width comma) stays as typed. A long value is cut, and the cut is marked.
fn push_escaped(out: &mut String, value: &str) {
    let mut chars = value.chars();
    for c in chars.by_ref().take(SHOWN_VALUE_CHARS) {
        if c.is_control() {
            out.extend(c.escape_debug());
        } else {
            out.push(c);
        }
    }
    if chars.next().is_some() {
        let _ = write!(out, "… ({} characters in all)", value.chars().count());
    }
}

/// A rejected option value or combination. Its `Display` is one line in command-line spelling;
/// [`ConfigError::render`] gives the Python spelling.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// The value is not one the option accepts. `detail` says what exactly was wrong when the
    /// list of accepted values alone would not make it obvious (a sixth step, a zero depth…).
    #[error("{}", self.render(NameStyle::Cli))]
    Invalid {
        option: OptionName,
        value: String,
        detail: Option<String>,
    },
    /// Two settings, each valid alone, that cannot be combined; `reason` joins them into a
    /// sentence: `{first} {reason} {second}`.
    #[error("{}", self.render(NameStyle::Cli))]
    Conflict {
        first: Setting,
        reason: &'static str,
        second: Setting,
    },
    /// The option exists but does not configure a run (`--pid`, `--input-path`), so it cannot be
    /// set on a [`RunConfig`](crate::config::RunConfig).
    #[error("{}", self.render(NameStyle::Cli))]
    NotConfigurable { option: OptionName },
}

impl ConfigError {
    /// An invalid value whose accepted-values list says it all.
    pub fn invalid(option: OptionName, value: &str) -> ConfigError {
        ConfigError::Invalid {
            option,
            value: value.to_owned(),
            detail: None,
        }
    }

    /// An invalid value with a short explanation of what exactly was wrong.
    pub fn invalid_because(
        option: OptionName,
        value: &str,
        detail: impl Into<String>,
    ) -> ConfigError {
        ConfigError::Invalid {
            option,
            value: value.to_owned(),
            detail: Some(detail.into()),
        }
    }

    /// The same error naming `option` instead: a value check written for `--format` reports
    /// `--data-format` when that is what the user typed.
    pub fn for_option(mut self, option: OptionName) -> ConfigError {
        match &mut self {
            ConfigError::Invalid { option: o, .. } | ConfigError::NotConfigurable { option: o } => {
                *o = option
            }
            ConfigError::Conflict { .. } => {}
        }
        self
    }

    /// The option the error is about (the first one of a conflict).
    pub fn option(&self) -> OptionName {
        match self {
            ConfigError::Invalid { option, .. } | ConfigError::NotConfigurable { option } => {
                *option
            }
            ConfigError::Conflict { first, .. } => first.option,
        }
    }

    /// The message, one line, with option names spelled in `style`.
    pub fn render(&self, style: NameStyle) -> String {
        let mut out = String::new();
        match self {
            ConfigError::Invalid {
                option,
                value,
                detail,
            } => {
                let _ = write!(out, "invalid {} \"", option.name(style));
                push_escaped(&mut out, value);
                out.push_str("\": ");
                if let Some(detail) = detail {
                    push_escaped(&mut out, detail);
                    out.push_str("; ");
                }
                out.push_str("accepted values are ");
                out.push_str(option.accepted());
            }
            ConfigError::Conflict {
                first,
                reason,
                second,
            } => {
                first.render(style, &mut out);
                out.push(' ');
                out.push_str(reason);
                out.push(' ');
                second.render(style, &mut out);
            }
            ConfigError::NotConfigurable { option } => {
                let _ = write!(
                    out,
                    "{} is not a run configuration option",
                    option.name(style)
                );
            }
        }
        out
    }
}

/// The options a user set explicitly (as opposed to left at their defaults). Cross-option rules
/// depend on it: `--steps` turns the *default* analysis off but conflicts with an explicit one.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GivenOptions(BTreeSet<OptionName>);

impl GivenOptions {
    pub fn new() -> GivenOptions {
        GivenOptions::default()
    }

    /// Records `option` as given; the `--data-format` alias counts as `--format`.
    pub fn insert(&mut self, option: OptionName) {
        let option = match option {
            OptionName::DataFormat => OptionName::Format,
            other => other,
        };
        self.0.insert(option);
    }

    /// Whether `option` was given (asking for either format spelling answers for both).
    pub fn contains(&self, option: OptionName) -> bool {
        let option = match option {
            OptionName::DataFormat => OptionName::Format,
            other => other,
        };
        self.0.contains(&option)
    }

    pub fn iter(&self) -> impl Iterator<Item = OptionName> + '_ {
        self.0.iter().copied()
    }
}
