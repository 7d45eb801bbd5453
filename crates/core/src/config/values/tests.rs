use super::*;
use crate::config::NameStyle;

fn err(result: Result<impl fmt::Debug, ConfigError>) -> String {
    result.expect_err("the value must be rejected").to_string()
}

#[test]
fn log_level() {
    assert_eq!(parse_log_level("warning"), Ok(LogLevel::Warning));
    assert_eq!(
        err(parse_log_level("warn")),
        "invalid --log-level \"warn\": accepted values are debug, info, warning, error"
    );
}

#[test]
fn events_lists() {
    use EventKind::*;
    assert_eq!(parse_events("alloc,free"), Ok(vec![Alloc, Free]));
    assert_eq!(parse_events("launch，alloc"), Ok(vec![Alloc, Launch]));
    assert_eq!(parse_events("access"), Ok(vec![Alloc, Free, Access]));
    assert_eq!(parse_events("free, free ,alloc"), Ok(vec![Alloc, Free]));
    assert_eq!(parse_events("none"), Ok(vec![]));
    assert_eq!(parse_events("none,none"), Ok(vec![]));
    assert_eq!(
        err(parse_events("none,alloc")),
        "invalid --events \"none,alloc\": none cannot be combined with other events; \
         accepted values are a list of alloc, free, launch, access (access implies alloc and free), or none alone"
    );
    assert!(err(parse_events("alloc,,free")).contains("the list has an empty item"));
    assert!(err(parse_events("")).contains("the value is empty"));
    assert!(err(parse_events("alloc,malloc")).contains("unknown item \"malloc\""));
}

#[test]
fn level_and_modes() {
    assert_eq!(parse_level("kernel"), Ok(Level::Kernel));
    assert_eq!(
        err(parse_level("foo")),
        "invalid --level \"foo\": accepted values are op, kernel"
    );
    assert_eq!(parse_collect_mode("deferred"), Ok(CollectMode::Deferred));
    assert!(parse_collect_mode("later").is_err());
    assert_eq!(parse_format("db"), Ok(DataFormat::Db));
    assert_eq!(parse_format("parquet"), Ok(DataFormat::Parquet));
    assert!(parse_format("CSV").is_err());
    assert_eq!(parse_host_leak_mode("event"), Ok(HostLeakMode::Event));
    assert!(parse_host_leak_mode("events").is_err());
}

#[test]
fn steps() {
    assert_eq!(parse_steps("3,1"), Ok(vec![1, 3]));
    assert_eq!(parse_steps("1，2，3，4，5"), Ok(vec![1, 2, 3, 4, 5]));
    assert_eq!(parse_steps("2,2,2,2,2,2"), Ok(vec![2]));
    assert_eq!(parse_steps("4294967295"), Ok(vec![u32::MAX]));
    assert!(err(parse_steps("1,2,3,4,5,6")).contains("6 steps given, at most 5 allowed"));
    assert!(err(parse_steps("0")).contains("step numbers start at 1"));
    assert!(err(parse_steps("-1")).contains("invalid --steps \"-1\""));
    assert!(err(parse_steps("+1")).contains("invalid --steps"));
    assert!(err(parse_steps("4294967296")).contains("invalid --steps"));
    assert!(err(parse_steps("1,x")).contains("unknown item \"x\""));
}

#[test]
fn call_stack() {
    let cs = |c, python| CallStack { c, python };
    assert_eq!(parse_call_stack("c"), Ok(cs(Some(50), None)));
    assert_eq!(parse_call_stack("python:0"), Ok(cs(None, Some(0))));
    assert_eq!(
        parse_call_stack("c:1000，python:7"),
        Ok(cs(Some(1000), Some(7)))
    );
    assert_eq!(parse_call_stack("c,c:50"), Ok(cs(Some(50), None)));
    assert!(err(parse_call_stack("c:1001")).contains("depth \"1001\" of c"));
    assert!(err(parse_call_stack("c:-1")).contains("is not a number from 0 to 1000"));
    assert!(err(parse_call_stack("c:")).contains("invalid --call-stack"));
    assert!(err(parse_call_stack("c:1,c:2")).contains("c is given twice"));
    assert!(err(parse_call_stack("java")).contains("invalid --call-stack \"java\""));
}

#[test]
fn devices() {
    use Device::*;
    assert_eq!(
        parse_devices("cpu,cuda:1,npu:2"),
        Ok(vec![Cpu, CudaIndex(1), CudaIndex(2)])
    );
    assert_eq!(parse_devices("npu，cuda"), Ok(vec![Cuda]));
    assert!(err(parse_devices("gpu")).contains("invalid --device \"gpu\""));
    assert!(err(parse_devices("cuda:x")).contains("device index \"x\""));
    assert!(err(parse_devices("cpu,cpu:0")).contains("unknown item \"cpu:0\""));
}

#[test]
fn analysis() {
    use Analysis::*;
    assert_eq!(parse_analysis("leaks"), Ok(vec![Leaks]));
    assert_eq!(parse_analysis("oom"), Ok(vec![Oom(10)]));
    assert_eq!(parse_analysis("oom:30,leaks"), Ok(vec![Oom(30), Leaks]));
    assert_eq!(
        parse_analysis("decompose，inefficient,decompose"),
        Ok(vec![Decompose, Inefficient])
    );
    assert_eq!(parse_analysis("host-leaks"), Ok(vec![HostLeaks]));
    assert_eq!(parse_analysis("none"), Ok(vec![]));
    assert!(err(parse_analysis("oom:0")).contains("K \"0\" of oom is not a number from 1 to 1000"));
    assert!(err(parse_analysis("oom:1001")).contains("from 1 to 1000"));
    assert!(err(parse_analysis("oom:1,oom:2")).contains("different K"));
    assert!(err(parse_analysis("host-leaks,leaks"))
        .contains("host-leaks cannot be combined with other analyses"));
    assert!(err(parse_analysis("none,leaks")).contains("none cannot be combined"));
    assert!(
        err(parse_analysis("leak")).starts_with("invalid --analysis \"leak\": accepted values are")
    );
}

#[test]
fn watch() {
    assert_eq!(
        parse_watch("aten::add.Tensor:1,aten::mul"),
        Ok(WatchSpec {
            start: "aten::add.Tensor".into(),
            outid: Some(1),
            end: "aten::mul".into(),
            full_content: false,
        })
    );
    assert_eq!(
        parse_watch("token0/layer0/module0/op0，token0/layer0/module0/op1,full-content"),
        Ok(WatchSpec {
            start: "token0/layer0/module0/op0".into(),
            outid: None,
            end: "token0/layer0/module0/op1".into(),
            full_content: true,
        })
    );
    let spec = parse_watch("a:b::c:12,d").unwrap();
    assert_eq!((spec.start.as_str(), spec.outid), ("a:b::c", Some(12)));
    let spec = parse_watch("aten::add,aten::mul").unwrap();
    assert_eq!((spec.start.as_str(), spec.outid), ("aten::add", None));
    assert!(err(parse_watch("aten::add")).contains("the end op is missing"));
    assert!(err(parse_watch("a,b,full")).contains("the third field must be full-content"));
    assert!(err(parse_watch("a,b,full-content,x")).contains("more than three fields"));
    assert!(err(parse_watch("op:x,b")).contains("outid \"x\" after the last ':'"));
    assert!(err(parse_watch(":1,b")).contains("the start op name is empty"));
    assert!(err(parse_watch("a,")).contains("empty item"));
    assert_eq!(
        parse_watch("aten::add.Tensor:1,aten::mul,full-content")
            .unwrap()
            .to_string(),
        "aten::add.Tensor:1,aten::mul,full-content"
    );
}

#[test]
fn dump_budgets() {
    assert_eq!(parse_dump_budget("unlimited"), Ok(None));
    assert_eq!(parse_dump_budget("UNLIMITED"), Ok(None));
    assert_eq!(parse_dump_budget("256MiB"), Ok(Some(256 << 20)));
    assert_eq!(parse_dump_budget("2G"), Ok(Some(2_000_000_000)));
    assert_eq!(parse_dump_budget("1048576"), Ok(Some(1 << 20)));
    assert_eq!(parse_dump_budget("4 kib").ok(), None, "below 1MiB");
    for bad in ["", "MiB", "1.5GiB", "-1", "10TB", "99999999999999999999GiB"] {
        assert!(parse_dump_budget(bad).is_err(), "{bad}");
    }
    let e = parse_dump_budget("1000").unwrap_err();
    assert_eq!(
        e.render(NameStyle::Cli),
        "invalid --dump-budget \"1000\": less than 1MiB; accepted values are a size of at \
         least 1MiB (bytes, or with K, M, G, KiB, MiB, GiB: 256MiB, 2G), or unlimited (keep every row)"
    );
}

#[test]
fn numbers() {
    assert_eq!(parse_block_size_threshold("0"), Ok(0));
    assert_eq!(
        parse_block_size_threshold("18446744073709551615"),
        Ok(u64::MAX)
    );
    assert!(parse_block_size_threshold("-1").is_err());
    assert!(parse_block_size_threshold("1k").is_err());
    let rate = |requested, effective| {
        Ok(SampleRate {
            requested,
            effective,
        })
    };
    assert_eq!(parse_sample_rate("1"), rate(1, 1));
    assert_eq!(parse_sample_rate("3"), rate(3, 4));
    assert_eq!(parse_sample_rate("1024"), rate(1024, 1024));
    assert_eq!(parse_sample_rate("1073741824"), rate(1 << 30, 1 << 30));
    assert_eq!(parse_sample_rate("2147483648"), rate(1 << 31, 1 << 30));
    assert_eq!(
        parse_sample_rate("18446744073709551615"),
        rate(u64::MAX, 1 << 30)
    );
    assert!(err(parse_sample_rate("0")).contains("0 is not a rate"));
    assert!(parse_sample_rate("-4").is_err());
    assert_eq!(parse_sample_bytes("0"), Ok(0));
    assert_eq!(parse_sample_bytes("524288"), Ok(524288));
    assert_eq!(parse_sample_bytes("1099511627776"), Ok(1 << 40));
    assert!(err(parse_sample_bytes("1099511627777")).contains("more than 2^40"));
    assert!(err(parse_sample_bytes("512k")).starts_with("invalid --sample-bytes \"512k\""));
    assert_eq!(parse_pid("1234"), Ok(1234));
    assert!(parse_pid("0").is_err());
    assert!(parse_pid("-5").is_err());
    assert!(parse_pid("99999999999").is_err());
}

#[test]
fn paths() {
    assert_eq!(parse_output_path("./out"), Ok(PathBuf::from("./out")));
    assert!(err(parse_output_path("")).contains("the value is empty"));
    assert_eq!(
        parse_input_paths("a.csv，b.db"),
        Ok([PathBuf::from("a.csv"), PathBuf::from("b.db")])
    );
    assert!(err(parse_input_paths("a.csv")).contains("1 paths given"));
    assert!(err(parse_input_paths("a,b,c")).contains("3 paths given"));
}

#[test]
fn python_spelling_and_aliases() {
    let e = parse_level("foo").unwrap_err();
    assert_eq!(
        e.render(NameStyle::Python),
        "invalid level \"foo\": accepted values are op, kernel"
    );
    let mut config = RunConfig::default();
    let e = set_option(&mut config, OptionName::DataFormat, "xml").unwrap_err();
    assert_eq!(
        e.to_string(),
        "invalid --data-format \"xml\": accepted values are csv, db, parquet"
    );
    assert_eq!(
        e.render(NameStyle::Python),
        "invalid data_format \"xml\": accepted values are csv, db, parquet"
    );
    assert_eq!(
        OptionName::from_python_key("data_format"),
        Some(OptionName::DataFormat)
    );
    assert_eq!(OptionName::from_python_key("pid"), None);
    assert_eq!(
        set_option(&mut config, OptionName::Pid, "1")
            .unwrap_err()
            .to_string(),
        "--pid is not a run configuration option"
    );
}

#[test]
fn messages_stay_on_one_line() {
    let message = err(parse_level("op\nkernel"));
    assert_eq!(
        message,
        "invalid --level \"op\\nkernel\": accepted values are op, kernel"
    );
}

#[test]
fn set_option_fills_fields() {
    let mut config = RunConfig::default();
    set_option(&mut config, OptionName::SampleRate, "5").unwrap();
    assert_eq!((config.sample_rate_requested, config.sample_rate), (5, 8));
    set_option(&mut config, OptionName::Format, "db").unwrap();
    assert_eq!(config.format, DataFormat::Db);
    set_option(&mut config, OptionName::Watch, "a,b").unwrap();
    assert!(config.watch.is_some());
}

fn config_with(options: &[(OptionName, &str)]) -> (RunConfig, GivenOptions) {
    let mut config = RunConfig::default();
    let mut given = GivenOptions::new();
    for (option, value) in options {
        set_option(&mut config, *option, value).unwrap();
        given.insert(*option);
    }
    (config, given)
}

fn resolved(options: &[(OptionName, &str)]) -> Result<RunConfig, ConfigError> {
    let (mut config, given) = config_with(options);
    resolve(&mut config, &given).map(|()| config)
}

#[test]
fn steps_switch_analyses_off() {
    let config = resolved(&[(OptionName::Steps, "1,2")]).unwrap();
    assert_eq!(config.analysis, vec![]);
    let config = resolved(&[(OptionName::Steps, "1"), (OptionName::Analysis, "none")]).unwrap();
    assert_eq!(config.analysis, vec![]);
    assert_eq!(
        resolved(&[(OptionName::Steps, "1,2"), (OptionName::Analysis, "leaks")])
            .unwrap_err()
            .to_string(),
        "--steps=1,2 switches the analyses off and cannot be combined with --analysis=leaks"
    );
    assert_eq!(
        resolved(&[
            (OptionName::Steps, "1"),
            (OptionName::Analysis, "host-leaks")
        ])
        .unwrap_err()
        .render(NameStyle::Python),
        "steps=\"1\" switches the analyses off and cannot be combined with analysis=\"host-leaks\""
    );
    // Without analyses, events need not include alloc and free.
    assert!(resolved(&[(OptionName::Steps, "1"), (OptionName::Events, "launch")]).is_ok());
}

#[test]
fn analyses_need_alloc_and_free() {
    assert_eq!(
        resolved(&[(OptionName::Events, "launch")])
            .unwrap_err()
            .to_string(),
        "--analysis=leaks needs alloc and free events, which are missing from --events=launch"
    );
    assert_eq!(
        resolved(&[
            (OptionName::Events, "alloc"),
            (OptionName::Analysis, "inefficient")
        ])
        .unwrap_err()
        .to_string(),
        "--analysis=inefficient needs alloc and free events, which are missing from --events=alloc"
    );
    assert!(resolved(&[
        (OptionName::Events, "none"),
        (OptionName::Analysis, "decompose")
    ])
    .unwrap_err()
    .to_string()
    .ends_with("--events=none"));
    assert!(resolved(&[
        (OptionName::Events, "access"),
        (OptionName::Analysis, "leaks")
    ])
    .is_ok());
    // host-leaks does not read the event stream, and says so rather than ignore --events.
    assert_eq!(
        resolved(&[
            (OptionName::Events, "launch"),
            (OptionName::Analysis, "host-leaks")
        ])
        .unwrap_err()
        .to_string(),
        "--analysis=host-leaks records host heap blocks, not the event dump, and does not take --events"
    );
}

#[test]
fn oom_turns_alloc_and_free_on() {
    use EventKind::*;
    let config = resolved(&[
        (OptionName::Events, "launch"),
        (OptionName::Analysis, "oom:5"),
    ])
    .unwrap();
    assert_eq!(config.events, vec![Alloc, Free, Launch]);
    assert_eq!(config.analysis, vec![Analysis::Oom(5)]);
}

#[test]
fn sampling_is_by_count_or_by_bytes() {
    let config = resolved(&[(OptionName::SampleBytes, "524288")]).unwrap();
    assert_eq!(config.sample_bytes, 524288);
    assert!(resolved(&[
        (OptionName::SampleBytes, "0"),
        (OptionName::SampleRate, "8")
    ])
    .is_ok());
    assert_eq!(
        resolved(&[
            (OptionName::SampleBytes, "4096"),
            (OptionName::SampleRate, "8")
        ])
        .unwrap_err()
        .to_string(),
        "--sample-bytes=4096 samples by bytes and cannot be combined with --sample-rate=8"
    );
}

#[test]
fn host_leaks_excludes_watch_and_other_analyses() {
    assert_eq!(
        resolved(&[
            (OptionName::Analysis, "host-leaks"),
            (OptionName::Watch, "a:1,b")
        ])
        .unwrap_err()
        .to_string(),
        "--analysis=host-leaks cannot be combined with --watch=a:1,b"
    );
    let mut config = RunConfig {
        analysis: vec![Analysis::HostLeaks, Analysis::Leaks],
        ..RunConfig::default()
    };
    assert!(resolve(&mut config, &GivenOptions::new())
        .unwrap_err()
        .to_string()
        .contains("host-leaks cannot be combined with other analyses"));
}
