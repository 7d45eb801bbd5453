//! The offline subcommands: `report`, `export` and `ranks`, on finished runs.

use super::*;

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

pub(super) fn quoted(args: &[OsString]) -> String {
    args.iter()
        .map(|a| format!("\"{}\"", a.to_string_lossy().escape_debug()))
        .collect::<Vec<_>>()
        .join(" ")
}

pub(super) fn parse_export(rest: &[OsString]) -> Result<Subcommand, UsageError> {
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
