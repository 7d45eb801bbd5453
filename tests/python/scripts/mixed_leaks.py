"""Two leaks of two kinds in one program, over 10 steps of about 0.1 s: ``buffer_frames``
leaks 4,000 bytes of C heap per call through the ``leaker`` C extension (built by the test next
to this script's copy), 5 calls a step; ``remember`` keeps 500 Python dicts a step in a list."""

import time

import leaker

seen = []


def buffer_frames():
    leaker.leak(4000)  # the C-extension leak


def remember(step):
    for i in range(500):
        seen.append({"step": step, "n": i % 50})  # the Python-object leak


for step in range(10):
    for _ in range(5):
        buffer_frames()
    remember(step)
    time.sleep(0.1)
print("done")
