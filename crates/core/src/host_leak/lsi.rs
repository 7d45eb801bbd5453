//! The Leak Suspicion Index: how much a call stack's unfreed memory looks like a leak rather
//! than a cache, a pool or work in flight (docs/analyses.md#lsi).
//!
//! `LSI = 100 · (0.26·G + 0.21·R + 0.12·S + 0.12·P + 0.29·E)`, every factor clipped to [0, 1]:
//!
//! * **G, growth**: the weighted least-squares slope of the stack's live bytes per beat, over
//!   the points after the warm-up, divided by the stack's mean allocated bytes per beat.
//!   1 = everything allocated stays; 0 = flat or shrinking. The warm-up (start-up allocations:
//!   tables, configuration) is the window's first 5 s, or its first quarter when shorter than
//!   20 s, so that a short window keeps most of its beats.
//! * **R, release**: unfreed bytes / allocated bytes.
//! * **S, lifetime**: mean age of the unfreed blocks against the mean lifetime of the freed
//!   ones, as `age / (age + lifetime)`: 0.5 when alike, towards 1 when the survivors are far
//!   older than blocks usually live. 0.5 with fewer than 8 frees.
//! * **P, pattern**: the recent slope against the base slope: does the growth go on? Recent =
//!   the last 25% of the series' beats, at least 10 of the beats the series were sampled at by
//!   the window's end, leaving at least 2 base points.
//! * **E, scale**: `max(log10(1 + unfreed count) / 2, log10(1 + unfreed MiB) / 2.8)`.
//!
//! A series' positions and slopes are in beats of the configured length (`WindowFacts::beat_ms`),
//! also while the beat was finer (fractional positions); G and P are ratios, so the unit cancels.
//! Only the warm-up and the recent span are lengths, converted from time and from the sampled
//! beat.
//!
//! Without a usable series, G and P are unknown: shown as `-`, the row says why, and the LSI
//! counts them as the neutral 0.5. Nothing is guessed. A series too short to split into a base
//! and a recent span is not usable for G either: its two or three points lie wherever the beats
//! of a short process fell, before, inside or after a growth of half a second. One thing is known without a series: a
//! stack's live bytes rise only through its own allocations, so a stack that allocated nothing
//! in the last quarter of the window (or in its last tenth, when all its allocations came in one
//! burst of at most a quarter of the window) was not growing as the window ended. Such a stack
//! is resident/early (made and kept), in a window long enough for a series to have shown growth
//! (its row still says the series was missing). A Python program's import leaves hundreds of
//! thousands of such small stacks, too many to sample; they are not leaks. Except a stack whose
//! surviving blocks were born late and kept (`grew_late`, from the ledger's counts and ages
//! alone): in a short process the work comes after seconds of imports and the exit can outlast
//! it, so its quiet end says nothing about the stack. What an import made is told apart by its
//! Python frames instead (`made_by_import`; the report moves such sites to the resident rows).
//!
//! Classification: **resident/early** when G < 0.05 and the stack's newest allocation lies in
//! the first 20% of the window or the stack stopped allocating as above (or, without a series,
//! when it stopped), or when its Python frames show an import; **resident/turnover** when R ≤ 0.3 and the tail is flat;
//! otherwise **suspected_leak** when LSI ≥ 60, else **growth_watch**, with `/turnover` appended
//! when R ≤ 0.3 but the tail still rises. The tail is flat when, over the recent span, live
//! bytes grew by at most 5% of the live bytes at its end (recent slope × recent beats / live):
//! a cache that turns over stays level, while a leak hidden in heavy traffic (every twentieth
//! request kept, say) keeps adding a visible share of what is live.

use super::model::CountBytes;

pub const WEIGHT_GROWTH: f64 = 0.26;
pub const WEIGHT_RELEASE: f64 = 0.21;
pub const WEIGHT_LIFETIME: f64 = 0.12;
pub const WEIGHT_PATTERN: f64 = 0.12;
pub const WEIGHT_SCALE: f64 = 0.29;
/// The start of a window that growth ignores (start-up allocations), at most this long...
pub const WARMUP_MS: f64 = 5000.0;
/// ...and at most this share of the window.
pub const WARMUP_SHARE: f64 = 0.25;
/// Points after the warm-up needed for a slope.
pub const MIN_POINTS: usize = 3;
/// The recent span of the pattern covers at least this many sampled beats: fewer points give
/// no stable recent slope.
pub const RECENT_MIN_BEATS: f64 = 10.0;
pub const MIN_FREES_FOR_LIFETIME: u64 = 8;
pub const SUSPECTED_LEAK_LSI: f64 = 60.0;
/// A stack without a series that allocated nothing in this last share of the window is
/// resident (see the module comment).
pub const QUIET_TAIL_SHARE: f64 = 0.25;
/// ...or nothing in this last share, when all its allocations came in one burst no longer than
/// `BURST_SHARE` of the window (a module imported lazily by the first training step).
pub const BURST_QUIET_TAIL_SHARE: f64 = 0.10;
pub const BURST_SHARE: f64 = 0.25;
pub const NEUTRAL: f64 = 0.5;
/// `grew_late`: live blocks, kept share and birth time that make a site's growth late.
pub const LATE_MIN_BLOCKS: u64 = 16;
pub const LATE_MIN_RELEASE: f64 = 0.5;
pub const LATE_BIRTH_SHARE: f64 = 0.5;

/// One sample of a stack's live memory: at `beat` (beats since the window opened), weighted by
/// the number of beats it stands for (more after the series' resolution was halved).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SeriesPoint {
    pub beat: f64,
    pub live_bytes: f64,
    /// Live blocks at that beat (not a factor input; kept for displays of the series).
    pub live_blocks: f64,
    pub weight: f64,
}

/// Why a site has no usable series.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Degradation {
    /// The stack was never among the top-k stacks at a beat.
    NoSeries,
    /// Its series was dropped to make room for another (at most 1024 series).
    SeriesEvicted,
    /// Too few points after the warm-up for a base and a recent span (a short window).
    InsufficientSeries,
    /// The window outlasted the warm-up but no beat was taken after it (no thread allocated
    /// after the warm-up to drive the beat).
    NoWarmupThread,
}

impl Degradation {
    pub fn label(self) -> &'static str {
        match self {
            Degradation::NoSeries => "no_series",
            Degradation::SeriesEvicted => "series_evicted",
            Degradation::InsufficientSeries => "insufficient_series",
            Degradation::NoWarmupThread => "no_warmup_thread",
        }
    }
}

/// A site's series as the report has it.
#[derive(Clone, Debug, PartialEq)]
pub enum Series {
    Points(Vec<SeriesPoint>),
    Missing(Degradation),
}

/// What the ledger knows about a site besides its series.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SiteFacts {
    pub unfreed: CountBytes,
    pub allocated: CountBytes,
    pub freed_count: u64,
    pub mean_live_age_ms: f64,
    pub mean_freed_lifetime_ms: f64,
    /// Time of the newest allocation, nanoseconds since the epoch.
    pub last_alloc_ns: u64,
    /// Time of the oldest allocation in the window (0: not known).
    pub first_alloc_ns: u64,
}

/// The window, in wall-clock time and in beats.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WindowFacts {
    pub start_ns: u64,
    pub end_ns: u64,
    /// The configured beat: the unit of series positions and slopes.
    pub beat_ms: u64,
    /// The beat the series were sampled at by the window's end: `beat_ms` when it is fixed,
    /// shorter or longer when the beat adapted to the window.
    pub sampled_ms: f64,
}

impl WindowFacts {
    pub fn window_ms(&self) -> f64 {
        self.end_ns.saturating_sub(self.start_ns) as f64 / 1e6
    }

    /// The window's length in beats; at least 1 ms' worth, so that no rate divides by zero.
    pub fn beats(&self) -> f64 {
        self.window_ms().max(1.0) / self.beat_ms.max(1) as f64
    }

    /// The warm-up, in beats.
    pub fn warmup_beats(&self) -> f64 {
        WARMUP_MS.min(WARMUP_SHARE * self.window_ms()) / self.beat_ms.max(1) as f64
    }

    /// The shortest recent span of the pattern, in beats.
    pub fn recent_min_beats(&self) -> f64 {
        RECENT_MIN_BEATS * self.sampled_ms / self.beat_ms.max(1) as f64
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Factors {
    pub growth: Option<f64>,
    pub release: f64,
    pub lifetime: f64,
    pub pattern: Option<f64>,
    pub scale: f64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    SuspectedLeak,
    GrowthWatch,
    ResidentEarly,
    ResidentTurnover,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Assessment {
    pub factors: Factors,
    pub lsi: f64,
    pub class: Class,
    /// `/turnover`: most of what the stack allocated was freed, but its tail still rises.
    pub turnover: bool,
    /// Live-bytes slope over the points after the warm-up, bytes per beat.
    pub slope: Option<f64>,
    /// Points the slope was fitted to.
    pub beats: usize,
    pub degraded: Option<Degradation>,
}

impl Assessment {
    pub fn is_resident(&self) -> bool {
        matches!(self.class, Class::ResidentEarly | Class::ResidentTurnover)
    }

    /// `suspected_leak`, `growth_watch/turnover`, `resident/early`, ...
    pub fn class_label(&self) -> String {
        let base = match self.class {
            Class::SuspectedLeak => "suspected_leak",
            Class::GrowthWatch => "growth_watch",
            Class::ResidentEarly => "resident/early",
            Class::ResidentTurnover => "resident/turnover",
        };
        if self.turnover && !self.is_resident() {
            format!("{base}/turnover")
        } else {
            base.to_string()
        }
    }
}

mod series;

use series::{clip, series_factors};
pub use series::{split_recent, weighted_slope, FLAT_TAIL};

/// Scale of the unfreed memory alone (no series needed).
pub fn scale_factor(unfreed: CountBytes) -> f64 {
    let by_count = (1.0 + unfreed.count as f64).log10() / 2.0;
    let by_mib = (1.0 + unfreed.bytes as f64 / (1024.0 * 1024.0)).log10() / 2.8;
    clip(by_count.max(by_mib))
}

pub fn lifetime_factor(site: &SiteFacts) -> f64 {
    if site.freed_count < MIN_FREES_FOR_LIFETIME {
        return NEUTRAL;
    }
    let age = site.mean_live_age_ms.max(0.0);
    let life = site.mean_freed_lifetime_ms.max(0.0);
    if age + life <= 0.0 {
        NEUTRAL
    } else {
        clip(age / (age + life))
    }
}

pub fn lsi(f: &Factors) -> f64 {
    100.0
        * (WEIGHT_GROWTH * f.growth.unwrap_or(NEUTRAL)
            + WEIGHT_RELEASE * f.release
            + WEIGHT_LIFETIME * f.lifetime
            + WEIGHT_PATTERN * f.pattern.unwrap_or(NEUTRAL)
            + WEIGHT_SCALE * f.scale)
}

/// Whether a site's surviving memory was made late in the window and kept: at least
/// `LATE_MIN_BLOCKS` blocks still live, at least `LATE_MIN_RELEASE` of what it allocated, born
/// on average after the window's midpoint. Only the ledger's counts and ages say so, not the
/// beats. Such a site is not called stopped from the quiet end of its window: a short process
/// (a DataLoader worker) spends its first seconds importing, its work comes late, and its exit
/// (interpreter finalization) can outlast the work, so a leak that grew until the work ended
/// looks as quiet at the end as a table made once.
pub fn grew_late(site: &SiteFacts, release: f64, window: &WindowFacts) -> bool {
    let window_ms = window.window_ms();
    let newest_ms = site.last_alloc_ns.saturating_sub(window.start_ns) as f64 / 1e6;
    // No block is younger than the newest allocation.
    let mean_birth_ms = (window_ms - site.mean_live_age_ms.max(0.0)).min(newest_ms);
    site.unfreed.count >= LATE_MIN_BLOCKS
        && release >= LATE_MIN_RELEASE
        && mean_birth_ms > LATE_BIRTH_SHARE * window_ms
}

/// Whether a Python stack (innermost first) runs through the import machinery: its memory was
/// made by a module body or the loader, which run once per module, so it does not grow however
/// its few beats fell. A script's own top level runs through `runpy`, not this.
pub fn made_by_import(python_frames: &[String]) -> bool {
    python_frames.iter().any(|frame| {
        let file = frame.split('(').next().unwrap_or(frame);
        file.contains("importlib._bootstrap") || file.contains("importlib/_bootstrap")
    })
}

impl Assessment {
    /// The same assessment, as resident/early: for a site `made_by_import`.
    pub fn made_once(self) -> Assessment {
        Assessment {
            class: Class::ResidentEarly,
            turnover: false,
            ..self
        }
    }
}

/// Assesses one site.
pub fn assess(series: &Series, site: &SiteFacts, window: &WindowFacts) -> Assessment {
    assess_with_flat_tail(series, site, window, FLAT_TAIL)
}

/// [`assess`], with the tail counted flat while it rose by at most `flat_tail` of the live
/// bytes: more than [`FLAT_TAIL`] where the series are estimates from samples, whose own noise
/// would otherwise read as a rising tail.
pub fn assess_with_flat_tail(
    series: &Series,
    site: &SiteFacts,
    window: &WindowFacts,
    flat_tail: f64,
) -> Assessment {
    let beats = window.beats();
    let mean_alloc_per_beat = site.allocated.bytes as f64 / beats;
    let release = if site.allocated.bytes == 0 {
        0.0
    } else {
        clip(site.unfreed.bytes as f64 / site.allocated.bytes as f64)
    };
    let computed = match series {
        Series::Points(points) => series_factors(points, mean_alloc_per_beat, window),
        Series::Missing(reason) => Err(*reason),
    };
    let (growth, pattern, slope, fitted, tail_rise, degraded) = match &computed {
        Ok(s) => (
            Some(s.growth),
            Some(s.pattern),
            Some(s.slope),
            s.beats,
            Some(s.tail_rise),
            None,
        ),
        Err(reason) => (None, None, None, 0, None, Some(*reason)),
    };
    // Only where a series could have shown growth: a window too short for MIN_POINTS sampled
    // beats after its warm-up says nothing either way.
    let newest_ms = site.last_alloc_ns.saturating_sub(window.start_ns) as f64 / 1e6;
    let warmup_ms = window.warmup_beats() * window.beat_ms.max(1) as f64;
    let long_enough = window.window_ms() - warmup_ms >= MIN_POINTS as f64 * window.sampled_ms;
    let window_ms = window.window_ms();
    let oldest_ms = site.first_alloc_ns.saturating_sub(window.start_ns) as f64 / 1e6;
    let burst = site.first_alloc_ns != 0 && newest_ms - oldest_ms <= BURST_SHARE * window_ms;
    let stopped = long_enough
        && !grew_late(site, release, window)
        && (newest_ms <= (1.0 - QUIET_TAIL_SHARE) * window_ms
            || (burst && newest_ms <= (1.0 - BURST_QUIET_TAIL_SHARE) * window_ms));
    let factors = Factors {
        growth,
        release,
        lifetime: lifetime_factor(site),
        pattern,
        scale: scale_factor(site.unfreed),
    };
    let lsi = lsi(&factors);

    let window_ns = window.end_ns.saturating_sub(window.start_ns) as f64;
    let newest_early = site.last_alloc_ns.saturating_sub(window.start_ns) as f64 <= 0.2 * window_ns;
    let turnover_share = release <= 0.3;
    let tail_flat = tail_rise.map(|r| r <= flat_tail);
    let class = if growth.map_or(stopped, |g| g < 0.05 && (newest_early || stopped)) {
        Class::ResidentEarly
    } else if turnover_share && tail_flat == Some(true) {
        Class::ResidentTurnover
    } else if lsi >= SUSPECTED_LEAK_LSI {
        Class::SuspectedLeak
    } else {
        Class::GrowthWatch
    };
    Assessment {
        factors,
        lsi,
        class,
        turnover: turnover_share && tail_flat == Some(false),
        slope,
        beats: fitted,
        degraded,
    }
}

#[cfg(test)]
mod tests;
