"""Two custom operators on two streams, reported with sanitizer-op marks from Python as the
original msMemScope's example does (one ``mstx.mark`` per operator, the stream as the second
argument).

    sanitizer_streams.py race   demo.py_produce (stream 11) writes a tensor's storage;
                                demo.py_overwrite (stream 22) writes its second half,
                                with nothing ordering them
    sanitizer_streams.py sync   the same, with event 33 recorded on stream 11 after the first
                                operator and waited for by stream 22 before the second

Prints ``ptr=<data_ptr> bytes=<nbytes>``. Runs under ``msmemscope`` with no other setup: the
marks alone turn the race checker on.
"""

import sys

import torch

import msmemscope
from msmemscope import mstx, sanitizer

PRODUCER, CONSUMER, EVENT = 11, 22, 33


def mark_op(name: str, stream: int, writes: list[tuple[str, torch.Tensor]]) -> None:
    items = ",".join(
        f"{alias}:{t.data_ptr()}:{t.numel() * t.element_size()}" for alias, t in writes
    )
    mstx.mark(f"sanitizer-op: name={name};write={items}", stream)


def main(mode: str) -> None:
    buf = torch.zeros(1024, dtype=torch.float32)
    print(f"ptr={buf.data_ptr()} bytes={buf.numel() * buf.element_size()}", flush=True)
    mark_op("demo.py_produce", PRODUCER, [("out", buf)])
    buf.fill_(1.0)
    if mode == "sync":
        sanitizer.event_record(EVENT, PRODUCER)
        sanitizer.stream_wait_event(CONSUMER, EVENT)
    half = buf[512:]
    mark_op("demo.py_overwrite", CONSUMER, [("dst", half)])
    half.fill_(2.0)
    assert msmemscope is not None


if __name__ == "__main__":
    main(sys.argv[1])
