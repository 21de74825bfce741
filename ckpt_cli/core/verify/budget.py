"""Time budgets, rotation state and disjoint subsets for ``verify``'s data levels.

* ``Deadline``: ``--max-duration``. The budget counts from the start of the run (as borg's
  ``check --max-duration`` does); the data pass asks ``should_stop(in_flight)`` before every new
  read and stops submitting once the reads already in flight would take it past the deadline at
  the rate measured so far, so a run ends close to its budget, not a whole leaf after it. The
  clock is injectable: the tests drive it by bytes decoded and measure termination exactly.
* ``RotationState``: ``--rotate``. A small file next to the digests,
  ``<item>/_CKPT_VERIFY_STATE.json``, remembers where the last run stopped, so N budgeted runs
  cover every block of the item (borg's partial checks continue the same way).
* ``subset_of``: ``--sample n/t`` (restic's ``--read-data-subset n/t``). A chunk's subset is a
  hash of its identity, so membership is stable across runs and steps, does not depend on the
  other chunks, and the t subsets are disjoint and cover everything.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from ckpt_cli._version import __version__
from ckpt_cli.core.format.digests import STATE_FILE
from ckpt_cli.core.storage import Location
from ckpt_cli.errors import CkptError, UsageError

Clock = Callable[[], float]
__all__ = ["STATE_FILE", "Deadline", "RotationState", "read_state", "write_state"]

STATE_FORMAT = "ckpt-verify-state"
STATE_VERSION = 1

_SUBSET_RE = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


class Deadline:
    """When a budgeted data pass must stop submitting reads (``budget_s`` None: never)."""

    def __init__(
        self, budget_s: float | None, clock: Clock = time.monotonic, started: float | None = None
    ) -> None:
        self.budget_s = budget_s
        self.clock = clock
        self.started = clock() if started is None else started
        self._data_started: float | None = None
        self._done = 0
        self.stopped = False

    def elapsed(self) -> float:
        return self.clock() - self.started

    def start_data(self) -> None:
        if self._data_started is None:
            self._data_started = self.clock()

    def done(self, nbytes: int) -> None:
        """Bytes whose reads finished: the rate that predicts how long the queue takes."""
        self._done += nbytes

    def should_stop(self, in_flight_bytes: int = 0) -> bool:
        if self.budget_s is None:
            return False
        if self.stopped:
            return True
        now = self.clock()
        drain = 0.0
        if in_flight_bytes and self._done and self._data_started is not None:
            rate = self._done / max(1e-9, now - self._data_started)
            drain = in_flight_bytes / rate
        if now - self.started + drain >= self.budget_s:
            self.stopped = True
        return self.stopped


def parse_subset(text: str) -> tuple[int, int] | None:
    """``n/t`` -> (n, t) with 1 <= n <= t; None when ``text`` is no ``n/t`` at all."""
    if "/" not in text:
        return None
    m = _SUBSET_RE.match(text)
    if m is None or not 1 <= int(m.group(1)) <= int(m.group(2)):
        raise UsageError(
            f"--sample {text!r}: a subset is N/T with 1 <= N <= T (the N-th of T disjoint parts)",
            hint="for example --sample 2/7; or a share such as --sample 5% or 2GiB",
        )
    return int(m.group(1)), int(m.group(2))


def subset_of(key: str, t: int) -> int:
    """Which of ``t`` subsets (1..t) the chunk named ``key`` belongs to."""
    digest = hashlib.sha256(key.encode()).digest()
    return 1 + int.from_bytes(digest[:8], "big") % t


def chunk_key(item: str, leaf: str, index: tuple[int, ...]) -> str:
    """A chunk's identity for ``subset_of``: the item's name (not its step, so every step of a
    root is split the same way), the leaf, the chunk's grid index."""
    return f"{item}/{leaf}/{','.join(str(i) for i in index)}"


@dataclass(frozen=True)
class RotationState:
    """Where the last budgeted run over one item stopped."""

    layout: str  # fingerprint of the unit list: a rewritten item starts a new cycle
    record: str | None  # sha256 of the digest file the cycle checks against
    cycle: int  # completed cycles so far
    cycle_started_at: str
    cursor: int  # next unit to read
    covered_bytes: int  # in the current cycle
    of_bytes: int
    last_run_at: str
    file_offset: int = 0  # a recorded file's CRC-32 resumes here
    file_crc: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            "tool": f"ckpt {__version__}",
            **asdict(self),
        }


def fingerprint(parts: list[str]) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode())
        h.update(b"\0")
    return h.hexdigest()


def read_state(item: Location) -> RotationState | None:
    """The item's rotation state; None when absent or unreadable (a new cycle starts: the worst
    a damaged state file costs is checking some blocks twice)."""
    try:
        raw = item.child(STATE_FILE).read_json_if_exists()
    except CkptError:
        return None
    if not isinstance(raw, dict) or raw.get("format") != STATE_FORMAT:
        return None
    if raw.get("version") != STATE_VERSION:
        return None
    try:
        return RotationState(
            layout=str(raw["layout"]),
            record=None if raw.get("record") is None else str(raw["record"]),
            cycle=int(raw["cycle"]),
            cycle_started_at=str(raw["cycle_started_at"]),
            cursor=int(raw["cursor"]),
            covered_bytes=int(raw["covered_bytes"]),
            of_bytes=int(raw["of_bytes"]),
            last_run_at=str(raw["last_run_at"]),
            file_offset=int(raw.get("file_offset", 0)),
            file_crc=None if raw.get("file_crc") is None else int(raw["file_crc"]),
        )
    except (KeyError, TypeError, ValueError):
        return None


def write_state(item: Location, state: RotationState) -> None:
    item.child(STATE_FILE).write_bytes((json.dumps(state.to_json(), indent=1) + "\n").encode())
