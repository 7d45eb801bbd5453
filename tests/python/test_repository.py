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
FORBIDDEN = re.compile(r"SPEC\s*\u00a7|(?<![a-z])the[ _]seeds?(?![a-z])", re.IGNORECASE)
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


# Where a path in ARCHITECTURE.md may be relative to: the repository, or the piece its line
# describes (a crate's folder or sources, the Python package, its capture, tests/).
ARCHITECTURE_BASES = (
    "",
    "crates/core/src",
    "crates/runtime",
    "crates/runtime/src",
    "crates/cli",
    "crates/cli/src",
    "crates/python/src",
    "python/msmemscope",
    "python/msmemscope/capture",
    "tests",
)
PATH_SUFFIXES = (".rs", ".py", ".md", ".h", ".c", ".cpp", ".sh", ".toml", ".sql", ".json")


def architecture_paths(text: str) -> list[str]:
    """The paths ARCHITECTURE.md names: in backquotes and in its code blocks, every word that
    ends with ``/`` or a source file's suffix (a backquoted one also when it has a ``/``), and
    every link target."""
    found: list[str] = []
    in_block = False
    for line in text.splitlines():
        if line.startswith("```"):
            in_block = not in_block
            continue
        words = line.split() if in_block else re.findall(r"`([^`]+)`", line)
        for word in words:
            word = word.strip(",;:()")
            if not re.fullmatch(r"[\w.*/-]+", word) or "*" in word or "//" in word:
                continue
            if word.endswith("/") or word.endswith(PATH_SUFFIXES) or (not in_block and "/" in word):
                found.append(word)
        found += [t for t in re.findall(r"\]\(([^)#]+)", line) if "://" not in t]
    return found


def test_architecture_names_only_paths_that_exist() -> None:
    text = (REPO / "ARCHITECTURE.md").read_text()
    assert len(text.splitlines()) <= 150, "ARCHITECTURE.md is a map: 150 lines at most"
    named = architecture_paths(text)
    # The reader itself: a code block's paths and a backquoted one are both taken.
    assert architecture_paths("```\n  -> a/b.rs x::y\n```\n`c/` and [d](e.md)") == [
        "a/b.rs",
        "c/",
        "e.md",
    ]
    assert len(named) > 40, named
    missing = sorted(
        {p for p in named if not any((REPO / base / p).exists() for base in ARCHITECTURE_BASES)}
    )
    assert not missing, f"ARCHITECTURE.md names paths that do not exist: {missing}"


# A `static` item of the runtime, as docs/runtime-globals.md counts them (thread-locals and the
# one macro line of the CUDA hooks included).
RUNTIME_STATIC = re.compile(r"^\s*(?:pub(?:\([a-z]+\))? )?static\s+(?:mut\s+)?(\$?[A-Za-z_]\w*)")


def test_the_runtime_globals_page_lists_every_static_and_their_count() -> None:
    names = []
    for path in sorted((REPO / "crates/runtime/src").rglob("*.rs")):
        for line in path.read_text().splitlines():
            found = RUNTIME_STATIC.match(line)
            if found:
                names.append((path.relative_to(REPO), found.group(1)))
    page = (REPO / "docs/runtime-globals.md").read_text()
    # The macro's `$hook` stands for the wrapper instances the page names by the macro.
    unlisted = [f"{path}: {name}" for path, name in names if f"`{name}`" not in page]
    unlisted = [u for u in unlisted if not u.endswith(": $hook")]
    assert not unlisted, f"statics docs/runtime-globals.md does not list: {unlisted}"
    count = re.search(r"\*\*Count: (\d+)\*\*", page)
    assert count, "docs/runtime-globals.md: no '**Count: N**' line"
    assert int(count.group(1)) == len(names), (
        f"docs/runtime-globals.md says {count.group(1)} statics; the runtime has {len(names)}"
    )
