"""The Python package's layers (python/msmemscope/__init__.py, ARCHITECTURE.md): each folder
imports only the layers below it, read from the import statements (type-only ones included)."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import PACKAGE

# The folders and what each may import; the public modules (the package's own files, watcher,
# describe, holders..., pytest_plugin/) and _autostart/ may import anything.
BOTTOM = {"_native", "_runtime", "_paths", "_import_hook"}
ALLOWED = {
    "bottom": {"bottom"},
    "capture": {"bottom", "capture"},
    "watch": {"bottom", "capture", "watch"},
    "snapshot": {"bottom", "capture", "snapshot"},
    "frameworks": {"bottom", "capture", "snapshot", "frameworks"},
}


def layer(module: str) -> str:
    """``msmemscope.capture.owners`` -> ``capture``; a public module -> ``top``."""
    parts = module.split(".")
    first = parts[1] if len(parts) > 1 else ""
    if first in BOTTOM:
        return "bottom"
    return first if first in ALLOWED else "top"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported(path: Path) -> set[str]:
    """The msmemscope modules ``path`` imports (``from pkg import sub`` counts as ``pkg.sub``
    when that is a module of the package)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            if node.level:
                base = base[: len(base) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                where = PACKAGE.joinpath(*sub.split(".")[1:])
                # A module, a package or the extension (typed by its .pyi stub).
                is_module = where.is_dir() or any(
                    where.with_suffix(suffix).is_file() for suffix in (".py", ".pyi")
                )
                found.add(sub if is_module else target)
    return {m for m in found if m == "msmemscope" or m.startswith("msmemscope.")}


def test_each_folder_imports_only_the_layers_below_it() -> None:
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        own = layer(module_name(path))
        if own == "top" or "_autostart" in path.parts:
            continue
        for target in sorted(imported(path)):
            if layer(target) not in ALLOWED[own]:
                wrong.append(f"{module_name(path)} ({own}) imports {target} ({layer(target)})")
    assert not wrong, "\n".join(wrong)
    # The table names what is there: a folder or module that moved would leave its files
    # unchecked ("top") instead of failing.
    folders = [name for name in ALLOWED if name != "bottom"]
    missing = [f for f in folders if not (PACKAGE / f / "__init__.py").is_file()]
    missing += [
        m
        for m in BOTTOM
        if not any((PACKAGE / m).with_suffix(s).is_file() for s in (".py", ".pyi"))
    ]
    assert not missing, f"the layer table names what the package does not have: {missing}"


def test_the_import_hook_imports_only_what_start_up_has_loaded() -> None:
    """``_autostart/sitecustomize.py`` loads ``_import_hook.py`` at interpreter start-up: it
    must not import msmemscope, typing or threading (type-only imports aside)."""
    tree = ast.parse((PACKAGE / "_import_hook.py").read_text())
    names = set()
    for node in tree.body:  # module level, where `if TYPE_CHECKING:` blocks are skipped
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            names.add(node.module or ".")
    assert names == {"_thread", "sys"}
