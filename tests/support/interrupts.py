"""Real ``ckpt`` processes interrupted mid-work, and what they leave behind.

A run starts in its own session (so Ctrl-C can be sent to its whole process group, workers
included, as a terminal does), waits until the process has read ``STARTED_BYTES`` of data (from
``/proc/PID/io``: imports read far less, so the work itself has begun), then sends the signal:
SIGINT to the group (Ctrl-C), SIGTERM to the process (``timeout``, ``kill``, a scheduler).

``python tests/support/interrupts.py INT|TERM ARGS...`` (``make demo``): run ``ckpt ARGS``, send
the signal as soon as its work has begun, print what it printed and ``exit N``. A fixed delay
(``timeout 3``) interrupts nothing on a machine fast enough to finish first.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

CKPT = str(Path(sys.executable).with_name("ckpt"))
#: Bytes the processes of a run (workers included) have read before it counts as working: the
#: imports of the heaviest command (migrate, with jax) read about 21 MiB, a spawned worker ~10.
STARTED_BYTES = 64 << 20
#: A process still running this long after the signal has not stopped (a hang guard, not a
#: speed check: the seconds are reported, bench/ and docs/how-to/terminal.md hold the figures).
STOP_GUARD_S = 60.0
#: A run that has not begun its work after this long is reported as such (a loaded machine).
START_GUARD_S = 240.0
EXIT_FOR = {signal.SIGINT: 130, signal.SIGTERM: 143}

#: The long writers of the tests on the big root (``{root}``, ``{dst}``, ``{spec}`` filled in).
RESHARD_BIG = [
    "reshard",
    "{root}",
    "{dst}",
    "--mesh",
    "data=2",
    "--rule",
    "params.embed=[data, null]",
]
MIGRATE_BIG = ["migrate", "{root}", "{dst}", "--spec", "{spec}"]
#: The spec of MIGRATE_BIG: the large leaf cast to bfloat16 (streams block by block).
CAST_SPEC = "version: 1\nrules:\n  - {op: cast, match: 'params\\.embed', dtype: bfloat16}\n"


@dataclass
class Interrupted:
    args: list[str]
    signal: signal.Signals
    code: int
    stdout: str
    stderr: str
    started_after_s: float  # from the start to the moment the work was seen
    stopped_after_s: float  # from the signal to the exit
    survivors: list[str]  # processes of the run's session still alive after it exited

    def describe(self) -> str:
        return (
            f"ckpt {' '.join(self.args)} <- {self.signal.name}: exit {self.code} "
            f"{self.stopped_after_s:.2f} s after the signal\n"
            f"stdout: {self.stdout[-2000:]!r}\nstderr: {self.stderr[-2000:]!r}"
        )


def read_chars(pid: int) -> int:
    """Bytes the process has read through read(2) and friends so far (-1 once it is gone)."""
    try:
        with open(f"/proc/{pid}/io") as f:
            fields = dict(line.split(": ") for line in f.read().splitlines())
        return int(fields["rchar"])
    except (OSError, KeyError, ValueError):
        return -1


def session_read_chars(sid: int) -> int:
    """Bytes read by every live process of session ``sid`` (a pool's workers do the reading)."""
    return sum(max(0, read_chars(int(line.split(":")[0]))) for line in session_processes(sid))


def session_processes(sid: int) -> list[str]:
    """Live processes of session ``sid`` (pid and command line), zombies excluded."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            # Fields after the parenthesised command: state is 1st, session id the 4th.
            rest = stat[stat.rindex(")") + 2 :].split()
            if int(rest[3]) != sid or rest[0] == "Z":
                continue
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue
        out.append(f"{entry.name}: {cmd.strip()}")
    return out


def interrupt(
    args: Sequence[str],
    sig: signal.Signals,
    *,
    env: dict[str, str] | None = None,
    started: Callable[[int], bool] | None = None,
    settle_s: float = 0.2,
) -> Interrupted:
    """Run ``ckpt ARGS``, send ``sig`` once its work has started, collect what it did."""
    args = [str(a) for a in args]
    proc = subprocess.Popen(
        [CKPT, *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, **(env or {})},
        start_new_session=True,
        text=True,
    )
    # Read both pipes all along: a worker that outlives the main process keeps them open.
    streams = [_Drain(proc.stdout), _Drain(proc.stderr)]
    is_started = started or (lambda pid: session_read_chars(pid) >= STARTED_BYTES)
    t0 = time.monotonic()
    survivors: list[str] = []
    try:
        while proc.poll() is None and not is_started(proc.pid):
            if time.monotonic() - t0 > START_GUARD_S:
                raise AssertionError(f"ckpt {' '.join(args)} did not start working")
            time.sleep(0.01)
        seen = time.monotonic()
        time.sleep(settle_s)
        if proc.poll() is not None:
            raise AssertionError(
                f"ckpt {' '.join(args)} finished (exit {proc.returncode}) before the signal: "
                f"the checkpoint is too small for this machine\n"
                f"stdout: {streams[0].text()[-1000:]}\nstderr: {streams[1].text()[-1000:]}"
            )
        sent = time.monotonic()
        if sig == signal.SIGINT:
            os.killpg(proc.pid, sig)  # Ctrl-C reaches the whole foreground process group
        else:
            proc.send_signal(sig)
        try:
            proc.wait(timeout=STOP_GUARD_S)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"ckpt {' '.join(args)} still runs {STOP_GUARD_S:.0f} s after {sig.name}\n"
                f"stderr: {streams[1].text()[-2000:]}"
            ) from None
        stopped = time.monotonic()
        deadline = time.monotonic() + 10
        while (survivors := session_processes(proc.pid)) and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for line in session_processes(proc.pid):  # never leave a worker behind
            with contextlib.suppress(OSError):
                os.kill(int(line.split(":")[0]), signal.SIGKILL)
        for s in streams:
            s.join()
    return Interrupted(
        args,
        sig,
        proc.returncode,
        streams[0].text(),
        streams[1].text(),
        seen - t0,
        stopped - sent,
        survivors,
    )


class _Drain(threading.Thread):
    """Reads a pipe to its end in the background."""

    def __init__(self, pipe: IO[str] | None) -> None:
        super().__init__(daemon=True)
        assert pipe is not None
        self.pipe = pipe
        self.parts: list[str] = []
        self.start()

    def run(self) -> None:
        for chunk in iter(lambda: self.pipe.read(4096), ""):
            self.parts.append(chunk)

    def text(self) -> str:
        return "".join(self.parts)


def tree_state(root: Path) -> dict[str, str]:
    """Every entry below ``root``: files by SHA-256 of their bytes, directories and links marked."""
    out: dict[str, str] = {}
    if not root.exists():
        return out
    for dirpath, dirnames, filenames in os.walk(root):
        base = Path(dirpath)
        for d in dirnames:
            p = base / d
            out[str(p.relative_to(root)) + "/"] = "link" if p.is_symlink() else "dir"
        for name in filenames:
            p = base / name
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = "link -> " + os.readlink(p)
                continue
            with p.open("rb") as f:
                out[rel] = hashlib.file_digest(f, "sha256").hexdigest()
    return out


#: Names a stopped ckpt must not leave: unfinished steps, prune trash and locks, digest files
#: being written.
LEFTOVER_MARKERS = (".orbax-checkpoint-tmp", ".ckpt-trash-", ".lock", "_CKPT_DIGESTS.json.tmp")


def leftovers(root: Path) -> list[str]:
    return sorted(rel for rel in tree_state(root) if any(m in rel for m in LEFTOVER_MARKERS))


def assert_stopped_cleanly(run: Interrupted) -> None:
    """Exit 130/143, ``ckpt: interrupted`` on stderr and no report of any kind about the data."""
    expected = EXIT_FOR[run.signal]
    assert run.code == expected, run.describe()
    lines = run.stderr.splitlines()
    assert "ckpt: interrupted" in lines, run.describe()
    for line in lines:
        assert "error" not in line and "Traceback" not in line, run.describe()
    assert not run.survivors, f"processes left running: {run.survivors}\n{run.describe()}"


def main(argv: list[str]) -> int:
    """The command line of the module docstring."""
    sig = signal.Signals[f"SIG{argv[0]}"]
    try:
        run = interrupt(argv[1:], sig, settle_s=0.0)
    except AssertionError as e:  # finished before the signal, or never started
        print(e, file=sys.stderr)
        return 1
    sys.stderr.write(run.stderr)
    sys.stderr.flush()
    sys.stdout.write(run.stdout)
    print(f"exit {run.code}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
