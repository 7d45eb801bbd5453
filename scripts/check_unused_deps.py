#!/usr/bin/env python3
"""Fails when a crate of the workspace declares a dependency its sources never name.

For each `crates/*/Cargo.toml`, every entry of [dependencies], [dev-dependencies] and
[build-dependencies] must appear in the crate's Rust sources as a path (`name::`), an import
(`use name`), a macro (`name!`) or an `extern crate`. Dev-dependencies are looked for in the
whole crate; the others in its `src/` and `build.rs` only, so a dependency that only the tests
use must be a dev-dependency. Standard library only (tomllib, Python 3.11).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent


def sources(paths: list[Path]) -> str:
    text = []
    for path in paths:
        files = [path] if path.is_file() else sorted(path.rglob("*.rs"))
        text.extend(f.read_text(encoding="utf-8") for f in files)
    return "\n".join(text)


def used(name: str, text: str) -> bool:
    ident = re.escape(name.replace("-", "_"))
    return (
        re.search(rf"(?<![\w:]){ident}(::|!|\s*;|\s*\{{)|extern crate {ident}\b", text) is not None
    )


def main() -> int:
    unused = []
    for manifest in sorted(ROOT.glob("crates/*/Cargo.toml")):
        crate = manifest.parent
        table = tomllib.loads(manifest.read_text(encoding="utf-8"))
        main_text = sources([p for p in (crate / "src", crate / "build.rs") if p.exists()])
        all_text = sources([crate])
        for section, text in (
            ("dependencies", main_text),
            ("build-dependencies", main_text),
            ("dev-dependencies", all_text),
        ):
            for name in table.get(section, {}):
                if not used(name, text):
                    unused.append(f"{manifest.relative_to(ROOT)} [{section}] {name}")
    for line in unused:
        print(f"unused dependency: {line}", file=sys.stderr)
    return 1 if unused else 0


if __name__ == "__main__":
    sys.exit(main())
