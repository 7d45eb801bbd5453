"""A launched host-leak run driven from Python: stop() closes the launcher's window 1, start()
opens window 2 with the launch configuration; reading the configuration changes nothing."""

import ctypes
import json

import msmemscope
from msmemscope._runtime import native

libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]

config = json.loads(native().current_config())
print("analysis", config["analysis"])
first = libc.malloc(123457)  # window 1
msmemscope.stop()
between = libc.malloc(234567)  # no window
msmemscope.start()
second = libc.malloc(345679)  # window 2
print("done")
