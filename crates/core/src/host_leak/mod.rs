//! The host heap leak report: the model the runtime fills when a window closes, and its two
//! renderings (`leak_overview_{stage}.txt`, `block_detail_{stage}.csv`).

pub mod buckets;
pub mod detail_csv;
pub mod knobs;
pub mod lsi;
pub mod made_once;
pub mod model;
pub mod overview;
pub mod sampling;
pub mod sites_json;

pub use buckets::{SizeBucket, SizeHistogram, SIZE_BUCKETS};
pub use model::*;
