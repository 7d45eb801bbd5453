//! `fluctuation`, which runs with `leaks` (docs/analyses.md#gap-analysis): per step, the smallest
//! and the largest `used` (bytes in use in the pool after an allocation or free) of each pool, and
//! their ratio, the gap = min / max (1 = flat; a step whose max is 0 has gap 1). The first step is
//! skipped, as the original msMemScope does: memory is not steady yet.
//!
//! # Rules
//! - Steps as in [`super::leaks`]: a `SYSTEM STEP` row starts the next step (Name = its number),
//!   rows before the first one are step 0, the end of the input ends the last step.
//! - A pool is (Device Id, Event Type of the MALLOC/FREE rows). Its `used` carries over step
//!   boundaries: a step starts with min = max = the pool's last known `used`, and every MALLOC
//!   or FREE row of the pool with a `used` Attr updates it. Rows without `used` are ignored; a
//!   pool that has shown no `used` yet has no row for that step.
//! - Only steps numbered 2 and later are listed.
//!
//! # Report (console, after the leak report, and `leaks/gap_analysis.txt`)
//! One table per pool that has rows, pools in the order (device `N/A`, `cpu`, `0`, …; `HAL`,
//! `PTA`, `HOST`):
//! ```text
//! ====== Gap Analysis on device cpu, pool PTA ======
//! Step     MinUsed(byte)   MaxUsed(byte)       Gap
//! 2                 1000            3000    0.3333
//! 3                 3000            3000    1.0000
//! Min gap: 0.3333 at step 2
//! Max gap: 1.0000 at step 3
//! Gap = MinUsed / MaxUsed of the pool within the step: 1 is flat; a floor (MinUsed) that rises from step to step is memory kept
//! ```
//! (the last line once, after every table).
//! Columns: `{:<6}{:>16}{:>16}{:>10}`; the gap with 4 decimals (Rust's `{:.4}`); min and max
//! gap name the first step that has them, over all of the pool's steps. Nothing is printed (and
//! no file is written) when no pool has a step from 2 on.
//!
//! The file always has every step line. On the console, a pool with more than
//! [`CONSOLE_MAX_LINES`] (12) step lines shows only its first and last [`CONSOLE_ENDS`] (3) with,
//! between them, one line for the rest; the min and max gap lines still name their steps,
//! shown or not:
//! ```text
//! 6                 1000            3000    0.3333
//! ... 1488 steps not shown (all of them in leaks/gap_analysis.txt)
//! 1495              1000            3000    0.3333
//! ```
//! Tables of 12 or fewer step lines print the same on the console as in the file.

use std::collections::BTreeMap;

use super::leaks::block_attrs;
use super::live_blocks::is_pool;
use super::{Analysis, AnalysisOutput};
use crate::events::{DeviceId, Event, EventRow, EventType};

/// The table file, relative to the run directory.
pub const REPORT_FILE: &str = "leaks/gap_analysis.txt";

/// One line of a pool's table.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepRange {
    pub step: u64,
    pub min_used: u64,
    pub max_used: u64,
}

impl StepRange {
    pub fn gap(&self) -> f64 {
        if self.max_used == 0 {
            1.0
        } else {
            self.min_used as f64 / self.max_used as f64
        }
    }
}

#[derive(Default)]
struct Pool {
    used: Option<u64>,
    /// This step's (min, max), once the pool has a known `used`.
    range: Option<(u64, u64)>,
    steps: Vec<StepRange>,
}

#[derive(Default)]
pub struct Fluctuation {
    step: u64,
    pools: BTreeMap<(DeviceId, EventType), Pool>,
}

impl Fluctuation {
    pub fn new() -> Fluctuation {
        Fluctuation::default()
    }

    /// Each pool's table rows, once `finish` has run.
    pub fn tables(&self) -> Vec<((DeviceId, EventType), Vec<StepRange>)> {
        self.pools
            .iter()
            .filter(|(_, p)| !p.steps.is_empty())
            .map(|(k, p)| (*k, p.steps.clone()))
            .collect()
    }

    fn end_step(&mut self) {
        for pool in self.pools.values_mut() {
            if let (Some((min, max)), true) = (pool.range, self.step >= 2) {
                pool.steps.push(StepRange {
                    step: self.step,
                    min_used: min,
                    max_used: max,
                });
            }
            pool.range = pool.used.map(|u| (u, u));
        }
    }
}

impl Analysis for Fluctuation {
    fn name(&self) -> &'static str {
        "fluctuation"
    }

    fn feed(&mut self, row: &EventRow) {
        match (row.event, row.event_type) {
            (Event::System, EventType::Step) => {
                self.end_step();
                self.step = row.name.trim().parse().unwrap_or(self.step + 1);
            }
            (Event::Malloc | Event::Free, pool) if is_pool(pool) => {
                let Some(used) = block_attrs(row).used else {
                    return;
                };
                let pool = self.pools.entry((row.device, pool)).or_default();
                pool.used = Some(used);
                pool.range = Some(match pool.range {
                    Some((min, max)) => (min.min(used), max.max(used)),
                    None => (used, used),
                });
            }
            _ => {}
        }
    }

    fn finish(&mut self) -> AnalysisOutput {
        self.end_step();
        let tables = self.tables();
        let text = render(&tables, false);
        if text.is_empty() {
            return AnalysisOutput::default();
        }
        AnalysisOutput {
            console: render(&tables, true),
            files: vec![(REPORT_FILE.to_string(), text)],
        }
    }
}

/// A pool's table on the console is cut when it has more step lines than this.
pub const CONSOLE_MAX_LINES: usize = 12;
/// How many step lines a cut table keeps at each end.
pub const CONSOLE_ENDS: usize = 3;

/// The Gap Analysis tables: every step line (`short` false: the file), or a pool's first and
/// last [`CONSOLE_ENDS`] step lines when it has more than [`CONSOLE_MAX_LINES`] (`short` true:
/// the console).
pub fn render(tables: &[((DeviceId, EventType), Vec<StepRange>)], short: bool) -> String {
    let mut out = String::new();
    for ((device, pool), steps) in tables {
        let Some(first) = steps.first() else { continue };
        out.push_str(&format!(
            "====== Gap Analysis on device {device}, pool {} ======\n",
            pool.as_str()
        ));
        out.push_str(&format!(
            "{:<6}{:>16}{:>16}{:>10}\n",
            "Step", "MinUsed(byte)", "MaxUsed(byte)", "Gap"
        ));
        let cut = short && steps.len() > CONSOLE_MAX_LINES;
        let (mut lo, mut hi) = (first, first);
        for (i, s) in steps.iter().enumerate() {
            if !cut || i < CONSOLE_ENDS || i >= steps.len() - CONSOLE_ENDS {
                out.push_str(&format!(
                    "{:<6}{:>16}{:>16}{:>10.4}\n",
                    s.step,
                    s.min_used,
                    s.max_used,
                    s.gap()
                ));
            } else if i == CONSOLE_ENDS {
                out.push_str(&format!(
                    "... {} steps not shown (all of them in {REPORT_FILE})\n",
                    steps.len() - 2 * CONSOLE_ENDS
                ));
            }
            if s.gap() < lo.gap() {
                lo = s;
            }
            if s.gap() > hi.gap() {
                hi = s;
            }
        }
        out.push_str(&format!("Min gap: {:.4} at step {}\n", lo.gap(), lo.step));
        out.push_str(&format!("Max gap: {:.4} at step {}\n", hi.gap(), hi.step));
    }
    if !out.is_empty() {
        out.push_str(GAP_MEANING);
    }
    out
}

/// The line after the tables that says what they show.
pub const GAP_MEANING: &str = "Gap = MinUsed / MaxUsed of the pool within the step: 1 is flat; \
     a floor (MinUsed) that rises from step to step is memory kept\n";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::leaks::tests::{block, step};

    const CPU: DeviceId = DeviceId::Cpu;

    fn used(event: Event, pool: EventType, device: DeviceId, used: u64) -> EventRow {
        block(event, pool, device, 0x10, 8, used)
    }

    fn run(rows: Vec<EventRow>) -> AnalysisOutput {
        let mut f = Fluctuation::new();
        for row in &rows {
            f.feed(row);
        }
        f.finish()
    }

    #[test]
    fn gap_table() {
        let rows = vec![
            used(Event::Malloc, EventType::Pta, CPU, 500), // step 0: not listed
            step(1),
            used(Event::Malloc, EventType::Pta, CPU, 1000), // step 1: not listed
            step(2),                                        // starts at 1000
            used(Event::Malloc, EventType::Pta, CPU, 3000),
            used(Event::Free, EventType::Pta, CPU, 2000),
            step(3), // starts at 2000
            used(Event::Malloc, EventType::Pta, CPU, 8000),
            used(Event::Free, EventType::Pta, CPU, 2000),
            step(4), // no rows: min = max = 2000
            step(5),
            used(Event::Free, EventType::Pta, CPU, 0),
        ];
        let out = run(rows);
        let expected = "\
====== Gap Analysis on device cpu, pool PTA ======
Step     MinUsed(byte)   MaxUsed(byte)       Gap
2                 1000            3000    0.3333
3                 2000            8000    0.2500
4                 2000            2000    1.0000
5                    0            2000    0.0000
Min gap: 0.0000 at step 5
Max gap: 1.0000 at step 4
Gap = MinUsed / MaxUsed of the pool within the step: 1 is flat; a floor (MinUsed) that rises from step to step is memory kept
";
        assert_eq!(out.console, expected);
        assert_eq!(
            out.files,
            vec![(REPORT_FILE.to_string(), expected.to_string())]
        );
    }

    #[test]
    fn pools_apart_and_rows_without_used_ignored() {
        let mut no_used = EventRow::new(Event::Malloc, EventType::Pta, "");
        no_used.device = CPU;
        no_used.ptr = Some(0x99);
        no_used.attrs_json = Some("{\"size\":4}".into());
        let rows = vec![
            step(1),
            step(2),
            used(Event::Malloc, EventType::Hal, DeviceId::Cuda(0), 1 << 20),
            no_used,
            used(Event::Malloc, EventType::Pta, DeviceId::Cuda(0), 0),
        ];
        let out = run(rows);
        assert_eq!(
            out.console,
            "\
====== Gap Analysis on device 0, pool HAL ======
Step     MinUsed(byte)   MaxUsed(byte)       Gap
2              1048576         1048576    1.0000
Min gap: 1.0000 at step 2
Max gap: 1.0000 at step 2
====== Gap Analysis on device 0, pool PTA ======
Step     MinUsed(byte)   MaxUsed(byte)       Gap
2                    0               0    1.0000
Min gap: 1.0000 at step 2
Max gap: 1.0000 at step 2
Gap = MinUsed / MaxUsed of the pool within the step: 1 is flat; a floor (MinUsed) that rises from step to step is memory kept
"
        );
    }

    /// Steps 2..=31 in one pool: 30 step lines. `used` starts every step at 1000, rises to
    /// 2000 + the step number (8000 in step 10, the min gap; nothing above 1000 in step 20, the
    /// max gap) and falls back to 1000.
    fn thirty_steps() -> Vec<EventRow> {
        let mut rows = vec![step(1), used(Event::Malloc, EventType::Pta, CPU, 1000)];
        for s in 2..=31 {
            let high = match s {
                10 => 8000,
                20 => 1000,
                _ => 2000 + s,
            };
            rows.push(step(s));
            rows.push(used(Event::Malloc, EventType::Pta, CPU, high));
            rows.push(used(Event::Free, EventType::Pta, CPU, 1000));
        }
        rows
    }

    #[test]
    fn long_table_is_cut_on_the_console_and_whole_in_the_file() {
        let out = run(thirty_steps());
        let console = "\
====== Gap Analysis on device cpu, pool PTA ======
Step     MinUsed(byte)   MaxUsed(byte)       Gap
2                 1000            2002    0.4995
3                 1000            2003    0.4993
4                 1000            2004    0.4990
... 24 steps not shown (all of them in leaks/gap_analysis.txt)
29                1000            2029    0.4929
30                1000            2030    0.4926
31                1000            2031    0.4924
Min gap: 0.1250 at step 10
Max gap: 1.0000 at step 20
Gap = MinUsed / MaxUsed of the pool within the step: 1 is flat; a floor (MinUsed) that rises from step to step is memory kept
";
        let file = "\
====== Gap Analysis on device cpu, pool PTA ======
Step     MinUsed(byte)   MaxUsed(byte)       Gap
2                 1000            2002    0.4995
3                 1000            2003    0.4993
4                 1000            2004    0.4990
5                 1000            2005    0.4988
6                 1000            2006    0.4985
7                 1000            2007    0.4983
8                 1000            2008    0.4980
9                 1000            2009    0.4978
10                1000            8000    0.1250
11                1000            2011    0.4973
12                1000            2012    0.4970
13                1000            2013    0.4968
14                1000            2014    0.4965
15                1000            2015    0.4963
16                1000            2016    0.4960
17                1000            2017    0.4958
18                1000            2018    0.4955
19                1000            2019    0.4953
20                1000            1000    1.0000
21                1000            2021    0.4948
22                1000            2022    0.4946
23                1000            2023    0.4943
24                1000            2024    0.4941
25                1000            2025    0.4938
26                1000            2026    0.4936
27                1000            2027    0.4933
28                1000            2028    0.4931
29                1000            2029    0.4929
30                1000            2030    0.4926
31                1000            2031    0.4924
Min gap: 0.1250 at step 10
Max gap: 1.0000 at step 20
Gap = MinUsed / MaxUsed of the pool within the step: 1 is flat; a floor (MinUsed) that rises from step to step is memory kept
";
        assert_eq!(out.console, console);
        assert_eq!(out.files, vec![(REPORT_FILE.to_string(), file.to_string())]);
    }

    #[test]
    fn twelve_step_lines_print_whole_thirteen_are_cut() {
        let step_lines = |text: &str| {
            text.lines()
                .filter(|l| l.starts_with(|c: char| c.is_ascii_digit()))
                .count()
        };
        // Steps 2..=13: 12 lines, the console is the file.
        let mut rows = thirty_steps();
        rows.truncate(2 + 3 * 12);
        let out = run(rows);
        assert_eq!(step_lines(&out.console), 12);
        assert!(!out.console.contains("not shown"));
        assert_eq!(out.files[0].1, out.console);
        // Steps 2..=14: 13 lines; the console shows steps 2 to 4 and 12 to 14.
        let mut rows = thirty_steps();
        rows.truncate(2 + 3 * 13);
        let out = run(rows);
        assert_eq!(step_lines(&out.console), 6);
        assert!(out
            .console
            .contains("\n... 7 steps not shown (all of them in leaks/gap_analysis.txt)\n12    "));
        assert_eq!(step_lines(&out.files[0].1), 13);
    }

    #[test]
    fn nothing_before_step_two() {
        let rows = vec![step(1), used(Event::Malloc, EventType::Pta, CPU, 10)];
        let out = run(rows);
        assert_eq!(out, AnalysisOutput::default());
    }
}
