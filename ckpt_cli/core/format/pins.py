"""Pinned steps: ``ckpt pin`` / ``ckpt unpin``, which ``prune`` always keeps and ``ls`` shows.

A pin is the file ``<step>/_CKPT_PINNED.json`` (T5X's ``PINNED`` file, in ckpt's naming),
written atomically (a temporary name and a rename locally, one PUT on a bucket). Orbax ignores
it: a step's items are its subdirectories (``CompositeCheckpointHandler._existing_items``),
its metadata is read by name, and Orbax deletes only whole directories. So the pin lives as long
as the step, and goes with it when Orbax's own retention deletes the step.

Per step, not one registry for the root: each pin is one atomic write (no read-modify-write race
between two pins), it travels with the step when the step is copied, and listings already see
the file.

Fail safe: a pin file that cannot be read or parsed still pins its step. Only ``unpin`` removes a
pin.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import socket
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import ClassVar, TypedDict

from ckpt_cli._version import __version__
from ckpt_cli.core.format.discovery import StepRef, list_steps
from ckpt_cli.core.format.names import parse_step_name
from ckpt_cli.core.storage import Entry, Location
from ckpt_cli.errors import CkptError, NotFoundError, RefusedError

PIN_FILE = "_CKPT_PINNED.json"
FORMAT_NAME = "ckpt-pin"
FORMAT_VERSION = 1
UNREADABLE_NOTE = "pin file unreadable: still pinned; `ckpt unpin` removes it"


# A step's pin, as ``ls --json`` shows it. No docstring: it would become the published schema's
# description, and ls's schema (docs/schemas/ls.schema.json) has none for it.
class PinJSON(TypedDict):
    note: str | None
    pinned_at: str | None
    by: str | None


@dataclass(frozen=True)
class Pin:
    note: str | None
    pinned_at: str | None
    by: str | None
    tool: str | None = None

    def to_json(self) -> PinJSON:
        return {"note": self.note, "pinned_at": self.pinned_at, "by": self.by}

    @property
    def reason(self) -> str:
        """How ``prune`` names it among a kept step's reasons."""
        return f"pinned: {self.note}" if self.note else "pinned"


def has_pin_file(children: tuple[Entry, ...] | list[Entry]) -> bool:
    return any(e.name == PIN_FILE and not e.is_dir for e in children)


def read_pin(step: Location, children: tuple[Entry, ...] | list[Entry] | None = None) -> Pin | None:
    """The step's pin, or None. ``children`` (the step's listing, when the caller has it) saves a
    request: without a pin file in it there is nothing to read."""
    if children is not None and not has_pin_file(children):
        return None
    loc = step.child(PIN_FILE)
    try:
        raw = loc.read_json_if_exists()
    except CkptError:
        return Pin(UNREADABLE_NOTE, None, None)
    if raw is None:
        return None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT_NAME:
        return Pin(UNREADABLE_NOTE, None, None)
    note = raw.get("note")
    return Pin(
        note if isinstance(note, str) and note else None,
        str(raw["pinned_at"]) if raw.get("pinned_at") else None,
        str(raw["by"]) if raw.get("by") else None,
        str(raw["tool"]) if raw.get("tool") else None,
    )


class PinResultJSON(TypedDict):
    """``ckpt pin --json`` / ``ckpt unpin --json``: what changed; ``previous``: the pin the step
    had before the command (the one a new note replaced, the one unpin removed), or null."""

    schema_version: int
    ok: bool
    root: str
    step: int
    path: str
    pinned: bool
    changed: bool
    note: str | None
    pinned_at: str | None
    previous: PinJSON | None


@dataclass(frozen=True)
class PinResult:
    root: str
    step: int
    path: str
    pinned: bool  # after the command
    changed: bool  # whether the command changed anything
    pin: Pin | None
    previous: Pin | None = None  # the step's pin before the command

    #: 2: ``previous``, the pin the command replaced or removed.
    SCHEMA_VERSION: ClassVar[int] = 2

    @property
    def replaced(self) -> Pin | None:
        """The pin a new one replaced (another note), or None."""
        return self.previous if self.changed and self.pinned else None

    def to_json(self) -> PinResultJSON:
        return {
            "schema_version": self.SCHEMA_VERSION,
            "ok": True,
            "root": self.root,
            "step": self.step,
            "path": self.path,
            "pinned": self.pinned,
            "changed": self.changed,
            "note": self.pin.note if self.pin else None,
            "pinned_at": self.pin.pinned_at if self.pin else None,
            "previous": self.previous.to_json() if self.previous else None,
        }


def _who() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (containers)
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def _committed_step(root: Location, entries: list[Entry], step: int) -> StepRef:
    steps = list_steps(root, entries)
    matches = [s for s in steps if s.step == step]
    committed = [s for s in matches if s.committed]
    if committed:
        return committed[0]
    if matches:
        s = matches[0]
        parsed = parse_step_name(s.name)
        what = "an unfinished save" if parsed is not None and parsed.tmp else f"{s.status}"
        raise RefusedError(
            f"step {step} of {root} is {what} ({s.name}): only committed steps can be pinned",
            hint="run `ckpt ls` to see the committed steps",
        )
    have = ", ".join(str(s.step) for s in steps if s.committed) or "none"
    raise NotFoundError(f"step {step} not found in {root}", hint=f"committed steps: {have}")


def pin_step(root: Location, step: int, note: str | None, entries: list[Entry]) -> PinResult:
    """Pin a committed step of ``root`` (``entries``: the root's listing). The caller holds the
    root's prune lock, so that no prune plans and deletes around the write. A step pinned
    already keeps its pin when ``note`` is None or the same; another note replaces it (the
    result's ``previous`` says what it replaced)."""
    ref = _committed_step(root, entries, step)
    old = read_pin(ref.location)
    if old is not None and old.note != UNREADABLE_NOTE and (not note or old.note == note):
        return PinResult(str(root), ref.step, str(ref.location), True, False, old, old)
    pin = Pin(
        note or None,
        datetime.now(timezone.utc).isoformat(timespec="seconds"),
        _who(),
        f"ckpt {__version__}",
    )
    doc = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "pinned_at": pin.pinned_at,
        "note": pin.note,
        "by": pin.by,
        "tool": pin.tool,
    }
    pin_file = ref.location.child(PIN_FILE)
    pin_file.write_bytes((json.dumps(doc, indent=1) + "\n").encode())
    _confirm_still_committed(root, ref, pin_file)
    return PinResult(str(root), ref.step, str(ref.location), True, True, pin, old)


def _confirm_still_committed(root: Location, ref: StepRef, pin_file: Location) -> None:
    """After the write, the step must still be committed: prune cannot delete it meanwhile
    (the caller holds its lock), but a trainer's own retention can. A pin in a step deleted
    meanwhile would be the only object of a dead step: it is removed, and the pin reported
    as not done."""
    root.refresh()
    try:
        alive = any(s.step == ref.step and s.committed for s in list_steps(root, root.list()))
    except NotFoundError:
        alive = False
    if alive:
        return
    with contextlib.suppress(CkptError):
        pin_file.delete_file()
    raise NotFoundError(
        f"step {ref.step} of {root} was deleted while it was being pinned: it is not pinned",
        hint="run `ckpt ls` to see the committed steps",
    )


def unpin_step(root: Location, step: int, entries: list[Entry]) -> PinResult:
    """Remove a step's pin; a step without one is left as it is (``changed`` false)."""
    steps = [s for s in list_steps(root, entries) if s.step == step]
    if not steps:
        have = ", ".join(str(s.step) for s in list_steps(root, entries) if s.committed)
        raise NotFoundError(
            f"step {step} not found in {root}", hint=f"committed steps: {have or 'none'}"
        )
    ref = next((s for s in steps if s.committed), steps[0])
    loc = ref.location.child(PIN_FILE)
    if not loc.is_file():
        return PinResult(str(root), ref.step, str(ref.location), False, False, None)
    old = read_pin(ref.location)
    loc.delete_file()
    return PinResult(str(root), ref.step, str(ref.location), False, True, None, old)
