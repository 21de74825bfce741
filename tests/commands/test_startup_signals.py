"""Ctrl-C and SIGTERM while ``ckpt`` starts: during its imports, before and while the
command runs, a signal ends the run with 130/143 and one line on stderr, never a traceback; a
signal that comes too late finds a normal completion.

When ckpt's code begins is observed, not arranged: the first thing ``ckpt_cli.app`` does is to
catch SIGINT and SIGTERM, so the moment the kernel shows SIGTERM caught (``SigCgt`` in
``/proc/PID/status``; the interpreter itself never catches SIGTERM) ckpt is running. From there
the signal goes out after delays spread from 0 to past the command's normal duration (measured in
the same test, so the imports, the command and the exit are all hit on a loaded machine too).
Before that moment the interpreter is still starting (site, .pth files): a signal there meets
Python's defaults, which no program can replace; the seconds of that window are reported.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.interrupts import CKPT, EXIT_FOR

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
#: Fractions of the normal run (from ckpt's first line to its exit) at which the signal goes.
FRACTIONS = (0.0, 0.01, 0.03, 0.08, 0.15, 0.3, 0.5, 0.75, 1.0, 1.5)
COMMANDS = {
    "ls": ["ls", str(FIXTURES / "ckpts" / "seed_mlp")],
    "verify-deep-json": ["verify", str(FIXTURES / "ckpts" / "seed_mlp"), "--deep", "--json"],
}


def _caught(pid: int, sig: signal.Signals) -> bool:
    """Whether process ``pid`` catches ``sig`` (its handler is installed)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except OSError:
        pass
    return False


def _same_output(a: str, b: str) -> bool:
    """Equal outputs; a JSON document's timings (``*_s`` numbers) may differ."""
    if a.lstrip().startswith("{") and b.lstrip().startswith("{"):
        timing = re.compile(r'"(\w+_s)": [0-9.e+-]+')
        return json.loads(timing.sub(r'"\1": 0', a)) == json.loads(timing.sub(r'"\1": 0', b))
    return a == b


@dataclass
class Outcome:
    delay_s: float
    code: int
    stdout: str
    stderr: str
    window_s: float  # from the spawn to ckpt's handler seen


def _run(args: list[str], sig: signal.Signals | None, delay_s: float) -> Outcome:
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [CKPT, *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        while proc.poll() is None and not _caught(proc.pid, signal.SIGTERM):
            if time.monotonic() - t0 > 120:
                raise AssertionError(f"ckpt {' '.join(args)} never started")
            time.sleep(0.0005)
        seen = time.monotonic()
        if sig is not None:
            time.sleep(delay_s)
            if proc.poll() is None:
                if sig == signal.SIGINT:
                    os.killpg(proc.pid, sig)  # Ctrl-C: the whole foreground group
                else:
                    proc.send_signal(sig)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    if sig is None:
        delay_s = time.monotonic() - seen
    return Outcome(delay_s, proc.returncode, out, err, seen - t0)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=lambda s: s.name)
@pytest.mark.parametrize("name", list(COMMANDS))
def test_a_signal_while_starting_is_one_line_or_nothing(name: str, sig: signal.Signals) -> None:
    args = COMMANDS[name]
    normal = _run(args, None, 0.0)
    assert normal.code == 0, normal.stderr
    assert normal.stdout and not normal.stderr
    outcomes = [_run(args, sig, f * normal.delay_s) for f in FRACTIONS]
    assert outcomes
    report = "\n".join(
        f"{o.delay_s * 1000:7.1f} ms: exit {o.code}, stderr {o.stderr[-300:]!r}" for o in outcomes
    )
    stopped = 0
    for o in outcomes:
        if o.code == EXIT_FOR[sig]:
            stopped += 1
            assert o.stderr == "ckpt: interrupted\n", report
            if "--json" in args and o.stdout:
                assert '"interrupted"' in o.stdout, report  # the one error document
            else:
                assert not o.stdout.strip() or _same_output(o.stdout, normal.stdout), report
        else:
            # Too late to stop it: the run ended as it does without a signal.
            assert (o.code, o.stderr) == (0, ""), report
            assert _same_output(o.stdout, normal.stdout), report
    # The earliest signals (at ckpt's first line, in its imports) did stop it.
    assert stopped >= 3, report
    windows = sorted(o.window_s for o in outcomes)
    print(f"{name} {sig.name}: interpreter start-up {windows[len(windows) // 2]:.3f} s (median)")
    print(report)


_IMPORTER = """
import signal, sys, time
sys.path.insert(0, sys.argv[1])
from ckpt_cli import app, signals
from ckpt_cli.errors import Interrupted
signal.signal(signal.SIGTERM, signals.on_signal)
try:
    import slow_module
    for _ in range(200):  # the run goes on: the signal comes back within milliseconds
        time.sleep(0.01)
    print("import finished, no signal")
except Interrupted:
    module = sys.modules.get("slow_module")
    print("interrupted", "after the import" if module and module.DONE else "inside the import")
"""

_SLOW_MODULE = """
import os, signal, time
os.kill(os.getpid(), signal.SIGTERM)
for _ in range(20):  # bytecode boundaries: where a handler that raises would raise
    time.sleep(0.005)
DONE = True
"""


def test_a_signal_during_an_import_is_taken_after_it(tmp_path: Path) -> None:
    """An import is never cut short by the handler (an extension cut short mid-init prints its
    own traceback, as numpy's C API does): the signal is taken right after the import."""
    (tmp_path / "slow_module.py").write_text(_SLOW_MODULE)
    run = subprocess.run(
        [sys.executable, "-c", _IMPORTER, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert run.stdout.strip() == "interrupted after the import", run.stderr
    assert run.stderr == ""
