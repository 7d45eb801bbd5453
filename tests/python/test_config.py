"""msmemscope.config(**kw) validation, through the extension's validate_config (core's parsers)."""

from __future__ import annotations

import json

import pytest

from msmemscope import _native


def apply(**kw: object) -> dict:
    return json.loads(_native.validate_config(_native.default_config(), **kw))


# (key, a bad value, a fragment of the accepted values the message must list)
BAD_VALUES = [
    ("level", "foo", "op, kernel"),
    ("events", "alloc,malloc", "alloc, free, launch, access"),
    ("events", "none,alloc", "none alone"),
    ("call_stack", "c:1001", "depth N from 0 to 1000"),
    ("call_stack", "java", "c[:N], python[:N]"),
    ("device", "gpu", "cpu, cuda, cuda:N"),
    ("format", "xml", "csv, db, parquet"),
    ("data_format", "xml", "csv, db, parquet"),
    ("output_path", "", "a non-empty directory path"),
    ("analysis", "leak", "leaks, decompose, inefficient, oom[:K]"),
    ("analysis", "oom:0", "K from 1 to 1000"),
    ("analysis", "host-leaks,leaks", "host-leaks alone"),
    ("watch", "aten::add", "start[:outid],end[,full-content]"),
    ("host_leak_mode", "full", "summary, event"),
    ("block_size_threshold", "-1", "a byte count"),
    ("block_size_threshold", "1k", "a byte count"),
    ("sample_rate", "0", "a positive integer"),
    ("sample_bytes", "512k", "a byte count from 0 (exact, every block)"),
    ("log_level", "loud", "debug, info, warning, error"),
    ("steps", "1,2,3,4,5,6", "1 to 5 positive step numbers"),
    ("collect_mode", "lazy", "immediate, deferred"),
]


@pytest.mark.parametrize(("key", "value", "accepted"), BAD_VALUES)
def test_bad_value_names_key_and_accepted_values(key: str, value: str, accepted: str) -> None:
    with pytest.raises(ValueError) as info:
        apply(**{key: value})
    message = str(info.value)
    assert message.startswith(f'invalid {key} "{value}": '), message
    assert "accepted values are" in message and accepted in message, message
    assert "\n" not in message


def test_unknown_key_lists_accepted_keys() -> None:
    with pytest.raises(ValueError) as info:
        apply(levle="op")
    message = str(info.value)
    assert message.startswith('unknown config key "levle": accepted keys are '), message
    for key in ("call_stack", "level", "events", "device", "format", "data_format"):
        assert key in message
    for key in ("output_path", "analysis", "watch", "host_leak_mode", "block_size_threshold"):
        assert key in message
    assert "sample_rate" in message


@pytest.mark.parametrize("key", ["pid", "input_path"])
def test_keys_that_configure_no_run_are_unknown(key: str) -> None:
    with pytest.raises(ValueError, match="unknown config key"):
        apply(**{key: "1"})


@pytest.mark.parametrize(
    ("key", "value"),
    [("level", 1), ("block_size_threshold", 1024), ("sample_rate", 2), ("events", ["alloc"])],
)
def test_non_string_value_is_type_error_naming_key(key: str, value: object) -> None:
    with pytest.raises(TypeError) as info:
        apply(**{key: value})
    message = str(info.value)
    assert message.startswith(f"{key} must be a str"), message
    assert type(value).__name__ in message


def test_analysis_accepts_a_list_or_tuple_of_str() -> None:
    assert apply(analysis=["host-leaks"])["analysis"] == ["host-leaks"]
    assert apply(analysis=("leaks", "decompose"))["analysis"] == ["leaks", "decompose"]
    assert apply(analysis="oom:5")["analysis"] == [{"oom": 5}]


def test_analysis_list_items_must_be_str() -> None:
    with pytest.raises(TypeError, match="analysis: every item must be a str, got int"):
        apply(analysis=["leaks", 3])
    with pytest.raises(TypeError, match="analysis must be a str or a list of str"):
        apply(analysis={"leaks"})


def test_full_width_comma_separates_items() -> None:
    wide = "\uff0c"  # the full-width comma of Chinese keyboards
    config = apply(
        events=f"alloc{wide}free", device=f"cpu{wide}cuda:1", analysis=f"leaks{wide}decompose"
    )
    assert config["events"] == ["alloc", "free"]
    assert config["devices"] == ["cpu", {"cudaindex": 1}]
    assert config["analysis"] == ["leaks", "decompose"]


def test_values_are_applied_and_resolved() -> None:
    config = apply(
        call_stack="c:10,python", sample_rate="3", block_size_threshold="1024", data_format="db"
    )
    assert config["call_stack"] == {"c": 10, "python": 50}
    assert (config["sample_rate_requested"], config["sample_rate"]) == (3, 4)
    assert config["block_size_threshold"] == 1024
    assert config["format"] == "db"
    # oom turns alloc and free on by itself.
    assert apply(events="launch", analysis="oom")["events"] == ["alloc", "free", "launch"]


def test_cross_option_rules_use_python_spelling() -> None:
    with pytest.raises(ValueError) as info:
        apply(analysis="host-leaks", watch="a,b")
    assert str(info.value) == 'analysis="host-leaks" cannot be combined with watch="a,b"'
    with pytest.raises(ValueError) as info:
        apply(events="launch")
    assert str(info.value) == (
        'analysis="leaks" needs alloc and free events, which are missing from events="launch"'
    )
    assert apply(analysis="host-leaks", sample_bytes="524288")["sample_bytes"] == 524288
    with pytest.raises(ValueError) as info:
        apply(sample_bytes="4096", sample_rate="8")
    assert str(info.value) == (
        'sample_bytes="4096" samples by bytes and cannot be combined with sample_rate="8"'
    )


def test_applies_to_the_current_config() -> None:
    current = _native.validate_config(_native.default_config(), analysis="none")
    # Without analyses, events need not include alloc and free.
    assert json.loads(_native.validate_config(current, events="launch"))["events"] == ["launch"]
    with pytest.raises(ValueError, match="the current configuration is invalid"):
        _native.validate_config("{}", level="op")


def test_no_keys_returns_the_config_unchanged() -> None:
    assert json.loads(_native.validate_config(_native.default_config())) == json.loads(
        _native.default_config()
    )


def test_event_codes_match_core() -> None:
    assert (_native.EVENT_MALLOC, _native.EVENT_FREE, _native.EVENT_MSTX) == (1, 2, 6)
    assert _native.EVENT_OP_LAUNCH == 4 and _native.EVENT_OOM_DETAIL == 9
    assert (_native.TYPE_HAL, _native.TYPE_PTA, _native.TYPE_HOST) == (1, 2, 3)
    assert (_native.TYPE_MARK, _native.TYPE_RANGE_START, _native.TYPE_RANGE_END) == (10, 11, 12)
    assert _native.TYPE_OOM_TOP_ALLOC == 19
    assert _native.abi_version() == _native.ABI_VERSION
