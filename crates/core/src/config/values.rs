//! Parsing and validation of each option value, one function per option.
//!
//! Every function takes the value as the user typed it (`&str`, which is also what
//! `msmemscope.config(**kw)` receives, since the original msMemScope's config values are strings)
//! and returns the typed value or a [`ConfigError`] that names the option and its accepted values.
//! The command line and the Python API call the same functions, so both accept exactly the same
//! spellings.
//!
//! Lists (`--events`, `--steps`, `--call-stack`, `--device`, `--analysis`, `--watch`,
//! `--input-path`) are separated by `,` or by the full-width comma `，` (U+FF0C), as the original
//! msMemScope's users type on Chinese keyboards. Spaces around an item are ignored; an empty item
//! is an error, because `alloc,,free` is far more often a typo than an intent.
//!
//! Cross-option rules (`--steps` versus `--analysis`, events an analysis needs, …) live in
//! [`validate`] and [`resolve`], which look at a whole [`RunConfig`].

mod error;
mod rules;

pub use error::{ConfigError, GivenOptions, Setting};
pub use rules::{resolve, validate};

use super::options::OptionName;
use super::types::*;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

/// The two list separators: ASCII comma and full-width comma (U+FF0C).
const SEPARATORS: [char; 2] = [',', '\u{FF0C}'];

/// Splits a list value at either comma and trims spaces around each item; items may be empty.
pub fn split_list(value: &str) -> impl Iterator<Item = &str> {
    value.split(SEPARATORS).map(str::trim)
}

/// The items of a list value, rejecting an empty value and empty items.
fn list_items(option: OptionName, value: &str) -> Result<Vec<&str>, ConfigError> {
    let items: Vec<&str> = split_list(value).collect();
    if items.iter().any(|item| item.is_empty()) {
        let detail = if value.trim().is_empty() {
            "the value is empty"
        } else {
            "the list has an empty item"
        };
        return Err(ConfigError::invalid_because(option, value, detail));
    }
    Ok(items)
}

/// A decimal number made of ASCII digits only: no sign, no spaces, no `0x`, which `FromStr`
/// for integers would partly accept. `None` when malformed or out of range for `T`.
fn parse_digits<T: FromStr>(text: &str) -> Option<T> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// Looks `value` up in a table of (spelling, value) pairs.
fn one_of<T: Copy>(option: OptionName, value: &str, table: &[(&str, T)]) -> Result<T, ConfigError> {
    table
        .iter()
        .find(|(name, _)| *name == value)
        .map(|(_, v)| *v)
        .ok_or_else(|| ConfigError::invalid(option, value))
}

/// `--log-level debug|info|warning|error`.
pub fn parse_log_level(value: &str) -> Result<LogLevel, ConfigError> {
    one_of(
        OptionName::LogLevel,
        value,
        &[
            ("debug", LogLevel::Debug),
            ("info", LogLevel::Info),
            ("warning", LogLevel::Warning),
            ("error", LogLevel::Error),
        ],
    )
}

/// `--events alloc,free,launch,access,none`. `access` implies `alloc` and `free` (an access
/// means nothing without the block it touches); `none` alone means no events. The result is
/// deduplicated and in the canonical order alloc, free, launch, access.
pub fn parse_events(value: &str) -> Result<Vec<EventKind>, ConfigError> {
    let option = OptionName::Events;
    let items = list_items(option, value)?;
    if items.contains(&"none") {
        if items.iter().all(|item| *item == "none") {
            return Ok(Vec::new());
        }
        return Err(ConfigError::invalid_because(
            option,
            value,
            "none cannot be combined with other events",
        ));
    }
    let mut wanted = [false; 4];
    for item in items {
        let kind = one_of(
            option,
            item,
            &[
                ("alloc", EventKind::Alloc),
                ("free", EventKind::Free),
                ("launch", EventKind::Launch),
                ("access", EventKind::Access),
            ],
        )
        .map_err(|_| unknown_item(option, value, item))?;
        wanted[event_index(kind)] = true;
        if kind == EventKind::Access {
            wanted[event_index(EventKind::Alloc)] = true;
            wanted[event_index(EventKind::Free)] = true;
        }
    }
    Ok(EVENT_ORDER
        .into_iter()
        .filter(|kind| wanted[event_index(*kind)])
        .collect())
}

/// The canonical order of events in a [`RunConfig`].
const EVENT_ORDER: [EventKind; 4] = [
    EventKind::Alloc,
    EventKind::Free,
    EventKind::Launch,
    EventKind::Access,
];

fn event_index(kind: EventKind) -> usize {
    match kind {
        EventKind::Alloc => 0,
        EventKind::Free => 1,
        EventKind::Launch => 2,
        EventKind::Access => 3,
    }
}

/// The error for one bad item of a list: the whole value is shown, the item named.
fn unknown_item(option: OptionName, value: &str, item: &str) -> ConfigError {
    if item == value {
        ConfigError::invalid(option, value)
    } else {
        ConfigError::invalid_because(option, value, format!("unknown item \"{item}\""))
    }
}

/// `--level op|kernel`.
pub fn parse_level(value: &str) -> Result<Level, ConfigError> {
    one_of(
        OptionName::Level,
        value,
        &[("op", Level::Op), ("kernel", Level::Kernel)],
    )
}

/// `--steps N[,N…]`: at most [`MAX_STEPS`] distinct positive step numbers, sorted ascending
/// (steps are compared by number, so the order typed carries no meaning).
pub fn parse_steps(value: &str) -> Result<Vec<u32>, ConfigError> {
    let option = OptionName::Steps;
    let mut steps = Vec::new();
    for item in list_items(option, value)? {
        match parse_digits::<u32>(item) {
            Some(0) => {
                return Err(ConfigError::invalid_because(
                    option,
                    value,
                    "step numbers start at 1",
                ))
            }
            Some(step) => steps.push(step),
            None => return Err(unknown_item(option, value, item)),
        }
    }
    steps.sort_unstable();
    steps.dedup();
    if steps.len() > MAX_STEPS {
        return Err(ConfigError::invalid_because(
            option,
            value,
            format!("{} steps given, at most {MAX_STEPS} allowed", steps.len()),
        ));
    }
    Ok(steps)
}

/// `--call-stack c[:N],python[:N]`: which stacks to record and how deep (0 to
/// [`MAX_STACK_DEPTH`], default [`DEFAULT_STACK_DEPTH`]). A kind named twice must name the same
/// depth, since there is no good guess which of two depths was meant.
pub fn parse_call_stack(value: &str) -> Result<CallStack, ConfigError> {
    let option = OptionName::CallStack;
    let mut stack = CallStack::default();
    for item in list_items(option, value)? {
        let (kind, depth) = match item.split_once(':') {
            Some((kind, depth)) => (kind, Some(depth)),
            None => (item, None),
        };
        let slot = match kind {
            "c" => &mut stack.c,
            "python" => &mut stack.python,
            _ => return Err(unknown_item(option, value, item)),
        };
        let depth = match depth {
            None => DEFAULT_STACK_DEPTH,
            Some(text) => match parse_digits::<u32>(text) {
                Some(depth) if depth <= MAX_STACK_DEPTH => depth,
                _ => {
                    return Err(ConfigError::invalid_because(
                        option,
                        value,
                        format!(
                        "depth \"{text}\" of {kind} is not a number from 0 to {MAX_STACK_DEPTH}"
                    ),
                    ))
                }
            },
        };
        if slot.is_some_and(|old| old != depth) {
            return Err(ConfigError::invalid_because(
                option,
                value,
                format!("{kind} is given twice with different depths"),
            ));
        }
        *slot = Some(depth);
    }
    Ok(stack)
}

/// `--collect-mode immediate|deferred`.
pub fn parse_collect_mode(value: &str) -> Result<CollectMode, ConfigError> {
    one_of(
        OptionName::CollectMode,
        value,
        &[
            ("immediate", CollectMode::Immediate),
            ("deferred", CollectMode::Deferred),
        ],
    )
}

/// `--device cpu,cuda,cuda:N`. The original msMemScope's `npu` and `npu:N` are accepted as aliases
/// of `cuda` and `cuda:N` so its command lines run unchanged. Duplicates are dropped; the order
/// typed is kept.
pub fn parse_devices(value: &str) -> Result<Vec<Device>, ConfigError> {
    let option = OptionName::Device;
    let mut devices = Vec::new();
    for item in list_items(option, value)? {
        let device = match item.split_once(':') {
            None => match item {
                "cpu" => Device::Cpu,
                "cuda" | "npu" => Device::Cuda,
                _ => return Err(unknown_item(option, value, item)),
            },
            Some(("cuda" | "npu", index)) => match parse_digits::<u32>(index) {
                Some(index) => Device::CudaIndex(index),
                None => {
                    return Err(ConfigError::invalid_because(
                        option,
                        value,
                        format!("device index \"{index}\" is not a number"),
                    ))
                }
            },
            Some(_) => return Err(unknown_item(option, value, item)),
        };
        if !devices.contains(&device) {
            devices.push(device);
        }
    }
    Ok(devices)
}

/// `--analysis leaks|decompose|inefficient|oom[:K]|host-leaks|none`, a list. `none` alone is
/// the empty list; `host-leaks` must stand alone (the original msMemScope keeps host-heap
/// accounting apart from the device analyses). Duplicates are dropped; `oom` given twice must name
/// the same K.
pub fn parse_analysis(value: &str) -> Result<Vec<Analysis>, ConfigError> {
    let option = OptionName::Analysis;
    let items = list_items(option, value)?;
    for (word, what) in [("none", "none"), ("host-leaks", "host-leaks")] {
        if items.contains(&word) && items.iter().any(|item| *item != word) {
            return Err(ConfigError::invalid_because(
                option,
                value,
                format!("{what} cannot be combined with other analyses"),
            ));
        }
    }
    if items.contains(&"none") {
        return Ok(Vec::new());
    }
    let mut analyses: Vec<Analysis> = Vec::new();
    for item in items {
        let analysis = match item.split_once(':') {
            None => match item {
                "leaks" => Analysis::Leaks,
                "decompose" => Analysis::Decompose,
                "inefficient" => Analysis::Inefficient,
                "oom" => Analysis::Oom(DEFAULT_OOM_K),
                "host-leaks" => Analysis::HostLeaks,
                _ => return Err(unknown_item(option, value, item)),
            },
            Some(("oom", k)) => match parse_digits::<u32>(k) {
                Some(k) if (1..=MAX_OOM_K).contains(&k) => Analysis::Oom(k),
                _ => {
                    return Err(ConfigError::invalid_because(
                        option,
                        value,
                        format!("K \"{k}\" of oom is not a number from 1 to {MAX_OOM_K}"),
                    ))
                }
            },
            Some(_) => return Err(unknown_item(option, value, item)),
        };
        let clash = analyses
            .iter()
            .any(|old| matches!((old, analysis), (Analysis::Oom(a), Analysis::Oom(b)) if *a != b));
        if clash {
            return Err(ConfigError::invalid_because(
                option,
                value,
                "oom is given twice with different K",
            ));
        }
        if !analyses.contains(&analysis) {
            analyses.push(analysis);
        }
    }
    Ok(analyses)
}

/// `--watch start[:outid],end[,full-content]`. Op names may contain `::` and `.`
/// (`aten::add.Tensor`), so the output index is the number after the last *single* colon of the
/// start field, one not part of a `::`: `aten::add.Tensor:1` is op `aten::add.Tensor`, output 1.
pub fn parse_watch(value: &str) -> Result<WatchSpec, ConfigError> {
    let option = OptionName::Watch;
    let fields = list_items(option, value)?;
    let (start, end, full_content) = match fields.as_slice() {
        [_] => {
            return Err(ConfigError::invalid_because(
                option,
                value,
                "the end op is missing",
            ))
        }
        [start, end] => (*start, *end, false),
        [start, end, "full-content"] => (*start, *end, true),
        [_, _, third] => {
            return Err(ConfigError::invalid_because(
                option,
                value,
                format!("the third field must be full-content, not \"{third}\""),
            ))
        }
        _ => {
            return Err(ConfigError::invalid_because(
                option,
                value,
                "more than three fields",
            ))
        }
    };
    let (start, outid) = match last_single_colon(start) {
        None => (start, None),
        Some(at) => {
            let digits = &start[at + 1..];
            match parse_digits::<u32>(digits) {
                Some(outid) => (&start[..at], Some(outid)),
                None => {
                    return Err(ConfigError::invalid_because(
                        option,
                        value,
                        format!("outid \"{digits}\" after the last ':' is not a number"),
                    ))
                }
            }
        }
    };
    if start.is_empty() {
        return Err(ConfigError::invalid_because(
            option,
            value,
            "the start op name is empty",
        ));
    }
    Ok(WatchSpec {
        start: start.to_owned(),
        outid,
        end: end.to_owned(),
        full_content,
    })
}

/// The byte offset of the last `:` that is neither preceded nor followed by another `:`.
fn last_single_colon(text: &str) -> Option<usize> {
    let bytes = text.as_bytes();
    (0..bytes.len()).rev().find(|&i| {
        bytes[i] == b':'
            && (i == 0 || bytes[i - 1] != b':')
            && !matches!(bytes.get(i + 1), Some(b':'))
    })
}

/// `-o/--output-path PATH`: any non-empty path without a NUL byte (which no file system accepts).
pub fn parse_output_path(value: &str) -> Result<PathBuf, ConfigError> {
    let option = OptionName::OutputPath;
    if value.is_empty() {
        return Err(ConfigError::invalid_because(
            option,
            value,
            "the value is empty",
        ));
    }
    if value.contains('\0') {
        return Err(ConfigError::invalid_because(
            option,
            value,
            "the path contains a NUL byte",
        ));
    }
    let path = PathBuf::from(value);
    // Without its trailing slashes, which would make the kernel follow a symlink.
    let plain: PathBuf = path.components().collect();
    // A symlink there could be swapped for another one while the run writes: refused.
    if plain
        .symlink_metadata()
        .is_ok_and(|m| m.file_type().is_symlink())
    {
        return Err(ConfigError::invalid_because(
            option,
            value,
            "it is a symlink",
        ));
    }
    // The run directory is made inside it later (at exit, for a sanitizer report): a path that
    // cannot hold one is said now, while the caller can still fix it.
    if let Some(existing) = path.ancestors().find(|a| a.symlink_metadata().is_ok()) {
        if !existing.is_dir() && !existing.as_os_str().is_empty() {
            let why = if existing == path {
                "it exists and is not a directory".to_string()
            } else {
                format!("{} is not a directory", existing.display())
            };
            return Err(ConfigError::invalid_because(option, value, &why));
        }
    }
    Ok(path)
}

/// `--format csv|db|parquet` (also spelled `--data-format`; see [`ConfigError::for_option`]).
pub fn parse_format(value: &str) -> Result<DataFormat, ConfigError> {
    one_of(
        OptionName::Format,
        value,
        &[
            ("csv", DataFormat::Csv),
            ("db", DataFormat::Db),
            ("parquet", DataFormat::Parquet),
        ],
    )
}

/// `--follow exec|none`.
pub fn parse_follow(value: &str) -> Result<Follow, ConfigError> {
    one_of(
        OptionName::Follow,
        value,
        &[("exec", Follow::Exec), ("none", Follow::None)],
    )
}

/// `--python-objects on|off`.
pub fn parse_python_objects(value: &str) -> Result<bool, ConfigError> {
    one_of(
        OptionName::PythonObjects,
        value,
        &[("on", true), ("off", false)],
    )
}

/// `--host-leak-mode summary|event`.
pub fn parse_host_leak_mode(value: &str) -> Result<HostLeakMode, ConfigError> {
    one_of(
        OptionName::HostLeakMode,
        value,
        &[
            ("summary", HostLeakMode::Summary),
            ("event", HostLeakMode::Event),
        ],
    )
}

/// `--block-size-threshold N`: a byte count, 0 (track everything) or more.
pub fn parse_block_size_threshold(value: &str) -> Result<u64, ConfigError> {
    parse_digits(value).ok_or_else(|| ConfigError::invalid(OptionName::BlockSizeThreshold, value))
}

/// The smallest `--dump-budget`: a budget smaller than a few steps' rows keeps too little.
pub const MIN_DUMP_BUDGET: u64 = 1 << 20;

/// `--dump-budget SIZE|unlimited`: `None` keeps every row. Sizes are bytes, or a number with
/// `K`/`M`/`G` (powers of 1000) or `KiB`/`MiB`/`GiB` (powers of 1024), at least 1 MiB.
pub fn parse_dump_budget(value: &str) -> Result<Option<u64>, ConfigError> {
    let option = OptionName::DumpBudget;
    let text = value.trim();
    if text.eq_ignore_ascii_case("unlimited") {
        return Ok(None);
    }
    let digits_end = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(digits_end);
    let scale: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1_000,
        "m" | "mb" => 1_000_000,
        "g" | "gb" => 1_000_000_000,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        _ => return Err(ConfigError::invalid(option, value)),
    };
    let bytes = parse_digits::<u64>(digits)
        .and_then(|n| n.checked_mul(scale))
        .ok_or_else(|| ConfigError::invalid(option, value))?;
    if bytes < MIN_DUMP_BUDGET {
        return Err(ConfigError::invalid_because(
            option,
            value,
            "less than 1MiB",
        ));
    }
    Ok(Some(bytes))
}

/// A sample rate as asked for and as applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SampleRate {
    /// What the user typed.
    pub requested: u64,
    /// `requested` rounded up to a power of two and clipped to [`MAX_SAMPLE_RATE`]: sampling by
    /// a mask of address bits needs a power of two, and the report states both numbers.
    pub effective: u64,
}

/// The rate actually applied for a requested one (≥ 1): the next power of two, at most
/// [`MAX_SAMPLE_RATE`]. 0 is treated as 1 (no sampling).
pub fn effective_sample_rate(requested: u64) -> u64 {
    requested
        .max(1)
        .checked_next_power_of_two()
        .map_or(MAX_SAMPLE_RATE, |rate| rate.min(MAX_SAMPLE_RATE))
}

/// `--sample-rate N`: a positive integer; 1 means every allocation is tracked.
pub fn parse_sample_rate(value: &str) -> Result<SampleRate, ConfigError> {
    match parse_digits::<u64>(value) {
        Some(0) => Err(ConfigError::invalid_because(
            OptionName::SampleRate,
            value,
            "0 is not a rate",
        )),
        Some(requested) => Ok(SampleRate {
            requested,
            effective: effective_sample_rate(requested),
        }),
        None => Err(ConfigError::invalid(OptionName::SampleRate, value)),
    }
}

/// `--sample-bytes N`: 0 (exact) or a mean sampling interval in bytes, at most
/// [`MAX_SAMPLE_BYTES`].
pub fn parse_sample_bytes(value: &str) -> Result<u64, ConfigError> {
    match parse_digits::<u64>(value) {
        Some(n) if n <= MAX_SAMPLE_BYTES => Ok(n),
        Some(_) => Err(ConfigError::invalid_because(
            OptionName::SampleBytes,
            value,
            "more than 2^40",
        )),
        None => Err(ConfigError::invalid(OptionName::SampleBytes, value)),
    }
}

/// `--input-path base,compare` of `--compare`: exactly two non-empty paths.
pub fn parse_input_paths(value: &str) -> Result<[PathBuf; 2], ConfigError> {
    let option = OptionName::InputPath;
    match list_items(option, value)?.as_slice() {
        [base, compare] => Ok([PathBuf::from(base), PathBuf::from(compare)]),
        items => Err(ConfigError::invalid_because(
            option,
            value,
            format!("{} paths given", items.len()),
        )),
    }
}

/// `--pid PID` of the attach client: a positive process id (0 and negatives would address
/// process groups in `kill(2)`, never a single process).
pub fn parse_pid(value: &str) -> Result<i32, ConfigError> {
    match parse_digits::<i32>(value) {
        Some(pid) if pid > 0 => Ok(pid),
        _ => Err(ConfigError::invalid(OptionName::Pid, value)),
    }
}

/// Sets the field of `config` that `option` names from its string value. This is the single
/// entry point of both the command line and `msmemscope.config(**kw)`; cross-option rules are
/// checked afterwards, once all options are in, by [`resolve`].
pub fn set_option(
    config: &mut RunConfig,
    option: OptionName,
    value: &str,
) -> Result<(), ConfigError> {
    match option {
        OptionName::LogLevel => config.log_level = parse_log_level(value)?,
        OptionName::Events => config.events = parse_events(value)?,
        OptionName::Level => config.level = parse_level(value)?,
        OptionName::Steps => config.steps = parse_steps(value)?,
        OptionName::CallStack => config.call_stack = parse_call_stack(value)?,
        OptionName::CollectMode => config.collect_mode = parse_collect_mode(value)?,
        OptionName::Device => config.devices = parse_devices(value)?,
        OptionName::Analysis => config.analysis = parse_analysis(value)?,
        OptionName::Watch => config.watch = Some(parse_watch(value)?),
        OptionName::OutputPath => config.output_path = parse_output_path(value)?,
        OptionName::Format | OptionName::DataFormat => {
            config.format = parse_format(value).map_err(|e| e.for_option(option))?
        }
        OptionName::HostLeakMode => config.host_leak_mode = parse_host_leak_mode(value)?,
        OptionName::BlockSizeThreshold => {
            config.block_size_threshold = parse_block_size_threshold(value)?
        }
        OptionName::SampleRate => {
            let rate = parse_sample_rate(value)?;
            config.sample_rate_requested = rate.requested;
            config.sample_rate = rate.effective;
        }
        OptionName::SampleBytes => config.sample_bytes = parse_sample_bytes(value)?,
        OptionName::Follow => config.follow = parse_follow(value)?,
        OptionName::PythonObjects => config.python_objects = parse_python_objects(value)?,
        OptionName::DumpBudget => config.dump_budget = parse_dump_budget(value)?,
        OptionName::InputPath | OptionName::Pid => {
            return Err(ConfigError::NotConfigurable { option })
        }
    }
    Ok(())
}

/// The spelling each value has on the command line, used to name settings in errors.
impl fmt::Display for EventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            EventKind::Alloc => "alloc",
            EventKind::Free => "free",
            EventKind::Launch => "launch",
            EventKind::Access => "access",
        })
    }
}

impl fmt::Display for Analysis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Analysis::Leaks => f.write_str("leaks"),
            Analysis::Decompose => f.write_str("decompose"),
            Analysis::Inefficient => f.write_str("inefficient"),
            Analysis::Oom(k) => write!(f, "oom:{k}"),
            Analysis::HostLeaks => f.write_str("host-leaks"),
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda => f.write_str("cuda"),
            Device::CudaIndex(index) => write!(f, "cuda:{index}"),
        }
    }
}

impl fmt::Display for WatchSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.start)?;
        if let Some(outid) = self.outid {
            write!(f, ":{outid}")?;
        }
        write!(f, ",{}", self.end)?;
        if self.full_content {
            f.write_str(",full-content")?;
        }
        Ok(())
    }
}

/// A list in command-line spelling (`alloc,free`), `none` when empty.
pub fn format_list<T: fmt::Display>(items: &[T]) -> String {
    if items.is_empty() {
        return "none".to_owned();
    }
    items.iter().map(T::to_string).collect::<Vec<_>>().join(",")
}

#[cfg(test)]
mod tests;
