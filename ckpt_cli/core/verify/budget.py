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
from dataclasses import dataclass
from typing import TypedDict

from ckpt_cli._version import __version__
from ckpt_cli.core.digest.records import STATE_FILE
from ckpt_cli.core.storage import Location
from ckpt_cli.core.units import short_repr
from ckpt_cli.errors import CkptError, UsageError

Clock = Callable[[], float]
__all__ = [
    "STATE_FILE",
    "Deadline",
    "RotationState",
    "load_state",
    "read_state",
    "state_mismatch",
    "write_state",
]

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


class RotationStateJSON(TypedDict):
    """The state file of ``--rotate`` (its own format, not a --json document)."""

    format: str
    version: int
    tool: str
    layout: str
    record: str | None
    cycle: int
    cycle_started_at: str
    cursor: int
    covered_bytes: int
    of_bytes: int
    last_run_at: str
    file_offset: int
    file_crc: int | None


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

    def to_json(self) -> RotationStateJSON:
        return {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            "tool": f"ckpt {__version__}",
            "layout": self.layout,
            "record": self.record,
            "cycle": self.cycle,
            "cycle_started_at": self.cycle_started_at,
            "cursor": self.cursor,
            "covered_bytes": self.covered_bytes,
            "of_bytes": self.of_bytes,
            "last_run_at": self.last_run_at,
            "file_offset": self.file_offset,
            "file_crc": self.file_crc,
        }


def fingerprint(parts: list[str]) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode())
        h.update(b"\0")
    return h.hexdigest()


#: Counts and offsets of a state are below this (a JSON reader keeps them exact up to 2**53).
_STATE_INT_LIMIT = 1 << 53
_INTS = ("cycle", "cursor", "covered_bytes", "of_bytes")


def read_state(item: Location) -> RotationState | None:
    """The item's rotation state; None when absent or unusable (``load_state`` says why)."""
    return load_state(item)[0]


def load_state(item: Location) -> tuple[RotationState | None, str | None]:
    """The item's rotation state, or (None, why it is not used): absent (why None), unreadable,
    of another format or version, a field missing, of the wrong type or out of range (a float,
    NaN, 1e400, a negative or astronomic number). The file is outside input: a new cycle starts
    instead (the worst a damaged state costs is checking some blocks twice)."""
    try:
        raw = item.child(STATE_FILE).read_json_if_exists()
    except CkptError as e:
        return None, f"it cannot be read ({e.message})"
    if raw is None:
        return None, None
    if not isinstance(raw, dict) or raw.get("format") != STATE_FORMAT:
        return None, f"it is not a {STATE_FORMAT} document"
    if raw.get("version") != STATE_VERSION:
        return None, f"it has version {short_repr(raw.get('version'))}, not {STATE_VERSION}"
    for key in (*_INTS, "file_offset", "file_crc"):
        value = raw.get(key, 0 if key == "file_offset" else None)
        if value is None and key == "file_crc":
            continue
        if not isinstance(value, int) or isinstance(value, bool):
            return None, f"field {key!r} is {short_repr(value)}, not an integer"
        limit = 1 << 32 if key == "file_crc" else _STATE_INT_LIMIT
        if not 0 <= value < limit:
            return None, f"field {key!r} is {short_repr(value)}, out of range"
    for key in ("layout", "cycle_started_at", "last_run_at"):
        if not isinstance(raw.get(key), str):
            return None, f"field {key!r} is {short_repr(raw.get(key))}, not a string"
    if raw.get("record") is not None and not isinstance(raw["record"], str):
        return None, f"field 'record' is {short_repr(raw['record'])}, not a string"
    state = RotationState(
        layout=raw["layout"],
        record=raw.get("record"),
        cycle=raw["cycle"],
        cycle_started_at=raw["cycle_started_at"],
        cursor=raw["cursor"],
        covered_bytes=raw["covered_bytes"],
        of_bytes=raw["of_bytes"],
        last_run_at=raw["last_run_at"],
        file_offset=raw.get("file_offset", 0),
        file_crc=raw.get("file_crc"),
    )
    return state, None


def state_mismatch(state: RotationState, leaf_bytes: list[int]) -> str | None:
    """Why a well-formed state does not fit the item whose arrays (in name order) hold
    ``leaf_bytes``, or None: another size, a cursor past the last leaf or past its leaf's
    blocks, more bytes covered than precede the cursor's leaf end."""
    size = sum(leaf_bytes)
    if state.of_bytes != size:
        return f"it is for {state.of_bytes:,} bytes of arrays, the item has {size:,}"
    leaf, block = state.cursor >> 32, state.cursor & 0xFFFFFFFF
    if leaf >= len(leaf_bytes):
        return f"its cursor names leaf {leaf:,}, the item has {len(leaf_bytes)}"
    if block > max(1, leaf_bytes[leaf]):  # a block holds a byte at least
        return f"its cursor names block {block:,} of a leaf of {leaf_bytes[leaf]:,} bytes"
    if state.covered_bytes > sum(leaf_bytes[: leaf + 1]):
        return f"it counts {state.covered_bytes:,} bytes covered, more than precede its cursor"
    return None


def write_state(item: Location, state: RotationState) -> None:
    item.child(STATE_FILE).write_bytes((json.dumps(state.to_json(), indent=1) + "\n").encode())
