//! Stages 2 to 5: every value through the shared checks of `msmemscope_core::config`, how the
//! modes combine, the cross-option rules of a launch, and what this build cannot run.

use super::*;

/// Stages 2–4: values, modes, cross-option rules.
pub(super) fn build(scanned: Scanned) -> Result<(Command, GivenOptions), UsageError> {
    let Scanned { options, program } = scanned;
    let mut config = RunConfig::default();
    let mut given = GivenOptions::new();
    let mut input_paths = None;
    let mut pid = None;
    let mut command_word = None;
    let mut compare = false;
    let mut report = false;
    let mut api_env = Vec::new();

    for occurrence in &options {
        let spelled = occurrence.spelled.as_str();
        let value = occurrence.value.as_deref();
        match (occurrence.kind, value) {
            (Kind::Config(option), Some(value)) => {
                set_option(&mut config, option, utf8(value, spelled)?)?;
                given.insert(option);
            }
            (Kind::Verbose | Kind::Quiet, _) => {
                config.log_level = if occurrence.kind == Kind::Verbose {
                    LogLevel::Debug
                } else {
                    LogLevel::Error
                };
                given.insert(OptionName::LogLevel);
            }
            (Kind::InputPath, Some(value)) => {
                input_paths = Some(parse_input_paths(utf8(value, spelled)?)?)
            }
            (Kind::Pid, Some(value)) => pid = Some(parse_pid(utf8(value, spelled)?)?),
            (Kind::CommandWord, Some(value)) => {
                let word = utf8(value, spelled)?;
                if word.trim().is_empty() {
                    return Err(UsageError(format!(
                        "invalid {spelled} \"{word}\": the control word is empty"
                    )));
                }
                command_word = Some(word.to_owned());
            }
            (Kind::Compare, _) => compare = true,
            (Kind::Report, _) => report = true,
            (Kind::LoadApiEnv, value) => {
                let kind = match value.map(|v| utf8(v, spelled)).transpose()? {
                    None | Some("npu" | "cuda") => ApiEnvKind::Device,
                    Some("host") => ApiEnvKind::Host,
                    Some("all") => ApiEnvKind::All,
                    Some(other) => {
                        return Err(UsageError(format!(
                        "invalid --load-api-env \"{}\": accepted values are host, npu, cuda, all",
                        other.escape_debug()
                    )))
                    }
                };
                api_env.push(ApiEnvRequest::Load(kind));
            }
            (Kind::UnloadApiEnv, _) => api_env.push(ApiEnvRequest::Unload),
            // Help and Version end the scan; value-taking kinds always carry a value.
            (Kind::Help | Kind::Version, _)
            | (Kind::Config(_) | Kind::InputPath | Kind::Pid | Kind::CommandWord, None) => {}
        }
    }

    if let Some(&request) = api_env.first() {
        let name = |r: ApiEnvRequest| match r {
            ApiEnvRequest::Load(_) => "--load-api-env",
            ApiEnvRequest::Unload => "--unload-api-env",
        };
        if let Some(other) = api_env.iter().find(|r| name(**r) != name(request)) {
            return Err(UsageError(format!(
                "{} cannot be combined with {}",
                name(request),
                name(*other)
            )));
        }
        let other_option = options
            .iter()
            .find(|o| !matches!(o.kind, Kind::LoadApiEnv | Kind::UnloadApiEnv));
        if let Some(other) = other_option {
            return Err(UsageError(format!(
                "{} cannot be combined with {}; it only edits the environment of the shell that sources msmemscope",
                name(request),
                other.spelled
            )));
        }
        if let Some(first) = program.first() {
            let first = first.to_string_lossy();
            let hint = if matches!(&*first, "host" | "npu" | "cuda" | "all") {
                format!("; did you mean --load-api-env={first}?")
            } else {
                String::new()
            };
            return Err(UsageError(format!(
                "{} takes no program, got \"{}\"{hint}",
                name(request),
                first.escape_debug()
            )));
        }
        return Ok((Command::ApiEnv(*api_env.last().unwrap_or(&request)), given));
    }

    if report && (pid.is_some() || compare) {
        return Err(UsageError(format!(
            "--report writes the page of the run it launches and cannot be combined with {}; for existing results run msmemscope report DIR",
            if compare { "--compare" } else { "--pid" }
        )));
    }
    if command_word.is_some() && pid.is_none() {
        return Err(UsageError("--command needs --pid PID".to_owned()));
    }
    if let Some(pid) = pid {
        if compare {
            return Err(UsageError(
                "--pid cannot be combined with --compare".to_owned(),
            ));
        }
        // The process's options were set when it started: one given here would be ignored.
        if let Some(ignored) = options
            .iter()
            .find(|o| matches!(o.kind, Kind::Config(_) | Kind::InputPath) || o.kind == Kind::Report)
        {
            return Err(UsageError(format!(
                "{} is not used with --pid: the running process keeps the options it started with",
                ignored.spelled
            )));
        }
        if let Some(word) = command_word.as_deref() {
            let word = word.trim();
            if !msmemscope_core::control_frame::COMMAND_WORDS.contains(&word) {
                return Err(UsageError(format!(
                    "unknown --command word {:?}; accepted: {}",
                    cut(word),
                    msmemscope_core::control_frame::COMMAND_WORDS.join(", ")
                )));
            }
        }
        if let Some(first) = program.first() {
            return Err(UsageError(format!(
                "--pid attaches to a running process and cannot be combined with launching \"{}\"",
                first.to_string_lossy().escape_debug()
            )));
        }
        return Ok((
            Command::Attach {
                pid,
                command: command_word,
            },
            given,
        ));
    }
    if compare {
        let Some(inputs) = input_paths else {
            return Err(UsageError(
                "--compare needs --input-path BASE,COMPARE".to_owned(),
            ));
        };
        if let Some(first) = program.first() {
            return Err(UsageError(format!(
                "--compare reads two dumps and cannot be combined with launching \"{}\"",
                first.to_string_lossy().escape_debug()
            )));
        }
        return Ok((Command::Compare { config, inputs }, given));
    }
    if input_paths.is_some() {
        return Err(UsageError("--input-path needs --compare".to_owned()));
    }
    if program.is_empty() {
        return Err(UsageError(
            "no program to launch; usage: msmemscope [options] <program> [args...]; run msmemscope --help for the accepted options"
                .to_owned(),
        ));
    }
    resolve(&mut config, &given)?;
    Ok((
        Command::Launch {
            config,
            program,
            report,
        },
        given,
    ))
}

/// What this build can run, stated in `--help`; edited together with [`refuse_unavailable`].
pub(super) const AVAILABILITY: &str =
    "--analysis=host-leaks, the event dump (--analysis=none) and the \
leaks, decompose, oom and inefficient analyses launch with every dump option; --pid attaches to a \
running process; --compare diffs two dumps; --watch checksums (or dumps) watched blocks before and \
after every op of its range.";

/// The capability gate: everything this build parses and validates but cannot run yet. It is
/// the last stage, so a bad value is always reported as such first. Each later feature deletes
/// its lines here (and updates [`AVAILABILITY`]).
pub(super) fn refuse_unavailable(command: &Command) -> Result<(), UsageError> {
    let config = match command {
        Command::Help(_)
        | Command::Version(_)
        | Command::ApiEnv(_)
        | Command::Attach { .. }
        | Command::Compare { .. } => return Ok(()),
        Command::Launch { config, .. } => config,
    };
    // Every analysis runs in this build, and --watch.
    let _ = config;
    Ok(())
}
