//! `--format parquet`: the writer encodes rows straight into Parquet (zstd), in segments. A
//! Parquet file is readable only once its footer is written, and a killed process writes none,
//! so a dump file (the head, a step's part) is a series of segments, each a complete Parquet
//! file: one is written under its name plus `.open` (`events::parts::OPEN_SUFFIX`) and given
//! its name when its footer is on disk. A run killed meanwhile loses the rows of that one
//! segment, and the readers name the file they miss; every closed segment reads as it is.
//!
//! When a segment closes: at the first flush point after its first row is [`segment_age`] old
//! (none for a dump's first segment, so the head file exists from the first drain on; then
//! 1 s, doubling with each segment closed so, up to [`MAX_SEGMENT_AGE`]), when it holds
//! [`SEGMENT_BYTES`] of text, at a step's end (a part ends there), and when the program asks
//! for a flush or the run ends. So a killed run loses at most the last minute of rows (the
//! last seconds early in a run), and a dump has at most a file a minute besides one per
//! [`SEGMENT_BYTES`] of text: a 256 MiB dump budget keeps a few dozen.

use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use msmemscope_core::events::parquet::writer::ParquetWriter;
use msmemscope_core::events::parts::OPEN_SUFFIX;
use msmemscope_core::events::EventRow;
use msmemscope_core::held_fd::HeldFile;
use msmemscope_core::run_dir::RunDir;

use super::files::Sink;

/// The longest a segment stays open with rows in it.
pub(super) const MAX_SEGMENT_AGE: Duration = Duration::from_secs(60);
/// Text (before compression) past which a segment closes: sixteen of the writer's row groups.
const SEGMENT_BYTES: u64 = 1 << 30;

/// How long the segment after `closed` earlier ones of its dump stays open: the first not at
/// all (it closes at the first flush point), then 1 s, 2 s, 4 s... up to [`MAX_SEGMENT_AGE`].
pub(super) fn segment_age(closed: u32) -> Duration {
    match closed {
        0 => Duration::ZERO,
        n => Duration::from_secs(1u64 << (n - 1).min(6)).min(MAX_SEGMENT_AGE),
    }
}

/// The name a segment has while it is written.
pub(super) fn open_name(relative: &Path) -> PathBuf {
    let mut name = relative.as_os_str().to_owned();
    name.push(OPEN_SUFFIX);
    PathBuf::from(name)
}

/// One segment being written.
pub(super) struct ParquetSink {
    writer: ParquetWriter<BufWriter<HeldFile>>,
    /// The directory holding the segment, and its name there once complete.
    dir: RunDir,
    name: PathBuf,
    first_row: Option<Instant>,
    age: Duration,
    text: u64,
}

impl ParquetSink {
    /// A segment at `relative` (its final name) in the run directory, whose `.open` file was
    /// just created as `file`.
    pub(super) fn new(
        run_dir: &RunDir,
        relative: &Path,
        file: std::fs::File,
        age: Duration,
    ) -> Result<ParquetSink, String> {
        let (Some(parent), Some(name)) = (relative.parent(), relative.file_name()) else {
            return Err(format!("{}: not a file's path", relative.display()));
        };
        let dir = run_dir
            .open_dir(parent)
            .map_err(|e| format!("cannot open {}: {e}", run_dir.path().join(parent).display()))?;
        let held = HeldFile::new(file, &run_dir.path().join(open_name(relative)))
            .map_err(|e| e.to_string())?;
        let writer = ParquetWriter::new(BufWriter::with_capacity(1 << 20, held))
            .map_err(|e| e.to_string())?;
        Ok(ParquetSink {
            writer,
            dir,
            name: PathBuf::from(name),
            first_row: None,
            age,
            text: 0,
        })
    }
}

impl Sink for ParquetSink {
    fn write(&mut self, row: &EventRow) -> Result<u64, String> {
        let bytes = self.writer.push(row).map_err(|e| e.to_string())?;
        self.first_row.get_or_insert_with(Instant::now);
        self.text += bytes;
        Ok(bytes)
    }

    fn flush(&mut self) -> Result<(), String> {
        // The rows of an open segment are readable only once it closes: nothing to do before.
        Ok(())
    }

    fn due(&self, now: Instant) -> bool {
        self.text >= SEGMENT_BYTES
            || self
                .first_row
                .is_some_and(|first| now.saturating_duration_since(first) >= self.age)
    }

    fn close(self: Box<Self>) -> Result<(), String> {
        let ParquetSink {
            writer, dir, name, ..
        } = *self;
        let (buffered, _) = writer.finish().map_err(|e| e.to_string())?;
        // Written out (to the page cache, where it outlives the process) before it is named.
        let held = buffered.into_inner().map_err(|e| e.error().to_string())?;
        drop(held);
        dir.publish(&open_name(&name), &name).map_err(|e| {
            format!(
                "cannot name {} complete: {e}",
                dir.path().join(&name).display()
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_stay_open_longer_as_the_dump_goes_on_up_to_a_minute() {
        let ages: Vec<u64> = (0..10).map(|n| segment_age(n).as_secs()).collect();
        assert_eq!(ages, [0, 1, 2, 4, 8, 16, 32, 60, 60, 60]);
        assert_eq!(segment_age(u32::MAX), MAX_SEGMENT_AGE);
    }
}
