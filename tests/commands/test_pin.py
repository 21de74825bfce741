"""``ckpt pin`` through the real entry point: the pin file, what ``ls``, ``prune`` and ``verify``
make of it, its text and JSON, and the steps it refuses (exit 2 usage, 3 no such step, an
unfinished save or a prune running). ``unpin`` is in ``test_unpin.py``, pins in a bucket in
``test_pins_bucket.py``, Orbax's retention beside pins in ``e2e/test_pins_orbax.py``."""

from __future__ import annotations

import json

import pytest

from ckpt_cli.core.format.pins import PIN_FILE
from ckpt_cli.core.prune.execute import prune_lock
from ckpt_cli.core.storage import LocalLocation
from tests.support.world import World, one_json_document

#: What ``ckpt pin --json`` prints (``PinResultJSON``).
PIN_KEYS = {
    "schema_version",
    "ok",
    "root",
    "step",
    "path",
    "pinned",
    "changed",
    "note",
    "pinned_at",
    "previous",
}


def pins(world: World) -> list[str]:
    return sorted(str(p.relative_to(world.tmp)) for p in world.tmp.rglob(PIN_FILE))


def test_pin_is_shown_by_ls(world: World, cli) -> None:  # type: ignore[no-untyped-def]
    r = cli("pin", world.good, "400", "--note", "best eval so far", "--json")
    assert r.code == 0, r.stderr
    doc = one_json_document(r.stdout)
    assert doc["ok"] is True and doc["step"] == 400 and doc["changed"] is True
    assert (world.good / "400" / PIN_FILE).is_file()
    listing = one_json_document(cli("ls", world.good, "--json").stdout)
    pinned = {s["step"]: s["pinned"] for s in listing["steps"]}
    assert pinned[300] is None and pinned[500] is None
    assert pinned[400]["note"] == "best eval so far" and pinned[400]["pinned_at"]
    text = cli("ls", world.good)
    row = next(line for line in text.stdout.splitlines() if line.lstrip().startswith("400"))
    assert "pinned" in row


def test_json_document_shape(world: World, cli) -> None:  # type: ignore[no-untyped-def]
    doc = one_json_document(cli("pin", world.good, "500", "-m", "release", "--json").stdout)
    assert set(doc) == PIN_KEYS
    assert (doc["root"], doc["step"], doc["path"]) == (
        str(world.good),
        500,
        str(world.good / "500"),
    )
    assert (doc["pinned"], doc["changed"], doc["note"]) == (True, True, "release")
    assert isinstance(doc["schema_version"], int) and doc["pinned_at"]
    written = json.loads((world.good / "500" / PIN_FILE).read_text())
    assert written["note"] == "release" and written["pinned_at"] == doc["pinned_at"]


def test_text_says_what_changed(world: World, cli) -> None:  # type: ignore[no-untyped-def]
    first = cli("pin", world.good, "400", "--note", "paper")
    assert first.code == 0 and first.stderr == ""
    assert first.stdout == f"pinned step 400 of {world.good} (paper)\n"
    again = cli("pin", world.good, "400", "--note", "paper")  # same note: nothing to write
    assert again.code == 0
    assert again.stdout == f"already pinned step 400 of {world.good} (paper)\n"
    bare = cli("pin", world.good, "300")
    assert bare.stdout == f"pinned step 300 of {world.good}\n"


def test_pin_twice_updates_the_note(world: World, cli) -> None:  # type: ignore[no-untyped-def]
    assert cli("pin", world.good, "400").code == 0
    again = one_json_document(cli("pin", world.good, "400", "--note", "n2", "--json").stdout)
    assert again["changed"] is True and again["note"] == "n2"
    assert again["previous"]["note"] is None and again["previous"]["pinned_at"]
    assert json.loads((world.good / "400" / PIN_FILE).read_text())["note"] == "n2"


def test_another_note_replaces_the_pin_and_says_what_it_replaced(world: World, cli) -> None:  # type: ignore[no-untyped-def]
    """Nothing is lost silently: the note replaced, who pinned it and when, on stderr and as
    ``previous`` in the JSON document."""
    first = one_json_document(cli("pin", world.good, "400", "-m", "best eval", "--json").stdout)
    assert first["previous"] is None
    old = json.loads((world.good / "400" / PIN_FILE).read_text())
    r = cli("pin", world.good, "400", "--note", "paper")
    assert r.code == 0, r.stderr
    assert r.stdout == f"pinned step 400 of {world.good} (paper)\n"
    assert r.stderr.splitlines() == [
        f'ckpt: replaced note "best eval" (pinned by {old["by"]} at {old["pinned_at"]})'
    ]
    doc = one_json_document(cli("pin", world.good, "400", "--note", "v3", "--json").stdout)
    assert doc["note"] == "v3" and doc["previous"]["note"] == "paper"
    assert doc["previous"]["by"] == old["by"]
    gone = one_json_document(cli("unpin", world.good, "400", "--json").stdout)
    assert gone["pinned"] is False and gone["previous"]["note"] == "v3"


def test_pinning_again_without_a_note_keeps_the_pin(world: World, cli) -> None:  # type: ignore[no-untyped-def]
    assert cli("pin", world.good, "400", "--note", "best eval").code == 0
    before = (world.good / "400" / PIN_FILE).read_bytes()
    r = cli("pin", world.good, "400")
    assert r.code == 0 and r.stderr == "", r.stderr
    assert r.stdout == f"already pinned step 400 of {world.good} (best eval)\n"
    assert (world.good / "400" / PIN_FILE).read_bytes() == before


def test_prune_keeps_a_pinned_step_with_the_reason(world: World, cli) -> None:  # type: ignore[no-untyped-def]
    assert cli("pin", world.good, "300", "--note", "paper figure 3").code == 0
    r = cli("prune", world.good, "--keep-last", "1", "--yes", "--json")
    assert r.code == 0, r.stderr
    doc = one_json_document(r.stdout)
    kept = {k["step"]: k["reasons"] for k in doc["keep"]}
    assert set(kept) == {300, 500}
    assert any(reason.startswith("pinned") and "paper figure 3" in reason for reason in kept[300])
    assert [d["step"] for d in doc["delete"]] == [400]
    assert sorted(p.name for p in world.good.iterdir() if not p.name.startswith(".")) == [
        "300",
        "500",
    ]
    # Unpinned, the same rule deletes it.
    assert cli("unpin", world.good, "300").code == 0
    assert cli("prune", world.good, "--keep-last", "1", "--yes").code == 0
    assert sorted(p.name for p in world.good.iterdir() if not p.name.startswith(".")) == ["500"]


def test_verify_does_not_flag_the_pin_file(world: World, cli) -> None:  # type: ignore[no-untyped-def]
    assert cli("pin", world.good, "500").code == 0
    doc = one_json_document(cli("verify", world.good, "--strict", "--json").stdout)
    assert doc["ok"] is True, doc["problems"]


@pytest.mark.parametrize(
    ("where", "step", "phrase"),
    [
        ("good", "7", "step 7 not found"),
        ("with_tmp", "3", "unfinished save"),
        ("missing", "1", "missing"),
    ],
)
def test_a_step_that_cannot_be_pinned_exits_3_in_one_line(  # type: ignore[no-untyped-def]
    world: World, cli, where: str, step: str, phrase: str
) -> None:
    r = cli("pin", getattr(world, where), step, "--note", "x")
    assert r.code == 3, r.stdout + r.stderr
    assert r.stdout == ""
    assert r.stderr.startswith("ckpt: error:") and phrase in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert pins(world) == []


@pytest.mark.parametrize("args", [["400x"], [], ["-1.5"]])
def test_a_step_that_is_no_number_is_a_usage_error(world: World, cli, args: list[str]) -> None:  # type: ignore[no-untyped-def]
    r = cli("pin", world.good, *args)
    assert r.code == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    assert pins(world) == []


def test_a_running_prune_refuses_the_pin(world: World, cli) -> None:  # type: ignore[no-untyped-def]
    """A pin beside a prune could land on a step the prune is deleting: refused while its lock
    is held, and pinned once it is gone."""
    with prune_lock(LocalLocation(str(world.good))):
        r = cli("pin", world.good, "400", "--json")
    assert r.code == 3 and "is being pruned by another process" in r.stderr, r.stderr
    error = one_json_document(r.stdout)
    assert error["ok"] is False and error["error"]["code"] == "locked"
    assert pins(world) == []
    assert cli("pin", world.good, "400").code == 0
    assert pins(world) == [f"good/400/{PIN_FILE}"]
