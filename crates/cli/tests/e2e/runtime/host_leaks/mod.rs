//! Host leak detection (`--analysis=host-leaks`), read back from the written overviews with
//! `util::host_leak`.

mod known_leaks;
mod many_windows;
mod sampling;
mod session;
mod tricky_programs;
