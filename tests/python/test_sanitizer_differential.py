"""The native race checker against PyTorch's CUDA sanitizer, on CPU.

``torch.cuda._sanitizer.EventHandler`` is pure Python: its vector clocks and access bookkeeping
run with integer stream, event and pointer handles and no GPU. Both checkers get the same
sequences of kernel launches, event records/waits and synchronizations; on launches whose
arguments are whole tensors (each pointer always with the same size, pointers never
overlapping) they must report the same races. Then the cases where memory overlaps without
sharing a data pointer (views at offsets): ours reports them, CSAN, keyed by data_ptr, misses
them.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest

csan = pytest.importorskip("torch.cuda._sanitizer")
from msmemscope import _native  # noqa: E402

TENSOR_BYTES = 256
POINTERS = [0x10000 + i * 0x1000 for i in range(6)]
STREAMS = [0, 1, 2, 3]
EVENTS = [100, 101, 102]


class Both:
    """Feeds one program to both checkers and keeps what each reported, as comparable tuples
    (current seq, current kind, current stream, previous seq, previous kind, previous stream,
    pointer)."""

    def __init__(self) -> None:
        self.csan = csan.EventHandler()
        self.ours = _native.RaceChecker()
        self.csan_races: list[tuple] = []
        self.our_races: list[tuple] = []

    def launch(
        self,
        stream: int,
        reads: list[int],
        writes: list[int],
        name: str = "op",
        sizes: dict[int, int] | None = None,
    ) -> None:
        sizes = sizes or {}
        size = lambda p: sizes.get(p, TENSOR_BYTES)  # noqa: E731
        read_items = ",".join(f"r{i}:{p:#x}:{size(p)}" for i, p in enumerate(reads))
        write_items = ",".join(f"w{i}:{p:#x}:{size(p)}" for i, p in enumerate(writes))
        message = f"sanitizer-op: name={name};read={read_items};write={write_items}"
        for race in self.ours.launch(stream, message):
            cur, prev = race["current"], race["previous"]
            self.our_races.append(
                (
                    cur["seq"],
                    cur["kind"],
                    cur["stream"],
                    prev["seq"],
                    prev["kind"],
                    prev["stream"],
                    cur["addr"],
                )
            )
        read_write = set(writes)
        read_only = set(reads) - read_write
        aliases = {p: [f"arg{p:#x}"] for p in read_only | read_write}
        for error in self.csan._handle_kernel_launch(
            stream, read_only, read_write, set(), name, aliases
        ):
            cur, prev = error.current_access, error.previous_access
            kind = lambda a: "read" if a.type is csan.AccessType.READ else "write"  # noqa: E731
            self.csan_races.append(
                (
                    cur.seq_num,
                    kind(cur),
                    cur.stream,
                    prev.seq_num,
                    kind(prev),
                    prev.stream,
                    error.data_ptr,
                )
            )

    def free(self, ptr: int) -> None:
        self.csan._handle_memory_deallocation(ptr)
        self.ours.forget(ptr, TENSOR_BYTES)

    def record(self, event: int, stream: int) -> None:
        self.csan._handle_event_record(event, stream)
        self.ours.event_record(event, stream)

    def wait(self, stream: int, event: int) -> None:
        self.csan._handle_event_wait(event, stream)
        self.ours.stream_wait_event(stream, event)

    def event_sync(self, event: int) -> None:
        self.csan._handle_event_synchronization(event)
        self.ours.event_synchronize(event)

    def stream_sync(self, stream: int) -> None:
        self.csan._handle_stream_synchronization(stream)
        self.ours.stream_synchronize(stream)

    def device_sync(self) -> None:
        self.csan._handle_device_synchronization()
        self.ours.device_synchronize()

    def assert_same(self) -> None:
        assert Counter(self.our_races) == Counter(self.csan_races)


def random_program(rng: random.Random, both: Both, steps: int) -> None:
    for _ in range(steps):
        roll = rng.random()
        if roll < 0.6:
            chosen = rng.sample(POINTERS, rng.randint(1, 3))
            writes = [p for p in chosen if rng.random() < 0.5]
            # Some written pointers are read too: in place, as CSAN's read_write set.
            reads = [p for p in chosen if p not in writes or rng.random() < 0.3]
            both.launch(rng.choice(STREAMS), reads, writes)
        elif roll < 0.75:
            both.record(rng.choice(EVENTS), rng.choice(STREAMS))
        elif roll < 0.9:
            both.wait(rng.choice(STREAMS), rng.choice(EVENTS))
        elif roll < 0.95:
            both.event_sync(rng.choice(EVENTS))
        elif roll < 0.97:
            both.stream_sync(rng.choice(STREAMS))
        elif roll < 0.98:
            both.free(rng.choice(POINTERS))
        else:
            both.device_sync()


@pytest.mark.parametrize("seed", range(40))
def test_random_programs_report_the_same_races(seed: int) -> None:
    both = Both()
    random_program(random.Random(seed), both, steps=150)
    both.assert_same()


class WithoutSyncs(Both):
    """The same programs with every synchronization (and free) left out."""

    def free(self, ptr: int) -> None:
        pass

    def record(self, event: int, stream: int) -> None:
        pass

    def wait(self, stream: int, event: int) -> None:
        pass

    def event_sync(self, event: int) -> None:
        pass

    def stream_sync(self, stream: int) -> None:
        pass

    def device_sync(self) -> None:
        pass


def test_the_random_programs_exercise_both_races_and_synchronization() -> None:
    """Two silent checkers would agree trivially: the programs race often, and their
    synchronizations remove a good share of the races (so the clocks were compared too)."""
    with_syncs = without_syncs = 0
    for seed in range(40):
        synced, unsynced = Both(), WithoutSyncs()
        random_program(random.Random(seed), synced, steps=150)
        random_program(random.Random(seed), unsynced, steps=150)
        unsynced.assert_same()
        with_syncs += len(synced.our_races)
        without_syncs += len(unsynced.our_races)
    assert with_syncs > 500
    assert with_syncs < 0.8 * without_syncs, (with_syncs, without_syncs)


A, B, C = 1, 2, 3
X, Y = POINTERS[0], POINTERS[1]
HAND_WRITTEN: dict[str, tuple[list[tuple[str, Any]], int]] = {
    # name: (program, races expected from both)
    "write_write_unsynchronized": ([("launch", (A, [], [X])), ("launch", (B, [], [X]))], 1),
    "read_after_write_unsynchronized": ([("launch", (A, [], [X])), ("launch", (B, [X], []))], 1),
    "write_after_read_unsynchronized": ([("launch", (A, [X], [])), ("launch", (B, [], [X]))], 1),
    "reads_never_race": ([("launch", (A, [X], [])), ("launch", (B, [X], []))], 0),
    "same_stream_is_ordered": ([("launch", (A, [], [X])), ("launch", (A, [X], [X]))], 0),
    "event_record_then_wait": (
        [
            ("launch", (A, [], [X])),
            ("record", (100, A)),
            ("wait", (B, 100)),
            ("launch", (B, [X], [X])),
        ],
        0,
    ),
    "wait_before_record_does_not_order": (
        [
            ("wait", (B, 100)),
            ("launch", (A, [], [X])),
            ("record", (100, A)),
            ("launch", (B, [X], [])),
        ],
        1,
    ),
    "record_captures_only_earlier_work": (
        [
            ("record", (100, A)),
            ("launch", (A, [], [X])),
            ("wait", (B, 100)),
            ("launch", (B, [], [X])),
        ],
        1,
    ),
    "ordering_is_transitive_through_events": (
        [
            ("launch", (A, [], [X])),
            ("record", (100, A)),
            ("wait", (B, 100)),
            ("record", (101, B)),
            ("wait", (C, 101)),
            ("launch", (C, [X], [])),
        ],
        0,
    ),
    "device_synchronize_orders_all": (
        [
            ("launch", (A, [], [X])),
            ("launch", (B, [], [Y])),
            ("device_sync", ()),
            ("launch", (C, [X, Y], [])),
        ],
        0,
    ),
    "stream_synchronize_orders_only_that_stream": (
        [
            ("launch", (A, [], [X])),
            ("launch", (B, [], [Y])),
            ("stream_sync", (A,)),
            ("launch", (C, [X, Y], [])),
        ],
        1,
    ),
    "event_synchronize_orders_what_it_captured": (
        [
            ("launch", (A, [], [X])),
            ("record", (100, A)),
            ("launch", (A, [], [Y])),
            ("event_sync", (100,)),
            ("launch", (B, [X, Y], [])),
        ],
        1,
    ),
    "a_freed_tensor_starts_without_history": (
        [("launch", (A, [], [X])), ("free", (X,)), ("launch", (B, [], [X]))],
        0,
    ),
    "write_after_two_reads_races_with_each_unordered_read": (
        [
            ("launch", (A, [], [X])),
            ("device_sync", ()),
            ("launch", (B, [X], [])),
            ("launch", (C, [X], [])),
            ("launch", (A, [], [X])),
        ],
        2,
    ),
}


@pytest.mark.parametrize("name", sorted(HAND_WRITTEN))
def test_hand_written_programs(name: str) -> None:
    program, expected = HAND_WRITTEN[name]
    both = Both()
    for op, args in program:
        {
            "launch": both.launch,
            "record": both.record,
            "wait": both.wait,
            "event_sync": both.event_sync,
            "stream_sync": both.stream_sync,
            "device_sync": both.device_sync,
            "free": both.free,
        }[op](*args)
    both.assert_same()
    assert len(both.our_races) == expected


# Overlapping memory without a shared data pointer: what a data_ptr-keyed checker misses.
# name: (launches as (stream, reads, writes, sizes), races we report, the ones CSAN reports)
BASE = 0x40000
MISSED_BY_CSAN = {
    # A view 1 KiB into a 4 KiB buffer, written on another stream.
    "view_at_offset": (
        [(A, [], [BASE], {BASE: 4096}), (B, [], [BASE + 1024], {BASE + 1024: 1024})],
        [(2, "write", B, 1, "write", A, BASE + 1024)],
        [],
    ),
    # Two halves read on two streams, then the whole buffer written on a third.
    "halves_then_whole": (
        [
            (A, [BASE], [], {BASE: 2048}),
            (B, [BASE + 2048], [], {BASE + 2048: 2048}),
            (C, [], [BASE], {BASE: 4096}),
        ],
        [(3, "write", C, 1, "read", A, BASE), (3, "write", C, 2, "read", B, BASE)],
        # The first half shares the buffer's data pointer; the second half does not.
        [(3, "write", C, 1, "read", A, BASE)],
    ),
    # Ranges that only partly overlap.
    "partial_overlap": (
        [(A, [], [BASE], {BASE: 100}), (B, [BASE + 99], [], {BASE + 99: 100})],
        [(2, "read", B, 1, "write", A, BASE + 99)],
        [],
    ),
}


@pytest.mark.parametrize("name", sorted(MISSED_BY_CSAN))
def test_overlapping_ranges_we_catch_and_csan_misses(name: str) -> None:
    launches, ours, theirs = MISSED_BY_CSAN[name]
    both = Both()
    for stream, reads, writes, sizes in launches:
        both.launch(stream, reads, writes, sizes=sizes)
    assert sorted(both.our_races) == sorted(ours)
    assert sorted(both.csan_races) == sorted(theirs)
    assert len(ours) > len(theirs)
