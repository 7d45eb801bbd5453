//! The `MSMEMSCOPE_HOST_*` environment knobs (`msmemscope_core::host_leak::knobs`) the runtime
//! reads at start. The runtime cannot say anything on the program's stderr, so the launcher
//! checks them first: a value that is not a number, or out of the accepted range, gets one
//! warning line naming the variable and the range; the runtime then resolves it as before.

use msmemscope_core::host_leak::knobs::ALL;

/// One warning line per unusable knob in the environment.
pub fn warnings() -> Vec<String> {
    ALL.iter()
        .filter_map(|k| {
            let value = std::env::var_os(k.name)?;
            k.complaint(&value.to_string_lossy())
        })
        .collect()
}
