//! The analyses of the event dump, run online by the launcher and offline on dumps.

mod inefficient;
mod leaks;
