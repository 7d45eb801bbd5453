//! The fast CSV reader (`events::csv::scan`, chunks parsed on worker threads) against the
//! row-by-row reader (`reader::open`, the reference): on every dump fixture, on damaged copies
//! of them, and on a 5 M-row generated dump, both hand out the same rows and end with the same
//! error, whatever the chunk size and the number of workers.

use std::path::{Path, PathBuf};

use msmemscope_core::events::csv::scan::{FastCsv, ScanOptions};
use msmemscope_core::events::reader::{self, RowSource};
use msmemscope_core::events::EventRow;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn fixtures() -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(root().join("tests/fixtures/dumps"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "csv"))
        .collect();
    found.sort();
    assert!(found.len() >= 9, "{found:?}");
    found
}

/// Everything the reference reader gives: the rows and the error that ended them (or the
/// error of opening). Both readers bare, as `FastCsv::open_with` is: without the leniency for a
/// cut last row that `reader::open` and `reader::open_rows` add to either.
fn reference(path: &Path) -> (Vec<EventRow>, Option<String>) {
    let rows = match reader::CsvRows::open(path) {
        Ok(rows) => rows,
        Err(e) => return (Vec::new(), Some(e.to_string())),
    };
    let mut good = Vec::new();
    for row in rows {
        match row {
            Ok(row) => good.push(row),
            Err(e) => return (good, Some(e.to_string())),
        }
    }
    (good, None)
}

/// Checks that the fast reader gives `expected` from `path` with `options`.
fn same_as(path: &Path, expected: &(Vec<EventRow>, Option<String>), options: ScanOptions) {
    let context = format!("{} with {options:?}", path.display());
    let mut rows = match FastCsv::open_with(path, options) {
        Ok(rows) => rows,
        Err(e) => {
            assert!(expected.0.is_empty(), "{context}: {e}");
            assert_eq!(Some(e.to_string()), expected.1, "{context}");
            return;
        }
    };
    let mut n = 0;
    loop {
        match rows.next_row() {
            Ok(Some(row)) => {
                assert!(n < expected.0.len(), "{context}: an extra row {row:?}");
                assert_eq!(row, &expected.0[n], "{context}: row {n}");
                n += 1;
            }
            Ok(None) => {
                assert_eq!(n, expected.0.len(), "{context}: rows missing");
                assert_eq!(expected.1, None, "{context}: the error is missing");
                return;
            }
            Err(e) => {
                assert_eq!(n, expected.0.len(), "{context}: ended early with {e}");
                assert_eq!(Some(e.to_string()), expected.1, "{context}");
                return;
            }
        }
    }
}

/// Chunk sizes from smaller than a row (every record crosses a chunk edge) to the default, and
/// worker counts up to 4, what `ScanOptions::default()` takes on a machine of 4 cores or more
/// (so that a 2-core machine tests what a many-core one runs).
fn option_grid() -> Vec<ScanOptions> {
    let mut grid = Vec::new();
    for block in [1, 7, 64, 301, 4096, 2 << 20] {
        for workers in [1, 2, 3, 4] {
            grid.push(ScanOptions { block, workers });
        }
    }
    grid
}

#[test]
fn every_fixture_reads_the_same() {
    for path in fixtures() {
        let expected = reference(&path);
        assert!(!expected.0.is_empty(), "{}", path.display());
        for options in option_grid() {
            same_as(&path, &expected, options);
        }
    }
}

/// A small deterministic generator, so that a failure can be replayed.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// One damage to a dump's bytes, of the kinds hostile or broken files have.
fn damage(bytes: &mut Vec<u8>, rng: &mut Lcg) {
    let at = rng.below(bytes.len());
    match rng.below(9) {
        0 => bytes[at] = b'"',
        1 => bytes.insert(at, b'\n'),
        2 => bytes.insert(at, b'\r'),
        3 => bytes[at] = 0xff,
        4 => bytes.truncate(at),
        5 => bytes.insert(at, b','),
        6 => {
            // Two lines swapped: IDs out of order.
            let lines: Vec<usize> = memchr::memchr_iter(b'\n', bytes).collect();
            if lines.len() > 3 {
                let i = 1 + rng.below(lines.len() - 2);
                let (a, b, c) = (lines[i - 1] + 1, lines[i] + 1, lines[i + 1] + 1);
                let first = bytes[a..b].to_vec();
                let second = bytes[b..c].to_vec();
                bytes.splice(a..c, second.into_iter().chain(first));
            }
        }
        7 => bytes[at] = b'x',
        _ => {
            let end = (at + 1 + rng.below(64)).min(bytes.len());
            bytes.drain(at..end);
        }
    }
}

#[test]
fn damaged_dumps_fail_the_same() {
    let dir = std::env::temp_dir().join(format!("msmemscope-differential-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut rng = Lcg(20);
    let small = [
        ScanOptions {
            block: 64,
            workers: 2,
        },
        ScanOptions {
            block: 1000,
            workers: 3,
        },
        ScanOptions {
            block: 2 << 20,
            workers: 2,
        },
        ScanOptions {
            block: 301,
            workers: 4,
        },
    ];
    let mut failed = 0;
    for (f, path) in fixtures().iter().enumerate() {
        let original = std::fs::read(path).unwrap();
        for case in 0..60 {
            let mut bytes = original.clone();
            for _ in 0..1 + rng.below(3) {
                if !bytes.is_empty() {
                    damage(&mut bytes, &mut rng);
                }
            }
            let copy = dir.join(format!("{f}-{case}.csv"));
            std::fs::write(&copy, &bytes).unwrap();
            let expected = reference(&copy);
            failed += usize::from(expected.1.is_some());
            for options in small {
                same_as(&copy, &expected, options);
            }
            std::fs::remove_file(&copy).unwrap();
        }
    }
    // Most damages break the file: the error paths were exercised, not only the rows.
    assert!(
        failed > 300,
        "{failed} of 540 damaged copies failed to read"
    );
    let _ = std::fs::remove_dir(&dir);
}

/// `bench/gen_dump.c`, built with gcc, writes a dump of `rows` rows.
fn generated_dump(rows: u64, dir: &Path) -> PathBuf {
    let gen = dir.join("gen_dump");
    let built = std::process::Command::new("gcc")
        .args(["-O2", "-o"])
        .arg(&gen)
        .arg(root().join("bench/gen_dump.c"))
        .status()
        .unwrap();
    assert!(built.success());
    let path = dir.join("dump.csv");
    let ran = std::process::Command::new(&gen)
        .arg(rows.to_string())
        .arg("0")
        .arg(&path)
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(ran.success());
    path
}

#[test]
fn a_generated_5m_row_dump_reads_the_same() {
    let dir = std::env::temp_dir().join(format!("msmemscope-5m-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = generated_dump(5_000_000, &dir);
    // Row by row against the reference, streaming both: 5 M rows are not kept.
    let mut expected = reader::open(&path).unwrap();
    let mut fast = FastCsv::open(&path).unwrap();
    let mut n = 0u64;
    while let Some(row) = fast.next_row().unwrap() {
        let want = expected
            .next()
            .expect("the reference has this row")
            .unwrap();
        assert_eq!(row, &want, "row {n}");
        n += 1;
    }
    assert!(
        expected.next().is_none(),
        "the fast reader stopped at row {n}"
    );
    assert!(n >= 5_000_000, "{n}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A dump whose last row was cut off where the writing stopped (no line end after it): both
/// readers users get (`open`, `open_rows`) hand out every complete row and end there; the same
/// damage on a row that is not the last is still an error naming it.
#[test]
fn a_cut_last_row_is_left_out_by_both_readers() {
    let text =
        std::fs::read_to_string(root().join("tests/fixtures/dumps/check_leaks.csv")).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines.len() >= 5);
    let dir = std::env::temp_dir().join(format!("msmemscope-cut-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cut_row = &lines[4][..lines[4].len() / 2];
    let cut = dir.join("cut.csv");
    std::fs::write(&cut, format!("{}\n{cut_row}", lines[..4].join("\n"))).unwrap();
    let rows: Vec<EventRow> = reader::open(&cut)
        .unwrap()
        .collect::<Result<_, _>>()
        .expect("the cut row is left out");
    assert_eq!(rows.len(), 3);
    let mut source = reader::open_rows(&cut).unwrap();
    let mut n = 0;
    while let Some(row) = source.next_row().unwrap() {
        assert_eq!(row, &rows[n]);
        n += 1;
    }
    assert_eq!(n, 3);

    let middle = dir.join("middle.csv");
    std::fs::write(
        &middle,
        format!(
            "{}\n{cut_row}\n{}\n",
            lines[..4].join("\n"),
            lines[5.min(lines.len() - 1)]
        ),
    )
    .unwrap();
    let error = reader::open(&middle)
        .unwrap()
        .find_map(Result::err)
        .expect("a damaged row before the end is refused");
    assert!(error
        .to_string()
        .starts_with(&format!("{}:5: malformed row", middle.display())));
    let _ = std::fs::remove_dir_all(&dir);
}
