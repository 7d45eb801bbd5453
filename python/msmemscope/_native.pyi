"""Type stubs of the msmemscope._native extension (crates/python)."""

import os

ABI_VERSION: int
HOST_HOOKS_MISSING: str
CONFIG_KEYS: str

EVENT_MALLOC: int
EVENT_FREE: int
EVENT_ACCESS: int
EVENT_OP_LAUNCH: int
EVENT_KERNEL_LAUNCH: int
EVENT_MSTX: int
EVENT_SYSTEM: int
EVENT_SNAPSHOT: int
EVENT_OOM_DETAIL: int

TYPE_HAL: int
TYPE_PTA: int
TYPE_HOST: int
TYPE_READ: int
TYPE_WRITE: int
TYPE_UNKNOWN: int
TYPE_ATEN_START: int
TYPE_ATEN_END: int
TYPE_KERNEL_LAUNCH: int
TYPE_MARK: int
TYPE_RANGE_START: int
TYPE_RANGE_END: int
TYPE_START_TRACE: int
TYPE_STOP_TRACE: int
TYPE_STEP: int
TYPE_SNAPSHOT: int
TYPE_OOM_TRIGGER: int
TYPE_OOM_RECENT_ALLOC: int
TYPE_OOM_TOP_ALLOC: int
TYPE_HOLDER: int
TYPE_OWNER: int

AttrValue = int | float | str | bool | None | list[int] | tuple[int, ...]

def abi_version() -> int:
    """The C ABI version this extension was built for."""

def runtime_loaded() -> bool:
    """Whether the runtime library is available (preloaded, or loaded by load_runtime)."""

def runtime_path() -> str | None:
    """Path of the runtime library in use; None when none is loaded."""

def runtime_preloaded() -> bool | None:
    """True: it was in the process already; False: load_runtime loaded it; None: none loaded."""

def load_runtime(path: str) -> str:
    """Loads the runtime library unless one is present; returns the path of the one in use."""

def default_config() -> str:
    """The default RunConfig JSON."""

def validate_config(current_json: str, **kw: str | list[str] | tuple[str, ...]) -> str:
    """Applies config keys to a RunConfig JSON and returns the resolved JSON.

    ValueError: unknown key or invalid value; TypeError: a value that is not a str (``analysis``
    may also be a list or tuple of str)."""

def configure(json: str) -> bool:
    """Applies a RunConfig JSON; False when refused because a host-leak window is open."""

def current_config() -> str:
    """The runtime's active RunConfig JSON."""

def start() -> None: ...
def stop() -> None: ...
def step() -> None: ...
def optimizer_step() -> bool:
    """An optimizer's step() ended: True when taken as the end of a step."""

def leak_suspects() -> str:
    """Live blocks of the sites judged leaking: `ptr\tdevice\tsize\tsite` lines."""

def findings() -> str:
    """What the running analyses found so far, as JSON (schema ``msmemscope.findings/1``)."""

def keep_steps(steps: list[int]) -> bool:
    """Asks a bounded dump to keep these steps' rows in full; False when nothing is traced."""

def tracing() -> bool: ...
def host_hooks_active() -> bool: ...
def track_python_objects() -> int: ...
def abi_entry_points() -> tuple[int, int, int, int]: ...
def emit(
    event: int,
    event_type: int,
    name: str,
    device: str | None,
    ptr: int | None,
    attrs: dict[str, AttrValue] | None,
    python_stack: str = "",
    want_c_stack: bool = False,
) -> int:
    """Sends one event; 0 recorded, 1 filtered out or not tracing."""

def mstx_mark(message: str, stream: int = 0) -> None: ...
def mstx_range_start(message: str, stream: int = 0) -> int: ...
def mstx_range_end(range_id: int) -> None: ...

# Offline analyses (crates/python/src/analyzers.rs)
INEFFICIENT_TYPES: list[str]
DEFAULT_IDLE_THRESHOLD: int

def check_leaks(
    input_path: str | os.PathLike[str], mstx_info: str, start_index: int
) -> tuple[str, list[dict[str, object]]]:
    """(the report text, the leaked blocks)."""

def check_inefficient(
    input_path: str | os.PathLike[str],
    mem_size: int | None = None,
    inefficient_type: str | None = None,
    idle_threshold: int | None = None,
    *,
    output_path: str | os.PathLike[str] | None = None,
) -> list[dict[str, object]]:
    """The marked blocks, one dict per (block, kind)."""

def check_decompose(input_path: str | os.PathLike[str]) -> list[dict[str, object]]:
    """The per-step table of bytes by owner."""

def check_peak(input_path: str | os.PathLike[str]) -> str:
    """What each device's peak is made of, as leaks/peak.json's text."""

# Memory block watch (crates/python/src/watch.rs)
def watch_crc64(addr: int, length: int) -> int:
    """CRC-64 of memory read in place (the caller keeps it allocated)."""

def watch_crc64_checked(addr: int, length: int) -> int | None:
    """CRC-64 read through /proc/self/mem; None when not readable memory."""

def watch_dump_bytes(path: str, addr: int, length: int, checked: bool = False) -> bool:
    """Writes the bytes to a new file; False when a checked range is not readable."""

def run_dir() -> str:
    """The run directory, created if the run has none yet."""

def run_dir_create(relative: str) -> int:
    """Creates a private file (0640) in the run directory through its held descriptor; its fd."""

def run_dir_mkdir(relative: str) -> None:
    """Makes a directory (0750) in the run directory through its held descriptor."""

# --- stream-race sanitizer ---------------------------------------------------------------------

def parse_sanitizer_mark(message: str) -> dict[str, object]:
    """``name`` and ``read_only``/``read_write``/``write_only`` lists of (alias, addr, size);
    ValueError (column and reason) when the message breaks a rule of the format."""

class RaceChecker:
    """The native race checker on its own: launches and synchronizations in program order."""

    def __init__(self) -> None: ...
    def launch(self, stream: int, message: str) -> list[dict[str, object]]: ...
    def forget(self, addr: int, size: int) -> None: ...
    def event_record(self, event: int, stream: int) -> None: ...
    def stream_wait_event(self, stream: int, event: int) -> None: ...
    def event_synchronize(self, event: int) -> None: ...
    def stream_synchronize(self, stream: int) -> None: ...
    def device_synchronize(self) -> None: ...
    def report(self) -> str: ...

def sanitizer_enable(forward: object | None = None) -> None: ...
def sanitizer_sync(kind: int, a: int = 0, b: int = 0) -> None: ...
def sanitizer_report() -> str: ...
