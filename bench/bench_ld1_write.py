"""The cost of verifying while writing: ``ckpt reshard`` of 512 MiB with and without an ``ld1``
record on the source (with one, every block written is digested and checked before commit).

Run from the repository root::

    .venv/bin/python bench/bench_ld1_write.py [--rounds 2] [--workdir bench/out/ld1_write]

The source is built once with real Orbax (``tests/support/gib_checkpoint.py``: 8 leaves of
64 MiB of uniform float32, 8 chunks each), recorded with ``ckpt verify --record``. Each round
runs ``ckpt reshard SRC DST --mesh data=2 --rule '*=[null, data]'`` in a fresh subprocess, with
the record in place and with it moved aside, alternating; wall time and the child's CPU time
(user + system) are printed, the least of the rounds kept.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support.gib_checkpoint import make_big  # noqa: E402

RECORD = "_CKPT_DIGESTS.json"


def _ckpt(*args: str) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "ckpt_cli", *args], check=True, cwd=REPO)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workdir", default=str(REPO / "bench" / "out" / "ld1_write"))
    args = parser.parse_args()
    work = Path(args.workdir)
    src = work / "src"
    if not src.exists():
        work.mkdir(parents=True, exist_ok=True)
        make_big(src, leaves=8)
        _ckpt("verify", str(src), "--record")
    item = next(src.glob("*/default"))
    record, aside = item / RECORD, work / RECORD
    best: dict[str, tuple[float, float]] = {}
    for _ in range(args.rounds):
        for label in ("with ld1 check", "without"):
            if label == "without":
                shutil.move(record, aside)
            dst = work / "dst"
            shutil.rmtree(dst, ignore_errors=True)
            try:
                got = _ckpt(
                    "reshard", str(src), str(dst), "--mesh", "data=2", "--rule", "*=[null, data]"
                )
            finally:
                if aside.exists():
                    shutil.move(aside, record)
            print(f"{label}: {got[0]:.2f} s wall, {got[1]:.2f} s CPU", flush=True)
            best[label] = min(best.get(label, got), got)
    for label, (wall, cpu) in best.items():
        print(f"best {label}: {wall:.2f} s wall, {cpu:.2f} s CPU")


if __name__ == "__main__":
    main()
