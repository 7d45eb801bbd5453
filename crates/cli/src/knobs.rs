//! The `MSMEMSCOPE_HOST_*` environment knobs the runtime reads at start. The runtime cannot say
//! anything on the program's stderr, so the launcher checks them first: a value that is not a
//! number, or out of the accepted range, gets one warning line naming the variable and the
//! range; the runtime then uses its default (or the nearest bound) as before.

use msmemscope_core::host_leak::{
    DEFAULT_BLOCK_CAP, DEFAULT_OVERFLOW_CAP, DEFAULT_STACK_CAP, DEFAULT_TOP_N, MAX_TOP_N,
};

/// One knob: its variable, what it counts, the accepted range and what an unusable value means.
struct Knob {
    name: &'static str,
    unit: &'static str,
    min: u64,
    max: u64,
    default: u64,
}

const KNOBS: [Knob; 5] = [
    Knob {
        name: "MSMEMSCOPE_HOST_BLOCK_CAP",
        unit: "blocks",
        min: 1,
        max: DEFAULT_BLOCK_CAP,
        default: DEFAULT_BLOCK_CAP,
    },
    Knob {
        name: "MSMEMSCOPE_HOST_OVERFLOW_CAP",
        unit: "blocks",
        min: 0,
        max: DEFAULT_OVERFLOW_CAP,
        default: DEFAULT_OVERFLOW_CAP,
    },
    Knob {
        name: "MSMEMSCOPE_HOST_STACK_CAP",
        unit: "stacks",
        min: 0,
        max: DEFAULT_STACK_CAP,
        default: DEFAULT_STACK_CAP,
    },
    Knob {
        name: "MSMEMSCOPE_HOST_TOP_N",
        unit: "sites",
        min: 1,
        max: MAX_TOP_N as u64,
        default: DEFAULT_TOP_N as u64,
    },
    Knob {
        name: "MSMEMSCOPE_HOST_BEAT_MS",
        unit: "milliseconds",
        min: 10,
        max: 60_000,
        default: 1000,
    },
];

/// At most this much of a bad value is repeated back.
const SHOWN: usize = 40;

/// The warning for `value` of `knob`, if it is not usable as given.
fn check(knob: &Knob, value: &str) -> Option<String> {
    let shown: String = value.chars().take(SHOWN).collect();
    let shown = if shown.len() < value.len() {
        format!("{shown}…")
    } else {
        shown
    };
    let range = format!("{} to {} {}", knob.min, knob.max, knob.unit);
    match value.trim().parse::<u64>() {
        Err(_) => Some(format!(
            "{}={shown:?} is not a whole number ({range}); using the default {}",
            knob.name, knob.default
        )),
        Ok(n) if n < knob.min || n > knob.max => {
            let used = if n < knob.min && knob.min == 1 && knob.name.ends_with("BLOCK_CAP") {
                knob.default
            } else {
                n.clamp(knob.min, knob.max)
            };
            Some(format!(
                "{}={n} is out of range ({range}); using {used}",
                knob.name
            ))
        }
        Ok(_) => None,
    }
}

/// One warning line per unusable knob in the environment.
pub fn warnings() -> Vec<String> {
    KNOBS
        .iter()
        .filter_map(|k| {
            let value = std::env::var_os(k.name)?;
            check(k, &value.to_string_lossy())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_values_are_named_with_their_range() {
        let beat = &KNOBS[4];
        assert_eq!(check(beat, "250"), None);
        assert_eq!(
            check(beat, "fast").unwrap(),
            "MSMEMSCOPE_HOST_BEAT_MS=\"fast\" is not a whole number (10 to 60000 milliseconds); using the default 1000"
        );
        assert_eq!(
            check(beat, "5").unwrap(),
            "MSMEMSCOPE_HOST_BEAT_MS=5 is out of range (10 to 60000 milliseconds); using 10"
        );
        let long = "9".repeat(120_000);
        let line = check(beat, &long).unwrap();
        assert!(line.len() < 200, "{line}");
        assert_eq!(
            check(&KNOBS[0], "0").unwrap(),
            "MSMEMSCOPE_HOST_BLOCK_CAP=0 is out of range (1 to 20000000 blocks); using 20000000"
        );
    }
}
