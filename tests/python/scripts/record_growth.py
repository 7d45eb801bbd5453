"""A pure-Python data pipeline: a lookup cache is filled once at start; then each of 12 steps
keeps 2,000 records (dicts holding a list, of small ints only, which CPython never allocates) in a
list that only grows (the leak), and builds and drops 3,000 temporary strings. About 0.1 s per
step.

With ``--tracemalloc OUT`` the program traces itself with the standard library's tracemalloc
and writes to OUT, for each line of this file, the bytes and blocks still allocated when the
steps are done (``{"LINE": [bytes, blocks]}``, the innermost frame's line): the oracle the
host-leak report is checked against.
"""

import json
import sys
import time
import tracemalloc

STEPS = 12
RECORDS_PER_STEP = 2000

kept = []
cache = {}


def fill_cache():
    for i in range(5000):
        cache[i] = ("entry", i, f"name-{i}")  # the cache: filled once, kept


def make_record(step, i):
    return {"step": step, "slot": i % 100, "payload": [step, i % 7, None]}  # the leak


def churn(step):
    scratch = [f"tmp-{step}-{j}" for j in range(3000)]  # temporaries: dropped each step
    return len(scratch)


def main():
    oracle = sys.argv[2] if len(sys.argv) > 2 and sys.argv[1] == "--tracemalloc" else None
    if oracle:
        tracemalloc.start()
    fill_cache()
    for step in range(STEPS):
        for i in range(RECORDS_PER_STEP):
            kept.append(make_record(step, i))
        churn(step)
        time.sleep(0.1)
    if oracle:
        by_line = {}
        for stat in tracemalloc.take_snapshot().statistics("lineno"):
            frame = stat.traceback[0]
            if frame.filename == __file__:
                by_line[str(frame.lineno)] = [stat.size, stat.count]
        with open(oracle, "w") as f:
            json.dump(by_line, f)
    print(f"kept {len(kept)} records")


main()
