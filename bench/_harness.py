"""What the benchmarks share: each contender runs in a fresh subprocess and reports its time."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
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


@dataclass
class Run:
    wall_s: float
    rss_mib: float
    out: str


def run_rss(cmd: list[str], ok: tuple[int, ...] = (0,), env: dict[str, str] | None = None) -> Run:
    """Run a command in a fresh process; wall time and that process's own peak RSS (``wait4``
    reaps the child itself, so the figure is not the max over all children so far)."""
    start = time.perf_counter()
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=err,
            env=env or {**os.environ, "PYTHONPATH": str(REPO)},
            close_fds=True,
        )
        assert proc.stdout is not None
        out = proc.stdout.read()
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - start
        if proc.returncode not in ok:
            err.seek(0)
            tail = err.read()[-2000:].decode(errors="replace")
            raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{tail}")
    return Run(wall, usage.ru_maxrss / 1024, out.decode())
