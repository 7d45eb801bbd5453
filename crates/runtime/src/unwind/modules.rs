//! The process's loaded ELF objects, seen through `dl_iterate_phdr`: the unwinder's modules
//! (their `.eh_frame_hdr`/`.eh_frame` read in place, in mapped memory) and the module map that
//! symbolization uses when the window closes.
//!
//! The unwinder is published as an immutable snapshot behind an atomic pointer: hooks read it
//! without a lock. A refresh (at start, after `dlopen`/`dlclose`, or when a stack reached an
//! address no module covers) builds a new snapshot; old ones are kept alive for the life of the
//! process, since a hook on another thread may still be walking one.

use std::ffi::CStr;
use std::ops::{Deref, Range};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use framehop::x86_64::UnwinderX86_64;
use framehop::{ExplicitModuleSectionInfo, MustNotAllocateDuringUnwind, Unwinder};
use msmemscope_core::symbolize::ModuleInfo;

/// Bytes that live in a mapped module for as long as the module stays loaded.
#[derive(Clone, Copy, Default)]
pub struct MappedBytes(&'static [u8]);

impl Deref for MappedBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.0
    }
}

pub type ProcessUnwinder = UnwinderX86_64<MappedBytes, MustNotAllocateDuringUnwind>;

pub struct Snapshot {
    pub unwinder: ProcessUnwinder,
    /// Sorted code ranges of all modules, to tell an unknown address from a known one.
    ranges: Vec<Range<u64>>,
    /// `dlpi_adds`/`dlpi_subs` when the snapshot was taken: unchanged counters mean unchanged modules.
    adds: u64,
    subs: u64,
    /// Code of msmemscope's Python extension: like the runtime's own frames, its frames at the
    /// top of a stack are the tool, not the program.
    tool_ranges: Vec<Range<u64>>,
}

impl Snapshot {
    pub fn is_tool_code(&self, address: u64) -> bool {
        self.tool_ranges.iter().any(|r| r.contains(&address))
    }

    pub fn covers(&self, address: u64) -> bool {
        self.range_of(address).is_some()
    }

    /// The code range of the module holding `address`.
    pub fn range_of(&self, address: u64) -> Option<Range<u64>> {
        let i = self.ranges.partition_point(|r| r.start <= address);
        (i > 0 && address < self.ranges[i - 1].end).then(|| self.ranges[i - 1].clone())
    }
}

static CURRENT: AtomicPtr<Snapshot> = AtomicPtr::new(std::ptr::null_mut());
/// Every module ever seen, in load order, so unloaded libraries still symbolize.
static SEEN: Mutex<Vec<ModuleInfo>> = Mutex::new(Vec::new());
static REFRESH: Mutex<()> = Mutex::new(());
/// Coarse time of the last refresh requested by an unknown address (rate limit).
static LAST_UNKNOWN_REFRESH_MS: AtomicU64 = AtomicU64::new(0);

/// The current unwinder snapshot, if modules were scanned.
#[inline]
pub fn current() -> Option<&'static Snapshot> {
    let ptr = CURRENT.load(Ordering::Acquire);
    // SAFETY: snapshots are leaked on publication and never freed, so a published pointer stays
    // valid for the rest of the process.
    unsafe { ptr.as_ref() }
}

/// Every module seen so far (for symbolization).
pub fn seen_modules() -> Vec<ModuleInfo> {
    SEEN.lock().map(|m| m.clone()).unwrap_or_default()
}

/// Re-scans loaded modules when the loader's add/remove counters changed (or `force`).
/// Returns whether a new snapshot was published.
pub fn refresh(force: bool) -> bool {
    let Ok(serial) = REFRESH.lock() else {
        return false;
    };
    refresh_holding(&serial, force)
}

/// Work of a layer above that rides along a scan of the loaded modules, so the loader's list is
/// walked once: the hooks' GOT survey, then the search for a CPython (hooks::loader).
pub trait ScanPass {
    /// For each loaded object, from inside `dl_iterate_phdr`'s callback.
    fn visit(&mut self, info: &libc::dl_phdr_info, path: &Path);
    /// After the scan's snapshot is published.
    fn finish(self: Box<Self>);
}

/// Begins one scan's [`ScanPass`] (`None`: nothing rides along this one).
pub type StartPass = fn() -> Option<Box<dyn ScanPass>>;

/// Starts the pass of each scan; set once, before the run's first scan.
static RIDER: OnceLock<StartPass> = OnceLock::new();

/// Has `start` begin a pass for every scan from now on. False when one was set already.
pub fn ride_along(start: StartPass) -> bool {
    RIDER.set(start).is_ok()
}

/// [`refresh`] by the thread that holds the refresh lock.
fn refresh_holding(_serial: &std::sync::MutexGuard<'_, ()>, force: bool) -> bool {
    if !force {
        if let Some(old) = current() {
            if loader_counters() == (old.adds, old.subs) {
                return false;
            }
        }
    }
    let mut scanned = scan();
    let pass = scanned.pass.take();
    let mut unwinder = ProcessUnwinder::new();
    let mut ranges = Vec::with_capacity(scanned.modules.len());
    let tool_ranges = scanned
        .modules
        .iter()
        .filter(|m| is_python_extension(&m.info.path))
        .map(|m| m.info.start..m.info.end)
        .collect();
    if let Ok(mut seen) = SEEN.lock() {
        for m in &scanned.modules {
            if !seen.iter().any(|s| s == &m.info) {
                seen.push(m.info.clone());
            }
        }
    }
    for m in scanned.modules {
        ranges.push(m.info.start..m.info.end);
        let name = m.info.path.to_string_lossy().into_owned();
        unwinder.add_module(framehop::Module::new(
            name,
            m.info.start..m.info.end,
            m.info.bias,
            m.sections,
        ));
    }
    ranges.sort_by_key(|r| r.start);
    let snapshot = Box::new(Snapshot {
        unwinder,
        ranges,
        adds: scanned.adds,
        subs: scanned.subs,
        tool_ranges,
    });
    CURRENT.store(Box::into_raw(snapshot), Ordering::Release);
    if let Some(pass) = pass {
        pass.finish();
    }
    true
}

/// The loader's counts of objects added and removed, read from the first callback only.
fn loader_counters() -> (u64, u64) {
    unsafe extern "C" fn first(
        info: *mut libc::dl_phdr_info,
        _size: libc::size_t,
        data: *mut libc::c_void,
    ) -> libc::c_int {
        // SAFETY: dl_iterate_phdr passes a valid info pointer and our tuple back to us.
        unsafe {
            let out = &mut *(data as *mut (u64, u64));
            *out = ((*info).dlpi_adds, (*info).dlpi_subs);
        }
        1
    }
    let mut counters = (0u64, 0u64);
    // SAFETY: the callback writes only into `counters`, during the call.
    unsafe { libc::dl_iterate_phdr(Some(first), &mut counters as *mut _ as *mut libc::c_void) };
    counters
}

/// What [`refresh_for_unknown_address`] did.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Rescan {
    /// A new snapshot is published.
    Changed,
    /// The loader's counters are as the current snapshot saw them: the address is no library's.
    Unchanged,
    /// Not checked: another check ran less than 10 ms ago, or another thread is scanning.
    Skipped,
}

/// Called from a hook whose stack met an address no module covers: a library was loaded since
/// the last scan (`dlopen` is not interposed, since glibc resolves a `dlopen`'s RUNPATH and
/// `$ORIGIN` from its caller). Checks the loader's counters at most once per 10 ms, so JIT code
/// does not make every allocation take the loader's lock.
pub fn refresh_for_unknown_address() -> Rescan {
    let now = crate::clock::coarse_millis();
    let last = LAST_UNKNOWN_REFRESH_MS.load(Ordering::Relaxed);
    if last != 0 && now.saturating_sub(last) < 10 {
        return Rescan::Skipped;
    }
    if LAST_UNKNOWN_REFRESH_MS
        .compare_exchange(last, now.max(1), Ordering::Relaxed, Ordering::Relaxed)
        .is_err()
    {
        return Rescan::Skipped;
    }
    // Inside an allocation hook: never wait for a lock of ours here. The thread refreshing may
    // itself wait inside `dl_iterate_phdr` for the loader's lock, which this thread may hold
    // (a library constructor or `dlclose` that allocates); the other thread's scan publishes a
    // snapshot anyway.
    let serial = match REFRESH.try_lock() {
        Ok(serial) => serial,
        Err(std::sync::TryLockError::WouldBlock) => return Rescan::Skipped,
        Err(std::sync::TryLockError::Poisoned(_)) => return Rescan::Unchanged,
    };
    if refresh_holding(&serial, false) {
        Rescan::Changed
    } else {
        Rescan::Unchanged
    }
}

/// Addresses outside every module of one snapshot that a rescan found to be no library's (JIT
/// code, frame-pointer guesses): direct-mapped by address, emptied when the snapshot changes.
/// A racing reset may keep a stale entry; that only lets one walk skip its rescan.
const CONFIRMED_SLOTS: usize = 64;
static CONFIRMED: [AtomicU64; CONFIRMED_SLOTS] = [const { AtomicU64::new(0) }; CONFIRMED_SLOTS];
static CONFIRMED_FOR: AtomicUsize = AtomicUsize::new(0);

#[inline]
fn confirmed_slot(address: u64) -> usize {
    ((address >> 4) ^ (address >> 13)) as usize % CONFIRMED_SLOTS
}

pub fn is_confirmed_unknown(snapshot: &Snapshot, address: u64) -> bool {
    CONFIRMED_FOR.load(Ordering::Acquire) == snapshot as *const Snapshot as usize
        && CONFIRMED[confirmed_slot(address)].load(Ordering::Relaxed) == address
}

pub fn confirm_unknown(snapshot: &Snapshot, address: u64) {
    let id = snapshot as *const Snapshot as usize;
    let previous = CONFIRMED_FOR.load(Ordering::Acquire);
    if previous != id {
        if CONFIRMED_FOR
            .compare_exchange(previous, 0, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            return;
        }
        for slot in &CONFIRMED {
            slot.store(0, Ordering::Relaxed);
        }
        CONFIRMED_FOR.store(id, Ordering::Release);
    }
    CONFIRMED[confirmed_slot(address)].store(address, Ordering::Relaxed);
}

struct ScannedModule {
    info: ModuleInfo,
    sections: ExplicitModuleSectionInfo<MappedBytes>,
}

struct Scan {
    modules: Vec<ScannedModule>,
    adds: u64,
    subs: u64,
    /// What rides along this scan ([`ride_along`]).
    pass: Option<Box<dyn ScanPass>>,
}

fn scan() -> Scan {
    let mut scan = Scan {
        modules: Vec::new(),
        adds: 0,
        subs: 0,
        pass: RIDER.get().and_then(|start| start()),
    };
    // SAFETY: the callback only reads the phdr info the loader hands it, during the call.
    unsafe {
        libc::dl_iterate_phdr(Some(visit), &mut scan as *mut Scan as *mut libc::c_void);
    }
    scan
}

unsafe extern "C" fn visit(
    info: *mut libc::dl_phdr_info,
    _size: libc::size_t,
    data: *mut libc::c_void,
) -> libc::c_int {
    // SAFETY: dl_iterate_phdr passes a valid info pointer and our `Scan` back to us.
    let (info, scan) = unsafe { (&*info, &mut *(data as *mut Scan)) };
    scan.adds = info.dlpi_adds;
    scan.subs = info.dlpi_subs;
    // SAFETY: dlpi_phdr points at dlpi_phnum program headers of a loaded object.
    let phdrs = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) };
    let bias = info.dlpi_addr;
    let mut start = u64::MAX;
    let mut end = 0u64;
    let mut loads: Vec<Range<u64>> = Vec::new();
    let mut eh_frame_hdr: Option<Range<u64>> = None;
    for ph in phdrs {
        if ph.p_type == libc::PT_LOAD {
            let s = bias + ph.p_vaddr;
            let e = s + ph.p_memsz;
            start = start.min(s);
            end = end.max(e);
            loads.push(s..s + ph.p_filesz);
        } else if ph.p_type == libc::PT_GNU_EH_FRAME {
            let s = bias + ph.p_vaddr;
            eh_frame_hdr = Some(s..s + ph.p_memsz);
        }
    }
    if start >= end {
        return 0;
    }
    let path = module_path(info);
    if let Some(pass) = scan.pass.as_mut() {
        pass.visit(info, &path);
    }
    let mut sections = ExplicitModuleSectionInfo {
        base_svma: 0,
        ..Default::default()
    };
    if let Some(hdr) = eh_frame_hdr {
        if let Some(eh_frame_start) = eh_frame_address(hdr.start) {
            // .eh_frame has no length in memory; it ends at the latest with its segment's file
            // data, and gimli stops at the zero terminator anyway.
            if let Some(seg) = loads.iter().find(|r| r.contains(&eh_frame_start)) {
                // SAFETY: both ranges lie inside loaded, readable segments of this module.
                let (hdr_bytes, eh_bytes) = unsafe {
                    (
                        std::slice::from_raw_parts(
                            hdr.start as *const u8,
                            (hdr.end - hdr.start) as usize,
                        ),
                        std::slice::from_raw_parts(
                            eh_frame_start as *const u8,
                            (seg.end - eh_frame_start) as usize,
                        ),
                    )
                };
                sections.eh_frame_hdr_svma = Some(hdr.start - bias..hdr.end - bias);
                sections.eh_frame_hdr = Some(MappedBytes(hdr_bytes));
                sections.eh_frame_svma = Some(eh_frame_start - bias..seg.end - bias);
                sections.eh_frame = Some(MappedBytes(eh_bytes));
            }
        }
    }
    scan.modules.push(ScannedModule {
        info: ModuleInfo {
            path,
            bias,
            start,
            end,
        },
        sections,
    });
    0
}

/// `.../msmemscope/_native*.so`: the package's extension module.
fn is_python_extension(path: &std::path::Path) -> bool {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let parent = path
        .parent()
        .and_then(|p| p.file_name())
        .and_then(|n| n.to_str());
    name.starts_with("_native") && name.ends_with(".so") && parent == Some("msmemscope")
}

fn module_path(info: &libc::dl_phdr_info) -> PathBuf {
    let name = if info.dlpi_name.is_null() {
        ""
    } else {
        // SAFETY: the loader gives a NUL-terminated name.
        unsafe { CStr::from_ptr(info.dlpi_name) }
            .to_str()
            .unwrap_or("")
    };
    if name.is_empty() {
        // The main program appears with an empty name.
        std::fs::read_link("/proc/self/exe").unwrap_or_default()
    } else {
        PathBuf::from(name)
    }
}

/// Decodes `eh_frame_ptr` from an in-memory `.eh_frame_hdr` (version 1).
fn eh_frame_address(hdr: u64) -> Option<u64> {
    // SAFETY: hdr points at the mapped PT_GNU_EH_FRAME segment, at least 8 bytes long.
    let bytes = unsafe { std::slice::from_raw_parts(hdr as *const u8, 12) };
    if bytes[0] != 1 {
        return None;
    }
    let enc = bytes[1];
    let field = hdr + 4;
    let value = match enc & 0x0f {
        0x0b => i32::from_le_bytes(bytes[4..8].try_into().ok()?) as i64 as u64, // sdata4
        0x03 => u32::from_le_bytes(bytes[4..8].try_into().ok()?) as u64,        // udata4
        0x00 | 0x04 => u64::from_le_bytes(bytes[4..12].try_into().ok()?),       // absptr, udata8
        _ => return None,
    };
    match enc & 0x70 {
        0x00 => Some(value),
        0x10 => Some(field.wrapping_add(value)), // pcrel
        0x30 => Some(hdr.wrapping_add(value)),   // datarel: relative to the header
        _ => None,
    }
}
