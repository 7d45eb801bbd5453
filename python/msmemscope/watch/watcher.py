"""``msmemscope.watcher``: watch a memory block for changes around PyTorch ops
(docs/python-api.md#watcher).

Two ways to name the block, as in the original msMemScope::

    msmemscope.watcher.watch(t, name="w", dump_nums=2)                    # a contiguous tensor
    msmemscope.watcher.watch(t.data_ptr(), length=64, name="w")           # an address range
    ...
    msmemscope.watcher.remove(t)
    msmemscope.watcher.remove(t.data_ptr(), length=64)
    msmemscope.watcher.remove(name="w")

Each op the PyTorch tracker sees from then on (or, with ``--watch=start,end``, each op of that
range) records the block's CRC-64 before and after it, or its bytes with ``full-content``, in
``watch_dump/`` of the run directory; ``dump_nums`` stops the watch after that many ops. At exit
a summary names the first op after which a block changed although the op's schema does not
write it. See :mod:`msmemscope.watch.state` for the details.

An address is accepted when it lies in a tensor storage msmemscope tracks (the range must end
inside that storage) or, for memory msmemscope does not know, when the whole range is readable
memory of this process. A watch never keeps memory alive: when the storage is freed the watch
ends.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import state

if TYPE_CHECKING:
    from typing import TypeGuard

    import torch

__all__ = ["remove", "watch"]


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_tensor(value: object) -> TypeGuard[torch.Tensor]:
    import sys

    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def _check_name(name: object) -> str:
    if name is None:
        raise TypeError('watch() needs name="..." to label the block in the dump files')
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, not {type(name).__name__}")
    if not name or len(name) > state.MAX_NAME:
        raise ValueError(
            f"name must have 1 to {state.MAX_NAME} characters, not {len(name)}: {name!r}"
        )
    if "/" in name or any(ord(c) < 32 or c == "\x7f" for c in name):
        raise ValueError(f"name {name!r} must not contain '/' or control characters")
    return name


def _check_dump_nums(dump_nums: object) -> int | None:
    if dump_nums is None:
        return None
    if not _is_int(dump_nums):
        raise TypeError(f"dump_nums must be an int or None, not {type(dump_nums).__name__}")
    if dump_nums < 1:
        raise ValueError(f"dump_nums must be at least 1 (None: no limit), not {dump_nums}")
    return dump_nums


def _check_length(length: object) -> int:
    if not _is_int(length):
        raise TypeError(f"length must be an int number of bytes, not {type(length).__name__}")
    if length < 1:
        raise ValueError(f"length must be at least 1 byte, not {length}")
    if length >= 1 << 64:
        raise ValueError(f"length must be below 2**64 bytes, not {length}")
    return length


def _device_name(t: torch.Tensor) -> str:
    if t.device.type == "cpu":
        return "cpu"
    if t.device.type == "cuda":
        return f"cuda:{t.device.index or 0}"
    raise ValueError(
        f"a tensor on {t.device} has no memory msmemscope can read; watch a cpu or cuda tensor"
    )


def _tensor_block(t: torch.Tensor, name: str, dump_nums: int | None) -> state.Block:
    device = _device_name(t)
    if t.numel() == 0:
        raise ValueError("the tensor has no elements, so there is no memory to watch")
    if not t.is_contiguous():
        raise ValueError(
            f"the tensor (shape {tuple(t.shape)}, strides {tuple(t.stride())}) is not "
            "contiguous, so its elements are not one address range: watch the tensor it is a "
            "view of, or an address and length"
        )
    try:
        storage = t.untyped_storage()
        offset = t.data_ptr() - storage.data_ptr()
    except Exception as exc:
        raise ValueError(f"the tensor has no memory msmemscope can read ({exc})") from None
    length = t.numel() * t.element_size()
    return state.Block(name, 0, device, length, storage=storage, offset=offset, dumps=dump_nums)


def _tracked_storage(addr: int) -> tuple[torch.UntypedStorage, str] | None:
    """``(storage, device)`` of the live tracked storage holding ``addr``, or None."""
    import sys

    tracker_module = sys.modules.get("msmemscope.capture.torch_tracker")
    tracker = getattr(tracker_module, "_tracker", None)
    if tracker is None:
        return None
    for ref in list(getattr(tracker, "live", {}).values()):
        size = getattr(ref, "size", 0)
        ptr = getattr(ref, "ptr", 0)
        if size and ptr <= addr < ptr + size:
            storage = ref()
            if storage is not None and storage.data_ptr() == ptr:
                return storage, ref.device
    return None


def _live_block(addr: int) -> tuple[int, int, str] | None:
    """``(start, size, device)`` of the live block holding ``addr`` when the native capture
    tracks the blocks, or None."""
    import sys

    tracker_module = sys.modules.get("msmemscope.capture.torch_tracker")
    tracker = getattr(tracker_module, "_tracker", None)
    live_block = getattr(tracker, "live_block", None)
    return live_block(addr) if live_block is not None else None


def _freed_block(addr: int) -> tuple[int, int, str] | None:
    """``(start, size, device)`` of a freed tracked block holding ``addr``, or None."""
    import sys

    tracker_module = sys.modules.get("msmemscope.capture.torch_tracker")
    # Either capture's tracker, or None (looked up without importing torch).
    tracker: Any = getattr(tracker_module, "_tracker", None)
    freed = getattr(tracker, "freed", None)
    if freed is not None and hasattr(freed, "block"):  # the native capture keeps them
        found: tuple[int, int, str] | None = freed.block(addr)
        return found
    if not freed:
        return None
    with tracker.lock:  # weakref callbacks (FREEs) may add to it from any thread
        blocks = list(freed.items())
    for start, (size, device) in blocks:
        if start <= addr < start + size:
            return start, size, device
    return None


def _address_block(addr: int, length: int, name: str, dump_nums: int | None) -> state.Block:
    if addr < 1 or addr >= 1 << 64:
        raise ValueError(f"address must be a positive int below 2**64 (a data_ptr()), not {addr}")
    if addr + length > 1 << 64:
        raise ValueError(f"0x{addr:x} + {length} bytes runs past the end of the address space")
    found = _tracked_storage(addr)
    if found is not None:
        storage, device = found
        start = storage.data_ptr()
        offset = addr - start
        room = storage.nbytes() - offset
        if length > room:
            raise ValueError(
                f"length {length} runs past the end of the tensor storage holding 0x{addr:x}: "
                f"the storage ({storage.nbytes()} bytes at 0x{start:x}) has {room} bytes from "
                "that address"
            )
        return state.Block(name, 0, device, length, storage=storage, offset=offset, dumps=dump_nums)
    live = _live_block(addr)
    if live is not None:  # the native capture: a block, no storage object to read through
        start, size, device = live
        room = start + size - addr
        if length > room:
            raise ValueError(
                f"length {length} runs past the end of the tensor storage holding 0x{addr:x}: "
                f"the storage ({size} bytes at 0x{start:x}) has {room} bytes from that address"
            )
    freed = None if live is not None else _freed_block(addr)
    if freed is not None:
        start, size, device = freed
        raise ValueError(
            f"0x{addr:x} lies in a tensor block msmemscope saw freed ({size} bytes at "
            f"0x{start:x} on {device}): what changes there is the allocator's reuse, not a "
            "tensor; watch a live tensor or an address inside one"
        )
    from .._runtime import native

    if native().watch_crc64_checked(addr, length) is None:
        raise ValueError(
            f"0x{addr:x} + {length} bytes is not readable memory of this process (nor inside "
            "a tensor storage msmemscope tracks): pass a tensor's data_ptr() and a length "
            "within it, or the tensor itself"
        )
    return state.Block(name, 0, "cpu", length, addr=addr, dumps=dump_nums)


def _address_and_length(target: object, length: object) -> tuple[int, int]:
    """The block given as ``(address, length=...)``: the first argument must be an int."""
    checked = _check_length(length)
    if not _is_int(target):
        raise TypeError(
            "with length=, the block is given by its address: the first argument must be "
            f"an int address (a data_ptr()), not {type(target).__name__}"
        )
    return target, checked


def watch(
    target: torch.Tensor | int,
    *,
    length: int | None = None,
    name: str | None = None,
    dump_nums: int | None = None,
) -> None:
    """Starts watching a block: ``watch(tensor, name=..., dump_nums=...)`` for a contiguous
    tensor's elements, or ``watch(address, length=..., name=..., dump_nums=...)`` for the
    ``length`` bytes at an int address. ``name`` (1 to 64 characters, no ``/``) labels the dumps;
    ``dump_nums`` limits how many ops are dumped (None: no limit)."""
    name = _check_name(name)
    dump_nums = _check_dump_nums(dump_nums)
    if length is not None:
        addr, size = _address_and_length(target, length)
        block = _address_block(addr, size, name, dump_nums)
    elif _is_tensor(target):
        block = _tensor_block(target, name, dump_nums)
    elif _is_int(target):
        raise TypeError("watching an address needs length=: watch(address, length=N, name=...)")
    else:
        raise TypeError(
            f"watch() takes a torch.Tensor or an int address with length=, not "
            f"{type(target).__name__}"
        )
    state.WATCH.add(block)


def remove(
    target: torch.Tensor | int | None = None,
    *,
    length: int | None = None,
    name: str | None = None,
) -> None:
    """Stops watching a block, given as it was to :func:`watch` (the tensor, or the address and
    length), or by its ``name``. A block whose watch already ended (``dump_nums`` reached, its
    storage freed) is accepted and nothing happens; one never watched is a ValueError."""
    if name is not None:
        if target is not None or length is not None:
            raise TypeError("remove() takes either name= alone, or the tensor / address and length")
        block = state.WATCH.find(lambda b: b.name == name)
        if block is None:
            raise ValueError(f"no block named {name!r} is watched; watched: {_listing()}")
        state.WATCH.remove(block)
        return
    if length is not None:
        addr, length = _address_and_length(target, length)
    elif _is_tensor(target):
        span = state.tensor_span(target)
        if span is None:
            raise ValueError("the tensor has no memory, so it cannot be watched")
        addr, length = span
    elif _is_int(target):
        raise TypeError("removing an address needs length=: remove(address, length=N)")
    else:
        raise TypeError(
            "remove() takes the watched torch.Tensor, an int address with length=, or name=, "
            f"not {type(target).__name__}"
        )

    def same(b: state.Block) -> bool:
        where = b.locate()
        return (where[0] if where else b.at) == addr and b.length == length

    block = state.WATCH.find(same)
    if block is None:
        raise ValueError(
            f"0x{addr:x} + {length} bytes is not a watched block; watched: {_listing()}"
        )
    state.WATCH.remove(block)


def _listing() -> str:
    with state.WATCH.lock:
        blocks = [b.describe() for b in state.WATCH.user_blocks]
    return ", ".join(blocks) if blocks else "none"
