//! The option table: every option's names, help line, accepted values and an example value,
//! written once. The command line's `--help` and parser, the error messages of
//! [`ConfigError`](crate::config::ConfigError) and the Python binding's `msmemscope.config(**kw)`
//! all read their strings from here.
//!
//! To add an option: one entry below (which also makes its [`OptionName`] variant), its parse
//! function and [`set_option`](crate::config::set_option) arm in `values.rs`, its
//! [`RunConfig`](crate::config::RunConfig) field in `types.rs`, and one row in the command line's
//! `crates/cli/src/args/flags.rs`, which picks where `--help` lists it.

/// How an error message spells option names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NameStyle {
    /// `--level`, `--analysis=leaks`: what a command-line user typed.
    Cli,
    /// `level`, `analysis="leaks"`: what a `msmemscope.config(**kw)` caller typed.
    Python,
}

/// Where an option can be given and what it sets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reach {
    /// The command line and `msmemscope.config(**kw)`: a field of a
    /// [`RunConfig`](crate::config::RunConfig).
    Everywhere,
    /// The command line only, though it sets a [`RunConfig`](crate::config::RunConfig) field:
    /// a launcher's choice that a program's own API run has no use for.
    CommandLine,
    /// The command line only, and not part of a [`RunConfig`](crate::config::RunConfig): the
    /// value of a mode (`--compare`, `--pid`) rather than of a run.
    Mode,
    /// Another spelling of this option, given wherever that one is; errors repeat the
    /// user's spelling.
    AliasOf(OptionName),
}

/// One option: its names, its `--help` line and what it accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OptionSpec {
    pub name: OptionName,
    /// The long command-line spelling, with its leading `--`.
    pub cli: &'static str,
    /// The `msmemscope.config(**kw)` key, also its name in Python-style messages: the long
    /// option without `--`, `-` replaced by `_`.
    pub key: &'static str,
    pub reach: Reach,
    /// What `--help` shows after the option's name: `--sample-bytes N`.
    pub placeholder: &'static str,
    /// The `--help` line, without its accepted values (which `--help` appends after `: `,
    /// except for an alias).
    pub help: &'static str,
    /// What the option accepts, in words; shared by error messages and `--help`.
    pub accepted: &'static str,
    /// A valid value, for hints such as Python's `config values are strings, e.g. …`.
    pub example: &'static str,
}

/// Makes the [`OptionName`] enum and [`OPTIONS`] from one list, in the same order, so each
/// option has exactly one entry and `OPTIONS[option as usize]` is its own.
macro_rules! option_table {
    ($($(#[$doc:meta])* $name:ident { $($field:ident: $value:expr),* $(,)? })*) => {
        /// Every option, independent of how it is spelled; its strings are in [`OPTIONS`].
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum OptionName {
            $($(#[$doc])* $name,)*
        }

        /// Every option's entry, in [`OptionName`] order.
        pub const OPTIONS: &[OptionSpec] = &[
            $(OptionSpec { name: OptionName::$name, $($field: $value),* },)*
        ];
    };
}

option_table! {
    LogLevel {
        cli: "--log-level",
        key: "log_level",
        reach: Reach::Everywhere,
        placeholder: "LEVEL",
        help: "log verbosity (default info)",
        accepted: "debug, info, warning, error",
        example: "info",
    }
    Events {
        cli: "--events",
        key: "events",
        reach: Reach::Everywhere,
        placeholder: "LIST",
        help: "events to record (default alloc,free,launch)",
        accepted: "a list of alloc, free, launch, access (access implies alloc and free), or none alone",
        example: "alloc,free",
    }
    Level {
        cli: "--level",
        key: "level",
        reach: Reach::Everywhere,
        placeholder: "LEVEL",
        help: "record ATen ops (op, the default) or kernel launches (kernel)",
        accepted: "op, kernel",
        example: "op",
    }
    Steps {
        cli: "--steps",
        key: "steps",
        reach: Reach::Everywhere,
        placeholder: "LIST",
        help: "record only these steps; switches the analyses off",
        accepted: "1 to 5 positive step numbers separated by commas, e.g. 1,3",
        example: "1,3",
    }
    CallStack {
        cli: "--call-stack",
        key: "call_stack",
        reach: Reach::Everywhere,
        placeholder: "LIST",
        help: "record C and/or Python call stacks (default off)",
        accepted: "c[:N], python[:N] separated by commas, depth N from 0 to 1000 (N left out: 50); host-leak stacks keep at most 20 C and 32 Python frames (Python frames on by default there, 20)",
        example: "python:20",
    }
    CollectMode {
        cli: "--collect-mode",
        key: "collect_mode",
        reach: Reach::Everywhere,
        placeholder: "MODE",
        help: "when recording starts (default immediate)",
        accepted: "immediate, deferred",
        example: "immediate",
    }
    Device {
        cli: "--device",
        key: "device",
        reach: Reach::Everywhere,
        placeholder: "LIST",
        help: "devices to record (default cpu,cuda)",
        accepted: "a list of cpu, cuda, cuda:N (npu and npu:N are aliases of cuda and cuda:N)",
        example: "cpu",
    }
    Analysis {
        cli: "--analysis",
        key: "analysis",
        reach: Reach::Everywhere,
        placeholder: "LIST",
        help: "analyses to run (default leaks)",
        accepted: "a list of leaks, decompose, inefficient, oom[:K] (K from 1 to 1000, default 10); or host-leaks alone; or none alone",
        example: "leaks",
    }
    Watch {
        cli: "--watch",
        key: "watch",
        reach: Reach::Everywhere,
        placeholder: "SPEC",
        help: "checksum (full-content: dump) watched blocks around ops from start to end",
        accepted: "start[:outid],end[,full-content] where start and end are op names and outid an output index",
        example: "aten::add,aten::mul",
    }
    OutputPath {
        cli: "--output-path",
        key: "output_path",
        reach: Reach::Everywhere,
        placeholder: "PATH",
        help: "directory of the results (default ./memscopeDumpResults)",
        accepted: "a non-empty directory path",
        example: "./out",
    }
    Format {
        cli: "--format",
        key: "format",
        reach: Reach::Everywhere,
        placeholder: "FORMAT",
        help: "dump file format (default csv; parquet is written as CSV while the program runs and converted when it ends)",
        accepted: "csv, db, parquet",
        example: "csv",
    }
    /// The original msMemScope's spelling of [`OptionName::Format`].
    DataFormat {
        cli: "--data-format",
        key: "data_format",
        reach: Reach::AliasOf(OptionName::Format),
        placeholder: "FORMAT",
        help: "alias of --format",
        accepted: "csv, db, parquet",
        example: "csv",
    }
    HostLeakMode {
        cli: "--host-leak-mode",
        key: "host_leak_mode",
        reach: Reach::Everywhere,
        placeholder: "MODE",
        help: "host-leaks report (default summary; event adds block_detail_N.csv)",
        accepted: "summary, event",
        example: "summary",
    }
    BlockSizeThreshold {
        cli: "--block-size-threshold",
        key: "block_size_threshold",
        reach: Reach::Everywhere,
        placeholder: "N",
        help: "host-leaks tracks only allocations of at least N bytes (default 0, all)",
        accepted: "a byte count from 0 to 18446744073709551615",
        example: "1024",
    }
    SampleRate {
        cli: "--sample-rate",
        key: "sample_rate",
        reach: Reach::Everywhere,
        placeholder: "N",
        help: "host-leaks tracks about 1 in N allocations (default 1, all)",
        accepted: "a positive integer, rounded up to a power of two and clipped to 1073741824 (2^30)",
        example: "1",
    }
    /// Host-leak sampling by bytes: one sample per N bytes allocated on average (0: exact).
    SampleBytes {
        cli: "--sample-bytes",
        key: "sample_bytes",
        reach: Reach::Everywhere,
        placeholder: "N",
        help: "host-leaks samples about one block per N bytes allocated, reporting estimates (default 0, exact; 524288 for services and long jobs)",
        accepted: "a byte count from 0 (exact, every block) to 1099511627776 (2^40): the mean number of bytes allocated between two samples, e.g. 524288",
        example: "524288",
    }
    /// The two dumps of `--compare`.
    InputPath {
        cli: "--input-path",
        key: "input_path",
        reach: Reach::Mode,
        placeholder: "BASE,COMPARE",
        help: "the two dumps of --compare",
        accepted: "exactly two paths separated by a comma, e.g. base.csv,compare.csv",
        example: "a.csv,b.csv",
    }
    /// The process the attach client talks to.
    Pid {
        cli: "--pid",
        key: "pid",
        reach: Reach::Mode,
        placeholder: "PID",
        help: "attach to a running process that has the runtime library loaded",
        accepted: "a positive process id",
        example: "1234",
    }
    /// Which processes of the job the launcher's run traces; a program's own API run traces
    /// itself, so `msmemscope.config` has no such key.
    Follow {
        cli: "--follow",
        key: "follow",
        reach: Reach::CommandLine,
        placeholder: "WHICH",
        help: "trace the processes the program starts too, each in its own run directory (default exec)",
        accepted: "exec (every process the program starts with exec is traced too), none (only the program)",
        example: "exec",
    }
    /// Whether a host-leak window accounts CPython's own allocators.
    PythonObjects {
        cli: "--python-objects",
        key: "python_objects",
        reach: Reach::Everywhere,
        placeholder: "ON|OFF",
        help: "host leaks: account Python objects too, CPython's own allocators (default on)",
        accepted: "on (host leaks include Python objects, CPython's own allocators), off (only the C heap)",
        example: "off",
    }
    /// The most bytes a process's event dump keeps on disk.
    DumpBudget {
        cli: "--dump-budget",
        key: "dump_budget",
        reach: Reach::Everywhere,
        placeholder: "SIZE",
        help: "most bytes a process's event dump keeps (default 256MiB; past it the first, the newest, the peak's, the leaks' and OOM steps stay, every step summarized)",
        accepted: "a size of at least 1MiB (bytes, or with K, M, G, KiB, MiB, GiB: 256MiB, 2G), or unlimited (keep every row)",
        example: "1GiB",
    }
}

impl OptionName {
    /// This option's entry of [`OPTIONS`].
    pub const fn spec(self) -> &'static OptionSpec {
        &OPTIONS[self as usize]
    }

    /// The long command-line spelling, with its leading `--`.
    pub const fn cli(self) -> &'static str {
        self.spec().cli
    }

    /// The long command-line name without its `--`, as the parser looks it up.
    pub const fn long(self) -> &'static str {
        let (_, name) = self.spec().cli.as_bytes().split_at(2);
        match std::str::from_utf8(name) {
            Ok(name) => name,
            Err(_) => panic!("an option's spelling is ASCII"),
        }
    }

    /// The `msmemscope.config(**kw)` key.
    pub const fn python_key(self) -> &'static str {
        self.spec().key
    }

    /// The name in the given style.
    pub const fn name(self, style: NameStyle) -> &'static str {
        match style {
            NameStyle::Cli => self.cli(),
            NameStyle::Python => self.python_key(),
        }
    }

    /// What the option accepts, in words.
    pub const fn accepted(self) -> &'static str {
        self.spec().accepted
    }

    /// A valid value of the option.
    pub const fn example(self) -> &'static str {
        self.spec().example
    }

    /// The option this one is another spelling of, or itself.
    pub const fn canonical(self) -> OptionName {
        match self.spec().reach {
            Reach::AliasOf(option) => option,
            _ => self,
        }
    }

    /// Whether `msmemscope.config(**kw)` takes this option as a key.
    pub const fn in_python_config(self) -> bool {
        matches!(self.canonical().spec().reach, Reach::Everywhere)
    }

    /// The options `msmemscope.config(**kw)` takes, in table order.
    pub fn python_config() -> impl Iterator<Item = OptionName> {
        OPTIONS
            .iter()
            .map(|spec| spec.name)
            .filter(|option| option.in_python_config())
    }

    /// The option a `msmemscope.config(**kw)` key sets; `None` for keys that configure no run
    /// (`pid`, `input_path`), for launcher-only ones (`follow`) and for unknown keys, so the
    /// Python side can reject them by name.
    pub fn from_python_key(key: &str) -> Option<OptionName> {
        OptionName::python_config().find(|o| o.python_key() == key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{parse_input_paths, parse_pid, set_option, RunConfig};
    use std::collections::HashSet;

    #[test]
    fn every_option_name_has_exactly_its_own_entry() {
        for (index, spec) in OPTIONS.iter().enumerate() {
            assert_eq!(spec.name as usize, index, "{:?} is out of place", spec.name);
            assert_eq!(spec.name.spec(), spec);
        }
        // The last variant closes the table: a variant without an entry cannot exist, since the
        // enum is made from the table.
        assert_eq!(OptionName::DumpBudget as usize, OPTIONS.len() - 1);
    }

    #[test]
    fn spellings_and_keys_are_unique_and_derived_alike() {
        let mut clis = HashSet::new();
        let mut keys = HashSet::new();
        for spec in OPTIONS {
            assert!(clis.insert(spec.cli), "{} twice", spec.cli);
            assert!(keys.insert(spec.key), "{} twice", spec.key);
            let long = spec.name.long();
            assert_eq!(format!("--{long}"), spec.cli);
            assert!(long.bytes().all(|b| b.is_ascii_lowercase() || b == b'-'));
            assert_eq!(long.replace('-', "_"), spec.key);
            for text in [spec.placeholder, spec.help, spec.accepted, spec.example] {
                assert!(!text.is_empty(), "{} lacks a text", spec.cli);
                assert!(!text.contains('\n') && !text.ends_with(' '), "{text:?}");
            }
        }
    }

    #[test]
    fn aliases_name_an_option_that_is_no_alias() {
        for spec in OPTIONS {
            if let Reach::AliasOf(target) = spec.reach {
                assert!(!matches!(target.spec().reach, Reach::AliasOf(_)));
                assert_eq!(spec.accepted, target.accepted());
            }
        }
        assert_eq!(OptionName::DataFormat.canonical(), OptionName::Format);
        assert_eq!(OptionName::Level.canonical(), OptionName::Level);
    }

    #[test]
    fn python_keys_are_the_run_options_and_their_aliases() {
        let keys: Vec<&str> = OptionName::python_config()
            .map(OptionName::python_key)
            .collect();
        assert_eq!(
            keys.join(","),
            "log_level,events,level,steps,call_stack,collect_mode,device,analysis,watch,\
             output_path,format,data_format,host_leak_mode,block_size_threshold,sample_rate,\
             sample_bytes,python_objects,dump_budget"
        );
        assert_eq!(
            OptionName::from_python_key("sample_bytes"),
            Some(OptionName::SampleBytes)
        );
        for key in ["follow", "pid", "input_path", "sample-bytes", ""] {
            assert_eq!(OptionName::from_python_key(key), None, "{key}");
        }
    }

    /// A new option cannot ship without its reference rows: `docs/cli.md` names every
    /// spelling, `docs/python-api.md` every `msmemscope.config` key.
    #[test]
    fn the_reference_pages_name_every_option() {
        let docs = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs");
        let read = |page: &str| std::fs::read_to_string(docs.join(page)).unwrap();
        let (cli, python) = (read("cli.md"), read("python-api.md"));
        for spec in OPTIONS {
            assert!(
                cli.contains(&format!("`{}", spec.cli)),
                "cli.md: {}",
                spec.cli
            );
            if spec.name.in_python_config() {
                let key = format!("`{}`", spec.key);
                assert!(python.contains(&key), "python-api.md: {key}");
            }
        }
    }

    #[test]
    fn every_example_is_accepted() {
        for spec in OPTIONS {
            let checked = match spec.name {
                OptionName::InputPath => parse_input_paths(spec.example).map(drop),
                OptionName::Pid => parse_pid(spec.example).map(drop),
                option => set_option(&mut RunConfig::default(), option, spec.example),
            };
            assert_eq!(checked, Ok(()), "{} {}", spec.cli, spec.example);
        }
    }
}
