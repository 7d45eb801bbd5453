//! The end-to-end tests of msmemscope: the real `msmemscope-cli` (and the runtime library it
//! preloads) run on real programs and real dumps, in one test binary (`cargo test --release
//! -p msmemscope-cli --test e2e`; a module's tests alone: add its path, e.g. `runtime::attach`).
//!
//! - `cli`: the command line itself: the usage-error contract, arguments it cannot use, the
//!   `bin/msmemscope` shell wrapper (`--load-api-env`);
//! - `runtime`: the runtime library inside programs launched (or preloaded) by the CLI: the
//!   event dump, marks, CUDA hooks, the sanitizer, host leaks, attach, signals, the run
//!   directory, programs that fight the runtime;
//! - `analyses`: the leak and inefficient-memory analyses, online in a launched run and
//!   offline on its dump and on hand-written dumps;
//! - `offline`: the commands that read existing dumps: `--compare`, `report`, `export`, on
//!   dumps of ours, the original msMemScope's, and inputs that are not dumps at all;
//! - `util`: what they share (scratch directories, fixture builds, running the CLI, the
//!   host-leak harness, the attach target).
//!
//! Needs `cargo build --release` first (the runtime library must lie next to the CLI binary)
//! and gcc on PATH; some modules say what else they need.
//!
//! All tests run as threads of one process: none changes the process's environment, working
//! directory, signal dispositions or umask, none waits for any child but its own, and every
//! file a test writes is in a directory of its own (`util::Scratch`, `util::build_dir`).

mod analyses;
mod cli;
mod offline;
mod runtime;
mod util;
