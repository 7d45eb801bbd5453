//! The flight recorder: which rows of a long run stay on disk in full, and the one-line summary
//! every step leaves whatever is kept.
//!
//! A run's dump is written in full into its head file (`memscope_dump_{ts}.csv`) until the head
//! holds half the budget. From the next step on, each step's rows go to a part file of their own
//! in `memscope_dump_{ts}.steps/` (`step_{S}_{P}.csv`: step `S`, part `P` of it; a step larger
//! than a chunk of the budget is cut into several parts). While the run's dump stays within the
//! budget every part is kept, so a run smaller than the budget keeps everything. Past it, parts
//! are removed oldest first, except the ones still wanted: the step of the run's peak, the steps
//! where the leaks analysis saw its leak sites' first and latest blocks allocated, the steps of
//! out-of-memory errors. So the head holds the first steps, the newest parts the most recent
//! ones, and the wanted steps stay wherever they are; every part is written as its step runs,
//! so a killed run keeps what was on disk.
//!
//! Every step also appends one line to `memscope_dump_{ts}.steps/steps.csv` (its rows, where
//! they went, each pool's bytes in use at its end and its high, the leak sites that grew): the
//! whole run at a glance, for the steps whose rows are gone too. The lines wait in memory while
//! the head is open (up to 4,096 of them), so a run that fits its budget stays one file.
//!
//! This module decides; the runtime's sinks do the file work, and the dump readers chain the
//! head and its parts back into one stream (`events::parts`, where the files' names and the
//! summary's columns are defined).

use std::collections::{BTreeSet, VecDeque};

use crate::events::{Event, EventRow, EventType};

/// Parts of the wanted steps kept at most (the oldest wanted ones go first past it).
const MAX_WANTED_STEPS: usize = 16;

/// One part file the policy knows of: `K` names it for the caller (its device, step, part).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Part<K> {
    pub key: K,
    pub step: u64,
    pub bytes: u64,
}

/// Which rows stay: the head's share, then parts removed oldest first past the budget, the
/// wanted steps spared.
#[derive(Debug)]
pub struct KeepPolicy<K> {
    /// `None`: keep everything (the head is never closed).
    budget: Option<u64>,
    head_bytes: u64,
    head_open: bool,
    /// Parts on disk, oldest first.
    parts: VecDeque<Part<K>>,
    parts_bytes: u64,
    /// Steps whose parts are spared, as the analyses and the summary last said.
    wanted: BTreeSet<u64>,
}

impl<K: Clone + PartialEq> KeepPolicy<K> {
    pub fn new(budget: Option<u64>) -> KeepPolicy<K> {
        KeepPolicy {
            budget,
            head_bytes: 0,
            head_open: true,
            parts: VecDeque::new(),
            parts_bytes: 0,
            wanted: BTreeSet::new(),
        }
    }

    pub fn head_open(&self) -> bool {
        self.head_open
    }

    /// Bytes on disk now: the head and the parts kept.
    pub fn bytes(&self) -> u64 {
        self.head_bytes + self.parts_bytes
    }

    /// The largest a part may grow before the next one starts.
    pub fn chunk(&self) -> u64 {
        self.budget.map_or(u64::MAX, |b| (b / 8).max(1))
    }

    /// A step starts: the head closes here once it holds half the budget.
    pub fn step_starts(&mut self) {
        if let Some(budget) = self.budget {
            if self.head_open && self.head_bytes >= budget / 2 {
                self.head_open = false;
            }
        }
    }

    /// Bytes written to the head; within a step the head closes only when it reaches three
    /// quarters of the budget (a run that marks no steps, or one huge step).
    pub fn head_wrote(&mut self, bytes: u64) {
        self.head_bytes += bytes;
        if let Some(budget) = self.budget {
            if self.head_bytes >= budget / 4 * 3 {
                self.head_open = false;
            }
        }
    }

    /// The parts on disk, oldest first.
    pub fn parts(&self) -> impl Iterator<Item = &Part<K>> {
        self.parts.iter()
    }

    /// A part file was made.
    pub fn part_opened(&mut self, key: K, step: u64) {
        self.parts.push_back(Part {
            key,
            step,
            bytes: 0,
        });
    }

    /// Bytes written to the part `key`.
    pub fn part_wrote(&mut self, key: &K, bytes: u64) {
        if let Some(part) = self.parts.iter_mut().rev().find(|p| p.key == *key) {
            part.bytes += bytes;
            self.parts_bytes += bytes;
        }
    }

    /// The steps to spare from now on (the newest [`MAX_WANTED_STEPS`] of them).
    pub fn want(&mut self, steps: impl IntoIterator<Item = u64>) {
        self.wanted = steps.into_iter().collect();
        while self.wanted.len() > MAX_WANTED_STEPS {
            self.wanted.pop_first();
        }
    }

    /// The parts to remove so that the dump fits its budget again, oldest first, never one in
    /// `open` (parts still being written). Unwanted parts go first; wanted ones only when the
    /// rest cannot make room.
    pub fn over_budget(&mut self, open: &[K]) -> Vec<Part<K>> {
        let Some(budget) = self.budget else {
            return Vec::new();
        };
        let mut removed = Vec::new();
        for spare_wanted in [true, false] {
            let mut i = 0;
            while self.bytes() > budget && i < self.parts.len() {
                let part = &self.parts[i];
                if open.contains(&part.key) || (spare_wanted && self.wanted.contains(&part.step)) {
                    i += 1;
                    continue;
                }
                let part = self.parts.remove(i).expect("index in range");
                self.parts_bytes -= part.bytes;
                removed.push(part);
            }
        }
        removed
    }
}

/// A pool's bytes in use: at the step's end and the step's high.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Used {
    now: Option<u64>,
    max: Option<u64>,
}

impl Used {
    fn see(&mut self, used: u64) {
        self.now = Some(used);
        self.max = Some(self.max.map_or(used, |m| m.max(used)));
    }

    /// The next step starts from what is in use now.
    fn restart(&mut self) {
        self.max = self.now;
    }
}

/// What the leaks analysis says at a step's end.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StepNotes {
    /// Steps whose rows it wants kept (its leak sites' first and latest allocations).
    pub keep: Vec<u64>,
    /// Sites whose live candidate bytes reached a new high at this step end, and by how much.
    pub sites_grown: u64,
    pub bytes_grown: u64,
}

/// The per-step summary of one device's rows, fed each row as it is written.
#[derive(Debug, Default)]
pub struct StepStats {
    step: u64,
    rows: u64,
    first_id: Option<u64>,
    last_id: u64,
    in_head: bool,
    pta: Used,
    hal: Used,
    ooms: u64,
    /// The run's highest bytes in use (PTA, else HAL) and the step it was reached in.
    peak: Option<(u64, u64)>,
    /// Steps with an out-of-memory error (the newest few).
    oom_steps: VecDeque<u64>,
}

impl StepStats {
    pub fn new() -> StepStats {
        StepStats {
            in_head: true,
            ..StepStats::default()
        }
    }

    pub fn step(&self) -> u64 {
        self.step
    }

    /// The run's highest bytes in use so far (PTA, else HAL) and the step it was reached in.
    pub fn peak(&self) -> Option<(u64, u64)> {
        self.peak
    }

    /// A row of this device (written before the STEP row that ends its step is handed over).
    pub fn feed(&mut self, row: &EventRow) {
        self.rows += 1;
        self.first_id.get_or_insert(row.id);
        self.last_id = row.id;
        match (row.event, row.event_type) {
            (Event::Malloc | Event::Free, pool @ (EventType::Pta | EventType::Hal)) => {
                let Some(used) = row.attr_u64("used") else {
                    return;
                };
                let own = if pool == EventType::Pta {
                    &mut self.pta
                } else {
                    &mut self.hal
                };
                own.see(used);
                // The peak is PTA's where PTA is counted (HAL's segments contain its blocks).
                let counts = pool == EventType::Pta || self.pta.now.is_none();
                if counts && self.peak.is_none_or(|(bytes, _)| used > bytes) {
                    self.peak = Some((used, self.step));
                }
            }
            (Event::OomDetail, EventType::OomTrigger) => {
                self.ooms += 1;
                if self.oom_steps.back() != Some(&self.step) {
                    self.oom_steps.push_back(self.step);
                    if self.oom_steps.len() > 4 {
                        self.oom_steps.pop_front();
                    }
                }
            }
            _ => {}
        }
    }

    /// Some of this step's rows went to a part file (not all are in the head).
    pub fn left_head(&mut self) {
        self.in_head = false;
    }

    /// The steps this summary wants kept: the peak's and the out-of-memory errors'.
    pub fn wanted(&self) -> impl Iterator<Item = u64> + '_ {
        self.peak
            .map(|(_, step)| step)
            .into_iter()
            .chain(self.oom_steps.iter().copied())
    }

    /// The step ends (`next`: the one that starts): its summary line, and the next step's
    /// counts start.
    pub fn end_step(&mut self, next: u64, notes: &StepNotes) -> String {
        let opt = |v: Option<u64>| v.map(|v| v.to_string()).unwrap_or_default();
        let line = format!(
            "{},{},{},{},{},{},{},{},{},{},{},{}\n",
            self.step,
            self.rows,
            opt(self.first_id),
            opt(self.first_id.map(|_| self.last_id)),
            if self.in_head { "head" } else { "part" },
            opt(self.pta.now),
            opt(self.pta.max),
            opt(self.hal.now),
            opt(self.hal.max),
            self.ooms,
            notes.sites_grown,
            notes.bytes_grown,
        );
        self.step = next;
        self.rows = 0;
        self.first_id = None;
        self.ooms = 0;
        self.pta.restart();
        self.hal.restart();
        line
    }

    /// The step's rows start in the head while it is open.
    pub fn starts_in(&mut self, head: bool) {
        self.in_head = head;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(budget: u64) -> KeepPolicy<u64> {
        KeepPolicy::new(Some(budget))
    }

    /// A run of steps of 10 bytes each under a budget of 100: the head takes the first five
    /// steps (half the budget), then parts come and go, the newest kept.
    #[test]
    fn the_head_then_the_newest_parts_within_the_budget() {
        let mut p = policy(100);
        let mut removed = Vec::new();
        for step in 0..20u64 {
            p.step_starts();
            if p.head_open() {
                p.head_wrote(10);
            } else {
                p.part_opened(step, step);
                p.part_wrote(&step, 10);
            }
            removed.extend(p.over_budget(&[step]).into_iter().map(|part| part.step));
            assert!(p.bytes() <= 100, "step {step}: {} bytes", p.bytes());
        }
        assert_eq!(removed, (5..15).collect::<Vec<_>>());
        let kept: Vec<u64> = p.parts.iter().map(|part| part.step).collect();
        assert_eq!(kept, (15..20).collect::<Vec<_>>());
    }

    /// Wanted steps are spared while unwanted ones can make room, and stop being spared when
    /// they are no longer wanted.
    #[test]
    fn wanted_steps_are_spared() {
        let mut p = policy(100);
        for step in 0..20u64 {
            p.step_starts();
            if p.head_open() {
                p.head_wrote(10);
                continue;
            }
            p.part_opened(step, step);
            p.part_wrote(&step, 10);
            if step == 7 {
                p.want([7]);
            }
            p.over_budget(&[step]);
        }
        let kept: Vec<u64> = p.parts.iter().map(|part| part.step).collect();
        assert_eq!(kept, vec![7, 16, 17, 18, 19]);
        p.want([]);
        p.part_opened(20, 20);
        p.part_wrote(&20, 10);
        let removed: Vec<u64> = p.over_budget(&[20]).iter().map(|part| part.step).collect();
        assert_eq!(removed, vec![7]);
    }

    /// Wanted steps give way when nothing else can: the budget holds.
    #[test]
    fn the_budget_holds_even_against_wanted_steps() {
        let mut p = policy(100);
        p.head_wrote(50);
        p.step_starts();
        for step in 1..10u64 {
            p.part_opened(step, step);
            p.part_wrote(&step, 20);
            p.want(1..=step);
            p.over_budget(&[step]);
            assert!(p.bytes() <= 100);
        }
    }

    /// Without steps the head closes at three quarters of the budget; without a budget never.
    #[test]
    fn the_head_closes_mid_step_only_when_large() {
        let mut p = policy(100);
        p.head_wrote(70);
        assert!(p.head_open());
        p.head_wrote(5);
        assert!(!p.head_open());
        let mut unbounded: KeepPolicy<u64> = KeepPolicy::new(None);
        unbounded.head_wrote(u64::MAX / 2);
        unbounded.step_starts();
        assert!(unbounded.head_open());
        assert!(unbounded.over_budget(&[]).is_empty());
    }

    fn block(event: Event, id: u64, used: u64) -> EventRow {
        let mut row = EventRow::new(event, EventType::Pta, "N/A");
        row.id = id;
        row.attrs_json = Some(format!(
            "{{\"addr\": \"0x10\", \"size\": 8, \"used\": {used}}}"
        ));
        row
    }

    /// A step's line: its rows, IDs, where they went, PTA in use at its end and its high.
    #[test]
    fn step_lines_and_the_peak_step() {
        let mut s = StepStats::new();
        s.feed(&block(Event::Malloc, 1, 100));
        s.feed(&block(Event::Free, 2, 0));
        let first = s.end_step(1, &StepNotes::default());
        assert_eq!(first, "0,2,1,2,head,0,100,,,0,0,0\n");
        s.left_head();
        s.feed(&block(Event::Malloc, 3, 300));
        let notes = StepNotes {
            keep: vec![],
            sites_grown: 1,
            bytes_grown: 300,
        };
        assert_eq!(s.end_step(2, &notes), "1,1,3,3,part,300,300,,,0,1,300\n");
        assert_eq!(s.end_step(3, &notes), "2,0,,,part,300,300,,,0,1,300\n");
        assert_eq!(s.wanted().collect::<Vec<_>>(), vec![1]);
    }
}
