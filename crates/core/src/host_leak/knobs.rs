//! The `MSMEMSCOPE_HOST_*` environment knobs: lower caps of the ledger, the report's TOP N and
//! the beat period. One table for both sides: the runtime resolves the values it runs with,
//! and the launcher, which can speak on the terminal, warns about the ones it will not use as
//! given.

use super::{DEFAULT_BLOCK_CAP, DEFAULT_OVERFLOW_CAP, DEFAULT_STACK_CAP, DEFAULT_TOP_N, MAX_TOP_N};

/// One knob: its variable, what it counts and the values it accepts.
#[derive(Debug)]
pub struct Knob {
    pub name: &'static str,
    pub unit: &'static str,
    pub min: u64,
    /// Also the default for the caps: overrides may only lower them (they are the ledger's
    /// safety valves, docs/environment.md#host-leak-knobs).
    pub max: u64,
    pub default: u64,
    /// A value below `min` means "unset" (a zero cap), not "the smallest".
    pub below_min_is_default: bool,
}

pub const BLOCK_CAP: Knob = Knob {
    name: "MSMEMSCOPE_HOST_BLOCK_CAP",
    unit: "blocks",
    min: 1,
    max: DEFAULT_BLOCK_CAP,
    default: DEFAULT_BLOCK_CAP,
    below_min_is_default: true,
};
pub const OVERFLOW_CAP: Knob = Knob {
    name: "MSMEMSCOPE_HOST_OVERFLOW_CAP",
    unit: "blocks",
    min: 0,
    max: DEFAULT_OVERFLOW_CAP,
    default: DEFAULT_OVERFLOW_CAP,
    below_min_is_default: false,
};
pub const STACK_CAP: Knob = Knob {
    name: "MSMEMSCOPE_HOST_STACK_CAP",
    unit: "stacks",
    min: 0,
    max: DEFAULT_STACK_CAP,
    default: DEFAULT_STACK_CAP,
    below_min_is_default: false,
};
pub const TOP_N: Knob = Knob {
    name: "MSMEMSCOPE_HOST_TOP_N",
    unit: "sites",
    min: 1,
    max: MAX_TOP_N as u64,
    default: DEFAULT_TOP_N as u64,
    below_min_is_default: false,
};
pub const BEAT_MS: Knob = Knob {
    name: "MSMEMSCOPE_HOST_BEAT_MS",
    unit: "milliseconds",
    min: 10,
    max: 60_000,
    default: 1000,
    below_min_is_default: false,
};

pub const ALL: [&Knob; 5] = [&BLOCK_CAP, &OVERFLOW_CAP, &STACK_CAP, &TOP_N, &BEAT_MS];

/// At most this much of a bad value is repeated back.
const SHOWN: usize = 40;

impl Knob {
    /// The variable's value as a number, if it is one (`None` when unset or not a number).
    pub fn read_env(&self) -> Option<u64> {
        std::env::var(self.name).ok()?.trim().parse().ok()
    }

    /// The value used for a parsed override (`None`: unset).
    pub fn resolve(&self, value: Option<u64>) -> u64 {
        match value {
            None => self.default,
            Some(n) if n < self.min && self.below_min_is_default => self.default,
            Some(n) => n.clamp(self.min, self.max),
        }
    }

    /// The warning for `text`, the variable's raw value, when it is not used as given.
    pub fn complaint(&self, text: &str) -> Option<String> {
        let range = format!("{} to {} {}", self.min, self.max, self.unit);
        match text.trim().parse::<u64>() {
            Err(_) => {
                let mut shown: String = text.chars().take(SHOWN).collect();
                if shown.len() < text.len() {
                    shown.push('…');
                }
                Some(format!(
                    "{}={shown:?} is not a whole number ({range}); using the default {}",
                    self.name, self.default
                ))
            }
            Ok(n) if n < self.min || n > self.max => Some(format!(
                "{}={n} is out of range ({range}); using {}",
                self.name,
                self.resolve(Some(n))
            )),
            Ok(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_values_are_named_with_their_range() {
        assert_eq!(BEAT_MS.complaint("250"), None);
        assert_eq!(
            BEAT_MS.complaint("fast").unwrap(),
            "MSMEMSCOPE_HOST_BEAT_MS=\"fast\" is not a whole number (10 to 60000 milliseconds); using the default 1000"
        );
        assert_eq!(
            BEAT_MS.complaint("5").unwrap(),
            "MSMEMSCOPE_HOST_BEAT_MS=5 is out of range (10 to 60000 milliseconds); using 10"
        );
        let long = "9".repeat(120_000);
        let line = BEAT_MS.complaint(&long).unwrap();
        assert!(line.len() < 200, "{line}");
        assert_eq!(
            BLOCK_CAP.complaint("0").unwrap(),
            "MSMEMSCOPE_HOST_BLOCK_CAP=0 is out of range (1 to 20000000 blocks); using 20000000"
        );
    }

    #[test]
    fn resolution_only_lowers_caps() {
        assert_eq!(BLOCK_CAP.resolve(None), DEFAULT_BLOCK_CAP);
        assert_eq!(BLOCK_CAP.resolve(Some(0)), DEFAULT_BLOCK_CAP);
        assert_eq!(BLOCK_CAP.resolve(Some(5)), 5);
        assert_eq!(BLOCK_CAP.resolve(Some(u64::MAX)), DEFAULT_BLOCK_CAP);
        assert_eq!(STACK_CAP.resolve(Some(0)), 0);
        assert_eq!(TOP_N.resolve(Some(0)), 1);
        assert_eq!(BEAT_MS.resolve(Some(100_000)), 60_000);
    }
}
