"""Trainer callbacks (msmemscope.integrations) on real trainers under the real CLI.

A tiny GPT-2 trained by ``transformers.Trainer`` and an MLP trained by a Lightning ``Trainer``,
each 24 micro-batches with gradient accumulation 2: the dump has one STEP row per optimizer
step (12), the ``train``/``eval``/``save`` phases are MSTX ranges, and the trainer's own log
carries the running findings: the leaking line's site in the leaking run, zero in the clean
one, matching what ``leaks/findings.json`` and ``leaks/peak.json`` say at exit.
"""

from __future__ import annotations

import csv
import glob
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import NEEDS_CLI_AND_TORCH, run_command_under_cli, run_python

pytestmark = NEEDS_CLI_AND_TORCH

SCRIPTS = Path(__file__).resolve().parent / "scripts"
HF = SCRIPTS / "hf_trainer_callback.py"
LIGHTNING = SCRIPTS / "lightning_callback.py"
KEYS = ("msmemscope/leak_sites", "msmemscope/leak_bytes_per_step", "msmemscope/peak_bytes")


def _leak_line(script: Path) -> int:
    lines = script.read_text().splitlines()
    return next(n for n, text in enumerate(lines, 1) if text.endswith("# LEAK"))


def _printed(stdout: str, tag: str) -> object:
    (line,) = [line for line in stdout.splitlines() if line.startswith(tag + " ")]
    return json.loads(line[len(tag) + 1 :])


def _run(tmp_path: Path, script: Path, mode: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    proc, out = run_command_under_cli(
        tmp_path, sys.executable, str(script), mode, str(tmp_path / "ckpt")
    )
    (run,) = glob.glob(str(out / "*" / "leaks"))
    return proc, Path(run).parent


def _dump_rows(run: Path) -> list[dict[str, str]]:
    (dump,) = glob.glob(str(run / "device_cpu" / "dump" / "*.csv"))
    with open(dump, newline="") as f:
        return list(csv.DictReader(f))


def _check_dump(run: Path, phases: set[str]) -> None:
    rows = _dump_rows(run)
    steps = [r["Name"] for r in rows if (r["Event"], r["Event Type"]) == ("SYSTEM", "STEP")]
    assert steps == [str(n) for n in range(1, 13)], steps  # one per optimizer step
    starts = [r["Name"] for r in rows if (r["Event"], r["Event Type"]) == ("MSTX", "Range_start")]
    ends = [r["Name"] for r in rows if (r["Event"], r["Event Type"]) == ("MSTX", "Range_end")]
    assert set(starts) == phases, starts
    assert sorted(starts) == sorted(ends)


def _file_findings(run: Path) -> tuple[dict, int]:
    findings = json.loads((run / "leaks" / "findings.json").read_text())
    peak = json.loads((run / "leaks" / "peak.json").read_text())
    return findings, peak["devices"][0]["peak"]["bytes"]


def _check_leak(run: Path, script: Path, found: dict, logged: list[dict]) -> None:
    line = _leak_line(script)
    findings, peak = _file_findings(run)
    (leak,) = findings["leaks"]
    assert (leak["file"], leak["line"]) == (str(script), line), leak
    # The callback's own findings at the end name the same line, growth and peak.
    assert found["available"] and found["steps"] == 12, found
    (site,) = found["leak_sites"]
    assert (site["file"], site["line"]) == (str(script), line), site
    assert site["bytes_per_step"] == leak["bytes_per_step"] > 0
    assert found["peak_bytes"] == peak
    # The trainer's log: no leak judged yet at the first log, then the site and its growth.
    with_keys = [entry for entry in logged if KEYS[0] in entry]
    assert len(with_keys) >= 3, logged
    assert with_keys[0]["msmemscope/leak_sites"] == 0
    last = with_keys[-1]
    assert last["msmemscope/leak_sites"] == 1
    assert last["msmemscope/leak_bytes_per_step"] == leak["bytes_per_step"]
    assert 0 < last["msmemscope/peak_bytes"] <= peak


def _check_clean(run: Path, found: dict, logged: list[dict]) -> None:
    findings, peak = _file_findings(run)
    assert findings["leaks"] == [], findings["leaks"]
    assert found["leak_sites"] == [] and found["leak_bytes_per_step"] == 0, found
    assert found["peak_bytes"] == peak
    with_keys = [entry for entry in logged if KEYS[0] in entry]
    assert len(with_keys) >= 3, logged
    for entry in with_keys:
        assert entry["msmemscope/leak_sites"] == entry["msmemscope/leak_bytes_per_step"] == 0
        assert entry["msmemscope/peak_bytes"] > 0


# --- Hugging Face transformers.Trainer -------------------------------------------------------
@pytest.fixture(scope="module")
def hf() -> None:
    pytest.importorskip("transformers")


def test_transformers_leaking_run(tmp_path: Path, hf: None) -> None:
    proc, run = _run(tmp_path, HF, "leak")
    assert _printed(proc.stdout, "GLOBAL_STEP") == 12
    _check_dump(run, {"train", "eval", "save"})
    history = _printed(proc.stdout, "LOG_HISTORY")
    assert isinstance(history, list)
    # The entries of the log steps (4, 8, 12) and the last summary carry the keys.
    assert [e["step"] for e in history if "loss" in e] == [4, 8, 12]
    assert all(KEYS[0] in e for e in history if "loss" in e), history
    found = _printed(proc.stdout, "FINDINGS")
    assert _printed(proc.stdout, "KEEP_PENDING") == []
    assert isinstance(found, dict)
    _check_leak(run, HF, found, history)
    # At the end of training: the leaking line and the peak on stderr.
    assert f"{HF}:{_leak_line(HF)} (keep_logits): +" in proc.stderr, proc.stderr
    assert "msmemscope: peak on device cpu:" in proc.stderr


def test_transformers_clean_run(tmp_path: Path, hf: None) -> None:
    proc, run = _run(tmp_path, HF, "clean")
    _check_dump(run, {"train", "eval", "save"})
    history = _printed(proc.stdout, "LOG_HISTORY")
    found = _printed(proc.stdout, "FINDINGS")
    assert _printed(proc.stdout, "KEEP_PENDING") == []
    assert isinstance(history, list) and isinstance(found, dict)
    _check_clean(run, found, history)
    assert "msmemscope: no leak sites after 12 step(s)" in proc.stderr


# --- PyTorch Lightning -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def lightning() -> None:
    try:
        import lightning.pytorch  # noqa: F401
    except ImportError:
        pytest.importorskip("pytorch_lightning")


def test_lightning_leaking_run(tmp_path: Path, lightning: None) -> None:
    proc, run = _run(tmp_path, LIGHTNING, "leak")
    assert _printed(proc.stdout, "GLOBAL_STEP") == 12
    _check_dump(run, {"train", "eval", "save"})
    metrics = _printed(proc.stdout, "METRICS")
    found = _printed(proc.stdout, "FINDINGS")
    assert _printed(proc.stdout, "KEEP_PENDING") == []
    assert isinstance(metrics, list) and isinstance(found, dict)
    _check_leak(run, LIGHTNING, found, metrics)
    assert f"{LIGHTNING}:{_leak_line(LIGHTNING)} (training_step): +" in proc.stderr


def test_lightning_clean_run(tmp_path: Path, lightning: None) -> None:
    proc, run = _run(tmp_path, LIGHTNING, "clean")
    _check_dump(run, {"train", "eval", "save"})
    metrics = _printed(proc.stdout, "METRICS")
    found = _printed(proc.stdout, "FINDINGS")
    assert _printed(proc.stdout, "KEEP_PENDING") == []
    assert isinstance(metrics, list) and isinstance(found, dict)
    _check_clean(run, found, metrics)


# --- without tracing ---------------------------------------------------------------------------
def test_untraced_callbacks_do_nothing_and_warn_once(hf: None) -> None:
    proc = run_python(
        """
        import sys, warnings
        import msmemscope.integrations
        assert not {"transformers", "lightning", "pytorch_lightning"} & set(sys.modules)
        from msmemscope.integrations.transformers import MsMemScopeCallback
        from transformers import TrainerControl, TrainerState, TrainingArguments

        cb = MsMemScopeCallback()
        state, control = TrainerState(), TrainerControl()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(3):
                cb.on_step_begin(None, state, control)
                logs = {"loss": 1.0}
                cb.on_log(None, state, control, logs=logs)
                assert logs == {"loss": 1.0}, logs
            cb.on_train_end(None, state, control)
        said = [str(w.message) for w in caught if "not tracing" in str(w.message)]
        assert len(said) == 1, said
        assert cb.findings is None and cb.tracer.steps_marked == 0
        print("OK")
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "OK"
