"""``bench/profile_threads.py`` runs a ckpt command in its own process with every thread
sampled: it reports the thread groups it saw with their ckpt frames, and passes the command's
exit code on."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.support.matrix import fixture

REPO = Path(__file__).resolve().parents[2]


def _profile(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PROF_MS": "1", "PYTHONPATH": str(REPO)}
    script = str(REPO / "bench" / "profile_threads.py")
    return subprocess.run(
        [sys.executable, script, *args], env=env, capture_output=True, text=True, timeout=300
    )


def test_a_command_is_profiled_thread_by_thread() -> None:
    run = _profile("verify", str(fixture("0.12.8", "linen_trainstate").path), "--deep")
    assert run.returncode == 0, run.stderr
    groups = dict(re.findall(r"^== (\S+): (\d+) samples", run.stderr, re.M))
    assert "MainThread" in groups and int(groups["MainThread"]) > 0, run.stderr
    assert re.search(r"^   ckpt +\d+ \S+\.py:\w+:\d+$", run.stderr, re.M), run.stderr
    assert re.search(r"^wall [\d.]+ s, .* peak RSS \d+ MiB, exit 0$", run.stderr, re.M)


def test_the_commands_exit_code_is_passed_on(tmp_path: Path) -> None:
    run = _profile("verify", str(tmp_path / "nothing-here"))
    assert run.returncode == 3, run.stderr  # the documented code of a path that is not there
    assert "does not exist" in run.stderr and run.stderr.splitlines()[-1].endswith("exit 3")
