"""The repository cites only what it carries: no file points at the numbered sections of a
specification or at the user guide of the original msMemScope by the names they had before
docs/ existed (facts go in docs/, and comments point at its sections, docs/README.md)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from conftest import REPO

# "SPEC" with a section sign after it, and "the" + " seed" (also in identifiers, with "_"), in
# any case. Written so that this file does not match itself: nothing is allowed, this file
# included.
FORBIDDEN = re.compile(r"SPEC\s*\u00a7|(?<![a-z])the[ _]seed(?![a-z])", re.IGNORECASE)
SKIPPED_DIRS = ("target", ".venv")


def repository_files() -> list[Path]:
    """The files git tracks (every file under the checkout but target/ and .venv/ without git)."""
    try:
        listed = subprocess.run(
            ["git", "-C", str(REPO), "ls-files", "-z"],
            capture_output=True,
            check=True,
        ).stdout
        names = [os.fsdecode(n) for n in listed.split(b"\0") if n]
    except (OSError, subprocess.CalledProcessError):
        names = []
        for top, dirs, files in os.walk(REPO):
            if Path(top) == REPO:
                dirs[:] = [d for d in dirs if d not in (*SKIPPED_DIRS, ".git")]
            names += [str((Path(top) / f).relative_to(REPO)) for f in files]
    paths = []
    for name in names:
        if Path(name).parts[0] in SKIPPED_DIRS:
            continue
        path = REPO / name
        if path.is_file():
            paths.append(path)
    return paths


def offending_lines(paths: list[Path]) -> list[str]:
    found = []
    for path in paths:
        data = path.read_bytes()
        if b"\0" in data:
            continue  # binary
        text = data.decode("utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), 1):
            if FORBIDDEN.search(line):
                found.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    return found


def test_no_file_cites_documents_the_repository_does_not_carry() -> None:
    paths = repository_files()
    assert paths, "no files found in the repository"
    found = offending_lines(paths)
    assert not found, (
        "these lines cite documents that are not in the repository; say the fact itself, or "
        "point at the docs/ section that says it (docs/README.md):\n" + "\n".join(found)
    )
