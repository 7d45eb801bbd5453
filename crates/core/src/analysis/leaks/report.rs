//! The original msMemScope's text for leaked blocks: a block per device, a line per leak, a
//! summary line (the report file lists every block; the console cuts long lists).

use std::collections::BTreeMap;

use super::{mb, Leak, REPORT_FILE};
use crate::events::row::format_ptr;
use crate::events::DeviceId;

/// The original msMemScope's report text for `leaks` (empty when there are none).
pub fn render(leaks: &[Leak]) -> String {
    render_lines(leaks, usize::MAX)
}

/// Blocks listed per device on the console, at each end of the list: a leak of a block a step
/// would otherwise print a line per step of the run (the whole list is in [`REPORT_FILE`]).
pub const CONSOLE_BLOCKS: usize = 5;

/// [`render`] with at most `shown` blocks from each end of a device's list, the rest counted
/// in one line; the summary line counts them all.
pub(super) fn render_lines(leaks: &[Leak], shown: usize) -> String {
    let mut by_device: BTreeMap<DeviceId, Vec<&Leak>> = BTreeMap::new();
    for leak in leaks {
        by_device.entry(leak.device).or_default().push(leak);
    }
    let mut out = String::new();
    for (device, mut leaks) in by_device {
        leaks.sort_by_key(|l| l.row_id);
        out.push_str(&format!(
            "====== ERROR: Detected memory leaks on device {device} ======\n"
        ));
        let total: u64 = leaks.iter().map(|l| l.size).sum();
        let cut = leaks.len() > shown.saturating_mul(2).saturating_add(1);
        for (i, leak) in leaks.iter().enumerate() {
            if cut && i >= shown && i < leaks.len() - shown {
                if i == shown {
                    out.push_str(&format!(
                        "... {} more block(s) (all of them in {REPORT_FILE})\n",
                        leaks.len() - 2 * shown
                    ));
                }
                continue;
            }
            let kernel = leak
                .kernel
                .map_or_else(|| "N/A".to_string(), |k| k.to_string());
            out.push_str(&format!(
                "Direct {} leak of {} Mb(s) at {} in kernel_{kernel} at step {}.\n",
                leak.pool.as_str(),
                mb(leak.size),
                format_ptr(leak.ptr),
                leak.step
            ));
        }
        out.push_str(&format!(
            "====== SUMMARY: {} Mb(s) leaked in {} allocation(s) ======\n",
            mb(total),
            leaks.len()
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::EventType;

    /// The console lists a device's first and last five blocks and counts the others; the
    /// summary line counts them all; eleven blocks or fewer are all listed.
    #[test]
    fn a_long_block_list_is_cut_on_the_console() {
        let leak = |i: u64| Leak {
            device: DeviceId::Cpu,
            pool: EventType::Pta,
            ptr: 0x1000 + i,
            size: 1 << 20,
            kernel: Some(i),
            step: i,
            row_id: i,
            site: 0,
            late: false,
        };
        let leaks: Vec<Leak> = (2..14).map(leak).collect();
        let line = |i: u64| {
            format!(
                "Direct PTA leak of 1.000 Mb(s) at 0x{:016x} in kernel_{i} at step {i}.\n",
                0x1000 + i
            )
        };
        let mut want = "====== ERROR: Detected memory leaks on device cpu ======\n".to_string();
        (2..7).for_each(|i| want.push_str(&line(i)));
        want.push_str("... 2 more block(s) (all of them in leaks/leak_report.txt)\n");
        (9..14).for_each(|i| want.push_str(&line(i)));
        want.push_str("====== SUMMARY: 12.000 Mb(s) leaked in 12 allocation(s) ======\n");
        assert_eq!(render_lines(&leaks, CONSOLE_BLOCKS), want);
        let whole = render(&leaks);
        assert_eq!(whole.lines().count(), 14);
        assert_eq!(
            render_lines(&leaks[..11], CONSOLE_BLOCKS),
            render(&leaks[..11])
        );
    }
}
