use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Default `--output-path`.
pub const DEFAULT_OUTPUT_PATH: &str = "./memscopeDumpResults";
/// Default and limits of the C/Python call-stack depth.
pub const DEFAULT_STACK_DEPTH: u32 = 50;
pub const MAX_STACK_DEPTH: u32 = 1000;
/// Largest sample rate; larger requests are clipped to it.
pub const MAX_SAMPLE_RATE: u64 = 1 << 30;
/// Largest `--sample-bytes` interval (1 TiB): beyond it nearly nothing would be sampled.
pub const MAX_SAMPLE_BYTES: u64 = 1 << 40;
/// Default and limits of K in `oom:K`.
pub const DEFAULT_OOM_K: u32 = 10;
pub const MAX_OOM_K: u32 = 1000;
/// At most this many `--steps`.
pub const MAX_STEPS: usize = 5;

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    Debug,
    Info,
    Warning,
    Error,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum EventKind {
    Alloc,
    Free,
    Launch,
    Access,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    Op,
    Kernel,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum CollectMode {
    Immediate,
    Deferred,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum DataFormat {
    Csv,
    Db,
    /// `memscope_dump_{ts}.parquet`, written by the writer thread in segments that are complete
    /// Parquet files (`events::parts`).
    Parquet,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum HostLeakMode {
    Summary,
    Event,
}

/// `--call-stack c[:N],python[:N]`: depth per kind, `None` when that kind is off.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct CallStack {
    pub c: Option<u32>,
    pub python: Option<u32>,
}

/// One `--device` entry.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Device {
    Cpu,
    /// Every CUDA device.
    Cuda,
    /// One CUDA device by index.
    CudaIndex(u32),
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Analysis {
    Leaks,
    Decompose,
    Inefficient,
    /// `oom[:K]`: dump the K most recent and K largest live blocks.
    Oom(u32),
    HostLeaks,
}

/// `--watch start[:outid],end[,full-content]`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct WatchSpec {
    pub start: String,
    pub outid: Option<u32>,
    pub end: String,
    pub full_content: bool,
}

/// Everything that configures a tracked run. Serialized as `config.json` in the run directory,
/// where the runtime library reads it back.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct RunConfig {
    pub log_level: LogLevel,
    pub events: Vec<EventKind>,
    pub level: Level,
    pub steps: Vec<u32>,
    pub call_stack: CallStack,
    pub collect_mode: CollectMode,
    pub devices: Vec<Device>,
    pub analysis: Vec<Analysis>,
    pub watch: Option<WatchSpec>,
    pub output_path: PathBuf,
    pub format: DataFormat,
    pub host_leak_mode: HostLeakMode,
    /// Only allocations of at least this many bytes enter the host-leak ledger (0 = all).
    pub block_size_threshold: u64,
    /// The sample rate as the user asked for it.
    pub sample_rate_requested: u64,
    /// The effective sample rate: a power of two, at most [`MAX_SAMPLE_RATE`].
    pub sample_rate: u64,
    /// Host-leak sampling by bytes: the mean number of bytes allocated between two sampled
    /// blocks (0: every block is tracked).
    #[serde(default)]
    pub sample_bytes: u64,
    /// Where the run sits in a distributed job, from the environment the run directory was made
    /// in: how `msmemscope ranks` tells the ranks' runs apart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub distributed: Option<Distributed>,
    /// Which processes of the job a launched run traces (`--follow`).
    #[serde(default)]
    pub follow: Follow,
    /// Host-leak windows account CPython's own allocators (Python objects) too
    /// (`--python-objects`).
    #[serde(default = "python_objects_default")]
    pub python_objects: bool,
    /// For a process traced because an earlier process of the job started it: which job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<JobLink>,
    /// The most bytes the process's event dump keeps on disk (`--dump-budget`); `None` keeps
    /// every row. Past it the flight recorder keeps the first, newest and wanted steps.
    #[serde(default = "dump_budget_default")]
    pub dump_budget: Option<u64>,
}

fn python_objects_default() -> bool {
    true
}

/// The default `--dump-budget` of a process's dump: 256 MiB.
pub const DEFAULT_DUMP_BUDGET: u64 = 256 << 20;

fn dump_budget_default() -> Option<u64> {
    Some(DEFAULT_DUMP_BUDGET)
}

/// `--follow`: which processes of the job a launched run traces.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Follow {
    /// The program and every process started from it with `exec` (each its own run directory).
    #[default]
    Exec,
    /// The program alone (the image the launcher started, and what it execs in its place).
    None,
}

/// How a followed process's run belongs to its job, recorded in its `config.json`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct JobLink {
    /// The run directory the launcher made for the job (the program's own).
    pub job_run: PathBuf,
    /// The launcher's process id.
    pub launcher_pid: u32,
    /// The process that started this one.
    pub parent_pid: u32,
    /// This process's command line.
    pub command: Vec<String>,
}

/// A distributed job's coordinates of one process, as torchrun (and most launchers) pass them.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct Distributed {
    /// `RANK`, or `LOCAL_RANK` when only that is set.
    pub rank: u64,
    pub local_rank: Option<u64>,
    pub world_size: Option<u64>,
}

impl Distributed {
    /// From `RANK`, `LOCAL_RANK` and `WORLD_SIZE`; `None` outside a distributed job.
    pub fn from_env() -> Option<Distributed> {
        let read = |name: &str| std::env::var(name).ok()?.trim().parse::<u64>().ok();
        let local_rank = read("LOCAL_RANK");
        Some(Distributed {
            rank: read("RANK").or(local_rank)?,
            local_rank,
            world_size: read("WORLD_SIZE"),
        })
    }
}

impl Default for RunConfig {
    fn default() -> Self {
        RunConfig {
            log_level: LogLevel::Info,
            events: vec![EventKind::Alloc, EventKind::Free, EventKind::Launch],
            level: Level::Op,
            steps: Vec::new(),
            call_stack: CallStack::default(),
            collect_mode: CollectMode::Immediate,
            devices: vec![Device::Cpu, Device::Cuda],
            analysis: vec![Analysis::Leaks],
            watch: None,
            output_path: PathBuf::from(DEFAULT_OUTPUT_PATH),
            format: DataFormat::Csv,
            host_leak_mode: HostLeakMode::Summary,
            block_size_threshold: 0,
            sample_rate_requested: 1,
            sample_rate: 1,
            sample_bytes: 0,
            distributed: None,
            follow: Follow::Exec,
            python_objects: true,
            job: None,
            dump_budget: dump_budget_default(),
        }
    }
}

impl RunConfig {
    pub fn host_leaks(&self) -> bool {
        self.analysis.contains(&Analysis::HostLeaks)
    }

    /// Host-leak windows account Python objects: asked for (the default), with the Python
    /// frames a Python object's site is made of.
    pub fn tracks_python_objects(&self) -> bool {
        self.host_leaks() && self.python_objects && self.call_stack.python != Some(0)
    }

    pub fn from_json(text: &str) -> Result<RunConfig, serde_json::Error> {
        serde_json::from_str(text)
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("RunConfig always serializes")
    }
}
