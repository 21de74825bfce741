"""How many threads one process uses for its array work: ``--threads N``, else ``CKPT_THREADS``,
else the CPUs this process may use.

The CPUs a process may use are the fewest of: the CPUs of its affinity mask
(``os.sched_getaffinity``: ``taskset``, a cpuset) and its CPU quota, rounded up (cgroup v2
``cpu.max`` ``"200000 100000"`` is 2 CPUs; v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``). A
container limited to 2 CPUs on a 64-core host sees 64 in ``os.cpu_count()``; 64 busy threads
would only queue behind each other.

The number is set once per process by the command (``use_threads``) and read where the work is
sized (``threads()``): TensorStore's ``data_copy_concurrency`` (its decode and encode threads)
in every context ckpt creates (``ts_context``), the pools that checksum files, and the ranges a
large decoded block is hashed in. ``file_io_concurrency`` (local files only) is at least
``FILE_IO_MIN`` (writers: ``WRITE_FILE_IO``) whatever the threads: a read or write in flight
waits on the disk, not on a core, and a deeper queue keeps the disk busy. Object stores have
their own request limit (``--max-requests``): a request waits on the network.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Generic, TypeVar

from ckpt_cli.errors import UsageError

ENV = "CKPT_THREADS"
CGROUP_ROOT = Path("/sys/fs/cgroup")
#: TensorStore's ``file_io_concurrency`` floors: reads (and writes) in flight beyond the cores
#: cost no CPU and keep the disk's queue full.
FILE_IO_MIN = 8
WRITE_FILE_IO = 32

_chosen: int | None = None

#: glibc ``mallopt`` parameters (malloc.h): ``M_TRIM_THRESHOLD``, ``M_TOP_PAD``.
M_TRIM_THRESHOLD, M_TOP_PAD = -1, -2
#: Free memory a heap keeps before glibc hands it back, and the slack it asks for when it grows.
TRIM_THRESHOLD_BYTES = 1 << 30
TOP_PAD_BYTES = 64 << 20


def cgroup_cpus(root: Path = CGROUP_ROOT, own: str | None = None) -> float | None:
    """The CPU quota of this process's cgroup in CPUs (``1.5``), or None when there is none.

    ``root`` is where cgroupfs is mounted; ``own`` the text of ``/proc/self/cgroup`` (read
    when None). v2: ``<root>/<path>/cpu.max``, then the same file at ``root``; v1:
    ``<root>/cpu[,cpuacct]/cpu.cfs_quota_us`` and ``cpu.cfs_period_us``."""
    if own is None:
        try:
            own = Path("/proc/self/cgroup").read_text()
        except OSError:
            own = ""
    v2_path = next((ln.split(":", 2)[2] for ln in own.splitlines() if ln.startswith("0::")), "/")
    for d in dict.fromkeys([root / v2_path.lstrip("/"), root]):
        quota = _v2_quota(d / "cpu.max")
        if quota is not None:
            return quota
    for name in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
        quota = _v1_quota(root / name)
        if quota is not None:
            return quota
    return None


def _v2_quota(path: Path) -> float | None:
    try:
        fields = path.read_text().split()
    except OSError:
        return None
    if len(fields) < 1 or fields[0] == "max":
        return None
    try:
        quota, period = int(fields[0]), int(fields[1]) if len(fields) > 1 else 100000
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def _v1_quota(d: Path) -> float | None:
    try:
        quota = int((d / "cpu.cfs_quota_us").read_text().strip())
        period = int((d / "cpu.cfs_period_us").read_text().strip())
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None


def available_cpus(
    affinity: set[int] | None = None, root: Path = CGROUP_ROOT, own: str | None = None
) -> int:
    """The CPUs this process may use: its affinity mask, capped by its cgroup quota (>= 1)."""
    if affinity is None:
        try:
            affinity = os.sched_getaffinity(0)
        except (AttributeError, OSError):  # not Linux
            affinity = set(range(os.cpu_count() or 1))
    cpus = max(1, len(affinity))
    quota = cgroup_cpus(root, own)
    if quota is not None:
        cpus = min(cpus, max(1, math.ceil(quota)))
    return cpus


def parse_threads(text: str, option: str) -> int:
    """A thread count from the command line or ``CKPT_THREADS``: a whole number >= 1."""
    try:
        n = int(text.strip())
    except ValueError:
        n = 0
    if n < 1:
        raise UsageError(
            f"{option} {text[:40]!r} is not a thread count: use a whole number of 1 or more"
        )
    return n


def resolve_threads(value: int | None = None, env: Mapping[str, str] | None = None) -> int:
    """``value`` when given, else ``CKPT_THREADS``, else ``available_cpus()``; a bad
    ``CKPT_THREADS`` is a ``UsageError``."""
    if value is not None:
        if value < 1:
            raise UsageError(f"--threads {value}: use a whole number of 1 or more")
        return value
    text = (os.environ if env is None else env).get(ENV, "").strip()
    if text:
        return parse_threads(text, ENV)
    return available_cpus()


def use_threads(n: int | None) -> int:
    """Set this process's thread count (None: the default); returns it."""
    global _chosen
    _chosen = resolve_threads(n)
    return _chosen


def tune_allocator(environ: Mapping[str, str] = os.environ) -> bool:
    """Keep freed buffers in the process (glibc only; a command's process, not a library
    caller's): returns whether malloc was tuned.

    Every block ckpt streams is a fresh buffer of megabytes (a read range, a decoded slab, a
    scratch array). Left to itself glibc trims each heap as soon as a few hundred KiB at its top
    are free, so every thread hands its pages back to the kernel after each block and faults them
    in again for the next: on the 13-core TPU host ``verify --deep --threads 13`` of 4 GiB spent
    13.7 s of its 33 s of CPU in the kernel and took 6.3 s; with heaps trimmed only past
    ``TRIM_THRESHOLD_BYTES`` free, 1.7 s and 3.9 s (peak RSS 650 -> 693 MiB). A user's own
    ``MALLOC_*`` settings win (nothing is changed), as does ``CKPT_MALLOC=0``."""
    if environ.get("CKPT_MALLOC") == "0" or any(k.startswith("MALLOC_") for k in environ):
        return False
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (macOS, musl without mallopt)
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) and mallopt(M_TOP_PAD, TOP_PAD_BYTES)
    )


def threads() -> int:
    """This process's thread count: the one ``use_threads`` set, else the default (a library
    caller who set nothing gets ``CKPT_THREADS`` or the CPUs it may use)."""
    global _chosen
    if _chosen is None:
        try:
            _chosen = resolve_threads(None)
        except UsageError:
            _chosen = available_cpus()
    return _chosen


def ts_context_spec(
    n: int | None = None, file_io: int = FILE_IO_MIN, **extra: Any
) -> dict[str, Any]:
    """The TensorStore context resources for ``n`` threads (default ``threads()``):
    ``data_copy_concurrency`` (decode, encode, copies: CPU-bound) is ``n``;
    ``file_io_concurrency`` (local files) at least ``file_io``; ``extra``: more resources."""
    n = threads() if n is None else n
    return {
        "data_copy_concurrency": {"limit": n},
        "file_io_concurrency": {"limit": max(n, file_io)},
        **extra,
    }


def ts_context(n: int | None = None, file_io: int = FILE_IO_MIN, **extra: Any) -> Any:
    """A ``ts.Context`` of ``ts_context_spec``."""
    import tensorstore as ts

    return ts.Context(ts_context_spec(n, file_io, **extra))


_pools: dict[tuple[str, int], Any] = {}
_pools_lock = threading.Lock()


def _named_pool(prefix: str, n: int | None) -> Any:
    """The process's pool of ``n`` threads named ``prefix``, made once per name and size."""
    from concurrent.futures import ThreadPoolExecutor

    n = threads() if n is None else n
    with _pools_lock:
        pool = _pools.get((prefix, n))
        if pool is None:
            pool = _pools[prefix, n] = ThreadPoolExecutor(n, thread_name_prefix=prefix)
        return pool


def hash_pool(n: int | None = None) -> Any:
    """The process's pool of ``n`` threads (default ``threads()``) for the parts of one block
    (``digest/ld1_threads.py``, file checksums in ranges): made once per size, threads named
    ``ckpt-hash``. A task on it must never wait on another task of it."""
    return _named_pool("ckpt-hash", n)


def read_pool(n: int | None = None) -> Any:
    """The process's pool of ``n`` threads (default ``threads()``) that decode whole chunks of a
    read (``arrays.LeafReader``, ``chunkread.read_rows``) and run what follows on them
    (``spec.ops.then``): threads named ``ckpt-read``. Its tasks never wait on one another."""
    return _named_pool("ckpt-read", n)


_T = TypeVar("_T")


class Spare(Generic[_T]):
    """One idle object a thread, handed from one use to the next on that thread (a read
    buffer, a zstd stream) instead of made and freed each time. ``take`` empties the slot, so
    a use nested inside another on one thread finds nothing and makes its own; ``give`` keeps
    an object only where the slot is empty."""

    def __init__(self) -> None:
        self._local = threading.local()

    def take(self) -> _T | None:
        obj: _T | None = getattr(self._local, "obj", None)
        self._local.obj = None
        return obj

    def give(self, obj: _T) -> None:
        if self.held() is None:
            self._local.obj = obj

    def held(self) -> _T | None:
        """This thread's idle object, left in place."""
        return getattr(self._local, "obj", None)
