//! The ordered index of live blocks' base pointers that finds the block an inner pointer falls
//! in, kept only while someone asks.
//!
//! Nearly every access names its block's own base, which a hash lookup answers, so keeping an
//! ordered set in step with every allocation and free (a B-tree insert and remove per block)
//! is mostly wasted. Here the set is built from the live bases at the first question, then
//! kept current from a log of the changes since, replayed at the next question. A log that
//! grows past twice the live blocks drops the set instead, to be built again if asked: each
//! rebuild is paid for by at least as many changes as it costs, and a run that never asks
//! keeps nothing but that log.

use std::collections::BTreeSet;

/// What changed since the set was last brought up to date.
#[derive(Clone, Copy)]
enum Change {
    Added(u64),
    Removed(u64),
}

/// A log shorter than this never drops the set, so a handful of live blocks does not rebuild
/// at every question.
const MIN_LOG: usize = 1024;

#[derive(Default)]
pub struct BaseIndex {
    /// `None` until asked, or after the log outgrew it.
    ordered: Option<BTreeSet<u64>>,
    log: Vec<Change>,
}

impl BaseIndex {
    /// `base` became live (again: adding a live base changes nothing).
    pub fn added(&mut self, base: u64, live: usize) {
        self.note(Change::Added(base), live);
    }

    /// `base` is no longer live.
    pub fn removed(&mut self, base: u64, live: usize) {
        self.note(Change::Removed(base), live);
    }

    fn note(&mut self, change: Change, live: usize) {
        if self.ordered.is_none() {
            return;
        }
        self.log.push(change);
        if self.log.len() > MIN_LOG.max(live.saturating_mul(2)) {
            self.ordered = None;
            self.log = Vec::new();
        }
    }

    /// The greatest live base at or below `ptr`. `live` gives the live bases when the set must
    /// be built; it is not called otherwise.
    pub fn at_or_below<I: IntoIterator<Item = u64>>(
        &mut self,
        ptr: u64,
        live: impl FnOnce() -> I,
    ) -> Option<u64> {
        let ordered = match &mut self.ordered {
            Some(ordered) => {
                for change in self.log.drain(..) {
                    match change {
                        Change::Added(base) => ordered.insert(base),
                        Change::Removed(base) => ordered.remove(&base),
                    };
                }
                ordered
            }
            None => {
                self.log.clear();
                self.ordered.insert(live().into_iter().collect())
            }
        };
        ordered.range(..=ptr).next_back().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::BaseIndex;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]
        /// Against a set kept in step with every change, through drops and rebuilds (a small
        /// pointer space makes re-adds, removes of absent bases and hits common).
        #[test]
        fn answers_as_an_ordered_set_kept_in_step(
            ops in proptest::collection::vec((0u8..3, 0u64..3000), 0..6000),
        ) {
            let mut index = BaseIndex::default();
            let mut live = BTreeSet::new();
            for (op, ptr) in ops {
                match op {
                    0 => {
                        live.insert(ptr);
                        index.added(ptr, live.len());
                    }
                    1 => {
                        live.remove(&ptr);
                        index.removed(ptr, live.len());
                    }
                    _ => {
                        let want = live.range(..=ptr).next_back().copied();
                        let got = index.at_or_below(ptr, || live.iter().copied().collect::<Vec<_>>());
                        prop_assert_eq!(got, want);
                    }
                }
            }
        }
    }

    #[test]
    fn a_long_log_drops_the_set_until_asked_again() {
        let mut index = BaseIndex::default();
        assert_eq!(index.at_or_below(5, || [1u64, 4, 9]), Some(4));
        for ptr in 0..super::MIN_LOG as u64 + 1 {
            index.added(100 + ptr, 3);
        }
        assert!(index.ordered.is_none() && index.log.is_empty());
        assert_eq!(index.at_or_below(5, || [1u64, 9]), Some(1));
    }
}
