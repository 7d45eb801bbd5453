//! Turning return addresses into `function file:line` or `function (module+offset)` text.
//!
//! Symbolization happens once, when a window closes, never on the hook path. Modules are
//! described by the map the runtime keeps (taken at start and at every `dlopen`), so a
//! library that was unloaded before the window closed still resolves from its file. A stripped
//! module's names and lines come from its installed debug file where there is one
//! (`debug_file`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

mod debug_file;

/// One mapped ELF object as the runtime saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModuleInfo {
    pub path: PathBuf,
    /// Load bias: run-time address minus the address stated in the file.
    pub bias: u64,
    /// Lowest and one-past-highest run-time address of its loadable segments.
    pub start: u64,
    pub end: u64,
}

/// A symbolized frame. One return address may give several when functions were inlined.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SymbolizedFrame {
    pub address: u64,
    pub function: Option<String>,
    pub module: Option<String>,
    pub offset: u64,
    pub file: Option<String>,
    pub line: Option<u32>,
    pub inlined: bool,
}

impl SymbolizedFrame {
    /// `function file:line` when debug info gave a location, else `function (module+0xoffset)`.
    pub fn render(&self) -> String {
        let function = self.function.as_deref().unwrap_or("??");
        let inlined = if self.inlined { " [inlined]" } else { "" };
        match (&self.file, self.line, &self.module) {
            (Some(file), Some(line), _) => format!("{function} {file}:{line}{inlined}"),
            (_, _, Some(module)) => format!("{function} ({module}+0x{:x}){inlined}", self.offset),
            _ => format!("{function} (0x{:016x})", self.address),
        }
    }

    pub fn is_resolved(&self) -> bool {
        self.function.is_some()
    }
}

/// Resolves return addresses against a fixed set of modules, loading each file's symbols and
/// DWARF lazily and at most once.
pub struct Symbolizer {
    modules: Vec<ModuleInfo>,
    loaded: HashMap<usize, ModuleSymbols>,
    /// Where installed debug files are looked for (by build-id and `.gnu_debuglink`).
    debug_roots: Vec<PathBuf>,
    /// Fallback name lookup for modules without a usable symbol table (e.g. stripped system
    /// libraries whose exported names only `dladdr` knows). Given the run-time address.
    fallback: Option<Box<dyn Fn(u64) -> Option<String> + Send>>,
}

/// A module's own symbols and DWARF, and those of its installed debug file. Both describe the
/// same file addresses (the debug file keeps the module's section layout), so one probe, taken
/// relative to the module's load bias, serves both.
struct ModuleSymbols {
    own: Option<addr2line::Loader>,
    debug: Option<addr2line::Loader>,
}

impl ModuleSymbols {
    fn load(path: &Path, debug_roots: &[PathBuf]) -> ModuleSymbols {
        let debug =
            debug_file::find(path, debug_roots).and_then(|p| addr2line::Loader::new(p).ok());
        ModuleSymbols {
            own: addr2line::Loader::new(path).ok(),
            debug,
        }
    }
}

impl Symbolizer {
    pub fn new(mut modules: Vec<ModuleInfo>) -> Symbolizer {
        modules.sort_by_key(|m| m.start);
        Symbolizer {
            modules,
            loaded: HashMap::new(),
            debug_roots: debug_file::DEFAULT_DEBUG_ROOTS
                .iter()
                .map(PathBuf::from)
                .collect(),
            fallback: None,
        }
    }

    /// Takes the modules as they are now (modules are added as libraries load, so the list is
    /// usually the old one and more), keeping what was already loaded for the modules in both:
    /// a process that closes many windows reads each file's symbols and DWARF once.
    pub fn set_modules(&mut self, mut modules: Vec<ModuleInfo>) {
        modules.sort_by_key(|m| m.start);
        if modules == self.modules {
            return;
        }
        let mut loaded = HashMap::new();
        for (old, symbols) in self.loaded.drain() {
            if let Some(new) = modules.iter().position(|m| *m == self.modules[old]) {
                loaded.insert(new, symbols);
            }
        }
        self.modules = modules;
        self.loaded = loaded;
    }

    pub fn with_fallback(
        mut self,
        fallback: Box<dyn Fn(u64) -> Option<String> + Send>,
    ) -> Symbolizer {
        self.fallback = Some(fallback);
        self
    }

    fn module_index(&self, address: u64) -> Option<usize> {
        let after = self.modules.partition_point(|m| m.start <= address);
        // Later loads may overlap an unloaded module's range; prefer the newest that covers it.
        (0..after).rev().find(|&i| address < self.modules[i].end)
    }

    /// Symbolizes one return address (the caller's next instruction): the lookup uses
    /// `address - 1` so that a call at the very end of a function resolves to that function.
    pub fn symbolize_return_address(&mut self, address: u64) -> Vec<SymbolizedFrame> {
        let Some(index) = self.module_index(address) else {
            return vec![SymbolizedFrame {
                address,
                function: self.fallback.as_ref().and_then(|f| f(address)),
                module: None,
                offset: 0,
                file: None,
                line: None,
                inlined: false,
            }];
        };
        let module = &self.modules[index];
        let offset = address.wrapping_sub(module.bias);
        let probe = offset.wrapping_sub(1);
        let module_name = module
            .path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| module.path.to_string_lossy().into_owned());
        let path = module.path.clone();
        let debug_roots = &self.debug_roots;
        let symbols = self
            .loaded
            .entry(index)
            .or_insert_with(|| ModuleSymbols::load(&path, debug_roots));

        let frame = |function, file, line, inlined| SymbolizedFrame {
            address,
            function,
            module: Some(module_name.clone()),
            offset,
            file,
            line,
            inlined,
        };
        let named = |frames: &[SymbolizedFrame]| frames.iter().any(|f| f.function.is_some());
        let exported = || {
            let own = symbols.own.as_ref()?;
            own.find_symbol(probe).map(demangle)
        };
        let mut frames = match &symbols.debug {
            Some(debug) => dwarf_frames(debug, probe, &frame),
            None => Vec::new(),
        };
        if named(&frames) {
            // The debug file's DWARF names glibc-style internal aliases (`__GI___strdup`,
            // `__pthread_create_2_1`); the module's exported name is the one the program called,
            // and the one shown without the debug file.
            if let (Some(name), Some(outer)) = (exported(), frames.last_mut()) {
                outer.function = Some(name);
            }
        } else if let Some(own) = &symbols.own {
            let found = dwarf_frames(own, probe, &frame);
            if named(&found) || frames.is_empty() {
                frames = found;
            }
        }
        if !named(&frames) {
            // Exported names first, for the same reason; the debug file's table adds the
            // module's local functions.
            let name = exported().or_else(|| {
                let debug = symbols.debug.as_ref()?;
                debug.find_symbol(probe).map(demangle)
            });
            let (file, line) = frames
                .first()
                .map(|f| (f.file.clone(), f.line))
                .unwrap_or_default();
            frames = vec![frame(name, file, line, false)];
        }
        // The outermost frame of an inline chain is the real function; the others were inlined
        // into it.
        if let Some(last) = frames.last_mut() {
            last.inlined = false;
        }
        if frames[0].function.is_none() {
            if let Some(fallback) = &self.fallback {
                frames[0].function = fallback(address);
            }
        }
        frames
    }
}

/// The inline chain DWARF gives for `probe`, innermost first (empty without DWARF there).
fn dwarf_frames(
    loader: &addr2line::Loader,
    probe: u64,
    frame: &dyn Fn(Option<String>, Option<String>, Option<u32>, bool) -> SymbolizedFrame,
) -> Vec<SymbolizedFrame> {
    let mut frames = Vec::new();
    if let Ok(mut iter) = loader.find_frames(probe) {
        while let Ok(Some(found)) = iter.next() {
            let function = found
                .function
                .as_ref()
                .and_then(|f| f.demangle().ok().map(|s| s.into_owned()));
            let (file, line) = match &found.location {
                Some(loc) => (loc.file.map(short_path), loc.line),
                None => (None, None),
            };
            frames.push(frame(function, file, line, true));
        }
    }
    frames
}

fn demangle(name: &str) -> String {
    addr2line::demangle_auto(name.into(), None).into_owned()
}

/// Source paths are shown from the last two components: enough to tell files apart without
/// the build machine's directory layout.
fn short_path(path: &str) -> String {
    let parts: Vec<&str> = path.rsplitn(3, '/').collect();
    match parts.len() {
        3 => format!("{}/{}", parts[1], parts[0]),
        _ => path.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_each_form() {
        let mut f = SymbolizedFrame {
            address: 0x1234,
            function: Some("leak".into()),
            module: Some("prog".into()),
            offset: 0x34,
            file: None,
            line: None,
            inlined: false,
        };
        assert_eq!(f.render(), "leak (prog+0x34)");
        f.file = Some("src/a.c".into());
        f.line = Some(7);
        assert_eq!(f.render(), "leak src/a.c:7");
        f.inlined = true;
        assert_eq!(f.render(), "leak src/a.c:7 [inlined]");
    }

    #[test]
    fn unknown_module_renders_address() {
        let mut s = Symbolizer::new(vec![]);
        let frames = s.symbolize_return_address(0xdead);
        assert_eq!(frames[0].render(), "?? (0x000000000000dead)");
    }

    #[test]
    fn short_path_keeps_two_components() {
        assert_eq!(short_path("/a/b/c/d.c"), "c/d.c");
        assert_eq!(short_path("d.c"), "d.c");
    }

    use debug_file::{check, DebugLinks, Rejected, Via};
    use object::{Object, ObjectSymbol};

    /// Where the test library is "loaded": any bias works, the probe is bias-relative.
    const BIAS: u64 = 0x7f12_3400_0000;
    /// Both functions on one line each, so every address in them has a known line.
    const LIB_SRC: &str = concat!(
        "static int __attribute__((noinline)) hidden_helper(int x) { return x * 3 + 1; }\n",
        "int exported_entry(int x) { return hidden_helper(x) + 2; }\n",
    );

    struct TempDir(PathBuf);

    impl TempDir {
        fn new(tag: &str) -> TempDir {
            let dir = std::env::temp_dir()
                .join(format!("msmemscope-symbolize-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            TempDir(dir)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn tool(program: &str, args: &[&std::ffi::OsStr]) {
        let out = std::process::Command::new(program)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {program} (binutils/gcc): {e}"));
        assert!(
            out.status.success(),
            "{program} {args:?} failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The test library, its split-off debug file, its build-id (if linked with one) and the
    /// file addresses of its two functions.
    struct Built {
        lib: PathBuf,
        debug: PathBuf,
        build_id: Option<Vec<u8>>,
        hidden_helper: u64,
        exported_entry: u64,
    }

    /// Builds the test library with `gcc -g` into `dir/libsym.so`, splits its debug part off into
    /// `dir/libsym.so.debug` and strips it.
    fn build_split(dir: &Path, build_id: &str) -> Built {
        let src = dir.join("symlib.c");
        std::fs::write(&src, LIB_SRC).unwrap();
        let lib = dir.join("libsym.so");
        let debug = dir.join("libsym.so.debug");
        let link = format!("-Wl,--build-id={build_id}");
        tool(
            "gcc",
            &[
                "-g".as_ref(),
                "-O0".as_ref(),
                "-shared".as_ref(),
                "-fPIC".as_ref(),
                link.as_ref(),
                src.as_os_str(),
                "-o".as_ref(),
                lib.as_os_str(),
            ],
        );
        let data = std::fs::read(&lib).unwrap();
        let object = object::File::parse(&*data).unwrap();
        let address = |name: &str| {
            object
                .symbols()
                .find(|s| s.name() == Ok(name))
                .unwrap_or_else(|| panic!("no {name} in the unstripped library"))
                .address()
        };
        let built = Built {
            build_id: object.build_id().unwrap().map(<[u8]>::to_vec),
            hidden_helper: address("hidden_helper"),
            exported_entry: address("exported_entry"),
            lib: lib.clone(),
            debug: debug.clone(),
        };
        tool(
            "objcopy",
            &[
                "--only-keep-debug".as_ref(),
                lib.as_os_str(),
                debug.as_os_str(),
            ],
        );
        tool("strip", &["--strip-all".as_ref(), lib.as_os_str()]);
        built
    }

    fn symbolizer(lib: &Path, roots: &[&Path]) -> Symbolizer {
        let mut s = Symbolizer::new(vec![ModuleInfo {
            path: lib.to_path_buf(),
            bias: BIAS,
            start: BIAS,
            end: BIAS + 0x10_0000,
        }]);
        s.debug_roots = roots.iter().map(|r| r.to_path_buf()).collect();
        s
    }

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// A return address 4 bytes into `function` (file address), as the symbolizer is given it.
    fn frame_in(s: &mut Symbolizer, function: u64) -> Vec<String> {
        s.symbolize_return_address(BIAS + function + 4)
            .iter()
            .map(SymbolizedFrame::render)
            .collect()
    }

    #[test]
    fn names_a_stripped_librarys_local_function_from_its_build_id_debug_file() {
        let tmp = TempDir::new("build-id");
        let built = build_split(&tmp.0, "sha1");
        let id = built.build_id.clone().expect("linked with --build-id=sha1");
        assert_eq!(id.len(), 20);
        let root = tmp.0.join("debug-root");
        let dir = root.join(".build-id").join(hex(&id[..1]));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::rename(&built.debug, dir.join(format!("{}.debug", hex(&id[1..])))).unwrap();
        let source = format!("{}/symlib.c", tmp.0.file_name().unwrap().to_string_lossy());

        // Without the debug file only the exported function has a name (from .dynsym).
        let empty = tmp.0.join("empty-root");
        let mut bare = symbolizer(&built.lib, &[&empty]);
        assert_eq!(
            frame_in(&mut bare, built.hidden_helper),
            [format!("?? (libsym.so+0x{:x})", built.hidden_helper + 4)]
        );
        assert_eq!(
            frame_in(&mut bare, built.exported_entry),
            [format!(
                "exported_entry (libsym.so+0x{:x})",
                built.exported_entry + 4
            )]
        );

        let mut s = symbolizer(&built.lib, &[&empty, &root]);
        let frames = s.symbolize_return_address(BIAS + built.hidden_helper + 4);
        assert_eq!(
            frames,
            [SymbolizedFrame {
                address: BIAS + built.hidden_helper + 4,
                function: Some("hidden_helper".into()),
                module: Some("libsym.so".into()),
                offset: built.hidden_helper + 4,
                file: Some(source.clone()),
                line: Some(1),
                inlined: false,
            }]
        );
        assert_eq!(
            frame_in(&mut s, built.exported_entry),
            [format!("exported_entry {source}:2")]
        );
    }

    #[test]
    fn finds_a_debuglink_debug_file_in_the_debug_subdirectory_and_checks_its_crc() {
        let tmp = TempDir::new("debuglink");
        // No build-id, so the CRC32 is all that ties the debug file to the library.
        let built = build_split(&tmp.0, "none");
        assert_eq!(built.build_id, None);
        let link = format!("--add-gnu-debuglink={}", built.debug.display());
        tool("objcopy", &[link.as_ref(), built.lib.as_os_str()]);
        let links = DebugLinks::read(&built.lib).unwrap();
        let (name, crc) = links.debuglink.clone().expect("a .gnu_debuglink");
        assert_eq!(name, PathBuf::from("libsym.so.debug"));
        let expected = crc32fast::hash(&std::fs::read(&built.debug).unwrap());
        assert_eq!(crc, expected);
        std::fs::create_dir(tmp.0.join(".debug")).unwrap();
        let moved = tmp.0.join(".debug/libsym.so.debug");
        std::fs::rename(&built.debug, &moved).unwrap();

        let mut s = symbolizer(&built.lib, &[]);
        assert_eq!(
            s.symbolize_return_address(BIAS + built.hidden_helper + 4)[0].function,
            Some("hidden_helper".to_string())
        );

        // One byte more and it is some other file.
        let mut bytes = std::fs::read(&moved).unwrap();
        bytes.push(0);
        std::fs::write(&moved, &bytes).unwrap();
        let via = Via::DebugLink { crc };
        match check(&moved, &built.lib, &links, via) {
            Err(Rejected::CrcMismatch { found, expected }) => {
                assert_eq!((found, expected), (crc32fast::hash(&bytes), crc));
            }
            other => panic!("expected a CRC mismatch, got {other:?}"),
        }
        let mut s = symbolizer(&built.lib, &[]);
        assert_eq!(
            s.symbolize_return_address(BIAS + built.hidden_helper + 4)[0].function,
            None
        );
    }

    #[test]
    fn malformed_or_huge_debug_files_are_skipped() {
        let tmp = TempDir::new("malformed");
        let built = build_split(&tmp.0, "sha1");
        let id = built.build_id.clone().unwrap();
        let root = tmp.0.join("debug-root");
        let dir = root.join(".build-id").join(hex(&id[..1]));
        std::fs::create_dir_all(&dir).unwrap();
        let at = dir.join(format!("{}.debug", hex(&id[1..])));
        let links = DebugLinks::read(&built.lib).unwrap();
        let real = std::fs::read(&built.debug).unwrap();

        // Not ELF at all, and an ELF header whose section table lies past the end.
        for bytes in [&b"not an object file"[..], &real[..64]] {
            std::fs::write(&at, bytes).unwrap();
            assert!(
                matches!(
                    check(&at, &built.lib, &links, Via::BuildId),
                    Err(Rejected::Parse(_))
                ),
                "{:?}",
                check(&at, &built.lib, &links, Via::BuildId)
            );
            let mut s = symbolizer(&built.lib, &[&root]);
            assert_eq!(
                frame_in(&mut s, built.hidden_helper),
                [format!("?? (libsym.so+0x{:x})", built.hidden_helper + 4)]
            );
            assert_eq!(
                frame_in(&mut s, built.exported_entry),
                [format!(
                    "exported_entry (libsym.so+0x{:x})",
                    built.exported_entry + 4
                )]
            );
        }

        // A FIFO would block the open for good.
        std::fs::remove_file(&at).unwrap();
        tool("mkfifo", &[at.as_os_str()]);
        assert!(matches!(
            check(&at, &built.lib, &links, Via::BuildId),
            Err(Rejected::NotAFile)
        ));
        let mut s = symbolizer(&built.lib, &[&root]);
        assert_eq!(
            frame_in(&mut s, built.hidden_helper),
            [format!("?? (libsym.so+0x{:x})", built.hidden_helper + 4)]
        );
        std::fs::remove_file(&at).unwrap();

        // Sparse, so the test does not write a gigabyte.
        let huge = std::fs::File::create(&at).unwrap();
        huge.set_len(debug_file::MAX_DEBUG_FILE_BYTES + 1).unwrap();
        assert!(matches!(
            check(&at, &built.lib, &links, Via::BuildId),
            Err(Rejected::TooLarge(n)) if n == debug_file::MAX_DEBUG_FILE_BYTES + 1
        ));

        // The stripped library itself has no debug data to add.
        assert!(matches!(
            check(&built.lib, &tmp.0.join("symlib.c"), &links, Via::BuildId),
            Err(Rejected::NoDebugData)
        ));
        // Nor is a module its own debug file.
        assert!(matches!(
            check(&built.debug, &built.debug, &links, Via::BuildId),
            Err(Rejected::SameFile)
        ));
    }
}
