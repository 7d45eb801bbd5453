//! Rules that involve more than one option (docs/cli.md#rules, the original msMemScope's). Each
//! single value has been checked by its own parse function already; these look at a whole
//! [`RunConfig`].

use super::error::{ConfigError, GivenOptions, Setting};
use super::{event_index, format_list};
use crate::config::options::OptionName;
use crate::config::types::{Analysis, EventKind, RunConfig};

/// Checks the rules between options without changing anything:
/// - `--steps` switches the analyses off, so it conflicts with analyses the user asked for
///   explicitly (a default analysis is silently dropped instead, by [`resolve`]);
/// - `host-leaks` stands alone: no other analysis and no `--watch` (host-heap accounting and
///   the device-side event pipeline are separate instruments in the original msMemScope);
/// - `leaks`, `decompose` and `inefficient` are computed from MALLOC/FREE rows, so they need
///   both `alloc` and `free` events (`oom` is exempt: it turns them on itself);
/// - host-leak sampling is by count (`--sample-rate`) or by bytes (`--sample-bytes`), not
///   both: their estimates would not combine.
pub fn validate(config: &RunConfig, given: &GivenOptions) -> Result<(), ConfigError> {
    if config.sample_bytes > 0 && config.sample_rate_requested > 1 {
        return Err(ConfigError::Conflict {
            first: Setting::new(OptionName::SampleBytes, config.sample_bytes.to_string()),
            reason: "samples by bytes and cannot be combined with",
            second: Setting::new(
                OptionName::SampleRate,
                config.sample_rate_requested.to_string(),
            ),
        });
    }
    let steps_given = !config.steps.is_empty();
    if steps_given && given.contains(OptionName::Analysis) && !config.analysis.is_empty() {
        return Err(ConfigError::Conflict {
            first: Setting::new(OptionName::Steps, format_list(&config.steps)),
            reason: "switches the analyses off and cannot be combined with",
            second: Setting::new(OptionName::Analysis, format_list(&config.analysis)),
        });
    }
    let analyses: &[Analysis] = if steps_given { &[] } else { &config.analysis };

    if analyses.contains(&Analysis::HostLeaks) {
        if analyses.len() > 1 {
            let value = format_list(analyses);
            return Err(ConfigError::invalid_because(
                OptionName::Analysis,
                &value,
                "host-leaks cannot be combined with other analyses",
            ));
        }
        if let Some(watch) = &config.watch {
            return Err(ConfigError::Conflict {
                first: Setting::new(OptionName::Analysis, "host-leaks"),
                reason: "cannot be combined with",
                second: Setting::new(OptionName::Watch, watch.to_string()),
            });
        }
        // Options of the event dump would be silently ignored by host-heap accounting.
        let dump_only = [
            OptionName::Events,
            OptionName::Level,
            OptionName::CollectMode,
            OptionName::Device,
            OptionName::Format,
        ];
        if let Some(option) = dump_only.into_iter().find(|o| given.contains(*o)) {
            return Err(ConfigError::Conflict {
                first: Setting::new(OptionName::Analysis, "host-leaks"),
                reason: "records host heap blocks, not the event dump, and does not take",
                second: Setting {
                    option,
                    value: None,
                },
            });
        }
    }

    let has_alloc_free =
        config.events.contains(&EventKind::Alloc) && config.events.contains(&EventKind::Free);
    if !has_alloc_free {
        let needy = analyses.iter().find(|a| {
            matches!(
                a,
                Analysis::Leaks | Analysis::Decompose | Analysis::Inefficient
            )
        });
        if let Some(analysis) = needy {
            return Err(ConfigError::Conflict {
                first: Setting::new(OptionName::Analysis, analysis.to_string()),
                reason: "needs alloc and free events, which are missing from",
                second: Setting::new(OptionName::Events, format_list(&config.events)),
            });
        }
    }
    Ok(())
}

/// [`validate`], then applies what the rules imply: `--steps` empties the analysis list, and
/// `oom` adds `alloc` and `free` to the events. Call once after every option has been set.
pub fn resolve(config: &mut RunConfig, given: &GivenOptions) -> Result<(), ConfigError> {
    validate(config, given)?;
    if !config.steps.is_empty() {
        config.analysis.clear();
    }
    if config
        .analysis
        .iter()
        .any(|a| matches!(a, Analysis::Oom(_)))
    {
        for kind in [EventKind::Alloc, EventKind::Free] {
            if !config.events.contains(&kind) {
                config.events.push(kind);
            }
        }
        config.events.sort_by_key(|kind| event_index(*kind));
    }
    Ok(())
}
