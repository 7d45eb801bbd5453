//! The race checker: vector clocks over streams, and the accesses of every operator kept per
//! byte range, so that two views of the same memory at different offsets meet.
//!
//! Happens-before follows PyTorch's CUDA sanitizer (`torch.cuda._sanitizer`) step for step, so
//! that on operators whose arguments are whole, identical ranges both report the same races:
//! - every launch takes the next global sequence number, which becomes its stream's own entry;
//! - a stream seen for the first time starts from what the host has waited for;
//! - `EventRecord` copies the stream's clock into the event; `StreamWaitEvent` joins the event's
//!   clock into the stream's; `EventSynchronize` joins it into every stream and the host;
//!   `StreamSynchronize` joins the stream's clock into every stream and the host;
//!   `DeviceSynchronize` lets the host catch up with every stream, then every stream with the
//!   host;
//! - an earlier access by `(stream S, sequence n)` is ordered before a later one on stream T
//!   when T's clock holds at least n for S.
//!
//! Per byte, the checker keeps the last write and the reads since it (CSAN keeps them per data
//! pointer). A read conflicts with an unordered last write; a write conflicts with every
//! unordered read since the last write, or, when there was none, with an unordered last write.
//! Bytes with the same history form one segment of an interval map; a launch splits segments
//! at its ranges' ends and merges what became equal again, so the map stays as small as the
//! memory's distinct histories.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use super::message::{Arg, OpMark};
use super::SyncOp;

/// Stream handle (0: the default stream).
pub type StreamId = u64;
/// Event handle.
pub type EventId = u64;

/// A vector clock: per stream, the last sequence number known to have completed before.
type Clock = HashMap<StreamId, u64>;

/// Reads kept per segment since its last write. Beyond this, a new read replaces the oldest
/// read of its own stream: a later write unordered with that one is unordered with the new one
/// too, so only repeated reports are lost, never a race.
const MAX_READS_PER_SEGMENT: usize = 64;
/// Segments kept at most; beyond this new memory is no longer tracked (and the checker says so).
pub const MAX_SEGMENTS: usize = 1 << 20;
/// Distinct operator names and aliases shared between accesses.
const MAX_NAMES: usize = 1 << 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AccessKind {
    Read,
    Write,
}

/// One access of one argument by one operator launch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Access {
    pub kind: AccessKind,
    /// The launch's global sequence number (1, 2, ...).
    pub seq: u64,
    pub stream: StreamId,
    pub operator: Arc<str>,
    /// The argument's alias; for in-place arguments both sides' (`x` or `x/out`).
    pub alias: Arc<str>,
    /// The argument's whole range as marked.
    pub addr: u64,
    pub size: u64,
    /// Whatever the caller attached to the launch (a stack id, say); the checker only keeps it.
    pub context: u64,
}

/// Two accesses of overlapping memory on different streams with no synchronization between
/// them. `overlap` is the part of the memory where the checker saw the conflict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Race {
    pub current: Arc<Access>,
    pub previous: Arc<Access>,
    pub overlap_start: u64,
    pub overlap_end: u64,
}

/// One operator launch on a stream.
#[derive(Debug, Clone, Copy)]
pub struct Launch<'a> {
    pub stream: StreamId,
    pub op: &'a OpMark,
    pub context: u64,
}

#[derive(Debug, Clone)]
struct Segment {
    end: u64,
    write: Option<Arc<Access>>,
    reads: Vec<Arc<Access>>,
}

impl Segment {
    fn empty(end: u64) -> Self {
        Segment {
            end,
            write: None,
            reads: Vec::new(),
        }
    }

    fn same_history(&self, other: &Segment) -> bool {
        let same = |a: &Arc<Access>, b: &Arc<Access>| Arc::ptr_eq(a, b);
        let writes = match (&self.write, &other.write) {
            (None, None) => true,
            (Some(a), Some(b)) => same(a, b),
            _ => false,
        };
        writes
            && self.reads.len() == other.reads.len()
            && self.reads.iter().zip(&other.reads).all(|(a, b)| same(a, b))
    }
}

/// The streams' synchronization state, as CSAN's `StreamSynchronizations`.
#[derive(Debug, Default)]
struct Syncs {
    streams: HashMap<StreamId, Clock>,
    events: HashMap<EventId, Clock>,
    host: Clock,
}

fn join(into: &mut Clock, other: &Clock) {
    for (&stream, &seq) in other {
        let e = into.entry(stream).or_insert(0);
        *e = (*e).max(seq);
    }
}

impl Syncs {
    fn new() -> Self {
        let mut s = Syncs::default();
        s.stream(0);
        s
    }

    fn stream(&mut self, stream: StreamId) -> &mut Clock {
        if !self.streams.contains_key(&stream) {
            self.host.insert(stream, 0);
            let start = self.host.clone();
            self.streams.insert(stream, start);
        }
        self.streams.get_mut(&stream).expect("inserted above")
    }

    fn apply(&mut self, op: SyncOp) {
        match op {
            SyncOp::EventRecord { event, stream } => {
                let clock = self.stream(stream).clone();
                self.events.insert(event, clock);
            }
            SyncOp::StreamWaitEvent { stream, event } => {
                let recorded = self.events.entry(event).or_default().clone();
                join(self.stream(stream), &recorded);
            }
            SyncOp::EventSynchronize { event } => {
                let recorded = self.events.entry(event).or_default().clone();
                for clock in self.streams.values_mut() {
                    join(clock, &recorded);
                }
                join(&mut self.host, &recorded);
            }
            SyncOp::StreamSynchronize { stream } => {
                let waited = self.stream(stream).clone();
                for clock in self.streams.values_mut() {
                    join(clock, &waited);
                }
                join(&mut self.host, &waited);
            }
            SyncOp::DeviceSynchronize => {
                for (&stream, clock) in &self.streams {
                    let own = clock.get(&stream).copied().unwrap_or(0);
                    self.host.insert(stream, own);
                }
                let host = self.host.clone();
                for clock in self.streams.values_mut() {
                    join(clock, &host);
                }
            }
        }
    }

    /// Whether work `seq` of stream `earlier` completes before what `later` runs next.
    fn ordered(&mut self, later: StreamId, seq: u64, earlier: StreamId) -> bool {
        self.stream(earlier);
        self.stream(later).get(&earlier).is_some_and(|&n| seq <= n)
    }
}

/// The checker: feed it launches and synchronizations in program order.
#[derive(Debug)]
pub struct RaceChecker {
    syncs: Syncs,
    seq: u64,
    segments: BTreeMap<u64, Segment>,
    saturated: bool,
    segment_limit: usize,
    /// Operator names and aliases, shared by every access that names them (a training loop
    /// repeats a few names millions of times).
    names: HashSet<Arc<str>>,
}

impl Default for RaceChecker {
    fn default() -> Self {
        Self::new()
    }
}

impl RaceChecker {
    pub fn new() -> Self {
        Self::with_segment_limit(MAX_SEGMENTS)
    }

    /// A checker that tracks at most `limit` segments (distinct memory histories).
    pub fn with_segment_limit(limit: usize) -> Self {
        RaceChecker {
            syncs: Syncs::new(),
            seq: 0,
            segments: BTreeMap::new(),
            saturated: false,
            segment_limit: limit,
            names: HashSet::new(),
        }
    }

    /// A stream/event synchronization.
    pub fn sync(&mut self, op: SyncOp) {
        self.syncs.apply(op);
    }

    /// Launches so far.
    pub fn launches(&self) -> u64 {
        self.seq
    }

    /// Whether memory went untracked because the segment limit was reached.
    pub fn saturated(&self) -> bool {
        self.saturated
    }

    /// An operator launch: checks its accesses against the earlier ones and records them.
    /// Returns the races it is part of, one per (argument, earlier access) pair.
    pub fn launch(&mut self, launch: Launch<'_>) -> Vec<Race> {
        self.seq += 1;
        let seq = self.seq;
        let stream = launch.stream;
        self.syncs.stream(stream).insert(stream, seq);
        let operator = self.name(&launch.op.name);
        let mut access = |kind, arg: &Arg| {
            Arc::new(Access {
                kind,
                seq,
                stream,
                operator: operator.clone(),
                alias: self.name(&arg.alias),
                addr: arg.addr,
                size: arg.size,
                context: launch.context,
            })
        };
        let mut accesses = Vec::with_capacity(launch.op.read_only.len() + 2);
        for arg in &launch.op.read_only {
            accesses.push(access(AccessKind::Read, arg));
        }
        for arg in launch.op.writes() {
            accesses.push(access(AccessKind::Write, arg));
        }
        let mut races = Vec::new();
        for access in accesses {
            self.touch(access, &mut races);
        }
        races
    }

    /// Forgets the accesses to `[addr, addr + size)`: the memory was freed, and whatever is
    /// allocated there next starts without history (CSAN's memory-deallocation event).
    pub fn forget(&mut self, addr: u64, size: u64) {
        let Some(end) = addr.checked_add(size).filter(|_| size > 0) else {
            return;
        };
        self.split_at(addr);
        self.split_at(end);
        let keys: Vec<u64> = self.segments.range(addr..end).map(|(&k, _)| k).collect();
        for key in keys {
            self.segments.remove(&key);
        }
    }

    /// The shared copy of `name`; past [`MAX_NAMES`] distinct names, a fresh one.
    fn name(&mut self, name: &str) -> Arc<str> {
        if let Some(shared) = self.names.get(name) {
            return shared.clone();
        }
        let shared: Arc<str> = Arc::from(name);
        if self.names.len() < MAX_NAMES {
            self.names.insert(shared.clone());
        }
        shared
    }

    /// Applies one access to every byte of its range.
    fn touch(&mut self, access: Arc<Access>, races: &mut Vec<Race>) {
        if access.size == 0 {
            return;
        }
        let (lo, hi) = (access.addr, access.addr + access.size);
        if !self.cover(lo, hi) {
            return;
        }
        let Self {
            segments, syncs, ..
        } = self;
        for (&start, segment) in segments.range_mut(lo..hi) {
            let conflicts: &[Arc<Access>] = match (access.kind, &segment.write) {
                (AccessKind::Write, _) if !segment.reads.is_empty() => &segment.reads,
                (_, Some(write)) => std::slice::from_ref(write),
                (_, None) => &[],
            };
            for previous in conflicts {
                if !syncs.ordered(access.stream, previous.seq, previous.stream) {
                    note_race(races, &access, previous, start, segment.end);
                }
            }
            match access.kind {
                AccessKind::Read => add_read(&mut segment.reads, access.clone()),
                AccessKind::Write => {
                    segment.write = Some(access.clone());
                    segment.reads.clear();
                }
            }
        }
        self.merge(lo, hi);
    }

    /// Makes segments tile `[lo, hi)` exactly (splitting at both ends, filling gaps). `false`
    /// when that needs more segments than the limit allows.
    fn cover(&mut self, lo: u64, hi: u64) -> bool {
        self.split_at(lo);
        self.split_at(hi);
        let mut gaps = Vec::new();
        let mut at = lo;
        for (&start, segment) in self.segments.range(lo..hi) {
            if start > at {
                gaps.push((at, start));
            }
            at = segment.end;
        }
        if at < hi {
            gaps.push((at, hi));
        }
        if self.segments.len() + gaps.len() > self.segment_limit {
            self.saturated = true;
            return false;
        }
        for (start, end) in gaps {
            self.segments.insert(start, Segment::empty(end));
        }
        true
    }

    /// Splits the segment that contains `at` strictly inside it.
    fn split_at(&mut self, at: u64) {
        let Some((_, segment)) = self.segments.range_mut(..at).next_back() else {
            return;
        };
        if segment.end <= at {
            return;
        }
        let tail = segment.clone();
        segment.end = at;
        self.segments.insert(at, tail);
    }

    /// Merges adjacent segments with the same history in and around `[lo, hi)`.
    fn merge(&mut self, lo: u64, hi: u64) {
        let first = self
            .segments
            .range(..lo)
            .next_back()
            .filter(|(_, s)| s.end == lo)
            .map_or(lo, |(&k, _)| k);
        let keys: Vec<u64> = self.segments.range(first..=hi).map(|(&k, _)| k).collect();
        let mut current = None::<u64>;
        for key in keys {
            let Some(prev) = current else {
                current = Some(key);
                continue;
            };
            let mergeable = {
                let a = &self.segments[&prev];
                a.end == key && a.same_history(&self.segments[&key])
            };
            if mergeable {
                let b = self.segments.remove(&key).expect("key collected above");
                self.segments.get_mut(&prev).expect("kept").end = b.end;
            } else {
                current = Some(key);
            }
        }
    }
}

fn add_read(reads: &mut Vec<Arc<Access>>, read: Arc<Access>) {
    if reads.len() >= MAX_READS_PER_SEGMENT {
        let oldest = reads
            .iter()
            .position(|r| r.stream == read.stream)
            .unwrap_or(0);
        reads.remove(oldest);
    }
    reads.push(read);
}

/// Adds (or widens) the race between `current` and `previous`.
fn note_race(
    races: &mut Vec<Race>,
    current: &Arc<Access>,
    previous: &Arc<Access>,
    start: u64,
    end: u64,
) {
    if let Some(race) = races
        .iter_mut()
        .find(|r| Arc::ptr_eq(&r.current, current) && Arc::ptr_eq(&r.previous, previous))
    {
        race.overlap_start = race.overlap_start.min(start);
        race.overlap_end = race.overlap_end.max(end);
        return;
    }
    races.push(Race {
        current: current.clone(),
        previous: previous.clone(),
        overlap_start: start,
        overlap_end: end,
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sanitizer::message::parse;

    fn run(checker: &mut RaceChecker, stream: u64, message: &str) -> Vec<String> {
        let op = parse(message).unwrap();
        checker
            .launch(Launch {
                stream,
                op: &op,
                context: 0,
            })
            .iter()
            .map(|r| {
                format!(
                    "{}:{}@{} vs {}:{}@{} [{:#x},{:#x})",
                    r.current.operator,
                    r.current.alias,
                    r.current.stream,
                    r.previous.operator,
                    r.previous.alias,
                    r.previous.stream,
                    r.overlap_start,
                    r.overlap_end
                )
            })
            .collect()
    }

    #[test]
    fn unsynchronized_writes_on_two_streams_race() {
        let mut c = RaceChecker::new();
        assert!(run(&mut c, 1, "sanitizer-op: name=a;write=x:0x1000:256").is_empty());
        assert_eq!(
            run(&mut c, 2, "sanitizer-op: name=b;write=y:0x1000:256"),
            vec!["b:y@2 vs a:x@1 [0x1000,0x1100)"]
        );
    }

    #[test]
    fn event_record_and_wait_order_the_streams() {
        let mut c = RaceChecker::new();
        run(&mut c, 1, "sanitizer-op: name=a;write=x:0x1000:256");
        c.sync(SyncOp::EventRecord {
            event: 9,
            stream: 1,
        });
        c.sync(SyncOp::StreamWaitEvent {
            stream: 2,
            event: 9,
        });
        assert!(run(&mut c, 2, "sanitizer-op: name=b;read=y:0x1000:256").is_empty());
        // The wait does not order stream 1's later work.
        run(&mut c, 1, "sanitizer-op: name=c;write=x:0x1000:16");
        assert_eq!(
            run(&mut c, 2, "sanitizer-op: name=d;read=y:0x1008:4"),
            vec!["d:y@2 vs c:x@1 [0x1008,0x100c)"]
        );
    }

    #[test]
    fn host_synchronizations_order_everything_before() {
        for sync in [
            SyncOp::DeviceSynchronize,
            SyncOp::StreamSynchronize { stream: 1 },
        ] {
            let mut c = RaceChecker::new();
            run(&mut c, 1, "sanitizer-op: name=a;write=x:0x10:8");
            c.sync(sync);
            assert!(
                run(&mut c, 2, "sanitizer-op: name=b;write=x:0x10:8").is_empty(),
                "{sync:?}"
            );
            // A stream first seen after the synchronization starts from the host's state.
            assert!(
                run(&mut c, 3, "sanitizer-op: name=c;read=x:0x10:8").len() == 1,
                "b on stream 2 is not ordered with stream 3"
            );
        }
        let mut c = RaceChecker::new();
        run(&mut c, 1, "sanitizer-op: name=a;write=x:0x10:8");
        c.sync(SyncOp::EventRecord {
            event: 5,
            stream: 1,
        });
        c.sync(SyncOp::EventSynchronize { event: 5 });
        assert!(run(&mut c, 7, "sanitizer-op: name=b;write=x:0x10:8").is_empty());
    }

    #[test]
    fn views_at_offsets_overlap() {
        let mut c = RaceChecker::new();
        run(&mut c, 1, "sanitizer-op: name=fill;write=buf:0x1000:1024");
        // A view 512 bytes in: a data-pointer-keyed checker would see another tensor.
        assert_eq!(
            run(&mut c, 2, "sanitizer-op: name=scale;read=half:0x1200:1024"),
            vec!["scale:half@2 vs fill:buf@1 [0x1200,0x1400)"]
        );
        // Disjoint ranges never meet.
        assert!(run(&mut c, 3, "sanitizer-op: name=far;write=z:0x1600:64").is_empty());
    }

    #[test]
    fn a_write_after_reads_is_checked_against_each_read() {
        let mut c = RaceChecker::new();
        run(&mut c, 1, "sanitizer-op: name=w;write=x:0x0:64");
        c.sync(SyncOp::DeviceSynchronize);
        run(&mut c, 2, "sanitizer-op: name=r2;read=x:0x0:64");
        run(&mut c, 3, "sanitizer-op: name=r3;read=x:0x20:32");
        assert_eq!(
            run(&mut c, 1, "sanitizer-op: name=w2;write=x:0x0:64"),
            vec![
                "w2:x@1 vs r2:x@2 [0x0,0x40)",
                "w2:x@1 vs r3:x@3 [0x20,0x40)"
            ]
        );
    }

    #[test]
    fn in_place_and_same_stream_accesses_do_not_race() {
        let mut c = RaceChecker::new();
        assert!(run(
            &mut c,
            4,
            "sanitizer-op: name=add_;read=self:0x100:64;write=self:0x100:64"
        )
        .is_empty());
        assert!(run(
            &mut c,
            4,
            "sanitizer-op: name=mul_;read=x:0x100:64;write=x:0x100:64"
        )
        .is_empty());
        assert_eq!(
            run(
                &mut c,
                5,
                "sanitizer-op: name=copy;read=src:0x100:64;write=dst:0x100:64"
            ),
            vec!["copy:src/dst@5 vs mul_:x@4 [0x100,0x140)"]
        );
    }

    #[test]
    fn segments_merge_back_after_whole_range_writes() {
        let mut c = RaceChecker::new();
        for i in 0..100u64 {
            run(
                &mut c,
                1,
                &format!("sanitizer-op: name=part;write=p:{}:16", 0x1000 + i * 16),
            );
        }
        assert_eq!(c.segments.len(), 100);
        run(&mut c, 1, "sanitizer-op: name=all;write=p:0x1000:1600");
        assert_eq!(c.segments.len(), 1);
        assert_eq!(c.segments[&0x1000].end, 0x1000 + 1600);
    }

    #[test]
    fn memory_beyond_the_segment_limit_is_not_tracked_and_says_so() {
        let mut c = RaceChecker::with_segment_limit(2);
        run(&mut c, 1, "sanitizer-op: name=a;write=x:0x0:8,y:0x100:8");
        assert!(!c.saturated());
        run(&mut c, 1, "sanitizer-op: name=b;write=z:0x200:8");
        assert!(c.saturated());
        // Tracked memory is still checked.
        assert_eq!(
            run(&mut c, 2, "sanitizer-op: name=c;read=x:0x0:8,z:0x200:8"),
            vec!["c:x@2 vs a:x@1 [0x0,0x8)"]
        );
    }

    #[test]
    fn freed_memory_starts_without_history() {
        let mut c = RaceChecker::new();
        run(&mut c, 1, "sanitizer-op: name=a;write=x:0x1000:64");
        c.forget(0x1010, 16);
        assert_eq!(c.segments.len(), 2);
        // Only the bytes still allocated keep their history.
        assert_eq!(
            run(&mut c, 2, "sanitizer-op: name=b;write=y:0x1000:64"),
            vec!["b:y@2 vs a:x@1 [0x1000,0x1040)"]
        );
        c.forget(0x1000, 64);
        assert!(c.segments.is_empty());
        assert!(run(&mut c, 3, "sanitizer-op: name=c;write=z:0x1000:64").is_empty());
    }

    #[test]
    fn reads_per_segment_are_bounded_without_losing_races() {
        let mut c = RaceChecker::new();
        for _ in 0..1000 {
            run(&mut c, 1, "sanitizer-op: name=r;read=x:0x0:8");
        }
        let reads = &c.segments[&0].reads;
        assert_eq!(reads.len(), MAX_READS_PER_SEGMENT);
        assert_eq!(
            run(&mut c, 2, "sanitizer-op: name=w;write=x:0x0:8").len(),
            MAX_READS_PER_SEGMENT
        );
    }
}
