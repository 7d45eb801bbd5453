//! `msmemscope-cli --pid` against running targets (tests/fixtures/attach_target.c, driven by
//! `util::attach_target`).

mod commands;
mod robustness;
