"""Benchmark the ``ld1`` leaf digest against today's SHA-256 path and ``sha256sum``, same run.

Run from the repository root::

    .venv/bin/python bench/bench_digest.py              # 512 MiB of float32, 512 MiB of bfloat16
    .venv/bin/python bench/bench_digest.py --mib 128    # smaller

For each dtype, one array of random normal values (``--mib`` MiB) in memory; each contender
hashes the same bytes ``--repeat`` times and the least CPU time is reported (MB/s = 10^6 bytes
per CPU second; all contenders are single-threaded, and CPU time does not count the other jobs
of a shared machine as wall time does):

ld1 (whole)
    ``ld1.digest_array``: the array as one box (one contiguous run of words).
ld1 (boxes)
    the array cut into 8 x 8 boxes (a sharded leaf's shards: the column edges cut words), each
    box's partial computed alone, then merged and finished: what a host hashing its shards does.
ld1 (columns)
    the array cut into 8 column boxes (full height, 1/8 of the width: rows of about 2 KiB for
    float32, 1 KiB for bfloat16), a leaf sharded on its last axis: many short rows per box;
    each box a strided slice of the array (``partial`` makes it contiguous: one more copy).
ld1 (shards)
    the same cut of a 4096-wide array, each box first copied out contiguous and not timed, as
    the host copy of a device's shard is: what ``ckpt_cli.orbax`` hashes at save time.
sha256 (today)
    ``digests.ValueHasher``: hashlib's SHA-256 of the C-order bytes, what ``verify --record``
    records today.
sha256sum
    the coreutils tool over the same bytes in a file in /dev/shm (page cache: no disk), one
    process, its CPU time (user + system, reading the file included); a single-stream hash
    outside Python.

Results: a table on stdout and JSON in ``bench/out/digest.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def best(fn: Callable[[], Any], repeat: int) -> float:
    """The least CPU time of ``repeat`` calls (this machine is shared: wall time measures the
    neighbours too; every contender is single-threaded, so CPU time is its own work)."""
    times = []
    for _ in range(repeat):
        t = time.process_time()
        fn()
        times.append(time.process_time() - t)
    return min(times)


def boxes(x: Any) -> str:
    from ckpt_cli.core.digest import ld1

    rows, cols = x.shape
    parts = []
    for i in range(8):
        for j in range(8):
            r0, r1 = rows * i // 8, rows * (i + 1) // 8
            c0, c1 = cols * j // 8 + (j > 0), cols * (j + 1) // 8 + (j < 7)
            parts.append(ld1.partial((r0, c0), x[r0:r1, c0:c1], x.shape))
    return ld1.finish(ld1.merge(parts))


def columns(x: Any) -> str:
    from ckpt_cli.core.digest import ld1

    cols = x.shape[1]
    parts = []
    for j in range(8):
        c0, c1 = cols * j // 8, cols * (j + 1) // 8
        parts.append(ld1.partial((0, c0), x[:, c0:c1], x.shape))
    return ld1.finish(ld1.merge(parts))


def shards(x: Any) -> tuple[list[tuple[tuple[int, int], Any]], tuple[int, int]]:
    """8 contiguous column shards of ``x`` cut to a width of 4096 (rows of whole words)."""
    import numpy as np

    rows = x.size // 4096
    y = x.reshape(-1)[: rows * 4096].reshape(rows, 4096)
    out = [((0, c), np.ascontiguousarray(y[:, c : c + 512])) for c in range(0, 4096, 512)]
    return out, y.shape


def sha256sum(raw: Any) -> float:
    """The CPU time (user + system) of one ``sha256sum`` process over ``raw``'s bytes."""
    folder = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.NamedTemporaryFile(dir=folder, suffix=".bin") as f:
        f.write(raw.reshape(-1).view("uint8").data)
        f.flush()
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run(["sha256sum", f.name], check=True, capture_output=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def run(dtype: str, mib: int, repeat: int) -> dict[str, Any]:
    import ml_dtypes
    import numpy as np

    from ckpt_cli.core.digest import ld1
    from ckpt_cli.core.digest.records import ValueHasher

    n = (mib << 20) // np.dtype(getattr(ml_dtypes, dtype, dtype)).itemsize
    cols = 4099  # odd: the box edges cut 8-byte words, as a real shard's may
    rows = n // cols
    x = np.random.default_rng(0).standard_normal((rows, cols), dtype=np.float32)
    x = x.astype(getattr(ml_dtypes, dtype, dtype))
    assert boxes(x) == columns(x) == ld1.digest_array(x)

    cut, shape = shards(x)
    whole = ld1.digest_array(x.reshape(-1)[: shape[0] * shape[1]].reshape(shape))

    def sharded() -> str:
        parts = [ld1.partial(origin, box, shape) for origin, box in cut]
        return ld1.finish(ld1.merge(parts))

    assert sharded() == whole

    def sha() -> str:
        h = ValueHasher()
        h.update(x)
        return h.hexdigest()

    times = {
        "ld1 (whole)": best(lambda: ld1.digest_array(x), repeat),
        "ld1 (boxes)": best(lambda: boxes(x), repeat),
        "ld1 (columns)": best(lambda: columns(x), repeat),
        "ld1 (shards)": best(sharded, repeat) * x.nbytes / (shape[0] * shape[1] * x.itemsize),
        "sha256 (today)": best(sha, repeat),
    }
    if shutil.which("sha256sum"):
        times["sha256sum"] = min(sha256sum(x) for _ in range(repeat))
    return {
        "dtype": dtype,
        "bytes": int(x.nbytes),
        "mb_per_s": {k: x.nbytes / t / 1e6 for k, t in times.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=512)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    results = [run(dtype, args.mib, args.repeat) for dtype in ("float32", "bfloat16")]
    print(f"{'dtype':<10} {'contender':<16} {'MB/s':>8}  vs sha256 (today)")
    for r in results:
        base = r["mb_per_s"]["sha256 (today)"]
        for name, rate in r["mb_per_s"].items():
            print(f"{r['dtype']:<10} {name:<16} {rate:>8.0f}  x{rate / base:.2f}")
    out = REPO / "bench" / "out"
    out.mkdir(parents=True, exist_ok=True)
    doc = {
        "machine": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "results": results,
    }
    (out / "digest.json").write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
