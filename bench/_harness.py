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


def bench_env(**extra: str) -> dict[str, str]:
    """The caller's environment with this checkout first on ``PYTHONPATH`` (its own entries
    kept: a host whose packages come from ``PYTHONPATH``, like the TPU host's wheels, still
    finds them) and ``extra`` on top."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, **extra}


def run(script: str, *args: str) -> tuple[float, int]:
    """Run ``python -c script args``; it prints ``RESULT <seconds> <peak RSS bytes>``."""
    seconds, rss, _ = run_usage(script, *args)
    return seconds, rss


def run_usage(script: str, *args: str) -> tuple[float, int, float]:
    """As ``run``, plus the child's CPU time (user + system seconds, from ``wait4``): on a
    shared machine, load stretches wall time far more than CPU time."""
    env = bench_env(PYTHONUNBUFFERED="1")
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(
            [sys.executable, "-c", script, *args], env=env, stdout=out, stderr=err
        )
        _, status, usage = os.wait4(proc.pid, 0)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"benchmark step failed:\n{stderr[-3000:]}")
    line = next(x for x in stdout.splitlines() if x.startswith("RESULT"))
    _, seconds, rss = line.split()
    return float(seconds), int(rss), usage.ru_utime + usage.ru_stime


@dataclass
class Run:
    wall_s: float
    rss_mib: float
    out: str
    cpu_s: float = 0.0  # user + system of the process and the children it waited for


def run_rss(cmd: list[str], ok: tuple[int, ...] = (0,), env: dict[str, str] | None = None) -> Run:
    """Run a command in a fresh process; wall time and that process's own peak RSS (``wait4``
    reaps the child itself, so the figure is not the max over all children so far)."""
    start = time.perf_counter()
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=err,
            env=env or bench_env(),
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
    return Run(wall, usage.ru_maxrss / 1024, out.decode(), usage.ru_utime + usage.ru_stime)
