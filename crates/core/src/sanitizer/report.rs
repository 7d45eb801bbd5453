//! What a run's sanitizer found: races folded by the pair of code sites involved (a racing
//! loop reports one race with its count, not one per iteration), and the text of the report.

use std::collections::HashMap;
use std::fmt::Write;
use std::sync::Arc;

use super::race::{Access, AccessKind, Race};

/// Distinct races kept with their details; later distinct ones are only counted.
pub const MAX_FINDINGS: usize = 256;

/// One distinct race: its first occurrence and how often it happened.
#[derive(Debug, Clone)]
pub struct Finding {
    pub first: Race,
    pub occurrences: u64,
}

/// The code-site identity of an access: who touched what, how, on which stream.
type Site = (AccessKind, u64, Arc<str>, Arc<str>);

fn site(a: &Access) -> Site {
    (a.kind, a.stream, a.operator.clone(), a.alias.clone())
}

/// Everything the report says.
#[derive(Debug, Default)]
pub struct RaceLog {
    findings: Vec<Finding>,
    index: HashMap<(Site, Site), usize>,
    /// Races seen, folded or not.
    pub occurrences: u64,
    /// Distinct races beyond [`MAX_FINDINGS`].
    pub dropped: u64,
    /// Well-formed sanitizer-op marks checked.
    pub marks: u64,
    /// Malformed sanitizer-op marks skipped.
    pub malformed: u64,
    /// Whether the checker stopped tracking new memory (its segment limit).
    pub saturated: bool,
}

impl RaceLog {
    pub fn add(&mut self, race: Race) {
        self.occurrences += 1;
        let key = (site(&race.current), site(&race.previous));
        if let Some(&i) = self.index.get(&key) {
            self.findings[i].occurrences += 1;
            return;
        }
        if self.findings.len() >= MAX_FINDINGS {
            self.dropped += 1;
            return;
        }
        self.index.insert(key, self.findings.len());
        self.findings.push(Finding {
            first: race,
            occurrences: 1,
        });
    }

    pub fn findings(&self) -> &[Finding] {
        &self.findings
    }

    /// The report. `stack` gives the frames (one line each) of an access's context, if any.
    pub fn render(&self, stack: &mut dyn FnMut(u64) -> Vec<String>) -> String {
        let mut out = String::new();
        let distinct = self.findings.len() as u64 + self.dropped;
        let marks = plural(self.marks, "sanitizer-op mark", "sanitizer-op marks");
        if distinct == 0 {
            let _ = writeln!(
                out,
                "====== msmemscope sanitizer: no data race between streams in {marks} ======"
            );
        } else {
            let _ = writeln!(
                out,
                "====== msmemscope sanitizer: {} between streams ({}) ======",
                plural(distinct, "possible data race", "possible data races"),
                plural(self.occurrences, "occurrence", "occurrences"),
            );
        }
        for (i, f) in self.findings.iter().enumerate() {
            let r = &f.first;
            let _ = writeln!(
                out,
                "Race {} ({}) on memory [{:#x}, {:#x}) ({} bytes):",
                i + 1,
                plural(f.occurrences, "occurrence", "occurrences"),
                r.overlap_start,
                r.overlap_end,
                r.overlap_end - r.overlap_start
            );
            describe(&mut out, &r.current, stack);
            out.push_str("  not ordered after the earlier\n");
            describe(&mut out, &r.previous, stack);
        }
        if self.dropped > 0 {
            let _ = writeln!(
                out,
                "{} more distinct races were counted but not detailed (at most {MAX_FINDINGS} are)",
                self.dropped
            );
        }
        if self.saturated {
            out.push_str(
                "The checker reached its limit of tracked memory ranges; memory first touched \
                 after that was not checked.\n",
            );
        }
        if distinct > 0 || self.malformed > 0 {
            let _ = writeln!(
                out,
                "====== SUMMARY: {}, {} checked, {} skipped ======",
                plural(distinct, "race", "races"),
                marks,
                plural(self.malformed, "malformed mark", "malformed marks"),
            );
        }
        out
    }
}

fn describe(out: &mut String, a: &Access, stack: &mut dyn FnMut(u64) -> Vec<String>) {
    let what = match a.kind {
        AccessKind::Read => "read",
        AccessKind::Write => "write",
    };
    let _ = writeln!(
        out,
        "  {what} by stream {:#x} in operator {}, argument {} ([{:#x}, {:#x}), {} bytes)",
        a.stream,
        a.operator,
        a.alias,
        a.addr,
        a.addr + a.size,
        a.size
    );
    for frame in stack(a.context) {
        let _ = writeln!(out, "      at {frame}");
    }
}

fn plural(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sanitizer::message::parse;
    use crate::sanitizer::race::{Launch, RaceChecker};

    fn launch(c: &mut RaceChecker, log: &mut RaceLog, stream: u64, msg: &str, context: u64) {
        let op = parse(msg).unwrap();
        log.marks += 1;
        for race in c.launch(Launch {
            stream,
            op: &op,
            context,
        }) {
            log.add(race);
        }
    }

    #[test]
    fn a_racing_loop_is_one_race_with_its_count() {
        let (mut c, mut log) = (RaceChecker::new(), RaceLog::default());
        for _ in 0..3 {
            launch(
                &mut c,
                &mut log,
                0x10,
                "sanitizer-op: name=ext.produce;write=out:0x1000:64",
                7,
            );
            launch(
                &mut c,
                &mut log,
                0x20,
                "sanitizer-op: name=ext.consume;read=in:0x1000:64",
                0,
            );
        }
        log.malformed = 1;
        let text = log.render(&mut |ctx| {
            if ctx == 7 {
                vec!["produce demo.c:12".into()]
            } else {
                vec![]
            }
        });
        assert_eq!(
            text,
            "====== msmemscope sanitizer: 2 possible data races between streams (5 occurrences) ======\n\
             Race 1 (3 occurrences) on memory [0x1000, 0x1040) (64 bytes):\n\
             \x20 read by stream 0x20 in operator ext.consume, argument in ([0x1000, 0x1040), 64 bytes)\n\
             \x20 not ordered after the earlier\n\
             \x20 write by stream 0x10 in operator ext.produce, argument out ([0x1000, 0x1040), 64 bytes)\n\
             \x20     at produce demo.c:12\n\
             Race 2 (2 occurrences) on memory [0x1000, 0x1040) (64 bytes):\n\
             \x20 write by stream 0x10 in operator ext.produce, argument out ([0x1000, 0x1040), 64 bytes)\n\
             \x20     at produce demo.c:12\n\
             \x20 not ordered after the earlier\n\
             \x20 read by stream 0x20 in operator ext.consume, argument in ([0x1000, 0x1040), 64 bytes)\n\
             ====== SUMMARY: 2 races, 6 sanitizer-op marks checked, 1 malformed mark skipped ======\n"
        );
    }

    #[test]
    fn a_clean_run_says_so() {
        let log = RaceLog {
            marks: 1,
            ..RaceLog::default()
        };
        assert_eq!(
            log.render(&mut |_| vec![]),
            "====== msmemscope sanitizer: no data race between streams in 1 sanitizer-op mark ======\n"
        );
    }
}
