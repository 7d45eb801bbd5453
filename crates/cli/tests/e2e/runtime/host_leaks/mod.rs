//! Host leak detection (`--analysis=host-leaks`), read back from the written overviews with
//! `util::host_leak`.

mod event_mode;
mod known_leaks;
mod lsi;
mod many_windows;
mod sampling;
mod session;
mod tricky_programs;
