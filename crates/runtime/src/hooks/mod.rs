//! The functions the runtime interposes. Each hook: call the real function (after taking the
//! block out of the ledger, for frees), then record, under the reentrancy guard.

// CUDA backend (issue 11).
pub mod cuda;
pub mod dl;
pub mod exec;
pub mod got;
pub mod malloc;
mod own_blocks;
pub mod pymem;

/// Whether this library's `malloc` is the process's `malloc`.
pub fn active() -> bool {
    fn object_of(address: *const libc::c_void) -> Option<usize> {
        // SAFETY: `Dl_info` is a C struct of four raw pointers, for which all-zero bytes (null
        // pointers) are a valid value.
        let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
        // SAFETY: dladdr only reads the loader's tables; `info` is a valid out-pointer.
        (unsafe { libc::dladdr(address, &mut info) } != 0).then_some(info.dli_fbase as usize)
    }
    // A private function: its address is ours whatever the process interposes.
    fn here() {}
    // SAFETY: dlsym of a libc symbol name.
    let resolved = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"malloc".as_ptr()) };
    let ours = object_of(here as *const libc::c_void);
    ours.is_some() && object_of(resolved) == ours
}
