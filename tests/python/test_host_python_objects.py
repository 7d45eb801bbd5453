"""Host leaks of Python objects: CPython's own allocators are accounted too.

scripts/record_growth.py keeps 2,000 dicts a step in a list, churns temporary strings and fills
a cache once. Under ``msmemscope --analysis=host-leaks`` the leaking line is the top site, its
bytes within 10% of what tracemalloc (the standard library's tracer, run in the same program)
reports for that line; the cache's line is resident with tracemalloc's bytes; the temporaries
are not reported. scripts/mixed_leaks.py leaks through a C extension and through a list in one
program: both sites, each with its Python line. ``--python-objects=off`` and an interpreter
started without ``site`` say what was not tracked. Run with the project's interpreter and with
one other CPython version where the machine has one.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import CLI, RUNTIME_LIB, build_leaker, clean_env, interpreter

HERE = Path(__file__).resolve().parent
RECORDS = HERE / "scripts" / "record_growth.py"
MIXED = HERE / "scripts" / "mixed_leaks.py"

pytestmark = pytest.mark.skipif(not CLI.is_file(), reason=f"{CLI} is not built (scripts/setup.sh)")


def interpreters() -> list[Path]:
    found = [Path(sys.executable)]
    other = interpreter("3.13") or interpreter("3.12")
    if other is not None:
        found.append(other)
    return found


def line_of(script: Path, marker: str) -> int:
    """The line of `script` that ends with the comment `marker`."""
    lines = script.read_text().splitlines()
    return next(n for n, line in enumerate(lines, 1) if line.rstrip().endswith(f"# {marker}"))


def run_host_leaks(
    tmp: Path, python: Path, script: Path, *options: str, python_flags: tuple[str, ...] = ()
) -> tuple[str, dict[str, Any]]:
    """Runs a copy of `script` with `python` under the CLI's host-leak analysis; returns the
    overview's text and the sites file (leak_sites_1.json)."""
    shutil.copy(script, tmp / script.name)
    cmd = [str(CLI), "--analysis=host-leaks", *options, "-o", "out"]
    cmd += [str(python), *python_flags, script.name]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=180, cwd=tmp, env=clean_env()
    )
    assert proc.returncode == 0, proc.stderr
    (overview,) = tmp.glob("out/msmemscope_*/host_leak/leak_overview_1.txt")
    (sites,) = tmp.glob("out/msmemscope_*/host_leak/leak_sites_1.json")
    return overview.read_text(), json.loads(sites.read_text())


def innermost(site: dict[str, Any]) -> str:
    frames: list[str] = site["python_frames"]
    return frames[0] if frames else ""


@pytest.mark.parametrize(
    "python", interpreters(), ids=lambda p: f"python{p.name.removeprefix('python')}"
)
def test_a_growing_list_of_records_is_the_top_site_as_tracemalloc_measures_it(
    python: Path, tmp_path: Path
) -> None:
    oracle_dir = tmp_path / "oracle"
    oracle_dir.mkdir()
    shutil.copy(RECORDS, oracle_dir / RECORDS.name)
    subprocess.run(
        [str(python), RECORDS.name, "--tracemalloc", "lines.json"],
        cwd=oracle_dir,
        env=clean_env(),
        check=True,
        capture_output=True,
    )
    oracle = json.loads((oracle_dir / "lines.json").read_text())

    overview, sites = run_host_leaks(tmp_path, python, RECORDS)
    script = str(tmp_path / RECORDS.name)
    leak_line = line_of(RECORDS, "the leak")
    cache_line = line_of(RECORDS, "the cache: filled once, kept")
    temp_line = line_of(RECORDS, "temporaries: dropped each step")

    top = sites["sites"][0]
    assert top["domain"] == "pymalloc", overview
    assert innermost(top) == f"{script}({leak_line}): make_record", overview
    assert top["class"] == "suspected_leak", overview
    expected_bytes, expected_blocks = oracle[str(leak_line)]
    assert abs(top["unfreed"]["bytes"] - expected_bytes) <= expected_bytes * 0.10, (
        top["unfreed"],
        oracle,
    )
    assert abs(top["unfreed"]["count"] - expected_blocks) <= expected_blocks * 0.10
    assert f"[stack {top['stack_id']}, pymalloc]" in overview

    # The cache that fills once and stays is resident, with the bytes tracemalloc sees.
    cache = [s for s in sites["resident"] if innermost(s) == f"{script}({cache_line}): fill_cache"]
    assert len(cache) == 1, overview
    cache_bytes, cache_blocks = oracle[str(cache_line)]
    assert abs(cache[0]["unfreed"]["bytes"] - cache_bytes) <= cache_bytes * 0.10, cache[0]
    assert abs(cache[0]["unfreed"]["count"] - cache_blocks) <= cache_blocks * 0.10

    # The temporaries were freed each step: they are not reported as a leak. (CPython 3.13 keeps
    # a few of the objects it frees on its own free lists, which a site may show as a dozen
    # unfreed blocks of its hundreds of thousands.)
    temp = f"{script}({temp_line}): churn"
    assert str(temp_line) not in oracle
    for s in sites["sites"] + sites["resident"]:
        if innermost(s) == temp:
            assert s["class"] != "suspected_leak", overview
            assert s["unfreed"]["bytes"] * 100 < s["allocated"]["bytes"], overview
    assert "\nPython objects: tracked (pymalloc, the interpreter's own allocators): " in overview


def test_a_c_extension_leak_and_a_python_object_leak_in_one_program(tmp_path: Path) -> None:
    python = Path(sys.executable)
    build_leaker(python, tmp_path)
    overview, sites = run_host_leaks(tmp_path, python, MIXED)
    script = str(tmp_path / MIXED.name)
    c_line = f"{script}({line_of(MIXED, 'the C-extension leak')}): buffer_frames"
    py_line = f"{script}({line_of(MIXED, 'the Python-object leak')}): remember"

    (c_site,) = [s for s in sites["sites"] if innermost(s) == c_line]
    assert c_site["domain"] == "malloc"
    assert c_site["frames"][0].startswith("leak "), c_site
    assert c_site["unfreed"] == {"count": 50, "bytes": 200_000}
    assert c_site["class"] == "suspected_leak", overview

    (py_site,) = [s for s in sites["sites"] if innermost(s) == py_line]
    assert py_site["domain"] == "pymalloc"
    assert py_site["frames"] == []
    # 5,000 dicts, each one object (a dict's small key table is part of it up to 3.12, a block
    # of its own in 3.11 for dicts built from a display): at least one block each.
    assert py_site["unfreed"]["count"] >= 5000, py_site
    assert py_site["class"] == "suspected_leak", overview
    assert {sites["sites"][0]["stack_id"], sites["sites"][1]["stack_id"]} == {
        c_site["stack_id"],
        py_site["stack_id"],
    }, overview


def test_python_objects_can_be_turned_off(tmp_path: Path) -> None:
    overview, sites = run_host_leaks(
        tmp_path, Path(sys.executable), RECORDS, "--python-objects=off"
    )
    assert "\nPython objects: off (--python-objects=off, or no Python frames with" in overview
    assert all(s["domain"] == "malloc" for s in sites["sites"] + sites["resident"]), overview
    assert ", pymalloc]" not in overview


def test_an_interpreter_started_without_site_says_its_objects_were_not_tracked(
    tmp_path: Path,
) -> None:
    overview, sites = run_host_leaks(tmp_path, Path(sys.executable), RECORDS, python_flags=("-S",))
    assert "\nPython objects: NOT tracked: the interpreter did not load msmemscope's" in overview
    assert all(s["domain"] == "malloc" for s in sites["sites"] + sites["resident"])


def test_a_window_opened_from_python_accounts_python_objects(tmp_path: Path) -> None:
    code = f"""
import msmemscope
msmemscope.config(analysis="host-leaks", output_path={str(tmp_path / "out")!r})
msmemscope.start()
kept = [{{"n": i % 10}} for i in range(3000)]  # kept
msmemscope.stop()
"""
    script = tmp_path / "api_window.py"
    script.write_text(code)
    proc = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        env=clean_env(LD_PRELOAD=str(RUNTIME_LIB)),
    )
    assert proc.returncode == 0, proc.stderr
    (path,) = tmp_path.glob("out/msmemscope_*/host_leak/leak_sites_1.json")
    sites = json.loads(path.read_text())
    line = f"{script}({line_of(script, 'kept')}): <listcomp>"
    if sys.version_info >= (3, 12):  # comprehensions are inlined
        line = f"{script}({line_of(script, 'kept')}): <module>"
    found = [s for s in sites["sites"] + sites["resident"] if innermost(s) == line]
    assert [s["domain"] for s in found] == ["pymalloc"], sites
    assert found[0]["unfreed"]["count"] >= 3000
