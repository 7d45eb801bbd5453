//! The one error type of option values.
//!
//! The same value check serves the command line (`--level op`) and Python's
//! `msmemscope.config(level="op")`. An error therefore carries *which* option was wrong as an
//! [`OptionName`], and the caller picks the spelling the user typed with [`NameStyle`]:
//! `invalid --level "foo": …` on the command line, `invalid level "foo": …` in a Python exception.
//! Names and accepted values come from the option table (`config/options.rs`).

use crate::config::options::{NameStyle, OptionName};
use std::collections::BTreeSet;
use std::fmt::Write as _;

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

    /// Records `option` as given; an alias (`--data-format`) counts as its option (`--format`).
    pub fn insert(&mut self, option: OptionName) {
        self.0.insert(option.canonical());
    }

    /// Whether `option` was given (asking for either spelling of an option answers for both).
    pub fn contains(&self, option: OptionName) -> bool {
        self.0.contains(&option.canonical())
    }

    pub fn iter(&self) -> impl Iterator<Item = OptionName> + '_ {
        self.0.iter().copied()
    }
}
