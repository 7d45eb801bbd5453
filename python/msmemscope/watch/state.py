"""Memory block watch (docs/analyses.md#watch): checksums or bytes of watched blocks before and
after ATen ops.

The PyTorch tracker calls :meth:`Watch.before` and :meth:`Watch.after` around every op it sees,
but only while ``tracker.watch`` is not None, which is the case while something is watched:
``--watch``/``config(watch=...)`` is set, or ``msmemscope.watcher.watch`` registered a block.
:class:`Watch` is the capture's ``OpWatch`` (:mod:`msmemscope.capture.tracker`); the package's
``__init__`` plugs :meth:`Watch.attach` into the capture, which calls it from each tracker's
constructor.

What is watched:

- blocks registered with ``msmemscope.watcher.watch`` (a tensor, or an address and a length);
- with ``--watch=start[:outid],end`` and no registered block, the outputs of the ``start`` op
  (only output ``outid`` of a list- or tuple-returning op when it is given), from that op's
  ``after`` until the range closes.

When: without ``--watch``, at every op from ``watch()`` until ``remove()``. With it, the range
opens when an op named ``start`` runs (names exactly as the dump's OP_LAUNCH rows write them,
e.g. ``aten::add_.Tensor``) and closes after the next op named ``end``; it opens again at the
next ``start``. ``dump_nums`` counts ops: a block is dumped before and after at most that many
ops, then dropped.

Output, in ``{run dir}/watch_dump/``:

- ``watch_dump_data_check_sum_{device}_{ts}.csv`` (``Tensor info,Check data sum``; the CRC-64 of
  the block as 16 hex digits), one row per block before and after each op; or, with
  ``full-content``,
- ``{deviceid}_{tid}_{opName}_{call}-{watchedName}_{outid}_{before|after}.bin``: the block's
  bytes. The CSV's Tensor info is that same name without ``.bin``. ``{call}`` numbers the
  op's calls that ran while something was watched (with ``--watch``: since tracking started,
  ranges closed or not); ``{tid}`` is the native thread id.

A block whose checksum changes inside an op is checked against the op's schema: an argument
the schema marks as written (``Tensor(a!)``) whose memory overlaps the block explains the
change (an in-place op on the tensor or on a view of it). A change that no written argument
explains, or one between two ops, is unexpected: the summary at exit names the first such op.
The summary goes to stderr and to ``watch_dump/watch_summary.txt`` when the Python program
ends (before the runtime's own exit report).

Blocks are read where they lie: a block inside a tensor storage is read in place through a
weak reference to the storage (a freed storage ends its watch; msmemscope never keeps memory
alive), a raw range outside every tracked storage through ``/proc/self/mem`` (an unmapped page
ends the watch instead of crashing the program). CUDA blocks are copied to the host first
(which waits for the device).
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    import torch

    from ..capture.op_info import OpInfo
    from ..capture.tracker import Tracker

MAX_NAME = 64
# Change lines printed on stderr at exit; the summary file has up to _MAX_CHANGES.
_MAX_PRINTED = 20
_MAX_CHANGES = 10_000
_CSV_HEADER = "Tensor info,Check data sum\n"


class Spec:
    """``--watch start[:outid],end[,full-content]`` as the runtime's config holds it."""

    __slots__ = ("end", "full_content", "outid", "start")

    def __init__(self, raw: dict[str, Any]):
        self.start: str = raw["start"]
        self.outid: int | None = raw.get("outid")
        self.end: str = raw["end"]
        self.full_content = bool(raw.get("full_content"))

    def text(self) -> str:
        outid = "" if self.outid is None else f":{self.outid}"
        full = ",full-content" if self.full_content else ""
        return f"{self.start}{outid},{self.end}{full}"


class Block:
    """One watched address range: inside a storage (``ref``, ``offset``) or raw (``addr``)."""

    __slots__ = (
        "addr",
        "at",
        "device",
        "device_id",
        "dumps",
        "dumps_left",
        "last",
        "last_op",
        "length",
        "name",
        "offset",
        "outid",
        "ref",
        "stopped",
        "tag_tail",
        "user",
    )

    def __init__(
        self,
        name: str,
        outid: int,
        device: str,
        length: int,
        *,
        storage: torch.UntypedStorage | None = None,
        offset: int = 0,
        addr: int = 0,
        dumps: int | None = None,
        user: bool = True,
    ) -> None:
        self.user = user  # registered by watcher.watch (not an output of the start op)
        self.name = name
        self.outid = outid
        self.device = device  # "cpu" or "cuda:N"
        # ``cpu`` or the CUDA index, as the dump directories name devices.
        self.device_id = "cpu" if device == "cpu" else device.partition(":")[2]
        # The end of the dumps' names: ``{watchedName}_{outid}``.
        self.tag_tail = f"{_safe_name(name)}_{outid}"
        self.length = length
        self.ref = weakref.ref(storage) if storage is not None else None
        self.offset = offset
        self.addr = addr
        # The address it was last seen at (remove() still matches it once the watch stopped).
        self.at = addr if storage is None else storage.data_ptr() + offset
        self.dumps_left = dumps  # None: unlimited
        self.dumps = 0
        self.last: int | None = None  # checksum after the last op (None: not read yet)
        self.last_op: tuple[str, int] | None = None  # (op, call) of that read
        self.stopped: str | None = None  # why the watch ended (None: still watched)

    def locate(self) -> tuple[int, torch.UntypedStorage | None] | None:
        """``(address, storage or None)`` now, or None when the storage is gone or shrank."""
        if self.ref is None:
            return self.addr, None
        st = self.ref()
        if st is None or st.nbytes() < self.offset + self.length:
            return None
        self.at = st.data_ptr() + self.offset
        return self.at, st

    def describe(self) -> str:
        where = self.locate()
        at = f"0x{where[0]:x}" if where else "(gone)"
        return f'"{self.name}" ({self.length} bytes at {at} on {self.device})'


class _Change:
    """One checksum change: in an op (``writer``: the written argument that overlaps, or None)
    or between two ops (``prev``)."""

    __slots__ = ("block", "call", "op", "prev", "writer")

    def __init__(
        self,
        block: str,
        op: str,
        call: int,
        writer: str | None = None,
        prev: tuple[str, int] | None = None,
    ) -> None:
        self.block, self.op, self.call, self.writer, self.prev = block, op, call, writer, prev

    @property
    def unexpected(self) -> bool:
        return self.writer is None

    def text(self) -> str:
        if self.prev is not None:
            return (
                f'block "{self.block}" changed between {self.prev[0]} (call {self.prev[1]}) and '
                f"{self.op} (call {self.call}), outside every op msmemscope saw"
            )
        if self.writer is not None:
            return (
                f'block "{self.block}" changed in {self.op} (call {self.call}); its schema writes '
                f"it (argument {self.writer})"
            )
        return (
            f'block "{self.block}" changed in {self.op} (call {self.call}), whose schema does not '
            "write it"
        )


def _safe_name(text: str) -> str:
    """A file-name part: path separators and control characters become ``_``."""
    return "".join("_" if c == "/" or ord(c) < 32 or c == "\x7f" else c for c in text)


class _Output:
    """``watch_dump/`` in the run directory: the per-device CSV files, the .bin files, the
    summary; counts what it writes."""

    def __init__(self, nat: ModuleType) -> None:
        self.nat = nat
        self.dir: str | None = None
        self.failed: str | None = None  # why nothing can be written (reported once, in the summary)
        self.csv: dict[str, TextIO] = {}  # device id -> open file
        self.files = 0
        self.bytes = 0

    def directory(self) -> str | None:
        if self.dir is None and self.failed is None:
            try:
                path = os.path.join(self.nat.run_dir(), "watch_dump")
                if hasattr(self.nat, "run_dir_mkdir"):
                    # Through the run directory's descriptor: never a swapped-in symlink.
                    self.nat.run_dir_mkdir("watch_dump")
                else:
                    os.makedirs(path, mode=0o750, exist_ok=True)
                self.dir = path
            except Exception as exc:
                self.failed = f"cannot create watch_dump: {exc}"
        return self.dir

    def csv_row(self, device_id: str, tag: str, checksum: int) -> None:
        f = self.csv.get(device_id)
        if f is None:
            d = self.directory()
            if d is None:
                return
            stamp = time.strftime("%Y%m%d%H%M%S")
            name = f"watch_dump_data_check_sum_{device_id}_{stamp}.csv"
            if hasattr(self.nat, "run_dir_create"):
                fd = self.nat.run_dir_create(os.path.join("watch_dump", name))
            else:
                path = os.path.join(d, name)
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o640)
            f = self.csv[device_id] = os.fdopen(fd, "w", newline="")
            f.write(_CSV_HEADER)
            self.files += 1
            self.bytes += len(_CSV_HEADER)
        line = f"{tag},{checksum:016x}\n"
        f.write(line)
        self.bytes += len(line)

    def bin_path(self, tag: str) -> str | None:
        d = self.directory()
        return None if d is None else os.path.join(d, tag + ".bin")

    def flush(self) -> None:
        for f in self.csv.values():
            f.flush()

    def close(self) -> None:
        for f in self.csv.values():
            try:
                f.close()
            except OSError:
                pass
        self.csv.clear()


def _arg(
    args: Sequence[object], kwargs: Mapping[str, object], pos: int | None, name: str
) -> object:
    if pos is not None and pos < len(args):
        return args[pos]
    return kwargs.get(name)


def _tensors(value: object) -> Sequence[torch.Tensor]:
    from torch import Tensor

    if isinstance(value, Tensor):
        return (value,)
    if isinstance(value, (list, tuple)):
        found: list[torch.Tensor] = []
        for v in value:
            found.extend(_tensors(v))
        return found
    return ()


def tensor_span(t: torch.Tensor) -> tuple[int, int] | None:
    """``(address, bytes)`` from ``t``'s first element to the end of its last one (its own
    elements and the gaps between them), or None for a tensor without memory."""
    try:
        if t.numel() == 0:
            return None
        extent = 1 + sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride()))
        return t.data_ptr(), extent * t.element_size()
    except Exception:  # tensor subclasses without storage (FakeTensor, meta)
        return None


def _host_copy(storage: torch.UntypedStorage, offset: int, length: int) -> torch.Tensor:
    """The block's bytes as a CPU uint8 tensor (for device memory; waits for the device)."""
    import torch

    view = torch.empty(0, dtype=torch.uint8, device=storage.device)
    # torch's stub omits the default of set_'s stride argument (the schema's `stride=[]`).
    view.set_(storage, offset, (length,))  # type: ignore[call-overload]
    return view.cpu()


class Watch:
    """The process's watch state: registered blocks, the op range, what changed, the output."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.local = threading.local()
        self.tracker: Tracker | None = None  # the PyTorch tracker (either capture's), from attach()
        self.nat: Any = None  # the runtime's native module, from attach()
        self.spec: Spec | None = None
        self.user_blocks: list[Block] = []
        self.op_blocks: list[Block] = []  # outputs of the start op while the range is open
        self.stopped: list[Block] = []
        self.open = False
        self.opened_by: tuple[str, int] | None = None  # (op, call) that opened the range
        self.ranges = 0
        self.calls: dict[str, int] = {}
        self.safe_ops: dict[str, str] = {}  # op name -> its file-name form
        self.changes: list[_Change] = []
        self.dropped_changes = 0
        self.notes: list[str] = []
        self.out: _Output | None = None
        self.used = False  # something was ever watched: the summary is due at exit
        self.exit_registered = False

    # --- configuration --------------------------------------------------------------------------
    def attach(self, tracker: Tracker) -> Watch | None:
        """Called from the tracker's constructor: what ``tracker.watch`` starts as."""
        with self.lock:
            self.tracker = tracker
            self.nat = tracker.nat
            try:
                self._read_spec()
            except Exception as exc:  # a broken config must not stop the tracker
                tracker.report(exc)
            return self if self.wanted() else None

    def _read_spec(self) -> None:
        raw = json.loads(self.nat.current_config()).get("watch")
        spec = Spec(raw) if raw else None
        if spec is not None and (self.spec is None or spec.text() != self.spec.text()):
            self.open = False
            self.op_blocks = []
            self._start_using()
        self.spec = spec

    def reconfigure(self) -> None:
        """Re-reads ``watch`` from the runtime's config (after ``msmemscope.config()``)."""
        with self.lock:
            if self.nat is not None:
                self._read_spec()
                self.refresh()

    def wanted(self) -> bool:
        return self.spec is not None or bool(self.user_blocks)

    def _report(self, exc: BaseException) -> None:
        """Tells the tracker (which reports once) that watching failed."""
        if self.tracker is not None:
            self.tracker.report(exc)

    def refresh(self) -> None:
        """Points the tracker at this watch while something is watched, else at nothing (so an
        op costs one attribute load)."""
        if self.tracker is not None:
            self.tracker.watch = self if self.wanted() else None

    def _start_using(self) -> None:
        self.used = True
        if not self.exit_registered:
            self.exit_registered = True
            atexit.register(self.at_exit)

    # --- blocks ---------------------------------------------------------------------------------
    def add(self, block: Block) -> None:
        with self.lock:
            for b in self.user_blocks:
                if b.name == block.name:
                    raise ValueError(
                        f'a block named "{block.name}" is watched already ({b.describe()}); '
                        "give each watched block its own name"
                    )
            self.user_blocks.append(block)
            self._start_using()
            self.refresh()

    def find(self, predicate: Callable[[Block], bool]) -> Block | None:
        """The watched block ``predicate`` accepts; else one that was watched and has stopped
        (freed, dump_nums reached), whose ``stopped`` is set."""
        with self.lock:
            for b in (*self.user_blocks, *self.stopped):
                if b.user and predicate(b):
                    return b
        return None

    def remove(self, block: Block, why: str = "removed") -> None:
        with self.lock:
            if block in self.user_blocks:
                self.user_blocks.remove(block)
                self._stop(block, why)
            self.refresh()

    def _stop(self, block: Block, why: str) -> None:
        if block.stopped is None:
            block.stopped = why
            self.stopped.append(block)

    def watched_names(self) -> list[str]:
        with self.lock:
            return [b.name for b in self.user_blocks]

    # --- reading a block ------------------------------------------------------------------------
    def _read(self, block: Block, tag: str) -> tuple[int, int] | None:
        """Records the block under ``tag`` (a CSV row, or a .bin file with full-content) and
        returns ``(checksum, address)``, or None when the block cannot be read any more (its
        watch then ends)."""
        where = block.locate()
        if where is None:
            self._drop(block, "its storage was freed or shrank")
            return None
        addr, storage = where
        nat = self.nat
        full = self.spec is not None and self.spec.full_content
        out = self.out
        if out is None:
            out = self.out = _Output(nat)
        host = None
        read_addr, checked = addr, storage is None
        if storage is not None and block.device != "cpu":
            host = _host_copy(storage, block.offset, block.length)
            read_addr = host.data_ptr()
        if checked:
            crc = nat.watch_crc64_checked(read_addr, block.length)
            if crc is None:
                self._drop(block, f"0x{addr:x} is no longer readable memory")
                return None
        else:
            crc = nat.watch_crc64(read_addr, block.length)
        if full:
            path = out.bin_path(tag)
            if path is not None and nat.watch_dump_bytes(path, read_addr, block.length, checked):
                out.files += 1
                out.bytes += block.length
        else:
            out.csv_row(block.device_id, tag, crc)
        del host
        return crc, addr

    def _drop(self, block: Block, why: str) -> None:
        if block in self.user_blocks:
            self.user_blocks.remove(block)
        elif block in self.op_blocks:
            self.op_blocks.remove(block)
        self._stop(block, why)

    def _note_change(self, change: _Change) -> None:
        if len(self.changes) < _MAX_CHANGES:
            self.changes.append(change)
        else:
            self.dropped_changes += 1

    # --- around one op --------------------------------------------------------------------------
    def before(self, info: OpInfo, args: Sequence[object], kwargs: Mapping[str, object]) -> None:
        try:
            with self.lock:
                self.local.pending = None
                op = info.name
                call = self.calls.get(op, 0) + 1
                self.calls[op] = call
                spec = self.spec
                if spec is not None and not self.open:
                    if op != spec.start:
                        return
                    self.open = True
                    self.opened_by = (op, call)
                    self.ranges += 1
                # ``{tid}_{opName}_{call}``: the middle of the dumps' names.
                op_part = f"{threading.get_native_id()}_{self._safe_op(op)}_{call}"
                records = []
                for b in (*self.user_blocks, *self.op_blocks):
                    read = self._read(b, f"{b.device_id}_{op_part}-{b.tag_tail}_before")
                    if read is None:
                        continue
                    if b.last is not None and read[0] != b.last:
                        self._note_change(_Change(b.name, op, call, prev=b.last_op))
                    records.append((b, read[0]))
                if records and self.out is not None:  # (_read made the output)
                    # Written now: if the op brings the process down, its "before" is on disk.
                    self.out.flush()
                self.local.pending = (op, call, op_part, records)
        except Exception as exc:
            self._report(exc)

    def after(
        self, info: OpInfo, args: Sequence[object], kwargs: Mapping[str, object], out: object
    ) -> None:
        try:
            pending = getattr(self.local, "pending", None)
            if pending is None or pending[0] != info.name:
                return
            self.local.pending = None
            with self.lock:
                op, call, op_part, records = pending
                for b, before in records:
                    if b.stopped is not None:
                        continue  # removed meanwhile
                    read = self._read(b, f"{b.device_id}_{op_part}-{b.tag_tail}_after")
                    if read is None:
                        continue
                    crc, addr = read
                    if crc != before:
                        writer = _written_arg(info, args, kwargs, addr, b.length)
                        self._note_change(_Change(b.name, op, call, writer=writer))
                    self._counted(b, crc, op, call)
                spec = self.spec
                if spec is not None and self.open:
                    if self.opened_by == (op, call) and not self.user_blocks:
                        self._watch_outputs(spec, op, call, op_part, out)
                    if op == spec.end:
                        self.open = False
                        for b in self.op_blocks:
                            self._stop(b, "the watch range closed")
                        self.op_blocks = []
                        for b in self.user_blocks:
                            # Ops outside the range may write it: no "between ops" change
                            # across the gap to the next range.
                            b.last = None
                if self.out is not None:
                    self.out.flush()
                self.refresh()
        except Exception as exc:
            self._report(exc)

    def _safe_op(self, op: str) -> str:
        safe = self.safe_ops.get(op)
        if safe is None:
            safe = self.safe_ops[op] = _safe_name(op)
        return safe

    def _counted(self, block: Block, crc: int, op: str, call: int) -> None:
        block.last, block.last_op = crc, (op, call)
        block.dumps += 1
        if block.dumps_left is not None:
            block.dumps_left -= 1
            if block.dumps_left <= 0:
                self._drop(block, f"dump_nums={block.dumps} reached")

    def _watch_outputs(self, spec: Spec, op: str, call: int, op_part: str, out: object) -> None:
        """With no registered block, the range watches what its start op returned."""
        outputs = list(_tensors(out))
        outid = spec.outid
        if outid is not None:
            if outid >= len(outputs):
                self.notes.append(
                    f"start op {op} (call {call}) returned {len(outputs)} tensor(s): outid "
                    f"{outid} is out of range, so nothing was watched"
                )
                return
            chosen = [(outid, outputs[outid])]
        else:
            chosen = list(enumerate(outputs))
        for index, t in chosen:
            block = _output_block(op, index, t)
            if block is None:
                continue
            self.op_blocks.append(block)
            read = self._read(block, f"{block.device_id}_{op_part}-{block.tag_tail}_after")
            if read is not None:
                self._counted(block, read[0], op, call)

    # --- exit -----------------------------------------------------------------------------------
    def summary_lines(self) -> list[str]:
        with self.lock:
            lines = []
            spec = self.spec
            if spec is not None:
                if spec.start not in self.calls:
                    lines.append(
                        f'start op "{spec.start}" never ran{_similar(spec.start, self.calls)}, so '
                        "nothing was watched; op names are written as in the dump's OP_LAUNCH "
                        "rows (aten::add_.Tensor)"
                    )
                elif spec.end not in self.calls:
                    lines.append(
                        f'end op "{spec.end}" never ran{_similar(spec.end, self.calls)}: the '
                        "range stayed open to the end"
                    )
            if not self.calls and self.used:
                lines.append(
                    "no op ran while tracking was on: call msmemscope.start(), or run under "
                    "msmemscope"
                )
            lines.extend(self.notes)
            unexpected = next((c for c in self.changes if c.unexpected), None)
            for c in self.changes[:_MAX_PRINTED]:
                lines.append(c.text())
            more = len(self.changes) - _MAX_PRINTED + self.dropped_changes
            if more > 0:
                lines.append(f"... and {more} more changes (all in watch_summary.txt)")
            for b in (*self.user_blocks, *self.stopped):
                state = "watched to the end" if b.stopped is None else f"stopped: {b.stopped}"
                lines.append(f'block "{b.name}": {b.dumps} op(s) dumped; {state}')
            if unexpected is not None:
                lines.append(f"first unexpected change: {unexpected.text()}")
            elif self.changes:
                lines.append(
                    "no unexpected change: every change came from an op whose schema writes the "
                    "block"
                )
            elif self.calls:
                lines.append("no watched block changed")
            out = self.out
            if out is not None and out.dir is not None:
                lines.append(f"{out.files} file(s), {out.bytes} bytes written in {out.dir}")
            elif out is not None and out.failed:
                lines.append(out.failed)
            return lines

    def at_exit(self) -> None:
        try:
            with self.lock:
                if not self.used:
                    return
                lines = self.summary_lines()
                out = self.out or _Output(self.nat)
                self.out = out
                full = lines
                extra = [c.text() for c in self.changes[_MAX_PRINTED:]]
                if extra:
                    full = [*lines, *extra]
                d = out.directory() if self.nat is not None else None
                if d is not None:
                    with open(os.path.join(d, "watch_summary.txt"), "w") as f:
                        f.write("".join(line + "\n" for line in full))
                out.close()
            sys.stderr.write("".join(f"msmemscope: watch: {line}\n" for line in lines))
            sys.stderr.flush()
        except Exception as exc:
            try:
                sys.stderr.write(f"msmemscope: watch: cannot write the summary: {exc}\n")
            except Exception:
                pass


def _similar(name: str, seen: Iterable[str]) -> str:
    """`` (did you mean aten::add.Tensor?)`` for a name that is a prefix of ops that ran."""
    close = sorted(n for n in seen if n.startswith(name + ".") or n.split(".")[0] == name)
    return f" (ops that ran: {', '.join(close[:5])})" if close else ""


def _written_arg(
    info: OpInfo, args: Sequence[object], kwargs: Mapping[str, object], addr: int, length: int
) -> str | None:
    """The name of the first argument the op's schema writes whose memory overlaps
    ``[addr, addr + length)``, or None."""
    end = addr + length
    name: str  # an argument's name in the schema
    for pos, name, write in info.access_args:
        if not write:
            continue
        for t in _tensors(_arg(args, kwargs, pos, name)):
            span = tensor_span(t)
            if span is not None and span[0] < end and addr < span[0] + span[1]:
                return name
    return None


def _output_block(op: str, index: int, t: torch.Tensor) -> Block | None:
    """A block over output ``index`` of the start op (its whole span)."""
    if t.device.type not in ("cpu", "cuda"):
        return None
    span = tensor_span(t)
    if span is None:
        return None
    st = t.untyped_storage()
    device = "cpu" if t.device.type == "cpu" else f"cuda:{t.device.index or 0}"
    offset = span[0] - st.data_ptr()
    return Block(op, index, device, span[1], storage=st, offset=offset, user=False)


WATCH = Watch()
