//! Where rows go: `device_{id}/dump/memscope_dump_{ts}.csv` or `.db`. One file per device,
//! opened on the first row for that device; rows without a device (marks, steps, op launches)
//! go to every device file open at the time. Until the first device file opens they wait in
//! memory (so `--device=cuda:0` makes no CPU file just for them); if the run ends without any
//! device row, they go to the CPU file.
//!
//! A run longer than its dump budget (`--dump-budget`) is kept as core's flight recorder
//! (`msmemscope_core::recorder`) decides: the head file takes the first steps, then each step's
//! rows go to part files in `memscope_dump_{ts}.steps/`, removed oldest first past the budget
//! unless a step is still wanted (the peak's, the leaks', an OOM's); every step appends its
//! summary line to `steps.csv` there.
//!
//! `--format parquet` writes `memscope_dump_{ts}.parquet` directly, each file in segments
//! that are complete Parquet files (`super::segments` says when one closes): the head's later
//! segments are `head_{N}.parquet` beside the parts, and a long step has more parts.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use msmemscope_core::config::DataFormat;
use msmemscope_core::events::parts;
use msmemscope_core::events::{DeviceId, EventRow};
use msmemscope_core::held_fd::HeldFile;
use msmemscope_core::recorder::{KeepPolicy, StepNotes, StepStats};
use msmemscope_core::run_dir::RunDir;

use super::files::{self, Sink};
use super::segments::{open_name, segment_age};

/// Device-less rows held for the first device file at most: past them, they go to the CPU file,
/// where the run's end would put them too. A run whose rows have no device (`--events=launch`)
/// would otherwise hold its whole dump in memory, and write none of it before exit.
const UNROUTED_ROWS: usize = 1 << 16;

/// Summary lines held while the head is open, at most: past them `steps.csv` is written.
const SUMMARY_LINES_WAITING: usize = 4_096;

/// One device's dump: its head file while the head is open, the part its rows go to after.
struct DeviceDump {
    /// Relative to the run directory.
    head_path: PathBuf,
    /// The head's segment being written; `None` once the head is closed, or while its next
    /// segment waits for a row (`head_pending`).
    head: Option<Box<dyn Sink>>,
    /// `--format parquet`: the head's segment closed, the next is made at its first row.
    head_pending: bool,
    /// The head's segments made so far, the first being `head_path` (relative).
    head_segments: Vec<PathBuf>,
    /// Segments closed at a flush point so far (they stay open longer as there are more).
    aged: u32,
    /// The part being written.
    part: Option<OpenPart>,
    /// The next part's number within the current step.
    next_part: u32,
    /// `steps.csv`, once the head has closed (or the lines waiting are many).
    summary: Option<std::io::BufWriter<HeldFile>>,
    /// Summary lines waiting for `steps.csv`: a run that fits its budget keeps every row in
    /// its one file, and needs no summary beside it.
    summary_waiting: String,
    summary_lines_waiting: usize,
    stats: StepStats,
}

impl DeviceDump {
    /// `memscope_dump_{ts}.steps/`, relative to the run directory.
    fn parts_dir(&self) -> PathBuf {
        parts::parts_dir(&self.head_path)
    }

    /// Takes the part being written, its last bytes told to `policy` first.
    fn take_part(&mut self, policy: &mut KeepPolicy<PathBuf>) -> Option<OpenPart> {
        let mut part = self.part.take()?;
        part.report(policy);
        Some(part)
    }
}

/// A part file being written.
struct OpenPart {
    /// Relative to the run directory.
    path: PathBuf,
    written: u64,
    /// The bytes the keep policy knows of: it is told at its decisions, not at each row (a
    /// part is found by its path there, which costs more than writing the row).
    reported: u64,
    sink: Box<dyn Sink>,
}

impl OpenPart {
    fn report(&mut self, policy: &mut KeepPolicy<PathBuf>) {
        policy.part_wrote(&self.path, self.written - self.reported);
        self.reported = self.written;
    }
}

/// The dump files of one run.
pub struct Sinks {
    run_dir: Arc<RunDir>,
    format: DataFormat,
    stamp: String,
    open: BTreeMap<DeviceId, DeviceDump>,
    /// Which part files stay, the whole run's (every device's) dump under one budget. Parts are
    /// named by their path relative to the run directory.
    policy: KeepPolicy<PathBuf>,
    /// Device-less rows written before any device file existed (at most [`UNROUTED_ROWS`]).
    unrouted: Vec<EventRow>,
    /// Files created so far (for the end-of-run summary).
    pub paths: Vec<PathBuf>,
    /// The same files reached through the run directory's descriptor, for reading back.
    held_paths: Vec<PathBuf>,
    /// The device whose dump opened first: the one device-less rows are read back from.
    first_device: Option<DeviceId>,
    /// The keys of `open`, in its order: a device-less row goes to each.
    devices: Vec<DeviceId>,
    /// Steps the program asked to keep in full (`msmemscope.keep_steps`), the newest
    /// [`KEPT_BY_REQUEST`].
    requested: std::collections::BTreeSet<u64>,
}

/// Steps kept in full on the program's request, at most.
const KEPT_BY_REQUEST: usize = 16;

impl Sinks {
    pub fn new(run_dir: &Arc<RunDir>, format: DataFormat, budget: Option<u64>) -> Sinks {
        Sinks {
            run_dir: run_dir.clone(),
            format,
            stamp: msmemscope_core::run_dir::local_timestamp(),
            open: BTreeMap::new(),
            policy: KeepPolicy::new(budget),
            unrouted: Vec::new(),
            paths: Vec::new(),
            held_paths: Vec::new(),
            first_device: None,
            devices: Vec::new(),
            requested: std::collections::BTreeSet::new(),
        }
    }

    /// The program asks that these steps' rows stay in full (a bounded dump spares them as
    /// it spares the peak's step).
    pub fn keep_steps(&mut self, steps: Vec<u64>) {
        self.requested.extend(steps);
        while self.requested.len() > KEPT_BY_REQUEST {
            self.requested.pop_first();
        }
    }

    /// A new dump file of the run's format at `relative` (created before, exclusively: a
    /// Parquet segment under its `.open` name); a Parquet segment closes after `age`.
    fn sink_at(
        &self,
        relative: &Path,
        file: std::fs::File,
        age: std::time::Duration,
    ) -> Result<Box<dyn Sink>, String> {
        files::open(self.format, &self.run_dir, relative, file, age)
    }

    fn extension(&self) -> &'static str {
        match self.format {
            DataFormat::Db => "db",
            DataFormat::Csv => "csv",
            DataFormat::Parquet => "parquet",
        }
    }

    /// Creates the file of a new segment or part at `relative` (a Parquet one under its
    /// `.open` name).
    fn create(&self, relative: &Path) -> Result<std::fs::File, String> {
        match self.format {
            DataFormat::Parquet => self.run_dir.create_file(&open_name(relative)),
            DataFormat::Csv | DataFormat::Db => self.run_dir.create_file(relative),
        }
    }

    fn device_for(&mut self, device: DeviceId) -> Result<&mut DeviceDump, String> {
        if !self.open.contains_key(&device) {
            let dir = Path::new(device.dir_name().as_str()).join("dump");
            let ext = self.extension();
            // A Parquet head is written as `.open` first: its final name must be free too.
            let (relative, file) = match self.format {
                DataFormat::Parquet => {
                    let (open, file) =
                        create_unique(&self.run_dir, &dir, &self.stamp, "parquet.open", Some(ext))?;
                    (open.with_extension(""), file)
                }
                DataFormat::Csv | DataFormat::Db => {
                    create_unique(&self.run_dir, &dir, &self.stamp, ext, None)?
                }
            };
            let mut sink = self.sink_at(&relative, file, segment_age(0))?;
            let mut bytes = 0;
            if self.open.is_empty() {
                for waiting in std::mem::take(&mut self.unrouted) {
                    bytes += sink.write(&waiting)?;
                }
            } else {
                bytes += self.replay_deviceless(sink.as_mut())?;
            }
            self.policy.head_wrote(bytes);
            self.paths.push(self.run_dir.path().join(&relative));
            self.held_paths
                .push(self.run_dir.resolved().join(&relative));
            self.first_device.get_or_insert(device);
            self.devices.push(device);
            self.devices.sort_unstable();
            let mut stats = StepStats::new();
            stats.starts_in(self.policy.head_open());
            self.open.insert(
                device,
                DeviceDump {
                    head_segments: vec![relative.clone()],
                    head_path: relative,
                    head: Some(sink),
                    head_pending: false,
                    aged: 0,
                    part: None,
                    next_part: 0,
                    summary: None,
                    summary_waiting: String::new(),
                    summary_lines_waiting: 0,
                    stats,
                },
            );
        }
        Ok(self.open.get_mut(&device).expect("just inserted"))
    }

    /// A device file that opens after another starts with the rows without a device written so
    /// far (marks, steps, op launches), read back from the first file: every device's dump then
    /// holds the whole step and mark structure, as offline analyses of one file need.
    fn replay_deviceless(&mut self, sink: &mut dyn Sink) -> Result<u64, String> {
        for dump in self.open.values_mut() {
            flush_dump(dump)?;
        }
        // The reader of the format written (not `reader::open`, which would read the parts
        // too and note what they miss on the program's stderr).
        use msmemscope_core::events::parquet::ParquetRows;
        use msmemscope_core::events::reader::{CsvRows, DbRows};
        let mut files: Vec<Box<dyn Iterator<Item = _>>> = Vec::new();
        match self.format {
            DataFormat::Db | DataFormat::Csv => {
                let Some(first) = self.held_paths.first() else {
                    return Ok(0);
                };
                files.push(match self.format {
                    DataFormat::Db => Box::new(DbRows::open(first).map_err(|e| e.to_string())?),
                    _ => Box::new(CsvRows::open(first).map_err(|e| e.to_string())?),
                });
            }
            DataFormat::Parquet => {
                // The first device's head segments, its open one closed to be read.
                let Some(device) = self.first_device else {
                    return Ok(0);
                };
                self.close_head_segment(device)?;
                let segments = self
                    .open
                    .get(&device)
                    .map(|d| d.head_segments.clone())
                    .unwrap_or_default();
                for segment in segments {
                    let path = self.run_dir.resolved().join(segment);
                    files.push(Box::new(
                        ParquetRows::open(&path).map_err(|e| e.to_string())?,
                    ));
                }
            }
        }
        let mut bytes = 0;
        for row in files.into_iter().flatten() {
            let row = row.map_err(|e| e.to_string())?;
            if row.device == DeviceId::None {
                bytes += sink.write(&row)?;
            }
        }
        Ok(bytes)
    }

    /// Closes the device's open head segment (a Parquet one: its rows readable now); the next
    /// head row starts another.
    fn close_head_segment(&mut self, device: DeviceId) -> Result<(), String> {
        let Some(dump) = self.open.get_mut(&device) else {
            return Ok(());
        };
        if self.format != DataFormat::Parquet || dump.head_pending {
            return Ok(());
        }
        if let Some(head) = dump.head.take() {
            dump.head_pending = true;
            head.close()?;
        }
        Ok(())
    }

    /// The device's next head segment, `head_{N}.parquet` beside the parts.
    fn open_head_segment(&mut self, device: DeviceId) -> Result<(), String> {
        let Some(dump) = self.open.get(&device) else {
            return Ok(());
        };
        let number = dump.head_segments.len() as u32;
        let relative = dump
            .parts_dir()
            .join(parts::head_segment_name(number, self.extension()));
        let age = segment_age(dump.aged);
        let file = self.create(&relative)?;
        let sink = self.sink_at(&relative, file, age)?;
        if let Some(dump) = self.open.get_mut(&device) {
            dump.head = Some(sink);
            dump.head_pending = false;
            dump.head_segments.push(relative);
        }
        Ok(())
    }

    /// Each open device's highest bytes in use so far and the step it was reached in.
    pub fn peaks(&self) -> Vec<(DeviceId, u64, u64)> {
        self.open
            .iter()
            .filter_map(|(device, dump)| dump.stats.peak().map(|(b, s)| (*device, b, s)))
            .collect()
    }

    /// Writes one row (rows arrive in time order).
    pub fn write(&mut self, row: &EventRow) -> Result<(), String> {
        if row.device == DeviceId::None {
            if self.open.is_empty() {
                if self.unrouted.len() < UNROUTED_ROWS {
                    self.unrouted.push(row.clone());
                    return Ok(());
                }
                self.device_for(DeviceId::Cpu)?;
            }
            // By index: `write_to` may open files, never a device.
            for i in 0..self.devices.len() {
                self.write_to(self.devices[i], row)?;
            }
            Ok(())
        } else {
            self.device_for(row.device)?;
            self.write_to(row.device, row)
        }
    }

    /// Writes `row` into the head or the current part of an open device's dump.
    fn write_to(&mut self, device: DeviceId, row: &EventRow) -> Result<(), String> {
        let Some(dump) = self.open.get_mut(&device) else {
            return Ok(());
        };
        dump.stats.feed(row);
        // The common cases first, with the one lookup above: the head or a part with room.
        if self.policy.head_open() {
            if !dump.head_pending {
                if let Some(head) = dump.head.as_mut() {
                    let bytes = head.write(row)?;
                    return self.head_wrote(bytes);
                }
            }
        } else if let Some(part) = dump
            .part
            .as_mut()
            .filter(|p| p.written < self.policy.chunk())
        {
            part.written += part.sink.write(row)?;
            dump.stats.left_head();
            return Ok(());
        }
        self.write_opening(device, row)
    }

    /// [`Sinks::write_to`] when a file must be made first: the head's next segment, or the
    /// next part.
    #[cold]
    fn write_opening(&mut self, device: DeviceId, row: &EventRow) -> Result<(), String> {
        let pending = self.open.get(&device).is_some_and(|d| d.head_pending);
        if self.policy.head_open() && pending {
            self.open_head_segment(device)?;
        }
        let Some(dump) = self.open.get_mut(&device) else {
            return Ok(());
        };
        if self.policy.head_open() {
            if let Some(head) = dump.head.as_mut() {
                let bytes = head.write(row)?;
                return self.head_wrote(bytes);
            }
        }
        let full = dump
            .part
            .as_ref()
            .is_none_or(|p| p.written >= self.policy.chunk());
        if full {
            self.open_part(device)?;
        }
        let Some(dump) = self.open.get_mut(&device) else {
            return Ok(());
        };
        dump.stats.left_head();
        let Some(part) = dump.part.as_mut() else {
            return Ok(());
        };
        part.written += part.sink.write(row)?;
        Ok(())
    }

    /// A row took `bytes` of the head: once the head has its share, it closes.
    fn head_wrote(&mut self, bytes: u64) -> Result<(), String> {
        self.policy.head_wrote(bytes);
        if !self.policy.head_open() {
            self.close_heads()?;
        }
        Ok(())
    }

    /// The head has its share of the budget: every device's head is flushed and closed.
    fn close_heads(&mut self) -> Result<(), String> {
        for dump in self.open.values_mut() {
            dump.head_pending = false;
            if let Some(head) = dump.head.take() {
                head.close()?;
            }
        }
        Ok(())
    }

    /// The device's next part file (its previous one flushed and closed), then the parts the
    /// budget no longer has room for removed.
    fn open_part(&mut self, device: DeviceId) -> Result<(), String> {
        let ext = self.extension();
        let (dir, name) = {
            let Some(dump) = self.open.get_mut(&device) else {
                return Ok(());
            };
            if let Some(part) = dump.take_part(&mut self.policy) {
                part.sink.close()?;
            }
            let number = dump.next_part;
            dump.next_part += 1;
            (
                dump.parts_dir(),
                parts::part_name(dump.stats.step(), number, ext),
            )
        };
        let relative = dir.join(&name);
        let file = self.create(&relative)?;
        let age = self.open.get(&device).map_or(0, |d| d.aged);
        let sink = self.sink_at(&relative, file, segment_age(age))?;
        let step = self.open.get(&device).map_or(0, |d| d.stats.step());
        self.policy.part_opened(relative.clone(), step);
        if let Some(dump) = self.open.get_mut(&device) {
            dump.part = Some(OpenPart {
                path: relative,
                written: 0,
                reported: 0,
                sink,
            });
        }
        self.remove_over_budget();
        Ok(())
    }

    /// Removes the part files past the budget (never one being written).
    fn remove_over_budget(&mut self) {
        for part in self.open.values_mut().filter_map(|d| d.part.as_mut()) {
            part.report(&mut self.policy);
        }
        let writing: Vec<PathBuf> = self
            .open
            .values()
            .filter_map(|d| d.part.as_ref().map(|p| p.path.clone()))
            .collect();
        for part in self.policy.over_budget(&writing) {
            let (Some(dir), Some(name)) = (part.key.parent(), part.key.file_name()) else {
                continue;
            };
            let removed = self
                .run_dir
                .open_dir(dir)
                .and_then(|d| d.remove_file(Path::new(name)));
            if let Err(e) = removed {
                crate::log::info(&format!(
                    "event dump: cannot remove {} past the dump budget: {e}",
                    self.run_dir.path().join(&part.key).display()
                ));
            }
        }
    }

    /// A STEP row starts step `next` (the one after the current when its Name is no number):
    /// each device's summary line of the step that ended, the
    /// steps the analyses want kept, the head closed once it has its share; then the row itself
    /// is written into the new step.
    pub fn step(
        &mut self,
        row: &EventRow,
        next: Option<u64>,
        notes: &StepNotes,
    ) -> Result<(), String> {
        let mut wanted: Vec<u64> = notes.keep.clone();
        wanted.extend(self.requested.iter().copied());
        let devices: Vec<DeviceId> = self.open.keys().copied().collect();
        for device in devices {
            self.summarize(device, next, notes)?;
            if let Some(dump) = self.open.get(&device) {
                wanted.extend(dump.stats.wanted());
            }
        }
        self.policy.want(wanted);
        let head_was_open = self.policy.head_open();
        self.policy.step_starts();
        if head_was_open && !self.policy.head_open() {
            self.close_heads()?;
        }
        let head_open = self.policy.head_open();
        for dump in self.open.values_mut() {
            if let Some(part) = dump.take_part(&mut self.policy) {
                part.sink.close()?;
            }
            dump.next_part = 0;
            dump.stats.starts_in(head_open);
        }
        self.remove_over_budget();
        self.write(row)
    }

    /// Appends the ended step's line to the device's `steps.csv` (made at the first step end).
    fn summarize(
        &mut self,
        device: DeviceId,
        next: Option<u64>,
        notes: &StepNotes,
    ) -> Result<(), String> {
        let run_dir = self.run_dir.clone();
        let Some(dump) = self.open.get_mut(&device) else {
            return Ok(());
        };
        let next = next.unwrap_or(dump.stats.step() + 1);
        let line = dump.stats.end_step(next, notes);
        if dump.summary.is_none() {
            if self.policy.head_open() && dump.summary_lines_waiting < SUMMARY_LINES_WAITING {
                dump.summary_waiting.push_str(&line);
                dump.summary_lines_waiting += 1;
                return Ok(());
            }
            let relative = dump.parts_dir().join(parts::SUMMARY_FILE);
            let mut file = run_dir.create_file(&relative)?;
            writeln!(file, "{}", parts::SUMMARY_HEADER).map_err(|e| e.to_string())?;
            let file =
                HeldFile::new(file, &run_dir.path().join(&relative)).map_err(|e| e.to_string())?;
            let mut file = std::io::BufWriter::new(file);
            file.write_all(std::mem::take(&mut dump.summary_waiting).as_bytes())
                .map_err(|e| e.to_string())?;
            dump.summary = Some(file);
        }
        if let Some(summary) = dump.summary.as_mut() {
            // Flushed at once, as the step's part is: a killed run's summary is as far on.
            summary
                .write_all(line.as_bytes())
                .and_then(|()| summary.flush())
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// The run ends: the summary line of each device's last step (no step row ends it).
    pub fn finish(&mut self) -> Result<(), String> {
        let devices: Vec<DeviceId> = self.open.keys().copied().collect();
        for device in devices {
            self.summarize(device, None, &StepNotes::default())?;
        }
        self.flush(true)
    }

    /// Makes everything written durable; `last` (the program asked for it, or the run ends)
    /// also places rows still waiting for a device and closes every open Parquet segment, the
    /// others only once they are due.
    pub fn flush(&mut self, last: bool) -> Result<(), String> {
        if last && self.open.is_empty() && !self.unrouted.is_empty() {
            self.device_for(DeviceId::Cpu)?;
        }
        self.close_due(last)?;
        for dump in self.open.values_mut() {
            flush_dump(dump)?;
        }
        Ok(())
    }

    /// Closes the Parquet segments that are due (every open one when `all`): their rows are
    /// readable from now on. The writer calls it at every turn, with rows or without.
    pub fn close_due(&mut self, all: bool) -> Result<(), String> {
        if self.format != DataFormat::Parquet {
            return Ok(());
        }
        let now = Instant::now();
        for dump in self.open.values_mut() {
            if dump.head.as_ref().is_some_and(|h| all || h.due(now)) {
                if let Some(head) = dump.head.take() {
                    dump.head_pending = true;
                    dump.aged += 1;
                    head.close()?;
                }
            }
            if dump.part.as_ref().is_some_and(|p| all || p.sink.due(now)) {
                if let Some(part) = dump.take_part(&mut self.policy) {
                    dump.aged += 1;
                    part.sink.close()?;
                }
            }
        }
        Ok(())
    }
}

/// Flushes a device's open files: its head, its part, its summary.
fn flush_dump(dump: &mut DeviceDump) -> Result<(), String> {
    if let Some(head) = dump.head.as_mut() {
        head.flush()?;
    }
    if let Some(part) = dump.part.as_mut() {
        part.sink.flush()?;
    }
    if let Some(summary) = dump.summary.as_mut() {
        summary.flush().map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// `memscope_dump_{stamp}.{ext}`, or with `_2`, `_3`… when a file of that name exists (another
/// process of the run wrote it in the same second), or one of that stem and extension `also`.
fn create_unique(
    run_dir: &RunDir,
    dir: &Path,
    stamp: &str,
    ext: &str,
    also: Option<&str>,
) -> Result<(PathBuf, std::fs::File), String> {
    let mut last_error = String::new();
    for n in 1..100 {
        let stem = if n == 1 {
            format!("memscope_dump_{stamp}")
        } else {
            format!("memscope_dump_{stamp}_{n}")
        };
        if let Some(also) = also {
            let taken = run_dir
                .open_dir(dir)
                .and_then(|d| d.has_entry(Path::new(&format!("{stem}.{also}"))));
            if matches!(taken, Ok(true)) {
                continue;
            }
        }
        // The directories on the way (`device_*/dump/`) are made 0750 by the same helper.
        let relative = dir.join(format!("{stem}.{ext}"));
        match run_dir.create_file(&relative) {
            Ok(file) => return Ok((relative, file)),
            Err(e) => last_error = e,
        }
    }
    Err(last_error)
}

#[cfg(test)]
mod tests {
    use super::*;
    use msmemscope_core::events::{Event, EventType};

    fn rows_in(dir: &Path) -> usize {
        let files: Vec<_> = std::fs::read_dir(dir.join("device_cpu/dump"))
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        files
            .iter()
            .map(|f| std::fs::read_to_string(f).unwrap().lines().count() - 1)
            .sum()
    }

    /// Device-less rows wait for the first device file only up to a bound: then they go to the
    /// CPU file, and later ones are written as they come.
    #[test]
    fn device_less_rows_wait_for_a_device_file_only_so_long() {
        let dir = std::env::temp_dir().join(format!("msmemscope_sinks_{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let run_dir = Arc::new(RunDir::open(&dir).unwrap());
        let mut sinks = Sinks::new(&run_dir, DataFormat::Csv, None);
        let row = EventRow::new(Event::OpLaunch, EventType::AtenStart, "aten::mm.default");
        for _ in 0..UNROUTED_ROWS {
            sinks.write(&row).unwrap();
        }
        sinks.flush(false).unwrap();
        assert_eq!(rows_in(&dir), 0, "held for a device file");
        for _ in 0..3 {
            sinks.write(&row).unwrap();
        }
        sinks.flush(false).unwrap();
        assert_eq!(rows_in(&dir), UNROUTED_ROWS + 3);
        assert!(sinks.unrouted.is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
