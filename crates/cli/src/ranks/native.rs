//! The native engine: each dump through `msmemscope_core`'s reader and rank summary, one
//! worker thread per core.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use msmemscope_core::analysis::rank_summary::{median, stands_out, RankSummarizer};
use msmemscope_core::events::reader;

use super::discover::Dump;
use super::table::Row;
use crate::failure::Failure;
use crate::progress::{Bar, Unit};

/// The table's rows, in the order of `dumps`, outliers marked against `threshold_pct`.
pub fn summarize(dumps: &[Dump], threshold_pct: u32) -> Result<Vec<Row>, Failure> {
    let results: Vec<Mutex<Option<Result<Row, Failure>>>> =
        dumps.iter().map(|_| Mutex::new(None)).collect();
    let next = AtomicUsize::new(0);
    let finished = Arc::new(AtomicUsize::new(0));
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(dumps.len().max(1));
    let counted = Arc::clone(&finished);
    let bar = Bar::start(
        "ranks",
        dumps.len() as u64,
        Unit::Items("dumps"),
        move || counted.load(Ordering::Relaxed) as u64,
    );
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(dump) = dumps.get(i) else { break };
                let row = summarize_one(dump);
                *results[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(row);
                finished.fetch_add(1, Ordering::Relaxed);
            });
        }
    });
    drop(bar);
    let mut rows = Vec::with_capacity(dumps.len());
    for result in results {
        let result = result.into_inner().unwrap_or_else(|e| e.into_inner());
        rows.push(result.unwrap_or_else(|| Err(Failure::io("a worker thread stopped")))?);
    }
    mark_outliers(&mut rows, threshold_pct);
    Ok(rows)
}

fn summarize_one(dump: &Dump) -> Result<Row, Failure> {
    let failure = |e: reader::ReadError| Failure::input(e.to_string());
    let mut rows = reader::open_rows(&dump.path).map_err(failure)?;
    let mut summarizer = RankSummarizer::new();
    while let Some(row) = rows.next_row().map_err(failure)? {
        summarizer.feed(row);
    }
    Ok(Row::from_summary(dump, summarizer.finish()))
}

/// Flags the lines whose peak or leaked bytes are more than `threshold_pct` percent above the
/// median of all lines (the SQL engines' rule).
fn mark_outliers(rows: &mut [Row], threshold_pct: u32) {
    let mut peaks: Vec<u64> = rows.iter().filter_map(|r| r.peak_allocated).collect();
    let mut leaks: Vec<u64> = rows.iter().map(|r| r.leaked_bytes).collect();
    let (peak_median, leak_median) = (median(&mut peaks), median(&mut leaks));
    for row in rows {
        let mut why = Vec::new();
        if row
            .peak_allocated
            .is_some_and(|p| stands_out(p, peak_median, threshold_pct))
        {
            why.push("peak");
        }
        if stands_out(row.leaked_bytes, leak_median, threshold_pct) {
            why.push("leaks");
        }
        row.stands_out = why.join(",");
    }
}
