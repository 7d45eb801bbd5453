"""Limits held against what a test did, and the failure text when one is exceeded.

The text names the bytes measured, the limit (in bytes and as written) and the largest
allocating sites as ``file:line (function)`` of the test's code, one line each.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .limits import HOST_LEAKS, LEAKS, MEMORY, Limit, format_bytes
from .tracking import HostResult, TensorResult
from .usage import Site, SiteNamer, top_sites

__all__ = ["TOP_SITES", "Breach", "host_breach", "render", "tensor_breaches"]

#: Sites listed per exceeded limit.
TOP_SITES = 5


@dataclass(frozen=True)
class Breach:
    """A limit the test exceeded: the bytes measured, their blocks, and where they came from."""

    limit: Limit
    measured: int
    blocks: int
    sites: Sequence[Site]


def tensor_breaches(
    limits: Sequence[Limit], result: TensorResult, namer: SiteNamer
) -> list[Breach]:
    """The tensor limits the test's rows exceed: peaks for limit_memory, blocks alive at the
    end for limit_leaks."""
    breaches = []
    for limit in limits:
        measure = result.usage.peak if limit.kind == MEMORY else result.usage.alive_at_end
        measured, blocks = measure(limit.device)
        if measured <= limit.limit:
            continue
        sites = top_sites(((namer.name(b.frames), b.size, 1) for b in blocks), TOP_SITES)
        breaches.append(Breach(limit, measured, len(blocks), sites))
    return breaches


def _host_site_name(site: dict[str, Any], namer: SiteNamer) -> str:
    python = site.get("python_frames") or []
    if python:
        return namer.name(python)
    frames = site.get("frames") or []
    return f"{frames[0]} (no Python frame)" if frames else "<no stack>"


def host_breach(limit: Limit, result: HostResult, namer: SiteNamer) -> Breach | None:
    """The host-leak limit, if the window's unfreed bytes exceed it."""
    if result.unfreed_bytes <= limit.limit:
        return None
    items = []
    for site in result.sites:
        unfreed = site.get("unfreed") or {}
        if unfreed.get("bytes"):
            items.append((_host_site_name(site, namer), int(unfreed["bytes"]), unfreed["count"]))
    sites = top_sites(items, TOP_SITES)
    return Breach(limit, result.unfreed_bytes, result.unfreed_blocks, sites)


def _blocks(n: int) -> str:
    return f"{n} block" if n == 1 else f"{n} blocks"


def _headline(b: Breach) -> str:
    lim = b.limit
    measured = f"{b.measured} bytes ({format_bytes(b.measured, lim.binary)})"
    over = f"over the limit of {lim.limit} bytes ({lim.written})"
    if lim.kind == MEMORY:
        return (
            f"{MEMORY}: tensor memory allocated by the test peaked at {measured} on "
            f"{lim.device}, {over}"
        )
    if lim.kind == LEAKS:
        return (
            f"{LEAKS}: {measured} of tensor memory in {_blocks(b.blocks)} allocated by the test "
            f"on {lim.device} still alive at its end, {over}"
        )
    assert lim.kind == HOST_LEAKS
    return (
        f"{HOST_LEAKS}: {measured} of host heap in {_blocks(b.blocks)} allocated by the test "
        f"and not freed by its end, {over}"
    )


_SITES_TITLE = {
    MEMORY: "Tensor blocks alive at the peak, by allocating site:",
    LEAKS: "Tensor blocks still alive, by allocating site:",
    HOST_LEAKS: "Unfreed host blocks, by allocating site (largest first):",
}


def render(breaches: Sequence[Breach], kept: str | None = None) -> str:
    """The failure text: per breach a headline and its largest sites; then where the dump is."""
    lines = []
    for b in breaches:
        lines.append(_headline(b))
        if b.sites:
            lines.append(_SITES_TITLE[b.limit.kind])
            for s in b.sites:
                size = f"{s.size} bytes ({format_bytes(s.size, b.limit.binary)})"
                lines.append(f"    - {s.where}: {size} in {_blocks(s.count)}")
    if kept:
        lines.append(f"The test's dump is kept in {kept} (open it with: msmemscope report {kept})")
    return "\n".join(lines)
