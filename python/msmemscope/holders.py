"""What keeps leaked tensors alive: the chain of references from a root to each tensor.

The leaks analysis (in the runtime) knows which blocks leak and from which line; only Python
knows what holds them. :func:`leak_holders` asks the runtime for the live blocks of the sites it
judges leaking, searches the object graph breadth first from the roots (the globals of the
user's modules, the locals of every thread's frames, then the other modules' globals), and
follows what the garbage collector does not show: a tensor's ``grad_fn``, an autograd node's
``next_functions`` and saved tensors, closures' cells. The first path found to a tensor whose
storage is a leaked block is its holder, e.g.
``all_logits (global of train.py) -> list[5] -> Tensor 4x64x1000 float32``.

Each holder is also written to the dump as a ``SYSTEM HOLDER`` row (Ptr: the block; Name: the
chain), so the report, ``leaks/findings.json`` and the offline commands show it. At the end of a
launched run the search runs once by itself, before the interpreter tears down.

The search is bounded by a time budget (``MSMEMSCOPE_HOLDER_BUDGET_S``, default 2 seconds); a
cut search says so instead of guessing.
"""

from __future__ import annotations

import collections
import gc
import os
import sys
import time
import types
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from .capture.sites import is_user_file

if TYPE_CHECKING:
    import torch

__all__ = ["leak_holders"]

BUDGET_VARIABLE = "MSMEMSCOPE_HOLDER_BUDGET_S"
_DEFAULT_BUDGET_S = 2.0
_MAX_ITEMS = 100_000  # children taken from one container
_LONG_CHAIN = 10  # hops beyond which the middle of a chain is elided


def _budget() -> float:
    raw = os.environ.get(BUDGET_VARIABLE, "")
    try:
        value = float(raw) if raw.strip() else _DEFAULT_BUDGET_S
    except ValueError:
        value = _DEFAULT_BUDGET_S
    return max(0.0, value)


def _short_key(key: object) -> str:
    text = repr(key)
    return text if len(text) <= 40 else text[:37] + "..."


def _roots(
    library: tuple[str, ...], own: tuple[str, ...]
) -> tuple[list[tuple[str, object]], Iterator[tuple[str, object]]]:
    """(label, object) for each root, in two tiers: the user's modules' globals and the live
    frames' locals (not torch's or msmemscope's frames, which include this search's own
    bookkeeping), searched first; then every other module's globals."""
    main = sys.modules.get("__main__")
    modules = [m for m in list(sys.modules.values()) if isinstance(m, types.ModuleType)]
    user_modules = [
        m for m in modules if m is main or is_user_file(getattr(m, "__file__", None), library)
    ]
    first: list[tuple[str, object]] = []
    for module in user_modules:
        file = getattr(module, "__file__", None)
        if file is None and module is main and sys.argv and sys.argv[0]:
            file = sys.argv[0]
        where = os.path.basename(file or module.__name__)
        for name, value in list(vars(module).items()):
            if not name.startswith("__"):
                first.append((f"{name} (global of {where})", value))
    frames = []
    for frame in sys._current_frames().values():
        f: types.FrameType | None = frame
        while f is not None:
            if not f.f_code.co_filename.startswith(own):
                frames.append(f)
            f = f.f_back
    frames.sort(key=lambda f: not is_user_file(f.f_code.co_filename, library))
    for f in frames:
        where = f"{f.f_code.co_name}, {os.path.basename(f.f_code.co_filename)}:{f.f_lineno}"
        for name, value in list(f.f_locals.items()):
            first.append((f"{name} (local of {where})", value))

    def rest() -> Iterator[tuple[str, object]]:
        for module in modules:
            if module not in user_modules:
                for name, value in list(vars(module).items()):
                    if not name.startswith("__"):
                        yield f"{name} (global of module {module.__name__})", value

    return first, rest()


def _children(obj: Any, torch: types.ModuleType) -> Iterator[tuple[str, object]]:
    """(edge label, child) for what ``obj`` refers to, as a person would name it."""
    if isinstance(obj, (type, types.ModuleType, types.FrameType, str, bytes, int, float)):
        return
    if isinstance(obj, dict):
        kind = type(obj).__name__
        for i, (key, value) in enumerate(list(obj.items())):
            if i >= _MAX_ITEMS:
                break
            yield f"{kind}[{_short_key(key)}]", value
            if not isinstance(key, (str, int, float, bytes, tuple)):
                yield f"{kind} key", key
        return
    if isinstance(obj, (list, tuple, collections.deque)):
        kind = type(obj).__name__
        for i, value in enumerate(list(obj)[:_MAX_ITEMS]):
            yield f"{kind}[{i}]", value
        return
    if isinstance(obj, (set, frozenset)):
        for value in list(obj)[:_MAX_ITEMS]:
            yield f"{type(obj).__name__} item", value
        return
    if isinstance(obj, torch.Tensor):
        fn = obj.grad_fn
        if fn is not None:
            yield f"grad_fn {type(fn).__name__}", fn
        for name, value in getattr(obj, "__dict__", {}).items():
            yield f".{name}", value
        return
    if isinstance(obj, torch.autograd.graph.Node):
        node = type(obj).__name__
        for name in dir(obj):
            if name.startswith("_saved_"):
                try:
                    value = getattr(obj, name)
                except Exception:  # freed (after backward) or not a tensor
                    continue
                if value is not None:
                    yield f"saved {name[len('_saved_') :]} of {node}", value
        for pair in obj.next_functions:
            nxt = pair[0] if pair else None
            if nxt is not None and type(nxt).__name__ != "AccumulateGrad":
                yield type(nxt).__name__, nxt
        return
    if isinstance(obj, types.FunctionType):
        cells = obj.__closure__ or ()
        for name, cell in zip(obj.__code__.co_freevars, cells):
            try:
                yield f"closure {name} of {obj.__qualname__}", cell.cell_contents
            except ValueError:  # an empty cell
                continue
        return
    if isinstance(obj, types.MethodType):
        yield f"self of {obj.__func__.__qualname__}", obj.__self__
        return
    d = getattr(obj, "__dict__", None)
    if isinstance(d, dict):
        kind = type(obj).__name__
        for name, value in list(d.items())[:_MAX_ITEMS]:
            yield f".{name} of {kind}", value
    for name in getattr(type(obj), "__slots__", ()) or ():
        if isinstance(name, str):
            try:
                yield f".{name} of {type(obj).__name__}", getattr(obj, name)
            except AttributeError:
                continue


def _tensor_text(t: torch.Tensor) -> str:
    shape = "x".join(str(d) for d in t.shape) or "scalar"
    dtype = str(t.dtype).replace("torch.", "")
    return f"Tensor {shape} {dtype}"


def _chain(labels: list[str]) -> str:
    # Runs of one hop (a sum's AddBackward0 nodes, one per step) as one, with their count.
    runs: list[str] = []
    count = 0
    for i, label in enumerate(labels):
        count += 1
        if i + 1 < len(labels) and labels[i + 1] == label:
            continue
        runs.append(label if count == 1 else f"{label} (x{count})")
        count = 0
    labels = runs
    if len(labels) > _LONG_CHAIN:
        cut = len(labels) - 8
        labels = [*labels[:4], f"... {cut} more ...", *labels[-4:]]
    return " -> ".join(labels)


class _Search:
    def __init__(
        self,
        targets: set[int],
        library: tuple[str, ...],
        own: tuple[str, ...],
        budget: float,
        torch: types.ModuleType,
    ) -> None:
        self.targets = targets
        self.library = library
        self.own = own
        self.deadline = time.monotonic() + budget
        self.budget = budget
        self.torch = torch
        self.found: dict[int, str] = {}
        self.visited = 0
        self.cut = False

    def _storage_ptr(self, t: torch.Tensor) -> int | None:
        try:
            return int(t.untyped_storage().data_ptr())
        except Exception:
            return None

    def run(self) -> None:
        torch = self.torch
        seen: set[int] = set()
        # Parent links: id(child) -> (id(parent) or None, label); objects kept alive meanwhile.
        parent: dict[int, tuple[int | None, str]] = {}
        keep: list[object] = []
        queue: collections.deque[object] = collections.deque()

        def push(obj: object, link: tuple[int | None, str]) -> None:
            key = id(obj)
            if key in seen:
                return
            seen.add(key)
            parent[key] = link
            keep.append(obj)
            queue.append(obj)

        first, rest = _roots(self.library, self.own)
        for label, value in first:
            push(value, (None, label))
        while True:
            if not queue:
                # The user's roots are exhausted: the other modules' globals next.
                for label, value in rest:
                    push(value, (None, label))
                if not queue:
                    return
            if len(self.found) == len(self.targets):
                return
            self.visited += 1
            if self.visited % 512 == 0 and time.monotonic() > self.deadline:
                self.cut = True
                return
            obj = queue.popleft()
            if isinstance(obj, torch.Tensor):
                ptr = self._storage_ptr(obj)
                if ptr in self.targets and ptr not in self.found:
                    labels = [_tensor_text(obj)]
                    key: int | None = id(obj)
                    while key is not None:
                        up, label = parent[key]
                        labels.append(label)
                        key = up
                    labels.reverse()
                    self.found[ptr] = _chain(labels)
            try:
                for label, child in _children(obj, torch):
                    push(child, (id(obj), label))
            except Exception:  # an object whose introspection fails: its children are unknown
                continue


def _suspects(nat: types.ModuleType) -> list[tuple[int, str, int, str]]:
    out = []
    for line in nat.leak_suspects().splitlines():
        parts = line.split("\t", 3)
        if len(parts) == 4:
            ptr, device, size, site = parts
            out.append((int(ptr, 16), device, int(size), site))
    return out


def leak_holders(budget_s: float | None = None) -> list[dict[str, object]]:
    """For the live tensors of the sites the leaks analysis judges leaking now, what holds
    each: a list of ``{"site", "ptr", "size", "device", "holder"}`` (``holder`` is the chain of
    references, or a sentence saying why none was found). Also written to the dump, so the
    run's report shows them. Empty when the leaks analysis is not running or judged nothing."""
    if "torch" not in sys.modules:
        return []
    import torch

    from ._runtime import native
    from .capture import sites
    from .capture.torch_tracker import _SKIP_DIRS

    nat = native()
    if not nat.tracing():
        return []
    suspects = _suspects(nat)
    if not suspects:
        return []
    budget = _budget() if budget_s is None else max(0.0, float(budget_s))
    targets = {s[0] for s in suspects}
    search = _Search(targets, sites.library_dirs(_SKIP_DIRS), _SKIP_DIRS, budget, torch)
    was_enabled = gc.isenabled()
    gc.disable()  # no collection (and no finalizer) runs in the middle of the walk
    try:
        with warnings.catch_warnings():
            # Looking at objects may touch deprecated attributes: the program's warnings stay
            # its own.
            warnings.simplefilter("ignore")
            search.run()
    finally:
        if was_enabled:
            gc.enable()
    results = []
    for ptr, device, size, site in suspects:
        holder = search.found.get(ptr)
        if holder is None:
            holder = (
                f"not found: the search stopped after {search.budget:g} s "
                f"({search.visited} objects; {BUDGET_VARIABLE} sets the budget)"
                if search.cut
                else "not reachable from module globals or live frames: kept by a reference "
                "cycle (freed only by gc.collect()) or by native code"
            )
        dev = None if device == "N/A" else ("cpu" if device == "cpu" else f"cuda:{device}")
        attrs = {"site": site, "size": size}
        nat.emit(nat.EVENT_SYSTEM, nat.TYPE_HOLDER, holder, dev, ptr, attrs, "", False)
        results.append({"site": site, "ptr": ptr, "size": size, "device": device, "holder": holder})
    return results


_registered = False


def search_at_exit() -> None:
    """Runs :func:`leak_holders` once when the interpreter exits (registered by the tracker
    when the leaks analysis is on). Never raises: the program's exit stays as it was."""
    global _registered
    if _registered:
        return
    _registered = True
    import atexit

    def at_exit() -> None:
        try:
            leak_holders()
        except Exception as exc:  # a failed search must not change how the program ends
            try:
                sys.stderr.write(f"msmemscope: leak holder search failed: {exc}\n")
            except Exception:
                pass

    atexit.register(at_exit)
