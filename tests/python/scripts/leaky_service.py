"""A Python "service" whose two request handlers leak through a C extension (leaker, built by
the test next to this script's copy): handle_upload leaks 1500 bytes per call, 150 calls;
handle_thumbnail 700 bytes per call, 50 calls; over about 3 s. Other requests allocate and free.
"""

import sys
import time

import leaker


def handle_upload():
    leaker.leak(1500)


def handle_thumbnail():
    leaker.leak(700)


def handle_ping():
    leaker.churn(4096)


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 3.0
    start = time.monotonic()
    for request in range(200):
        if request % 4 == 3:
            handle_thumbnail()
        else:
            handle_upload()
        handle_ping()
        # Evenly spread over the run, so that the leaks grow all along it.
        time.sleep(max(0.0, start + seconds * (request + 1) / 200 - time.monotonic()))
    print("served 200 requests")


main()
