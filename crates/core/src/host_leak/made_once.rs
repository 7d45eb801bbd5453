//! Moves the sites that a module import made out of the leak ranking and into the resident
//! rows. Whether a site was made by an import is known from its Python frames, which are
//! costly to read for the hundreds of thousands of sites an `import torch` leaves; so only the
//! sites that would be shown are looked at, walking down the ranking until `top_n` sites that
//! were not made by an import remain on top.

use super::model::{HostLeakReport, LeakSite};

/// `made_by_import` reads a site's Python frames (keeping them on the site) and says whether
/// they run through the import machinery; `None` when the site has none.
pub fn demote_imports(
    sites: &mut Vec<LeakSite>,
    resident: &mut Vec<LeakSite>,
    top_n: usize,
    mut made_by_import: impl FnMut(&mut LeakSite) -> Option<bool>,
) {
    let mut kept = 0;
    let mut i = 0;
    let mut moved = false;
    while i < sites.len() && kept < top_n {
        if made_by_import(&mut sites[i]) == Some(true) {
            let mut site = sites.remove(i);
            site.assessment = site.assessment.made_once();
            resident.push(site);
            moved = true;
        } else {
            kept += 1;
            i += 1;
        }
    }
    if moved {
        let all = std::mem::take(resident);
        let (none, sorted) = HostLeakReport::rank_sites(all);
        debug_assert!(none.is_empty());
        *resident = sorted;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host_leak::lsi::{assess, Degradation, Series, SiteFacts, WindowFacts};
    use crate::host_leak::model::{AllocDomain, CountBytes};

    fn site(id: u32, bytes: u64, frame: &str) -> LeakSite {
        let unfreed = CountBytes { count: 100, bytes };
        let facts = SiteFacts {
            unfreed,
            allocated: unfreed,
            freed_count: 0,
            mean_live_age_ms: 1000.0,
            mean_freed_lifetime_ms: 0.0,
            last_alloc_ns: 19_900_000_000,
            first_alloc_ns: 1,
        };
        let window = WindowFacts {
            start_ns: 0,
            end_ns: 20_000_000_000,
            beat_ms: 1000,
            sampled_ms: 1000.0,
        };
        LeakSite {
            stack_id: Some(id),
            unfreed,
            allocated: unfreed,
            freed: CountBytes::default(),
            assessment: assess(&Series::Missing(Degradation::NoSeries), &facts, &window),
            samples: unfreed.count,
            frames: Vec::new(),
            python_frames: vec![frame.to_string()],
            cut: false,
            domain: AllocDomain::Pymalloc,
            live_series: Vec::new(),
        }
    }

    #[test]
    fn import_sites_leave_the_top_until_top_n_others_remain() {
        let import = "<frozen importlib._bootstrap>(1176): _find_and_load";
        let (mut sites, mut resident) = HostLeakReport::rank_sites(vec![
            site(1, 9000, import),
            site(2, 8000, "/w/train.py(19): Samples.__getitem__"),
            site(3, 7000, import),
            site(4, 6000, "/w/train.py(30): step"),
            site(5, 5000, import),
        ]);
        let mut looked = Vec::new();
        demote_imports(&mut sites, &mut resident, 2, |s| {
            looked.push(s.stack_id.unwrap());
            Some(crate::host_leak::lsi::made_by_import(&s.python_frames))
        });
        // Site 5 lies below the two kept sites: never looked at, still in the ranking.
        assert_eq!(looked, [1, 2, 3, 4]);
        let ids = |v: &[LeakSite]| v.iter().map(|s| s.stack_id.unwrap()).collect::<Vec<_>>();
        assert_eq!(ids(&sites), [2, 4, 5]);
        assert_eq!(ids(&resident), [1, 3]);
        assert!(resident
            .iter()
            .all(|s| s.assessment.class_label() == "resident/early"));
    }
}
