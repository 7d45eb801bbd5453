//! One line of a source file, for findings that quote the user's line.

/// Line `line` (1-based) of `file`, trimmed and cut at 160 characters; `None` when the file
/// is not a readable regular file or has no such line.
pub fn read(file: &str, line: u32) -> Option<String> {
    use std::io::{BufRead, BufReader};
    if line == 0 {
        return None;
    }
    let meta = std::fs::metadata(file).ok()?;
    // Only regular files: a FIFO or a device named like a source file must not block us.
    if !meta.is_file() {
        return None;
    }
    let reader = BufReader::new(std::fs::File::open(file).ok()?);
    let text = reader.lines().nth(line as usize - 1)?.ok()?;
    let text = text.trim();
    (!text.is_empty()).then(|| text.chars().take(160).collect())
}
