//! Allocator calls that bypass the hooks through a library's GOT.
//!
//! A library opened with `RTLD_DEEPBIND` looks symbols up in its own dependencies before the
//! global scope, so its `malloc`/`free` bind to glibc's definitions, not to the preloaded
//! runtime's. What it gets through a hooked path (glibc's own `strdup` calls `malloc` through
//! glibc's PLT, which binds to us) it then frees past the ledger: a false leak. `dlopen` is not
//! wrapped (glibc finds a `dlopen`'s caller from its return address, for `$ORIGIN`/RUNPATH) and
//! the flag is left alone (the program asked for its binding). Instead, whenever the module
//! snapshot is rebuilt (modules::refresh), each module's GOT slots for the malloc family are
//! checked and, where they lead to glibc's allocator, pointed at the runtime's hook of the same
//! name, which forwards to that same allocator: the library's behaviour does not change, only
//! that its calls are seen.
//!
//! A slot is rewritten only when
//! - the runtime is what the global scope binds the name to (nothing loaded before it defines
//!   it; so not when the runtime was `dlopen`ed, or a program or earlier preload brings its own
//!   allocator), and
//! - the slot holds glibc's own definition (what `dlsym(RTLD_NEXT, name)` from the runtime
//!   returns: looked up in glibc's symbol table here, since `dlsym` takes the loader's lock),
//!   or it is a lazy PLT slot still pointing into its own module, for a name the module does
//!   not define, while no loaded module but glibc, the runtime and the dynamic linker defines the
//!   name: then whatever the loader would bind it to shares glibc's heap. A slot bound to any
//!   other allocator (a dependency's, another link-map namespace's glibc) is left alone, since
//!   handing its blocks to glibc would corrupt both heaps.
//!
//! When slots are written: never before this library's ELF constructor (a run that begins at an
//! earlier library's first allocation only scans; the constructor writes). After it, also from
//! inside an allocation hook, at the rebuild a stack meeting a new library's code asks for: a
//! DEEPBIND library's next call must already be seen, or its frees of the blocks it got through
//! a hooked path are lost (false leaks). What that costs the hook: the scan reads the loader's
//! list under its own recursive lock, a write is an atomic store (with `mprotect` around it for
//! RELRO pages); nothing waits for a lock of the runtime's (the refresh is skipped while another
//! thread holds it) and nothing allocates through the hooks.
//!
//! Not covered:
//! - a library that never allocates through a hooked path is not rescanned when it is loaded
//!   (only at the next rebuild: another stack meeting an unknown address, a `dlclose`, the
//!   report), so its direct `malloc` calls stay unseen until then; blocks it got from glibc
//!   directly and frees after the rewrite count as pre-window frees;
//! - a rebuild put off by the rate limit of unknown-address rescans (10 ms) is retried at the
//!   library's next allocation through a hooked path, not at its next free;
//! - allocator addresses taken into data with absolute relocations (`R_X86_64_64`, e.g. a static
//!   table `{ .free = free }`), and calls bound through `dlsym` by the library itself;
//! - a lazy slot the loader resolves on another thread at the moment it is rewritten may end up
//!   glibc's again (then it is rewritten at the next rebuild);
//! - a module whose relocation is still in progress on another thread when it is first seen:
//!   its slots are re-examined at every rebuild, so a later rebuild catches them.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use crate::unwind::maps;

/// The malloc family the runtime exports, in one fixed order (bit i of a mask is `NAMES[i]`).
const NAMES: [&[u8]; 10] = [
    b"malloc",
    b"calloc",
    b"realloc",
    b"free",
    b"reallocarray",
    b"posix_memalign",
    b"aligned_alloc",
    b"memalign",
    b"valloc",
    b"pvalloc",
];
const ALL: u16 = (1 << NAMES.len()) - 1;

/// An address inside this library: a function nothing exports. Not the address of a hook
/// (`malloc as *const ()`): an exported name's address is what the loader binds that name to
/// for everyone, and in a program built without PIE that takes `free`'s address, that is the
/// program's own PLT entry. The hooks' own addresses are read from this library's symbol table
/// instead (a GOT slot pointed at a PLT entry that jumps through it would loop forever).
#[inline(never)]
fn inside_runtime() {
    std::hint::black_box(());
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    /// This library.
    Runtime,
    /// The glibc whose allocator the hooks forward to.
    Libc,
    /// The dynamic linker: older ones define a minimal malloc that nothing binds to once glibc
    /// is loaded (glibc precedes it in every scope).
    Loader,
    Other,
}

#[derive(Clone, Copy, Debug)]
struct Slot {
    addr: u64,
    name: u8,
    /// A `JUMP_SLOT` for a symbol the module does not define: it may still be unresolved.
    lazy: bool,
}

struct ModuleGot {
    bias: u64,
    start: u64,
    end: u64,
    kind: Kind,
    /// Bit i: the module defines `NAMES[i]`.
    defines: u16,
    /// glibc's definitions (Libc only), 0 where absent.
    definitions: [u64; NAMES.len()],
    slots: Vec<Slot>,
    relro: Option<(u64, u64)>,
    /// The survey that saw it last.
    seen: u64,
}

struct Registry {
    /// By the address of the module's dynamic section.
    modules: BTreeMap<u64, ModuleGot>,
    generation: u64,
}

/// Whether slots may be written: not before this library's ELF constructor. A run that begins
/// at the first hooked allocation scans the modules then (inside some library's constructor,
/// maybe under the loader's lock); their slots are written from our constructor, which follows
/// before the program's own code runs.
static REWRITES_ALLOWED: AtomicBool = AtomicBool::new(false);

/// Lets the next module rebuild write slots (from the ELF constructor). True when a scan was
/// made before: then the caller rebuilds at once, so slots found then are written now.
pub fn allow_rewrites() -> bool {
    REWRITES_ALLOWED.store(true, Ordering::Release);
    REGISTRY.lock().map(|r| r.generation > 0).unwrap_or(false)
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    modules: BTreeMap::new(),
    generation: 0,
});

/// One pass over the loaded modules, fed from `modules::scan`'s `dl_iterate_phdr` callback
/// (inside it a module cannot be unloaded, so its memory may be read). Runs under the module
/// refresh lock.
pub struct Survey {
    registry: MutexGuard<'static, Registry>,
    generation: u64,
    runtime_function: u64,
    libc_function: u64,
    runtime_seen: bool,
    /// Names defined by modules that precede the runtime in the global scope.
    before_runtime: u16,
    /// Modules visited so far: the first is the program.
    visited: usize,
}

impl Survey {
    pub fn begin() -> Option<Survey> {
        let mut registry = REGISTRY.lock().ok()?;
        registry.generation += 1;
        let generation = registry.generation;
        Some(Survey {
            registry,
            generation,
            runtime_function: inside_runtime as *const () as u64,
            libc_function: crate::libc_heap::__libc_malloc as *const () as u64,
            runtime_seen: false,
            before_runtime: 0,
            visited: 0,
        })
    }

    /// Must be called from inside the `dl_iterate_phdr` callback for `info`.
    pub fn visit(&mut self, info: &libc::dl_phdr_info, path: &Path) {
        let Some(layout) = Layout::of(info) else {
            return;
        };
        let generation = self.generation;
        let is_program = self.visited == 0;
        self.visited += 1;
        let known = self
            .registry
            .modules
            .get_mut(&layout.dynamic.0)
            .filter(|m| m.bias == layout.bias && m.start == layout.start && m.end == layout.end);
        let (kind, defines) = match known {
            Some(m) => {
                m.seen = generation;
                (m.kind, m.defines)
            }
            None => {
                let kind = if layout.contains(self.runtime_function) {
                    Kind::Runtime
                } else if layout.contains(self.libc_function) {
                    Kind::Libc
                } else if !is_program && is_loader(path) {
                    Kind::Loader
                } else {
                    Kind::Other
                };
                let m = layout.parse(kind, generation);
                let entry = (m.kind, m.defines);
                self.registry.modules.insert(layout.dynamic.0, m);
                entry
            }
        };
        match kind {
            Kind::Runtime => self.runtime_seen = true,
            Kind::Loader => {}
            _ if !self.runtime_seen => self.before_runtime |= defines,
            _ => {}
        }
    }

    /// After the pass: forgets unloaded modules and rewrites the slots that qualify.
    pub fn finish(mut self) {
        let generation = self.generation;
        self.registry.modules.retain(|_, m| m.seen == generation);
        if !self.runtime_seen || !REWRITES_ALLOWED.load(Ordering::Acquire) || cfg!(test) {
            // In the runtime's own unit tests the hooks are not exported.
            return;
        }
        if !crate::forward::forwards_to_glibc() {
            // The hooks hand blocks to another allocator (jemalloc preloaded after the runtime):
            // a slot bound to glibc must keep glibc, or its earlier blocks would reach the other
            // allocator's free.
            return;
        }
        let mut plan = Plan {
            generation,
            ours: [0; NAMES.len()],
            interposed: ALL & !self.before_runtime,
            other_definers: 0,
            libc: [0; NAMES.len()],
            registry: &self.registry,
        };
        for m in self.registry.modules.values() {
            match m.kind {
                Kind::Other => plan.other_definers |= m.defines,
                Kind::Libc => plan.libc = m.definitions,
                Kind::Runtime => plan.ours = m.definitions,
                Kind::Loader => {}
            }
        }
        if plan.interposed == 0 {
            return;
        }
        // SAFETY: the callback only reads the phdr info it is handed and the plan, during the
        // call.
        unsafe {
            libc::dl_iterate_phdr(Some(rewrite), &mut plan as *mut Plan as *mut libc::c_void);
        }
    }
}

/// The dynamic linker: `ld-linux-x86-64.so.2`, or `ld-2.NN.so` on older systems.
fn is_loader(path: &Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("ld-"))
}

struct Plan<'a> {
    generation: u64,
    ours: [u64; NAMES.len()],
    interposed: u16,
    other_definers: u16,
    libc: [u64; NAMES.len()],
    registry: &'a Registry,
}

/// The second pass: slots are written only from inside their module's callback, where the
/// module cannot be unloaded under the write.
unsafe extern "C" fn rewrite(
    info: *mut libc::dl_phdr_info,
    _size: libc::size_t,
    data: *mut libc::c_void,
) -> libc::c_int {
    // SAFETY: dl_iterate_phdr passes a valid info pointer and our plan back to us.
    let (info, plan) = unsafe { (&*info, &*(data as *const Plan)) };
    let Some(layout) = Layout::of(info) else {
        return 0;
    };
    let Some(m) = plan.registry.modules.get(&layout.dynamic.0) else {
        return 0;
    };
    if m.seen != plan.generation
        || m.kind != Kind::Other
        || (m.bias, m.start, m.end) != (layout.bias, layout.start, layout.end)
    {
        return 0;
    }
    let mut writer = SlotWriter::default();
    for slot in &m.slots {
        let name = slot.name as usize;
        let bit = 1u16 << name;
        if plan.interposed & bit == 0 {
            continue;
        }
        // SAFETY: the slot was checked to lie 8-aligned in a writable segment of this module,
        // which stays mapped during the callback.
        let cell = unsafe { AtomicU64::from_ptr(slot.addr as *mut u64) };
        let value = cell.load(Ordering::Acquire);
        let target = plan.ours[name];
        if target == 0 || value == target {
            continue;
        }
        let glibc_bound = plan.libc[name] != 0 && value == plan.libc[name];
        let unresolved =
            slot.lazy && plan.other_definers & bit == 0 && m.start <= value && value < m.end;
        if glibc_bound || unresolved {
            writer.write(cell, slot.addr, target, m.relro);
        }
    }
    0
}

/// Writes GOT slots, making a page of `PT_GNU_RELRO` writable for the write and restoring its
/// protection after.
#[derive(Default)]
struct SlotWriter {
    /// The mapping of the last slot written.
    last: Option<maps::Mapping>,
}

impl SlotWriter {
    fn write(&mut self, cell: &AtomicU64, addr: u64, value: u64, relro: Option<(u64, u64)>) {
        let mapping = match self.last {
            Some(m) if m.start <= addr && addr < m.end => m,
            _ => match maps::mapping_containing(addr) {
                Some(m) => m,
                None => return,
            },
        };
        self.last = Some(mapping);
        if mapping.writable {
            cell.store(value, Ordering::Release);
            return;
        }
        let in_relro = relro.is_some_and(|(s, e)| s <= addr && addr + 8 <= e);
        if !in_relro || !mapping.readable {
            return;
        }
        let page_size = page_size();
        let page = addr & !(page_size - 1);
        // SAFETY: a RELRO page of a loaded module: made writable only for this one store, then
        // given back its protection as /proc/self/maps showed it. Nothing relies on the page
        // being read-only in between (the loader is done relocating it: it was read-only).
        unsafe {
            if !maps::sys::mprotect(page, page_size, mapping.prot() | libc::PROT_WRITE) {
                return;
            }
            cell.store(value, Ordering::Release);
            maps::sys::mprotect(page, page_size, mapping.prot());
        }
    }
}

fn page_size() -> u64 {
    // SAFETY: getauxval only reads the auxiliary vector.
    match unsafe { libc::getauxval(libc::AT_PAGESZ) } {
        0 => 4096,
        n => n,
    }
}

// ------------------------------------------------------------------------------------------
// Reading one module's dynamic section

const DT_NULL: i64 = 0;
const DT_PLTRELSZ: i64 = 2;
const DT_HASH: i64 = 4;
const DT_STRTAB: i64 = 5;
const DT_SYMTAB: i64 = 6;
const DT_RELA: i64 = 7;
const DT_RELASZ: i64 = 8;
const DT_RELAENT: i64 = 9;
const DT_STRSZ: i64 = 10;
const DT_SYMENT: i64 = 11;
const DT_PLTREL: i64 = 20;
const DT_JMPREL: i64 = 23;
const DT_GNU_HASH: i64 = 0x6fff_fef5;
const R_X86_64_GLOB_DAT: u32 = 6;
const R_X86_64_JUMP_SLOT: u32 = 7;
const SHN_UNDEF: u16 = 0;
const STB_GLOBAL: u8 = 1;
const STB_WEAK: u8 = 2;
const SYM_SIZE: u64 = 24;
const RELA_SIZE: u64 = 24;

/// Where a loaded module's parts lie in memory.
struct Layout {
    bias: u64,
    start: u64,
    end: u64,
    /// `(address, flags)` of each `PT_LOAD`'s in-memory range.
    loads: Vec<(u64, u64, u32)>,
    dynamic: (u64, u64),
    relro: Option<(u64, u64)>,
}

/// A module's dynamic symbol table.
struct Symbols {
    symtab: u64,
    syment: u64,
    strtab: u64,
    strsz: u64,
    gnu_hash: Option<u64>,
    hash: Option<u64>,
}

/// One dynamic symbol's fields that matter here.
struct Sym {
    defined: bool,
    value: u64,
}

impl Layout {
    fn of(info: &libc::dl_phdr_info) -> Option<Layout> {
        if info.dlpi_phdr.is_null() {
            return None;
        }
        // SAFETY: dlpi_phdr points at dlpi_phnum program headers of a loaded object.
        let phdrs = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) };
        let bias = info.dlpi_addr;
        let mut layout = Layout {
            bias,
            start: u64::MAX,
            end: 0,
            loads: Vec::new(),
            dynamic: (0, 0),
            relro: None,
        };
        for ph in phdrs {
            let s = bias.wrapping_add(ph.p_vaddr);
            let e = s.wrapping_add(ph.p_memsz);
            match ph.p_type {
                libc::PT_LOAD => {
                    layout.start = layout.start.min(s);
                    layout.end = layout.end.max(e);
                    layout.loads.push((s, e, ph.p_flags));
                }
                libc::PT_DYNAMIC => layout.dynamic = (s, e),
                libc::PT_GNU_RELRO => layout.relro = Some((s, e)),
                _ => {}
            }
        }
        (layout.dynamic.0 != 0 && layout.start < layout.end).then_some(layout)
    }

    fn contains(&self, addr: u64) -> bool {
        self.start <= addr && addr < self.end
    }

    /// `[addr, addr + len)` lies in one segment with all of `flags`.
    fn within(&self, addr: u64, len: u64, flags: u32) -> bool {
        let Some(end) = addr.checked_add(len) else {
            return false;
        };
        self.loads
            .iter()
            .any(|&(s, e, f)| f & flags == flags && s <= addr && end <= e)
    }

    fn readable(&self, addr: u64, len: u64) -> bool {
        self.within(addr, len, libc::PF_R)
    }

    fn u64_at(&self, addr: u64) -> Option<u64> {
        // SAFETY: checked to lie in a readable segment of this (loaded) module.
        self.readable(addr, 8)
            .then(|| unsafe { std::ptr::read_unaligned(addr as *const u64) })
    }

    fn u32_at(&self, addr: u64) -> Option<u32> {
        // SAFETY: as in u64_at.
        self.readable(addr, 4)
            .then(|| unsafe { std::ptr::read_unaligned(addr as *const u32) })
    }

    fn u8_at(&self, addr: u64) -> Option<u8> {
        // SAFETY: as in u64_at.
        self.readable(addr, 1)
            .then(|| unsafe { std::ptr::read(addr as *const u8) })
    }

    /// A `d_ptr` value: glibc rewrites a writable dynamic section's pointers to run-time
    /// addresses, a read-only one (the vDSO's) keeps link-time ones.
    fn dyn_ptr(&self, value: u64) -> u64 {
        if self.contains(value) {
            value
        } else {
            value.wrapping_add(self.bias)
        }
    }

    fn parse(&self, kind: Kind, generation: u64) -> ModuleGot {
        let mut m = ModuleGot {
            bias: self.bias,
            start: self.start,
            end: self.end,
            kind,
            defines: 0,
            definitions: [0; NAMES.len()],
            slots: Vec::new(),
            relro: self.relro,
            seen: generation,
        };
        if kind == Kind::Loader {
            return m;
        }
        let mut d = DynamicInfo::default();
        let (dyn_start, dyn_end) = self.dynamic;
        let mut at = dyn_start;
        while at + 16 <= dyn_end {
            let (Some(tag), Some(value)) = (self.u64_at(at), self.u64_at(at + 8)) else {
                break;
            };
            let tag = tag as i64;
            match tag {
                DT_NULL => break,
                DT_PLTRELSZ => d.pltrelsz = value,
                DT_HASH => d.hash = Some(self.dyn_ptr(value)),
                DT_STRTAB => d.strtab = Some(self.dyn_ptr(value)),
                DT_SYMTAB => d.symtab = Some(self.dyn_ptr(value)),
                DT_RELA => d.rela = Some(self.dyn_ptr(value)),
                DT_RELASZ => d.relasz = value,
                DT_RELAENT => d.relaent = value,
                DT_STRSZ => d.strsz = value,
                DT_SYMENT => d.syment = value,
                DT_PLTREL => d.pltrel = value as i64,
                DT_JMPREL => d.jmprel = Some(self.dyn_ptr(value)),
                DT_GNU_HASH => d.gnu_hash = Some(self.dyn_ptr(value)),
                _ => {}
            }
            at += 16;
        }
        let (Some(symtab), Some(strtab)) = (d.symtab, d.strtab) else {
            return m;
        };
        let symbols = Symbols {
            symtab,
            syment: if d.syment == 0 { SYM_SIZE } else { d.syment },
            strtab,
            strsz: d.strsz,
            gnu_hash: d.gnu_hash,
            hash: d.hash,
        };
        for (i, name) in NAMES.iter().enumerate() {
            if let Some(sym) = self.lookup(&symbols, name) {
                m.defines |= 1 << i;
                m.definitions[i] = self.bias.wrapping_add(sym.value);
            }
        }
        if kind == Kind::Libc || kind == Kind::Runtime {
            return m;
        }
        let relaent = if d.relaent == 0 { RELA_SIZE } else { d.relaent };
        let mut tables = vec![];
        if let Some(rela) = d.rela {
            tables.push((rela, d.relasz, relaent));
        }
        if let (Some(jmprel), DT_RELA) = (d.jmprel, d.pltrel) {
            tables.push((jmprel, d.pltrelsz, RELA_SIZE));
        }
        for (table, size, entry) in tables {
            if entry < 16 || !self.readable(table, size) {
                continue;
            }
            for i in 0..size / entry {
                let at = table + i * entry;
                let (Some(offset), Some(info)) = (self.u64_at(at), self.u64_at(at + 8)) else {
                    break;
                };
                let r_type = info as u32;
                if r_type != R_X86_64_GLOB_DAT && r_type != R_X86_64_JUMP_SLOT {
                    continue;
                }
                let sym_index = info >> 32;
                if sym_index == 0 {
                    continue;
                }
                let sym_at = symbols.symtab + sym_index * symbols.syment;
                let Some(st_name) = self.u32_at(sym_at) else {
                    continue;
                };
                let Some(name) = self.name_index(&symbols, st_name) else {
                    continue;
                };
                let Some(shndx) = self.u32_at(sym_at + 4).map(|w| (w >> 16) as u16) else {
                    continue;
                };
                let addr = self.bias.wrapping_add(offset);
                if !addr.is_multiple_of(8) || !self.within(addr, 8, libc::PF_R | libc::PF_W) {
                    continue;
                }
                if m.slots.iter().any(|s| s.addr == addr) {
                    continue;
                }
                m.slots.push(Slot {
                    addr,
                    name: name as u8,
                    lazy: r_type == R_X86_64_JUMP_SLOT && shndx == SHN_UNDEF,
                });
            }
        }
        m
    }

    /// Which of [`NAMES`] the string at `strtab + offset` is.
    fn name_index(&self, symbols: &Symbols, offset: u32) -> Option<usize> {
        let offset = offset as u64;
        if offset >= symbols.strsz {
            return None;
        }
        let at = symbols.strtab + offset;
        let first = self.u8_at(at)?;
        NAMES
            .iter()
            .position(|name| name[0] == first && self.str_equals(symbols, offset, name))
    }

    /// The string at `strtab + offset` is `name` (and ends there).
    fn str_equals(&self, symbols: &Symbols, offset: u64, name: &[u8]) -> bool {
        let len = name.len() as u64;
        if offset + len >= symbols.strsz || !self.readable(symbols.strtab + offset, len + 1) {
            return false;
        }
        // SAFETY: len + 1 bytes checked readable just above.
        let bytes = unsafe {
            std::slice::from_raw_parts((symbols.strtab + offset) as *const u8, len as usize + 1)
        };
        &bytes[..len as usize] == name && bytes[len as usize] == 0
    }

    fn symbol(&self, symbols: &Symbols, index: u64) -> Option<(u32, Sym)> {
        let at = symbols.symtab + index * symbols.syment;
        let st_name = self.u32_at(at)?;
        let word = self.u32_at(at + 4)?;
        let st_info = word as u8;
        let st_other = (word >> 8) as u8;
        let shndx = (word >> 16) as u16;
        let value = self.u64_at(at + 8)?;
        let bind = st_info >> 4;
        let exported = (bind == STB_GLOBAL || bind == STB_WEAK) && st_other & 3 == 0;
        Some((
            st_name,
            Sym {
                defined: exported && shndx != SHN_UNDEF,
                value,
            },
        ))
    }

    /// The module's own exported definition of `name`, through its hash table.
    fn lookup(&self, symbols: &Symbols, name: &[u8]) -> Option<Sym> {
        if let Some(table) = symbols.gnu_hash {
            return self.gnu_lookup(symbols, table, name);
        }
        self.sysv_lookup(symbols, symbols.hash?, name)
    }

    fn gnu_lookup(&self, symbols: &Symbols, table: u64, name: &[u8]) -> Option<Sym> {
        let nbuckets = self.u32_at(table)? as u64;
        let symoffset = self.u32_at(table + 4)? as u64;
        let bloom_size = self.u32_at(table + 8)? as u64;
        let bloom_shift = self.u32_at(table + 12)?;
        if nbuckets == 0 || bloom_size == 0 {
            return None;
        }
        let h = name
            .iter()
            .fold(5381u32, |h, &c| h.wrapping_mul(33).wrapping_add(c as u32));
        let bloom = table + 16;
        let word = self.u64_at(bloom + ((h / 64) as u64 % bloom_size) * 8)?;
        let mask = (1u64 << (h % 64)) | (1u64 << ((h >> (bloom_shift % 32)) % 64));
        if word & mask != mask {
            return None;
        }
        let buckets = bloom + bloom_size * 8;
        let chain = buckets + nbuckets * 4;
        let first = self.u32_at(buckets + (h as u64 % nbuckets) * 4)? as u64;
        if first < symoffset {
            return None;
        }
        // Bounded: a chain ends at a hash with its low bit set.
        for index in first..first + (1 << 20) {
            let h2 = self.u32_at(chain + (index - symoffset) * 4)?;
            if h | 1 == h2 | 1 {
                let (st_name, sym) = self.symbol(symbols, index)?;
                if sym.defined && self.str_equals(symbols, st_name as u64, name) {
                    return Some(sym);
                }
            }
            if h2 & 1 != 0 {
                return None;
            }
        }
        None
    }

    fn sysv_lookup(&self, symbols: &Symbols, table: u64, name: &[u8]) -> Option<Sym> {
        let nbucket = self.u32_at(table)? as u64;
        let nchain = self.u32_at(table + 4)? as u64;
        if nbucket == 0 {
            return None;
        }
        let h = name.iter().fold(0u32, |h, &c| {
            let h = (h << 4).wrapping_add(c as u32);
            let g = h & 0xf000_0000;
            (h ^ (g >> 24)) & !g
        });
        let chain = table + 8 + nbucket * 4;
        let mut index = self.u32_at(table + 8 + (h as u64 % nbucket) * 4)? as u64;
        for _ in 0..nchain {
            if index == 0 || index >= nchain {
                return None;
            }
            let (st_name, sym) = self.symbol(symbols, index)?;
            if sym.defined && self.str_equals(symbols, st_name as u64, name) {
                return Some(sym);
            }
            index = self.u32_at(chain + index * 4)? as u64;
        }
        None
    }
}

#[derive(Default)]
struct DynamicInfo {
    pltrelsz: u64,
    hash: Option<u64>,
    strtab: Option<u64>,
    symtab: Option<u64>,
    rela: Option<u64>,
    relasz: u64,
    relaent: u64,
    strsz: u64,
    syment: u64,
    pltrel: i64,
    jmprel: Option<u64>,
    gnu_hash: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Found {
        libc: Option<[u64; NAMES.len()]>,
        libc_defines: u16,
    }

    unsafe extern "C" fn find_libc(
        info: *mut libc::dl_phdr_info,
        _size: libc::size_t,
        data: *mut libc::c_void,
    ) -> libc::c_int {
        // SAFETY: dl_iterate_phdr passes a valid info pointer and our `Found` back to us.
        let (info, found) = unsafe { (&*info, &mut *(data as *mut Found)) };
        let Some(layout) = Layout::of(info) else {
            return 0;
        };
        if layout.contains(crate::libc_heap::__libc_malloc as *const () as u64) {
            let m = layout.parse(Kind::Libc, 1);
            found.libc = Some(m.definitions);
            found.libc_defines = m.defines;
            return 1;
        }
        0
    }

    /// glibc's table lookups find its allocator: `malloc` and `free` are the `__libc_*`
    /// functions under their public names.
    #[test]
    fn finds_glibc_definitions_through_its_hash_table() {
        let mut found = Found {
            libc: None,
            libc_defines: 0,
        };
        // SAFETY: the callback writes only into `found`, during the call.
        unsafe {
            libc::dl_iterate_phdr(
                Some(find_libc),
                &mut found as *mut Found as *mut libc::c_void,
            )
        };
        let defs = found.libc.expect("glibc is loaded");
        assert_eq!(defs[0], crate::libc_heap::__libc_malloc as *const () as u64);
        assert_eq!(defs[3], crate::libc_heap::__libc_free as *const () as u64);
        assert_eq!(defs[1], crate::libc_heap::__libc_calloc as *const () as u64);
        // malloc, calloc, realloc, free, posix_memalign, aligned_alloc, memalign, valloc.
        for i in [0, 1, 2, 3, 5, 6, 7, 8] {
            assert!(found.libc_defines & (1 << i) != 0, "{:?}", NAMES[i]);
        }
    }
}
