//! Stage 1, syntax: argv split into option occurrences (looked up in the table) and the
//! program, in argv order.

use super::*;

/// One option occurrence after the syntax pass.
pub(super) struct Occurrence {
    pub(super) kind: Kind,
    /// As the user spelled it (`--data-format`, `-o`), for messages.
    pub(super) spelled: String,
    pub(super) value: Option<OsString>,
}

/// The result of the syntax pass.
pub(super) enum Scan {
    /// The options in argv order and the program, if any.
    Done(Scanned),
    /// `-h`: answer with the help at once.
    Help,
    /// `-V`: answer with the version at once.
    Version,
}

/// Options in argv order and the program (empty when none was given).
pub(super) struct Scanned {
    pub(super) options: Vec<Occurrence>,
    pub(super) program: Vec<OsString>,
}

/// Stage 1: splits argv into options and the program. `-h` and `-V` end parsing early and win
/// over bad values anywhere, so `msmemscope --level=x --help` helps rather than scolds (but an
/// unknown option before them is reported: its arity, and so the rest of argv, is unknown).
pub(super) fn scan(args: Vec<OsString>) -> Result<Scan, UsageError> {
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
                None => return Err(missing_value(spec, &spelled)),
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
pub(super) fn cut(value: &str) -> String {
    const SHOWN: usize = 80;
    match value.char_indices().nth(SHOWN) {
        Some((end, _)) => format!("{}…", &value[..end]),
        None => value.to_owned(),
    }
}

pub(super) fn missing_value(spec: &OptSpec, spelled: &str) -> UsageError {
    let accepted = match spec.shared {
        Some(option) => option.accepted(),
        // `--command`, the one value-taking option of the command line's own.
        None => "a control word such as start, stop, step or \"display host_leak summary\"",
    };
    UsageError(format!(
        "{spelled} needs a value: accepted values are {accepted}"
    ))
}

/// A value as UTF-8. Everything lands in `config.json` or a control message, both UTF-8, so a
/// non-UTF-8 value is refused here rather than mangled later.
pub(super) fn utf8<'a>(value: &'a OsStr, spelled: &str) -> Result<&'a str, UsageError> {
    value
        .to_str()
        .ok_or_else(|| UsageError(format!("invalid {spelled}: the value is not valid UTF-8")))
}
