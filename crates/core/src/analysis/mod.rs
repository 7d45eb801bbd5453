//! The analyses of the event stream (docs/analyses.md). Each is one implementation that sees rows
//! in time order through [`Analysis::feed`]: online, the runtime's writer thread feeds every row it
//! writes; offline, a dump reader feeds the rows of a file. Nothing here does I/O.

mod base_index;
pub mod check_leaks;
pub mod compare;
pub mod decompose;
pub mod fast_map;
pub mod fluctuation;
pub mod inefficient;
pub mod leaks;
pub mod live_blocks;
pub mod myers;
pub mod oom_summary;
pub mod oom_watch;
pub mod rank_summary;

use crate::config::Analysis as Requested;
use crate::events::EventRow;

/// What an analysis produced when its input ended.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct AnalysisOutput {
    /// Text for the user's console, in the original msMemScope's report format (may be empty).
    pub console: String,
    /// Files to write, paths relative to the run directory.
    pub files: Vec<(String, String)>,
}

pub trait Analysis: Send {
    /// The analysis's name as `--analysis` spells it.
    fn name(&self) -> &'static str;
    /// One row, in time order.
    fn feed(&mut self, row: &EventRow);
    /// The input has ended.
    fn finish(&mut self) -> AnalysisOutput;
    /// The live blocks of the sites judged leaking so far: (device, Ptr, size, site) each.
    /// Only `leaks` has any; the runtime hands them to the Python side, which looks for what
    /// holds them.
    fn leak_suspects(&self) -> Vec<(crate::events::DeviceId, u64, u64, String)> {
        Vec::new()
    }
    /// What the analysis saw at the step end just fed (a STEP row): the steps whose rows it
    /// wants kept in a bounded dump, and its sites' growth. Only `leaks` has any.
    fn step_notes(&self) -> Option<crate::recorder::StepNotes> {
        None
    }
    /// What the analysis finds so far, while the input goes on (`steps`: STEP rows fed), for
    /// a program that asks (`msmemscope.findings()`): only `leaks` has any, its `leak_sites`
    /// (each judged leaking now, by line, the largest growth first) and `leak_bytes_per_step`.
    /// Built from its state without I/O.
    fn findings_now(&self, steps: u64) -> Option<serde_json::Value> {
        let _ = steps;
        None
    }
}

/// The analyses a run asked for (`RunConfig::analysis`) that run online, in the writer.
pub fn online_for(requested: &[Requested]) -> Vec<Box<dyn Analysis>> {
    #[allow(unused_mut)] // each analysis pushes itself in the match below as it is built
    let mut analyses: Vec<Box<dyn Analysis>> = Vec::new();
    for requested in requested {
        match requested {
            // Each online analysis registers itself here as it is built.
            Requested::Inefficient => analyses.push(Box::new(inefficient::Inefficient::new(
                inefficient::DEFAULT_IDLE_THRESHOLD,
            ))),
            // The leak report first, then the Gap Analysis tables (they print in this order).
            Requested::Leaks => {
                analyses.push(Box::new(
                    leaks::Leaks::new().with_source(crate::source_line::read),
                ));
                analyses.push(Box::new(fluctuation::Fluctuation::new()));
            }
            Requested::Decompose => analyses.push(Box::new(decompose::Decompose::new())),
            Requested::Oom(_) => analyses.push(Box::new(
                oom_summary::OomSummary::new().with_source(crate::source_line::read),
            )),
            Requested::HostLeaks => {}
        }
    }
    analyses
}

/// Feeds every row of `rows` to `analysis` and finishes it: the offline driver.
pub fn run_offline<E>(
    analysis: &mut dyn Analysis,
    rows: impl Iterator<Item = Result<EventRow, E>>,
) -> Result<AnalysisOutput, E> {
    for row in rows {
        analysis.feed(&row?);
    }
    Ok(analysis.finish())
}
