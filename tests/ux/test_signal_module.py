"""``ckpt_cli.signals``: what the boundary relies on, in a process of its own."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROBE = r"""
import os, signal, sys, time
from ckpt_cli.signals import Interrupted, handle_signals, interrupted
caught = []
try:
    with handle_signals():
        try:
            os.kill(os.getpid(), getattr(signal, sys.argv[1]))
            time.sleep(5)
        except Exception as e:  # what the core's read loops catch: must not see it
            caught.append(repr(e))
except Interrupted as e:
    print("INTERRUPTED", e.exit_code, interrupted(), caught)
"""


@pytest.mark.parametrize(("sig", "code"), [("SIGINT", 130), ("SIGTERM", 143)])
def test_signal_raises_interrupted_past_except_exception(sig: str, code: int) -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, sig], capture_output=True, text=True, check=True
    ).stdout
    assert out.split() == ["INTERRUPTED", str(code), "True", "[]"]


SECOND = r"""
import os, signal, time
from ckpt_cli.signals import Interrupted, handle_signals, leaving
with handle_signals():
    try:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)
    except Interrupted:
        with leaving("/tmp/x/7.orbax-checkpoint-tmp"):
            os.kill(os.getpid(), signal.SIGTERM)  # a second signal during the cleanup
            time.sleep(5)
print("not reached")
"""


def test_second_signal_stops_at_once_and_names_what_is_left() -> None:
    proc = subprocess.run([sys.executable, "-c", SECOND], capture_output=True, text=True)
    assert proc.returncode == 143
    assert proc.stdout == ""
    assert "interrupted again" in proc.stderr and "/tmp/x/7.orbax-checkpoint-tmp" in proc.stderr
