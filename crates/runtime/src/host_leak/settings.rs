//! What a window runs with, snapshotted when it opens (changes apply from the next window).

use msmemscope_core::config::{HostLeakMode, RunConfig};
use msmemscope_core::host_leak::{knobs, PYTHON_STACK_CAP};

use crate::python::{DEFAULT_PY_DEPTH, MAX_PY_FRAMES};
use crate::unwind::MAX_FRAMES;

#[derive(Clone, Debug)]
pub struct WindowSettings {
    pub mode: HostLeakMode,
    pub block_size_threshold: u64,
    pub sample_rate: u64,
    pub sample_rate_requested: u64,
    /// Sampling by bytes: the mean interval between samples (0: every block is tracked).
    pub sample_bytes: u64,
    pub block_cap: u64,
    pub overflow_cap: u64,
    pub stack_cap: u64,
    pub top_n: usize,
    pub beat_ms: u64,
    /// C frames in a stack key (`--call-stack=c:N`, at most the 20 captured).
    pub c_depth: usize,
    /// Python frames in a stack key (`--call-stack=python:N`; 0: none).
    pub python_depth: usize,
    /// CPython's own allocators are accounted too (`--python-objects`, on by default).
    pub python_objects: bool,
    /// `MSMEMSCOPE_HOST_BEAT_MS` was given: the beat stays `beat_ms` instead of adapting.
    pub beat_fixed: bool,
}

/// The environment's overrides (`msmemscope_core::host_leak::knobs`: lower caps for tests and
/// for users who need a smaller footprint, the report's TOP N, the beat), read once at start.
#[derive(Clone, Debug, Default)]
pub struct CapOverrides {
    pub block_cap: Option<u64>,
    pub overflow_cap: Option<u64>,
    pub stack_cap: Option<u64>,
    pub top_n: Option<u64>,
    pub beat_ms: Option<u64>,
}

impl CapOverrides {
    pub fn from_env() -> CapOverrides {
        CapOverrides {
            block_cap: knobs::BLOCK_CAP.read_env(),
            overflow_cap: knobs::OVERFLOW_CAP.read_env(),
            stack_cap: knobs::STACK_CAP.read_env(),
            top_n: knobs::TOP_N.read_env(),
            beat_ms: knobs::BEAT_MS.read_env(),
        }
    }
}

impl WindowSettings {
    /// Python objects are accounted: asked for, and keyed by Python frames, which are on.
    pub fn python_objects_on(&self) -> bool {
        self.python_objects && self.python_depth > 0
    }

    pub fn new(config: &RunConfig, caps: &CapOverrides) -> WindowSettings {
        WindowSettings {
            mode: config.host_leak_mode,
            block_size_threshold: config.block_size_threshold,
            sample_rate: config.sample_rate.max(1),
            sample_rate_requested: config.sample_rate_requested.max(1),
            sample_bytes: config.sample_bytes,
            block_cap: knobs::BLOCK_CAP.resolve(caps.block_cap),
            overflow_cap: knobs::OVERFLOW_CAP.resolve(caps.overflow_cap),
            stack_cap: match caps.stack_cap {
                None if crate::python::in_process() => PYTHON_STACK_CAP,
                given => knobs::STACK_CAP.resolve(given),
            },
            top_n: knobs::TOP_N.resolve(caps.top_n) as usize,
            beat_ms: knobs::BEAT_MS.resolve(caps.beat_ms),
            // A kind `--call-stack` does not name keeps its default: host-leak stacks always
            // have C frames, and Python frames wherever Python code runs.
            c_depth: config
                .call_stack
                .c
                .map_or(MAX_FRAMES, |n| (n as usize).min(MAX_FRAMES)),
            python_depth: config
                .call_stack
                .python
                .map_or(DEFAULT_PY_DEPTH, |n| (n as usize).min(MAX_PY_FRAMES)),
            python_objects: config.python_objects,
            beat_fixed: caps.beat_ms.is_some(),
        }
    }
}
