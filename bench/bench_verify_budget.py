"""Benchmark ``ckpt verify --deep --max-duration``: where a budgeted run stops, against a full
deep pass of the same checkpoint in the same run.

Run from the repository root::

    .venv/bin/python bench/bench_verify_budget.py        # budgets 1 s, 2 s, 4 s

The checkpoint is the 1 GiB one of the tests (real Orbax, 16 float32 leaves of 64 MiB, each in
8 chunks of 8 MiB, uniform values), cached under ``bench/out/verify_budget/``. Each contender
runs in a fresh process on a hot page cache. Reported per budget: the run's own elapsed time,
the overrun past the budget (the deadline counts from the start of the run, structure included),
the bytes read and the share of the checkpoint; and the full pass's time and rate. The machine's
load (``uptime``) is printed beside the figures: overruns grow with it (reads already in flight
finish after the deadline).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support.gib_checkpoint import make_big  # noqa: E402

OUT = REPO / "bench" / "out" / "verify_budget"
CKPT = [str(Path(sys.executable).parent / "ckpt")]


def run(args: list[str]) -> tuple[float, dict[str, object]]:
    started = time.perf_counter()
    r = subprocess.run([*CKPT, *args, "--json"], capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    if r.returncode != 0:
        sys.exit(f"ckpt {' '.join(args)} exited {r.returncode}: {r.stderr}")
    return wall, json.loads(r.stdout)


def main() -> None:
    root = OUT / "run"
    if not root.exists():
        OUT.mkdir(parents=True, exist_ok=True)
        make_big(root)
    for p in root.rglob("*"):  # hot page cache
        if p.is_file():
            p.read_bytes()
    print(f"load: {os.getloadavg()[0]:.1f} (1-min average), {os.cpu_count()} cores")
    wall, doc = run(["verify", str(root), "--deep"])
    checked = doc["checked"]
    assert isinstance(checked, dict)
    full_bytes = checked["bytes_decoded"]
    print(
        f"full deep pass: {wall:.2f} s wall, {full_bytes / wall / 2**20:.0f} MiB/s, "
        f"{full_bytes / 2**30:.2f} GiB"
    )
    for budget in (1, 2, 4):
        wall, doc = run(["verify", str(root), "--deep", "--max-duration", f"{budget}s"])
        checked = doc["checked"]
        assert isinstance(checked, dict)
        cov = checked["coverage"]
        elapsed = float(doc["elapsed_s"])  # type: ignore[arg-type]
        over = elapsed - budget
        print(
            f"--max-duration {budget}s: ran {elapsed:.2f} s ({over:+.2f} s, "
            f"{100 * over / budget:+.1f} %), read {cov['bytes'] / 2**20:.0f} MiB = "
            f"{100 * cov['bytes'] / cov['of_bytes']:.0f} %, {cov['leaves']}/{cov['of_leaves']} "
            f"leaves whole, stopped={cov['stopped']}; process wall {wall:.2f} s"
        )


if __name__ == "__main__":
    main()
