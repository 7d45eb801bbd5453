//! Turning return addresses into `function file:line` or `function (module+offset)` text.
//!
//! Symbolization happens once, when a window closes, never on the hook path. Modules are
//! described by the map the runtime keeps (taken at start and at every `dlopen`), so a
//! library that was unloaded before the window closed still resolves from its file.

use std::collections::HashMap;
use std::path::PathBuf;

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
    loaders: HashMap<usize, Option<addr2line::Loader>>,
    /// Fallback name lookup for modules without a usable symbol table (e.g. stripped system
    /// libraries whose exported names only `dladdr` knows). Given the run-time address.
    fallback: Option<Box<dyn Fn(u64) -> Option<String> + Send>>,
}

impl Symbolizer {
    pub fn new(mut modules: Vec<ModuleInfo>) -> Symbolizer {
        modules.sort_by_key(|m| m.start);
        Symbolizer {
            modules,
            loaders: HashMap::new(),
            fallback: None,
        }
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
        let loader = self
            .loaders
            .entry(index)
            .or_insert_with(|| addr2line::Loader::new(&path).ok());

        let mut frames = Vec::new();
        if let Some(loader) = loader.as_ref() {
            if let Ok(mut iter) = loader.find_frames(probe) {
                while let Ok(Some(frame)) = iter.next() {
                    let function = frame
                        .function
                        .as_ref()
                        .and_then(|f| f.demangle().ok().map(|s| s.into_owned()));
                    let (file, line) = match &frame.location {
                        Some(loc) => (loc.file.map(short_path), loc.line),
                        None => (None, None),
                    };
                    frames.push(SymbolizedFrame {
                        address,
                        function,
                        module: Some(module_name.clone()),
                        offset,
                        file,
                        line,
                        inlined: true,
                    });
                }
            }
            if frames.is_empty() || frames.iter().all(|f| f.function.is_none()) {
                let name = loader.find_symbol(probe).map(demangle);
                frames = vec![SymbolizedFrame {
                    address,
                    function: name,
                    module: Some(module_name.clone()),
                    offset,
                    file: frames.first().and_then(|f| f.file.clone()),
                    line: frames.first().and_then(|f| f.line),
                    inlined: false,
                }];
            }
        }
        if frames.is_empty() {
            frames.push(SymbolizedFrame {
                address,
                function: None,
                module: Some(module_name),
                offset,
                file: None,
                line: None,
                inlined: false,
            });
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
}
