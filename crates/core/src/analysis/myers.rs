//! Myers' O(ND) difference algorithm ("An O(ND) Difference Algorithm and Its Variations",
//! E. W. Myers, 1986), in its linear-space form: each subproblem is split at its middle snake,
//! found by running the greedy forward and backward searches towards each other, so memory is
//! O(N + M) whatever D is. Common prefixes and suffixes are stripped first.
//!
//! Like GNU diff, a search that has spent [`Limits::too_expensive`] rounds without meeting the
//! other direction stops and splits at the furthest-reaching diagonal instead: the script is
//! then still a correct edit script, just not guaranteed minimal. This bounds the time on two
//! unrelated sequences (D close to N + M) to about O((N + M) · too_expensive) rather than
//! O((N + M)²). With inputs that differ in fewer than `too_expensive` places the result is a
//! shortest edit script.

/// One step of an edit script from `a` to `b`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Edit {
    /// `a[base] == b[compare]`: kept.
    Equal { base: usize, compare: usize },
    /// `a[base]` is not in `b`.
    Delete { base: usize },
    /// `b[compare]` is not in `a`.
    Insert { compare: usize },
}

/// The result: which elements of `a` were removed and which of `b` inserted. Every other
/// element of `a` is matched, in order, with an unmarked element of `b`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Script {
    pub removed: Vec<bool>,
    pub inserted: Vec<bool>,
}

impl Script {
    /// The number of deletions plus insertions (D).
    pub fn distance(&self) -> usize {
        self.removed.iter().filter(|r| **r).count() + self.inserted.iter().filter(|i| **i).count()
    }

    /// The edits in order; within a changed region the deletions come before the insertions.
    pub fn edits(&self) -> impl Iterator<Item = Edit> + '_ {
        let (n, m) = (self.removed.len(), self.inserted.len());
        let (mut i, mut j) = (0, 0);
        std::iter::from_fn(move || {
            if i < n && self.removed[i] {
                i += 1;
                Some(Edit::Delete { base: i - 1 })
            } else if j < m && self.inserted[j] {
                j += 1;
                Some(Edit::Insert { compare: j - 1 })
            } else if i < n && j < m {
                i += 1;
                j += 1;
                Some(Edit::Equal {
                    base: i - 1,
                    compare: j - 1,
                })
            } else {
                None
            }
        })
    }
}

/// Tuning of the search.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Rounds (edit distance explored from each end) a middle-snake search may take before it
    /// settles for the furthest-reaching diagonal.
    pub too_expensive: usize,
}

impl Limits {
    /// GNU diff's choice: about the square root of N + M, at least 4096.
    pub fn for_sizes(n: usize, m: usize) -> Limits {
        let mut too_expensive = 1usize;
        let mut diags = n + m + 3;
        while diags != 0 {
            too_expensive <<= 1;
            diags >>= 2;
        }
        Limits {
            too_expensive: too_expensive.max(4096),
        }
    }
}

/// A shortest edit script from `a` to `b` (see the module note for very different inputs).
pub fn diff<T: PartialEq>(a: &[T], b: &[T]) -> Script {
    diff_with(a, b, Limits::for_sizes(a.len(), b.len()))
}

/// [`diff`] with explicit limits.
pub fn diff_with<T: PartialEq>(a: &[T], b: &[T], limits: Limits) -> Script {
    let (n, m) = (a.len(), b.len());
    let mut ctx = Ctx {
        a,
        b,
        // Diagonals k = x - y run from -(m + 1) to n + 1 (the searches read one past each end).
        fd: vec![0; n + m + 3],
        bd: vec![0; n + m + 3],
        offset: m as isize + 1,
        too_expensive: limits.too_expensive.max(1) as isize,
        script: Script {
            removed: vec![false; n],
            inserted: vec![false; m],
        },
    };
    // An explicit stack instead of recursion: a degenerate split sequence cannot overflow it.
    let mut work = vec![(0usize, n, 0usize, m, false)];
    while let Some((mut xoff, mut xlim, mut yoff, mut ylim, minimal)) = work.pop() {
        while xoff < xlim && yoff < ylim && a[xoff] == b[yoff] {
            xoff += 1;
            yoff += 1;
        }
        while xoff < xlim && yoff < ylim && a[xlim - 1] == b[ylim - 1] {
            xlim -= 1;
            ylim -= 1;
        }
        if xoff == xlim {
            ctx.script.inserted[yoff..ylim].fill(true);
        } else if yoff == ylim {
            ctx.script.removed[xoff..xlim].fill(true);
        } else {
            let p = ctx.middle(xoff, xlim, yoff, ylim, minimal);
            work.push((p.x, xlim, p.y, ylim, p.hi_minimal));
            work.push((xoff, p.x, yoff, p.y, p.lo_minimal));
        }
    }
    ctx.script
}

struct Ctx<'a, T> {
    a: &'a [T],
    b: &'a [T],
    /// Forward search: furthest x reached on each diagonal.
    fd: Vec<isize>,
    /// Backward search: smallest x reached on each diagonal.
    bd: Vec<isize>,
    offset: isize,
    too_expensive: isize,
    script: Script,
}

/// Where a subproblem is split, and whether each half must be solved minimally.
struct Split {
    x: usize,
    y: usize,
    lo_minimal: bool,
    hi_minimal: bool,
}

impl<T: PartialEq> Ctx<'_, T> {
    fn fd(&mut self, k: isize) -> &mut isize {
        &mut self.fd[(k + self.offset) as usize]
    }

    fn bd(&mut self, k: isize) -> &mut isize {
        &mut self.bd[(k + self.offset) as usize]
    }

    /// The middle snake of a[xoff..xlim] vs b[yoff..ylim] (both non-empty, first and last
    /// elements differing), or a heuristic split when the search gets too expensive.
    fn middle(
        &mut self,
        xoff: usize,
        xlim: usize,
        yoff: usize,
        ylim: usize,
        minimal: bool,
    ) -> Split {
        let (a, b) = (self.a, self.b);
        let (xoff, xlim, yoff, ylim) = (xoff as isize, xlim as isize, yoff as isize, ylim as isize);
        let dmin = xoff - ylim;
        let dmax = xlim - yoff;
        let fmid = xoff - yoff;
        let bmid = xlim - ylim;
        let (mut fmin, mut fmax, mut bmin, mut bmax) = (fmid, fmid, bmid, bmid);
        let odd = (fmid - bmid) & 1 != 0;
        *self.fd(fmid) = xoff;
        *self.bd(bmid) = xlim;
        let mut c: isize = 1;
        loop {
            // Forward: extend each diagonal by one edit, then follow the snake.
            if fmin > dmin {
                fmin -= 1;
                *self.fd(fmin - 1) = -1;
            } else {
                fmin += 1;
            }
            if fmax < dmax {
                fmax += 1;
                *self.fd(fmax + 1) = -1;
            } else {
                fmax -= 1;
            }
            let mut d = fmax;
            while d >= fmin {
                let tlo = *self.fd(d - 1);
                let thi = *self.fd(d + 1);
                let x0 = if tlo >= thi { tlo + 1 } else { thi };
                let mut x = x0;
                let mut y = x0 - d;
                while x < xlim && y < ylim && a[x as usize] == b[y as usize] {
                    x += 1;
                    y += 1;
                }
                *self.fd(d) = x;
                if odd && bmin <= d && d <= bmax && *self.bd(d) <= x {
                    return Split {
                        x: x as usize,
                        y: y as usize,
                        lo_minimal: true,
                        hi_minimal: true,
                    };
                }
                d -= 2;
            }
            // Backward.
            if bmin > dmin {
                bmin -= 1;
                *self.bd(bmin - 1) = isize::MAX;
            } else {
                bmin += 1;
            }
            if bmax < dmax {
                bmax += 1;
                *self.bd(bmax + 1) = isize::MAX;
            } else {
                bmax -= 1;
            }
            let mut d = bmax;
            while d >= bmin {
                let tlo = *self.bd(d - 1);
                let thi = *self.bd(d + 1);
                let x0 = if tlo < thi { tlo } else { thi - 1 };
                let mut x = x0;
                let mut y = x0 - d;
                while xoff < x && yoff < y && a[x as usize - 1] == b[y as usize - 1] {
                    x -= 1;
                    y -= 1;
                }
                *self.bd(d) = x;
                if !odd && fmin <= d && d <= fmax && x <= *self.fd(d) {
                    return Split {
                        x: x as usize,
                        y: y as usize,
                        lo_minimal: true,
                        hi_minimal: true,
                    };
                }
                d -= 2;
            }
            if !minimal && c >= self.too_expensive {
                // Settle for the diagonal that got furthest, forward or backward.
                let (mut fxybest, mut fxbest) = (-1isize, 0isize);
                let mut d = fmax;
                while d >= fmin {
                    let mut x = (*self.fd(d)).min(xlim);
                    let mut y = x - d;
                    if ylim < y {
                        x = ylim + d;
                        y = ylim;
                    }
                    if fxybest < x + y {
                        fxybest = x + y;
                        fxbest = x;
                    }
                    d -= 2;
                }
                let (mut bxybest, mut bxbest) = (isize::MAX, 0isize);
                let mut d = bmax;
                while d >= bmin {
                    let mut x = (*self.bd(d)).max(xoff);
                    let mut y = x - d;
                    if y < yoff {
                        x = yoff + d;
                        y = yoff;
                    }
                    if x + y < bxybest {
                        bxybest = x + y;
                        bxbest = x;
                    }
                    d -= 2;
                }
                return if (xlim + ylim) - bxybest < fxybest - (xoff + yoff) {
                    Split {
                        x: fxbest as usize,
                        y: (fxybest - fxbest) as usize,
                        lo_minimal: true,
                        hi_minimal: false,
                    }
                } else {
                    Split {
                        x: bxbest as usize,
                        y: (bxybest - bxbest) as usize,
                        lo_minimal: false,
                        hi_minimal: true,
                    }
                };
            }
            c += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Applies the script to `a` and checks it yields `b`, that equal pairs are equal, and that
    /// every index appears exactly once.
    fn check<T: PartialEq + Clone + std::fmt::Debug>(a: &[T], b: &[T], s: &Script) {
        let mut out = Vec::new();
        let (mut seen_a, mut seen_b) = (0, 0);
        for e in s.edits() {
            match e {
                Edit::Equal { base, compare } => {
                    assert_eq!(a[base], b[compare]);
                    assert_eq!((base, compare), (seen_a, seen_b));
                    seen_a += 1;
                    seen_b += 1;
                    out.push(a[base].clone());
                }
                Edit::Delete { base } => {
                    assert_eq!(base, seen_a);
                    seen_a += 1;
                }
                Edit::Insert { compare } => {
                    assert_eq!(compare, seen_b);
                    seen_b += 1;
                    out.push(b[compare].clone());
                }
            }
        }
        assert_eq!((seen_a, seen_b), (a.len(), b.len()));
        assert_eq!(out, b);
    }

    /// The textbook dynamic-programming LCS length, for cross-checking minimality.
    fn lcs(a: &[u8], b: &[u8]) -> usize {
        let mut row = vec![0usize; b.len() + 1];
        for x in a {
            let mut prev = 0;
            for (j, y) in b.iter().enumerate() {
                let cur = row[j + 1];
                row[j + 1] = if x == y {
                    prev + 1
                } else {
                    row[j + 1].max(row[j])
                };
                prev = cur;
            }
        }
        row[b.len()]
    }

    fn d(a: &str, b: &str) -> usize {
        let s = diff(a.as_bytes(), b.as_bytes());
        check(a.as_bytes(), b.as_bytes(), &s);
        s.distance()
    }

    #[test]
    fn the_papers_example() {
        // Myers 1986, figure 1: ABCABBA -> CBABAC has D = 5 (LCS "CABA", length 4).
        assert_eq!(d("ABCABBA", "CBABAC"), 5);
        assert_eq!(lcs(b"ABCABBA", b"CBABAC"), 4);
    }

    #[test]
    fn classic_cases() {
        assert_eq!(d("", ""), 0);
        assert_eq!(d("abc", "abc"), 0);
        assert_eq!(d("", "abc"), 3);
        assert_eq!(d("abc", ""), 3);
        assert_eq!(d("abc", "xyz"), 6);
        assert_eq!(d("abcdef", "abXdef"), 2);
        assert_eq!(d("abcabba", "cbabac"), 5);
        // The LCS example of CLRS: LCS("ABCBDAB", "BDCABA") = 4, so D = 7 + 6 - 8.
        assert_eq!(d("ABCBDAB", "BDCABA"), 5);
        assert_eq!(d("kitten", "sitting"), 5);
        assert_eq!(d("a", "b"), 2);
        assert_eq!(d("ab", "ba"), 2);
    }

    #[test]
    fn one_insertion_is_one_insert() {
        let a = ["conv", "relu", "pool", "fc"];
        let b = ["conv", "relu", "dropout", "pool", "fc"];
        let s = diff(&a, &b);
        check(&a, &b, &s);
        let edits: Vec<Edit> = s.edits().collect();
        assert_eq!(
            edits,
            vec![
                Edit::Equal {
                    base: 0,
                    compare: 0
                },
                Edit::Equal {
                    base: 1,
                    compare: 1
                },
                Edit::Insert { compare: 2 },
                Edit::Equal {
                    base: 2,
                    compare: 3
                },
                Edit::Equal {
                    base: 3,
                    compare: 4
                },
            ]
        );
    }

    /// A small deterministic generator (xorshift), so the test needs no crate.
    fn sequence(seed: &mut u64, len: usize, alphabet: u8) -> Vec<u8> {
        (0..len)
            .map(|_| {
                *seed ^= *seed << 13;
                *seed ^= *seed >> 7;
                *seed ^= *seed << 17;
                b'a' + (*seed % alphabet as u64) as u8
            })
            .collect()
    }

    #[test]
    fn minimal_on_random_inputs() {
        let mut seed = 0x9e3779b97f4a7c15u64;
        for round in 0..300 {
            let a = sequence(&mut seed, round % 40, 2 + (round % 5) as u8);
            let b = sequence(&mut seed, (round * 7) % 37, 2 + (round % 5) as u8);
            let s = diff(&a, &b);
            check(&a, &b, &s);
            assert_eq!(
                s.distance(),
                a.len() + b.len() - 2 * lcs(&a, &b),
                "{a:?} {b:?}"
            );
        }
    }

    #[test]
    fn the_heuristic_still_yields_a_correct_script() {
        let mut seed = 12345u64;
        for round in 0..50 {
            let a = sequence(&mut seed, 200 + round, 4);
            let b = sequence(&mut seed, 180 + 2 * round, 4);
            let s = diff_with(&a, &b, Limits { too_expensive: 3 });
            check(&a, &b, &s);
            assert!(s.distance() >= a.len() + b.len() - 2 * lcs(&a, &b));
        }
    }

    #[test]
    fn long_sequences_with_few_changes_are_fast_and_minimal() {
        let mut seed = 777u64;
        let a = sequence(&mut seed, 200_000, 20);
        let mut b = a.clone();
        b.insert(1000, b'z');
        b.remove(150_000);
        b[90_000] = b'y';
        let s = diff(&a, &b);
        check(&a, &b, &s);
        assert_eq!(s.distance(), 4);
    }
}
