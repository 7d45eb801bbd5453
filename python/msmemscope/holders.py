"""What keeps leaked tensors alive: the chain of references from a root to each tensor.

The leaks analysis (in the runtime) knows which blocks leak and from which line; only Python
knows what holds them. :func:`leak_holders` asks the runtime for the live blocks of the sites it
judges leaking, searches the object graph breadth first from the roots (the globals of the
user's modules, the locals of every thread's frames, then the other modules' globals), and
follows what the garbage collector does not show: a tensor's ``grad_fn``, an autograd node's
``next_functions`` and saved tensors, closures' cells. The first path found to a tensor whose
storage is a leaked block is its holder, e.g.
``all_logits (global of train.py) -> list[5] -> Tensor 4x64x1000 float32``.

Containers written in C show their contents only to the garbage collector: those are opened
with :func:`gc.get_referents`, and named where their layout is known, e.g.
``causal_mask (global of train.py) -> cache[7] of causal_mask (lru_cache of train.py:9) ->
Tensor 128x128 float32`` or ``batches (global of train.py) -> itertools.cycle item -> list[3]
-> ...``. The classes defined in the user's modules are opened too (a cache kept as a class
attribute, a method's ``lru_cache``); torch's own objects are not.

Each holder is also written to the dump as a ``SYSTEM HOLDER`` row (Ptr: the block; Name: the
chain), so the report, ``leaks/findings.json`` and the offline commands show it. At the end of a
launched run the search runs once by itself, before the interpreter tears down.

The search is bounded by a time budget (``MSMEMSCOPE_HOLDER_BUDGET_S``, default 2 seconds); a
cut search says so instead of guessing.
"""

from __future__ import annotations

import collections
import functools
import gc
import os
import re
import sys
import time
import types
import warnings
import weakref
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


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_SPACES = re.compile(r"\s+")


def _short_text(text: str) -> str:
    # An address differs per object and a module's repr spans lines: neither belongs in a chain
    # whose shape merges the blocks held the same way.
    text = _SPACES.sub(" ", _ADDRESS.sub("", text))
    return text if len(text) <= 40 else text[:37] + "..."


def _short_key(key: object) -> str:
    return _short_text(repr(key))


def _user_modules(
    library: tuple[str, ...],
) -> tuple[list[types.ModuleType], list[types.ModuleType]]:
    """(the user's modules, all modules): ``__main__`` and those loaded from outside
    ``library``."""
    main = sys.modules.get("__main__")
    modules = [m for m in list(sys.modules.values()) if isinstance(m, types.ModuleType)]
    user = [m for m in modules if m is main or is_user_file(getattr(m, "__file__", None), library)]
    return user, modules


def _roots(
    library: tuple[str, ...],
    own: tuple[str, ...],
    user_modules: list[types.ModuleType],
    modules: list[types.ModuleType],
) -> tuple[list[tuple[str, object]], Iterator[tuple[str, object]]]:
    """(label, object) for each root, in two tiers: the user's modules' globals and the live
    frames' locals (not torch's or msmemscope's frames, which include this search's own
    bookkeeping), searched first; then every other module's globals."""
    main = sys.modules.get("__main__")
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
        for name, value in list(f.f_locals.items()):
            first.append((_local_label(name, f.f_code.co_name, f), value))

    def rest() -> Iterator[tuple[str, object]]:
        for module in modules:
            if module not in user_modules:
                for name, value in list(vars(module).items()):
                    if not name.startswith("__"):
                        yield f"{name} (global of module {module.__name__})", value

    return first, rest()


def _local_label(name: str, function: str, frame: types.FrameType) -> str:
    where = f"{function}, {os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"
    return f"{name} (local of {where})"


# What an opaque object refers to that names nothing a person would look for: following these
# only costs time (a builtin function's module, a generator's code and name).
_ATOMS = (type, types.ModuleType, types.CodeType, types.FrameType, str, bytes, int, float)
_LRU_WRAPPER: tuple[type, ...] = tuple(
    t for t in [getattr(functools, "_lru_cache_wrapper", None)] if isinstance(t, type)
)
_GENERATORS = (types.GeneratorType, types.CoroutineType, types.AsyncGeneratorType)


def _type_name(cls: type) -> str:
    module = getattr(cls, "__module__", None)
    name = getattr(cls, "__qualname__", cls.__name__)
    return name if module in (None, "builtins") else f"{module}.{name}"


def _is_torch(obj: object) -> bool:
    """Whether ``obj`` (a class, a function) is torch's own, by the module it names."""
    module = getattr(obj, "__module__", None)
    return isinstance(module, str) and (module == "torch" or module.startswith("torch."))


def _where(fn: object) -> str:
    """``file.py:line`` of a function's definition (the innermost one, past the decorators
    that wrap it with ``functools.wraps``); empty for one without Python code."""
    for _ in range(16):
        inner = getattr(fn, "__wrapped__", None)
        if inner is None:
            break
        fn = inner
    code = getattr(fn, "__code__", None)
    if not isinstance(code, types.CodeType):
        return ""
    return f"{os.path.basename(code.co_filename)}:{code.co_firstlineno}"


def _lru_name(wrapper: Any) -> str:
    """``causal_mask (lru_cache of train.py:9)``: the cached function and where it is defined."""
    fn = getattr(wrapper, "__wrapped__", wrapper)
    name = getattr(fn, "__qualname__", None) or getattr(wrapper, "__qualname__", "?")
    where = _where(fn)
    return f"{name} (lru_cache of {where})" if where else f"{name} (lru_cache)"


def _call_text(key: object, typed: bool) -> str:
    """An ``lru_cache`` key as the call's arguments: ``3``, ``4, 128``, ``x, dim=1``.

    The C cache keys one ``int`` or ``str`` argument by itself, else by the tuple of the
    arguments, then a bare ``object()`` and the keywords' names and values, then (``typed``)
    the arguments' types."""
    if type(key) is not tuple:
        return _short_key(key)
    parts = list(key)
    mark = next((i for i, p in enumerate(parts) if type(p) is object), None)
    if mark is None:
        args = parts[: len(parts) // 2] if typed else parts
        pairs: list[object] = []
    else:
        keywords = (len(parts) - 2 * mark - 1) // 3 if typed else (len(parts) - mark - 1) // 2
        args = parts[:mark]
        pairs = parts[mark + 1 : mark + 1 + 2 * keywords]
    texts = [repr(a) for a in args]
    texts += [f"{pairs[i]}={pairs[i + 1]!r}" for i in range(0, len(pairs) - 1, 2)]
    return _short_text(", ".join(texts))


def _lru_children(wrapper: Any) -> Iterator[tuple[str, object]]:
    """Each result in an ``lru_cache``, keyed by the call that made it. The cache is a dict
    only the garbage collector shows; an unbounded one maps keys to results, a bounded one to
    links whose key and result it shows in that order, one link after another."""
    name = _lru_name(wrapper)
    attrs = getattr(wrapper, "__dict__", None)
    if isinstance(attrs, dict):
        for attr, value in list(attrs.items())[:_MAX_ITEMS]:
            yield f".{attr} of {name}", value
    if _is_torch(wrapper):  # torch's own caches (many, some large) stay closed
        return
    refs = gc.get_referents(wrapper)
    cache = next((r for r in refs if type(r) is dict and r is not attrs), None)
    try:
        typed = bool(wrapper.cache_parameters()["typed"])
    except Exception:  # a wrapper of another Python's making
        typed = False
    if cache:
        entries = list(cache.items())[:_MAX_ITEMS]
        if type(entries[0][1]).__name__ != "_lru_list_elem":
            for key, result in entries:
                yield f"cache[{_call_text(key, typed)}] of {name}", result
        else:
            keys = {id(k) for k, _ in entries}
            i = 0
            while i + 1 < len(refs):
                if id(refs[i]) in keys:
                    yield f"cache[{_call_text(refs[i], typed)}] of {name}", refs[i + 1]
                    i += 2
                else:
                    i += 1


class _Context:
    """What naming an object's children needs: torch, the directories of torch and msmemscope
    (``own``), the names of the user's modules, and each class's slots, found once."""

    def __init__(
        self, torch: types.ModuleType, own: tuple[str, ...], user_modules: frozenset[str]
    ) -> None:
        self.torch = torch
        self.own = own
        self.user_modules = user_modules
        self._slots: dict[type, tuple[str, ...]] = {}

    def slot_names(self, cls: type) -> tuple[str, ...]:
        found = self._slots.get(cls)
        if found is None:
            names = []
            for klass in cls.__mro__:
                slots = klass.__dict__.get("__slots__", ())
                for name in (slots,) if isinstance(slots, str) else slots:
                    if not isinstance(name, str) or name in ("__dict__", "__weakref__"):
                        continue
                    if name.startswith("__") and not name.endswith("__"):
                        name = f"_{klass.__name__.lstrip('_')}{name}"  # as Python stores it
                    names.append(name)
            found = self._slots[cls] = tuple(names)
        return found


def _opaque(
    obj: object, shown: list[tuple[str, object]], also: tuple[object, ...]
) -> Iterator[tuple[str, object]]:
    """What ``obj`` refers to beyond ``shown`` (its children named already) and ``also``:
    for a container written in C, everything it holds."""
    known = {id(child) for _, child in shown}
    known.update(id(x) for x in also)
    kind = f"{_type_name(type(obj))} item"
    for ref in gc.get_referents(obj)[:_MAX_ITEMS]:
        if id(ref) not in known and not isinstance(ref, _ATOMS) and ref is not None:
            known.add(id(ref))
            yield kind, ref


def _children(obj: Any, ctx: _Context) -> Iterator[tuple[str, object]]:
    """(edge label, child) for what ``obj`` refers to, as a person would name it. Of the
    classes, only those of the user's modules are opened: the others are torch's and the
    libraries', many and large."""
    torch = ctx.torch
    if isinstance(obj, type):
        if getattr(obj, "__module__", None) in ctx.user_modules:
            kind = f"class {obj.__qualname__}"
            for name, value in list(vars(obj).items())[:_MAX_ITEMS]:
                if not name.startswith("__"):
                    yield f".{name} of {kind}", value
        return
    if isinstance(obj, (types.ModuleType, types.FrameType, str, bytes, int, float)):
        return
    if isinstance(obj, dict):
        kind = type(obj).__name__
        # What the dict stores, not what a subclass's items() makes of it: transformers' lazy
        # auto-mappings import every model they name when asked for their items.
        for i, (key, value) in enumerate(list(dict.items(obj))):
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
    if isinstance(obj, types.BuiltinMethodType):
        # A bound method of a C object (``history.append`` kept as a callback) keeps its object;
        # a builtin function's ``__self__`` is its module.
        owner = obj.__self__
        if owner is not None and not isinstance(owner, (type, types.ModuleType)):
            yield f"self of {obj.__qualname__}", owner
        return
    if isinstance(obj, _GENERATORS):
        # A suspended generator's locals (a prefetch buffer, the batch being yielded); not
        # torch's own generators, which hold nothing of the program's that is not reachable
        # from elsewhere.
        frame = getattr(obj, "gi_frame", None) or getattr(obj, "cr_frame", None)
        if frame is None:
            frame = getattr(obj, "ag_frame", None)
        if frame is not None and not frame.f_code.co_filename.startswith(ctx.own):
            for name, value in list(frame.f_locals.items()):
                yield _local_label(name, obj.__qualname__, frame), value
        return
    if isinstance(obj, _LRU_WRAPPER):
        yield from _lru_children(obj)
        return
    if isinstance(obj, functools.partial):
        kind = f"partial({getattr(obj.func, '__qualname__', _type_name(type(obj.func)))})"
        yield f"func of {kind}", obj.func
        for i, value in enumerate(obj.args):
            yield f"args[{i}] of {kind}", value
        for key, value in obj.keywords.items():
            yield f"keywords[{key!r}] of {kind}", value
        for name, value in list(getattr(obj, "__dict__", {}).items())[:_MAX_ITEMS]:
            yield f".{name} of {kind}", value
        return
    if isinstance(obj, weakref.WeakKeyDictionary):
        # Its keys are weak: only the values it keeps, each by its key's referent.
        for key, value in list(obj.items())[:_MAX_ITEMS]:
            yield f"WeakKeyDictionary[{_short_key(key)}]", value
        return
    if isinstance(obj, weakref.WeakValueDictionary):
        # Its values are weak (they hold nothing up): only the keys it keeps.
        for key in list(obj.keys())[:_MAX_ITEMS]:
            if not isinstance(key, (str, int, float, bytes, tuple)):
                yield "WeakValueDictionary key", key
        return
    shown: list[tuple[str, object]] = []
    d = getattr(obj, "__dict__", None)
    kind = type(obj).__name__
    if isinstance(d, dict):
        for name, value in list(d.items())[:_MAX_ITEMS]:
            shown.append((f".{name} of {kind}", value))
    for name in ctx.slot_names(type(obj)):
        try:
            shown.append((f".{name} of {kind}", getattr(obj, name)))
        except AttributeError:
            continue
    yield from shown
    if not _is_torch(type(obj)) and len(shown) < _MAX_ITEMS:
        yield from _opaque(obj, shown, (type(obj), d))


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

        user_modules, modules = _user_modules(self.library)
        first, rest = _roots(self.library, self.own, user_modules, modules)
        ctx = _Context(torch, self.own, frozenset(m.__name__ for m in user_modules))
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
                for label, child in _children(obj, ctx):
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


def _search(targets: set[int], budget: float) -> _Search:
    """The holders of the tensors whose storages start at ``targets``, searched for within
    ``budget`` seconds (torch imported). Needs no runtime: the tests call it directly."""
    import torch

    from .capture import sites
    from .capture.config import SKIP_DIRS

    search = _Search(targets, sites.library_dirs(SKIP_DIRS), SKIP_DIRS, budget, torch)
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
    return search


def leak_holders(budget_s: float | None = None) -> list[dict[str, object]]:
    """For the live tensors of the sites the leaks analysis judges leaking now, what holds
    each: a list of ``{"site", "ptr", "size", "device", "holder"}`` (``holder`` is the chain of
    references, or a sentence saying why none was found). Also written to the dump, so the
    run's report shows them. Empty when the leaks analysis is not running or judged nothing."""
    if "torch" not in sys.modules:
        return []
    from ._runtime import native

    nat = native()
    if not nat.tracing():
        return []
    suspects = _suspects(nat)
    if not suspects:
        return []
    budget = _budget() if budget_s is None else max(0.0, float(budget_s))
    search = _search({s[0] for s in suspects}, budget)
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
