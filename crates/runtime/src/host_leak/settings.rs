//! What a window runs with, snapshotted when it opens (changes apply from the next window).

use msmemscope_core::config::{HostLeakMode, RunConfig};
use msmemscope_core::host_leak::{
    DEFAULT_BLOCK_CAP, DEFAULT_OVERFLOW_CAP, DEFAULT_STACK_CAP, DEFAULT_TOP_N, MAX_TOP_N,
};

/// Environment variables that lower the ledger's caps (for tests and for users who need a
/// smaller footprint) and set the TOP N of the report.
pub const ENV_BLOCK_CAP: &str = "MSMEMSCOPE_HOST_BLOCK_CAP";
pub const ENV_OVERFLOW_CAP: &str = "MSMEMSCOPE_HOST_OVERFLOW_CAP";
pub const ENV_STACK_CAP: &str = "MSMEMSCOPE_HOST_STACK_CAP";
pub const ENV_TOP_N: &str = "MSMEMSCOPE_HOST_TOP_N";

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

/// The environment's overrides, read once at start (the runtime then removes them from the
/// target's environment).
#[derive(Clone, Debug, Default)]
pub struct CapOverrides {
    pub block_cap: Option<u64>,
    pub overflow_cap: Option<u64>,
    pub stack_cap: Option<u64>,
    pub top_n: Option<usize>,
    pub beat_ms: Option<u64>,
}

impl CapOverrides {
    pub fn from_env() -> CapOverrides {
        let num = |name: &str| {
            std::env::var(name)
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
        };
        CapOverrides {
            block_cap: num(ENV_BLOCK_CAP).filter(|&n| n > 0),
            overflow_cap: num(ENV_OVERFLOW_CAP),
            stack_cap: num(ENV_STACK_CAP),
            top_n: num(ENV_TOP_N).map(|n| n as usize),
            beat_ms: num(super::beats::ENV_BEAT_MS),
        }
    }
}

impl WindowSettings {
    pub fn new(config: &RunConfig, caps: &CapOverrides) -> WindowSettings {
        // Overrides may only lower the caps: the defaults are the safety valves of SPEC §8.
        WindowSettings {
            mode: config.host_leak_mode,
            block_size_threshold: config.block_size_threshold,
            sample_rate: config.sample_rate.max(1),
            sample_rate_requested: config.sample_rate_requested.max(1),
            block_cap: caps
                .block_cap
                .unwrap_or(DEFAULT_BLOCK_CAP)
                .min(DEFAULT_BLOCK_CAP),
            overflow_cap: caps
                .overflow_cap
                .unwrap_or(DEFAULT_OVERFLOW_CAP)
                .min(DEFAULT_OVERFLOW_CAP),
            stack_cap: caps
                .stack_cap
                .unwrap_or(DEFAULT_STACK_CAP)
                .min(DEFAULT_STACK_CAP),
            top_n: caps.top_n.unwrap_or(DEFAULT_TOP_N).clamp(1, MAX_TOP_N),
            beat_ms: caps
                .beat_ms
                .unwrap_or(super::beats::DEFAULT_BEAT_MS)
                .clamp(10, 60_000),
        }
    }
}
