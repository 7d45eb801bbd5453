//! Finding a module's separate debug file, where gdb and heaptrack look for it: the file its
//! build-id names under a debug root (`<root>/.build-id/xx/yyyy.debug`), then the file its
//! `.gnu_debuglink` names beside it, in its `.debug/` directory or under a debug root
//! (`<root>/<module dir>/<name>`). Distribution `-dbg`/`-debuginfo` packages install there.
//!
//! The module and the candidates are read through `object`'s `ReadCache`, which reads only the
//! headers and the few sections asked for, so looking does not map or read whole libraries.

use std::ffi::OsStr;
use std::fs::File;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use object::read::ReadCache;
use object::{Object, ObjectSection, SectionKind};

/// Where distributions install detached debug files.
pub(super) const DEFAULT_DEBUG_ROOTS: &[&str] = &["/usr/lib/debug"];

/// Larger candidates are skipped: the DWARF loader decompresses every debug section of the file
/// into memory at once, in the traced process, when a window closes.
pub(super) const MAX_DEBUG_FILE_BYTES: u64 = 1 << 30;

/// Why a candidate debug file was not used.
#[derive(Debug, thiserror::Error)]
pub(super) enum Rejected {
    #[error("cannot read it: {0}")]
    Io(#[from] std::io::Error),
    #[error("not an object file: {0}")]
    Parse(#[from] object::Error),
    #[error("not a regular file")]
    NotAFile,
    #[error("{0} bytes, over the {MAX_DEBUG_FILE_BYTES}-byte limit")]
    TooLarge(u64),
    #[error("it is the module itself")]
    SameFile,
    #[error("its build-id is not the module's")]
    BuildIdMismatch,
    #[error("its CRC32 is {found:08x}, .gnu_debuglink says {expected:08x}")]
    CrcMismatch { found: u32, expected: u32 },
    #[error("it has neither DWARF nor a symbol table")]
    NoDebugData,
}

/// How a candidate was found, which decides how it is matched to the module.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Via {
    BuildId,
    /// The CRC32 the module's `.gnu_debuglink` records for its debug file.
    DebugLink {
        crc: u32,
    },
}

/// What a module says about its debug file.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct DebugLinks {
    pub build_id: Option<Vec<u8>>,
    /// The file name from `.gnu_debuglink` and the CRC32 recorded with it.
    pub debuglink: Option<(PathBuf, u32)>,
    /// The module carries its own DWARF, so a debug file would add nothing.
    pub has_dwarf: bool,
}

impl DebugLinks {
    pub fn read(module: &Path) -> Result<DebugLinks, Rejected> {
        let cache = ReadCache::new(File::open(module)?);
        let object = object::File::parse(&cache)?;
        let build_id = object
            .build_id()
            .ok()
            .flatten()
            .filter(|id| !id.is_empty())
            .map(<[u8]>::to_vec);
        // A name with a directory part could point anywhere; gdb's own producers never write one.
        let debuglink = object
            .gnu_debuglink()
            .ok()
            .flatten()
            .filter(|(name, _)| !name.is_empty() && !name.contains(&b'/'))
            .map(|(name, crc)| (PathBuf::from(OsStr::from_bytes(name)), crc));
        Ok(DebugLinks {
            build_id,
            debuglink,
            has_dwarf: has_content(&object, ".debug_info"),
        })
    }

    /// Every place to look, in gdb's order.
    pub fn candidates(&self, module: &Path, roots: &[PathBuf]) -> Vec<(PathBuf, Via)> {
        let mut out = Vec::new();
        if let Some(id) = self.build_id.as_deref().filter(|id| id.len() >= 2) {
            let (dir, file) = (hex(&id[..1]), format!("{}.debug", hex(&id[1..])));
            for root in roots {
                out.push((root.join(".build-id").join(&dir).join(&file), Via::BuildId));
            }
        }
        if let Some((name, crc)) = &self.debuglink {
            let via = Via::DebugLink { crc: *crc };
            // gdb looks beside the file the link resolves to, not beside the link.
            let module = std::fs::canonicalize(module).unwrap_or_else(|_| module.to_path_buf());
            if let Some(dir) = module.parent() {
                out.push((dir.join(name), via));
                out.push((dir.join(".debug").join(name), via));
                let relative = dir.strip_prefix("/").unwrap_or(dir);
                for root in roots {
                    out.push((root.join(relative).join(name), via));
                }
            }
        }
        out
    }
}

/// The first candidate that belongs to `module` and has something to add, if any.
pub(super) fn find(module: &Path, roots: &[PathBuf]) -> Option<PathBuf> {
    let links = DebugLinks::read(module).ok()?;
    if links.has_dwarf {
        return None;
    }
    links
        .candidates(module, roots)
        .into_iter()
        .find(|(path, via)| check(path, module, &links, *via).is_ok())
        .map(|(path, _)| path)
}

/// Accepts `candidate` as `module`'s debug file: a readable object file of sane size, not the
/// module itself, with DWARF or a symbol table, whose build-id is the module's (or, where one
/// of them has none and it was found by `.gnu_debuglink`, whose CRC32 is the recorded one).
pub(super) fn check(
    candidate: &Path,
    module: &Path,
    links: &DebugLinks,
    via: Via,
) -> Result<(), Rejected> {
    // Checked before opening: opening a FIFO would block the window's report.
    let meta = std::fs::metadata(candidate)?;
    if !meta.is_file() {
        return Err(Rejected::NotAFile);
    }
    if meta.len() > MAX_DEBUG_FILE_BYTES {
        return Err(Rejected::TooLarge(meta.len()));
    }
    let module_meta = std::fs::metadata(module)?;
    if (meta.dev(), meta.ino()) == (module_meta.dev(), module_meta.ino()) {
        return Err(Rejected::SameFile);
    }
    let cache = ReadCache::new(File::open(candidate)?);
    let object = object::File::parse(&cache)?;
    if !has_content(&object, ".debug_info") && !has_content(&object, ".symtab") {
        return Err(Rejected::NoDebugData);
    }
    let candidate_id = object.build_id().ok().flatten();
    match (links.build_id.as_deref(), candidate_id, via) {
        (Some(ours), Some(theirs), _) if ours == theirs => Ok(()),
        (Some(_), Some(_), _) | (_, _, Via::BuildId) => Err(Rejected::BuildIdMismatch),
        (_, _, Via::DebugLink { crc: expected }) => {
            let found = crc32(cache.into_inner())?;
            if found == expected {
                Ok(())
            } else {
                Err(Rejected::CrcMismatch { found, expected })
            }
        }
    }
}

/// A section with bytes in the file (a debug file keeps the module's code sections as NOBITS).
fn has_content<'data, R: object::ReadRef<'data>>(
    object: &object::File<'data, R>,
    name: &str,
) -> bool {
    object
        .section_by_name(name)
        .is_some_and(|s| s.size() > 0 && s.kind() != SectionKind::UninitializedData)
}

/// The CRC32 `.gnu_debuglink` records: the standard (zlib) one over the whole file.
fn crc32(mut file: File) -> std::io::Result<u32> {
    use std::io::Seek;
    file.rewind()?;
    let mut hasher = crc32fast::Hasher::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            return Ok(hasher.finalize());
        }
        hasher.update(&buf[..n]);
    }
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_follow_gdb_order() {
        let links = DebugLinks {
            build_id: Some(vec![0x93, 0xac, 0x61, 0x0e]),
            debuglink: Some((PathBuf::from("libx.so.debug"), 7)),
            has_dwarf: false,
        };
        let roots = [PathBuf::from("/r1"), PathBuf::from("/r2")];
        // A module path that does not exist is used as given.
        let got = links.candidates(Path::new("/no/such/dir/libx.so"), &roots);
        let link = Via::DebugLink { crc: 7 };
        assert_eq!(
            got,
            vec![
                (PathBuf::from("/r1/.build-id/93/ac610e.debug"), Via::BuildId),
                (PathBuf::from("/r2/.build-id/93/ac610e.debug"), Via::BuildId),
                (PathBuf::from("/no/such/dir/libx.so.debug"), link),
                (PathBuf::from("/no/such/dir/.debug/libx.so.debug"), link),
                (PathBuf::from("/r1/no/such/dir/libx.so.debug"), link),
                (PathBuf::from("/r2/no/such/dir/libx.so.debug"), link),
            ]
        );
    }

    #[test]
    fn crc32_is_the_zlib_one() {
        let path = std::env::temp_dir().join(format!("msmemscope-crc-{}", std::process::id()));
        std::fs::write(&path, b"123456789").unwrap();
        let crc = crc32(File::open(&path).unwrap()).unwrap();
        std::fs::remove_file(&path).unwrap();
        // The CRC-32/ISO-HDLC check value.
        assert_eq!(crc, 0xcbf4_3926);
    }
}
