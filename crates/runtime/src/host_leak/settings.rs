//! What a window runs with, snapshotted when it opens (changes apply from the next window).

use msmemscope_core::config::{HostLeakMode, RunConfig};
use msmemscope_core::host_leak::knobs;

#[derive(Clone, Debug)]
pub struct WindowSettings {
    pub mode: HostLeakMode,
    pub block_size_threshold: u64,
    pub sample_rate: u64,
    pub sample_rate_requested: u64,
    pub block_cap: u64,
    pub overflow_cap: u64,
    pub stack_cap: u64,
    pub top_n: usize,
    pub beat_ms: u64,
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
    pub fn new(config: &RunConfig, caps: &CapOverrides) -> WindowSettings {
        WindowSettings {
            mode: config.host_leak_mode,
            block_size_threshold: config.block_size_threshold,
            sample_rate: config.sample_rate.max(1),
            sample_rate_requested: config.sample_rate_requested.max(1),
            block_cap: knobs::BLOCK_CAP.resolve(caps.block_cap),
            overflow_cap: knobs::OVERFLOW_CAP.resolve(caps.overflow_cap),
            stack_cap: knobs::STACK_CAP.resolve(caps.stack_cap),
            top_n: knobs::TOP_N.resolve(caps.top_n) as usize,
            beat_ms: knobs::BEAT_MS.resolve(caps.beat_ms),
        }
    }
}
