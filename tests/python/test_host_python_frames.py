"""Host leaks in a Python process name the Python lines that leak.

A C extension (tests/python/native/leaker.c, compiled here against the interpreter's headers)
leaks from ``leak(n)``; scripts/leaky_service.py calls it from two handlers, 150 and 50 times
over 3 s. Under ``msmemscope --analysis=host-leaks`` the two handlers are two sites, each
showing its Python frames above its C frames with exact counts and bytes, the block details
carry the Python stack, and the growing sites are classified from their beat series. Run with
the project's interpreter and with one other CPython version where the machine has one.
"""

from __future__ import annotations

import csv
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import CLI, build_leaker, clean_env, interpreter

HERE = Path(__file__).resolve().parent
SERVICE = HERE / "scripts" / "leaky_service.py"

pytestmark = pytest.mark.skipif(not CLI.is_file(), reason=f"{CLI} is not built (scripts/setup.sh)")


def line_of(text: str) -> int:
    """The line of leaky_service.py that is ``text`` (indentation aside)."""
    lines = SERVICE.read_text().splitlines()
    return next(n for n, line in enumerate(lines, 1) if line.strip() == text)


def other_python() -> Path | None:
    """A CPython 3.13 or 3.12 of this machine, for the second interpreter version."""
    return interpreter("3.13") or interpreter("3.12")


def interpreters() -> list[Path]:
    found = [Path(sys.executable)]
    other = other_python()
    if other is not None:
        found.append(other)
    return found


SITE = re.compile(r"^#R?\d+ \[stack \d+\] unfreed (\d+) blocks / (\d+) bytes;")


def sites(overview: str) -> list[tuple[int, int, str, list[str]]]:
    """(unfreed blocks, bytes, class line, frame lines) of each site, TOP N and resident."""
    found = []
    lines = overview.splitlines()
    for i, line in enumerate(lines):
        m = SITE.match(line)
        if m:
            frames = []
            for later in lines[i + 2 :]:
                if not later.startswith("    "):
                    break
                frames.append(later.strip())
            found.append((int(m[1]), int(m[2]), lines[i + 1].strip(), frames))
    return found


def run_service(tmp: Path, python: Path, *options: str, seconds: str = "3") -> str:
    """Runs leaky_service.py with `python` under the CLI's host-leak analysis (the extension
    built for it); returns the leak overview."""
    shutil.copy(SERVICE, tmp / SERVICE.name)
    build_leaker(python, tmp)
    cmd = [str(CLI), "--analysis=host-leaks", *options, "-o", "out"]
    cmd += [str(python), SERVICE.name, seconds]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=120, cwd=tmp, env=clean_env()
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "served 200 requests\n"
    (overview,) = tmp.glob("out/msmemscope_*/host_leak/leak_overview_1.txt")
    return overview.read_text()


@pytest.mark.parametrize(
    "python", interpreters(), ids=lambda p: f"python{p.name.removeprefix('python')}"
)
def test_two_python_callers_of_one_leaking_c_function_are_two_sites(
    python: Path, tmp_path: Path
) -> None:
    version = subprocess.run(
        [str(python), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    overview = run_service(tmp_path, python, "--host-leak-mode=event")
    script = str(tmp_path / SERVICE.name)  # the main script's path is made absolute
    upload = f"py {script}({line_of('leaker.leak(1500)')}): handle_upload"
    thumbnail = f"py {script}({line_of('leaker.leak(700)')}): handle_thumbnail"
    callers = {
        upload: f"py {script}({line_of('handle_upload()')}): main",
        thumbnail: f"py {script}({line_of('handle_thumbnail()')}): main",
    }
    module = f"py {script}({line_of('main()')}): <module>"

    found = {(blocks, size): (cls, frames) for blocks, size, cls, frames in sites(overview)}
    assert (150, 150 * 1500) in found and (50, 50 * 700) in found, f"Python {version}\n{overview}"
    for key, first in (((150, 225000), upload), ((50, 35000), thumbnail)):
        cls, frames = found[key]
        # Innermost first: the extension's C frame that called malloc, then the Python frames
        # that called it (the interpreter's own C frames are left out).
        c_frames = [f for f in frames if not f.startswith("py ")]
        py_frames = [f for f in frames if f.startswith("py ")]
        assert c_frames[0].startswith("leak "), f"Python {version}\n{overview}"
        assert frames.index(py_frames[0]) == len(c_frames), frames
        assert py_frames[0] == first, f"Python {version}\n{overview}"
        assert py_frames[1:] == [callers[first], module], frames
        assert cls.startswith("suspected_leak") and "degraded" not in cls, (
            f"Python {version}\n{overview}"
        )

    (detail_path,) = tmp_path.glob("out/msmemscope_*/host_leak/block_detail_1.csv")
    with detail_path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    uploads = [r for r in rows if r["size"] == "1500"]
    assert len(uploads) == 150
    assert {r["Call Stack(Python)"].splitlines()[0] for r in uploads} == {
        upload.removeprefix("py ")
    }
    thumbnails = [r for r in rows if r["size"] == "700"]
    assert len(thumbnails) == 50
    assert {r["Call Stack(Python)"].splitlines()[0] for r in thumbnails} == {
        thumbnail.removeprefix("py ")
    }


def test_python_frames_can_be_turned_off(tmp_path: Path) -> None:
    overview = run_service(tmp_path, Path(sys.executable), "--call-stack=python:0", seconds="0.5")
    # Without Python frames the sites are C stacks through the interpreter's eval loop, which
    # do not tell the two handlers apart; every leaked block is still accounted.
    leaking = [
        (blocks, size)
        for blocks, size, _, frames in sites(overview)
        if frames[0].startswith("leak ")
    ]
    assert sum(b for b, _ in leaking) == 200 and sum(s for _, s in leaking) == 260000, overview
    assert "\n    py " not in overview
