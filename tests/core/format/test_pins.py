"""``core/pins.py`` on real fixtures: the pin file, its fail-safe reading, which steps can be pinned."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ckpt_cli.core.format.pins import PIN_FILE, UNREADABLE_NOTE, pin_step, read_pin, unpin_step
from ckpt_cli.core.storage import LocalLocation
from ckpt_cli.errors import NotFoundError, RefusedError
from tests.support.world import World


def _pin(root: Path, step: int, note: str | None = None):  # type: ignore[no-untyped-def]
    loc = LocalLocation(str(root))
    return pin_step(loc, step, note, loc.list())


def test_pin_writes_one_file_and_unpin_removes_it(world: World) -> None:
    result = _pin(world.good, 400, "eval best")
    assert result.changed and result.pinned and result.step == 400
    doc = json.loads((world.good / "400" / PIN_FILE).read_text())
    assert doc["format"] == "ckpt-pin" and doc["note"] == "eval best" and doc["pinned_at"]
    assert sorted(p.name for p in (world.good / "400").iterdir()) == sorted(
        ["_CHECKPOINT_METADATA", "commit_success.txt", "default", PIN_FILE]
    )
    assert not _pin(world.good, 400, "eval best").changed  # same note: nothing to write
    pin = read_pin(LocalLocation(str(world.good / "400")))
    assert pin is not None and pin.reason == "pinned: eval best"
    loc = LocalLocation(str(world.good))
    assert unpin_step(loc, 400, loc.list()).changed
    assert not (world.good / "400" / PIN_FILE).exists()
    assert not unpin_step(loc, 400, loc.list()).changed


def test_a_damaged_pin_file_still_pins(world: World) -> None:
    (world.good / "300" / PIN_FILE).write_text("{not json")
    pin = read_pin(LocalLocation(str(world.good / "300")))
    assert pin is not None and pin.note == UNREADABLE_NOTE


def test_only_committed_steps_can_be_pinned(world: World) -> None:
    with pytest.raises(RefusedError, match="unfinished save"):
        _pin(world.with_tmp, 3)
    with pytest.raises(NotFoundError, match="step 7 not found"):
        _pin(world.good, 7)
    assert not any(p.name == PIN_FILE for p in world.with_tmp.rglob(PIN_FILE))
