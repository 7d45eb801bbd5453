//! `msmemscope ranks DIR…`: one line per rank and device of a distributed job, and which ranks
//! stand out. Each run directory under the given directories is one rank's run (its rank is in
//! its `config.json`); each of its dumps one line.
//!
//! Three engines compute the same table: `native` (the analyses of `msmemscope_core`, one
//! thread per core), and `duckdb` or `spark` (the package's `ranks.sql` over the dumps' Parquet
//! files, through Python). The engines produce rows; the outliers and the printing are
//! computed from rows the same way whichever engine made them.

mod discover;
mod engine;
mod native;
mod table;

pub use discover::dump_files;
pub use table::{bytes, Row};

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::process::ExitCode;

use crate::failure::UsageError;

pub const USAGE: &str = "usage: msmemscope ranks DIR... [--engine native|duckdb|spark] \
    [--output-format table|csv|json] [--threshold PCT]";

/// A rank stands out when its peak or its leaked bytes are more than this many percent above
/// the median of all lines.
pub const DEFAULT_THRESHOLD_PCT: u32 = 25;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    Native,
    Duckdb,
    Spark,
}

impl Engine {
    pub fn as_str(self) -> &'static str {
        match self {
            Engine::Native => "native",
            Engine::Duckdb => "duckdb",
            Engine::Spark => "spark",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputFormat {
    Table,
    Csv,
    Json,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    pub dirs: Vec<PathBuf>,
    pub engine: Engine,
    pub format: OutputFormat,
    pub threshold_pct: u32,
}

/// Parses what follows `ranks`.
pub fn parse(rest: &[OsString]) -> Result<Options, UsageError> {
    let mut options = Options {
        dirs: Vec::new(),
        engine: Engine::Native,
        format: OutputFormat::Table,
        threshold_pct: DEFAULT_THRESHOLD_PCT,
    };
    let mut args = rest.iter();
    while let Some(arg) = args.next() {
        let bytes = arg.as_bytes();
        let (flag, inline) = match bytes.iter().position(|&b| b == b'=') {
            Some(eq) if bytes.starts_with(b"--") => (&bytes[..eq], Some(&bytes[eq + 1..])),
            _ => (bytes, None),
        };
        let mut value = |name: &str| -> Result<String, UsageError> {
            let raw = match inline {
                Some(v) => v.to_vec(),
                None => args
                    .next()
                    .map(|v| v.as_bytes().to_vec())
                    .ok_or_else(|| UsageError(format!("ranks {name} needs a value; {USAGE}")))?,
            };
            String::from_utf8(raw)
                .map_err(|_| UsageError(format!("ranks {name}: the value is not UTF-8")))
        };
        match flag {
            b"--engine" => {
                options.engine = match value("--engine")?.as_str() {
                    "native" => Engine::Native,
                    "duckdb" => Engine::Duckdb,
                    "spark" => Engine::Spark,
                    other => {
                        return Err(UsageError(format!(
                        "invalid ranks --engine \"{}\": accepted values are native, duckdb, spark",
                        other.escape_debug()
                    )))
                    }
                }
            }
            b"--output-format" => {
                options.format = match value("--output-format")?.as_str() {
                    "table" => OutputFormat::Table,
                    "csv" => OutputFormat::Csv,
                    "json" => OutputFormat::Json,
                    other => {
                        return Err(UsageError(format!(
                    "invalid ranks --output-format \"{}\": accepted values are table, csv, json",
                    other.escape_debug()
                )))
                    }
                }
            }
            b"--threshold" => {
                let text = value("--threshold")?;
                options.threshold_pct = text
                    .trim_end_matches('%')
                    .parse()
                    .ok()
                    .filter(|&p: &u32| p <= 100_000)
                    .ok_or_else(|| {
                        UsageError(format!(
                            "invalid ranks --threshold \"{}\": accepted values are whole percentages from 0 to 100000 (e.g. 25 or 25%)",
                            text.escape_debug()
                        ))
                    })?;
            }
            _ if bytes.starts_with(b"-") => {
                return Err(UsageError(format!(
                    "ranks does not take \"{}\"; {USAGE}",
                    arg.to_string_lossy().escape_debug()
                )))
            }
            _ => options.dirs.push(PathBuf::from(arg)),
        }
    }
    if options.dirs.is_empty() {
        return Err(UsageError(format!(
            "ranks needs at least one directory holding run directories (one per rank); {USAGE}"
        )));
    }
    Ok(options)
}

/// Why `ranks` could not make its table: one line, and whether it was the user's input.
use crate::failure::Failure;

/// Runs `ranks` and prints its table.
pub fn run(options: &Options) -> ExitCode {
    match table_for(options) {
        Ok(table) => {
            print!("{}", table.render(options.format));
            ExitCode::SUCCESS
        }
        Err(failure) => {
            eprintln!("msmemscope: ranks: {}", failure.message);
            ExitCode::from(if failure.usage { 2 } else { 1 })
        }
    }
}

/// The native engine's rows for the dumps of the given run directories (a job's processes),
/// outliers marked against the default threshold.
pub fn rows_of_runs(runs: Vec<PathBuf>) -> Result<Vec<Row>, Failure> {
    let dumps = discover::dumps_of(runs)?;
    native::summarize(&dumps, DEFAULT_THRESHOLD_PCT)
}

fn table_for(options: &Options) -> Result<table::Table, Failure> {
    let dumps = discover::dumps_under(&options.dirs)?;
    let rows = match options.engine {
        Engine::Native => native::summarize(&dumps, options.threshold_pct)?,
        engine => engine::summarize(engine, &dumps, options.threshold_pct)?,
    };
    Ok(table::Table::new(rows, options.threshold_pct))
}
