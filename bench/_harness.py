"""What the benchmarks share: each contender runs in a fresh subprocess and reports its time."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def run(script: str, *args: str) -> tuple[float, int]:
    """Run ``python -c script args``; it prints ``RESULT <seconds> <peak RSS bytes>``."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", script, *args], env=env, capture_output=True, text=True
    )
    if proc.returncode:
        raise SystemExit(f"benchmark step failed:\n{proc.stderr[-3000:]}")
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT"))
    _, seconds, rss = line.split()
    return float(seconds), int(rss)
