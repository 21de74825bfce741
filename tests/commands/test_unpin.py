"""``ckpt unpin`` through the real entry point: the pin removed, prune's rules apply again, an
unpinned step left as it is (exit 0, so scripts unpin unconditionally), the steps it refuses
(exit 2 usage, 3 no such step or a prune running)."""

from __future__ import annotations

import pytest

from ckpt_cli.core.format.pins import PIN_FILE
from ckpt_cli.core.prune.execute import prune_lock
from ckpt_cli.core.storage import LocalLocation
from tests.support.world import World, one_json_document


def test_unpin_removes_the_pin_and_is_idempotent(world: World, cli) -> None:  # type: ignore[no-untyped-def]
    assert cli("pin", world.good, "400", "--note", "n1").code == 0
    first = one_json_document(cli("unpin", world.good, "400", "--json").stdout)
    assert first["ok"] is True and first["changed"] is True and first["pinned"] is False
    assert (first["step"], first["root"]) == (400, str(world.good))
    assert not (world.good / "400" / PIN_FILE).exists()
    second = cli("unpin", world.good, "400", "--json")
    assert second.code == 0, second.stderr
    doc = one_json_document(second.stdout)
    assert doc["ok"] is True and doc["changed"] is False and doc["pinned"] is False


def test_text_says_what_changed(world: World, cli) -> None:  # type: ignore[no-untyped-def]
    assert cli("pin", world.good, "500").code == 0
    r = cli("unpin", world.good, "500")
    assert r.code == 0 and r.stderr == ""
    assert r.stdout == f"unpinned step 500 of {world.good}\n"
    again = cli("unpin", world.good, "500")
    assert again.code == 0
    assert again.stdout == f"was not pinned: step 500 of {world.good}\n"


def test_unpinned_step_is_pruned_by_the_rules_again(world: World, cli) -> None:  # type: ignore[no-untyped-def]
    assert cli("pin", world.good, "300").code == 0
    plan = one_json_document(
        cli("prune", world.good, "--keep-last", "1", "--dry-run", "--json").stdout
    )
    assert sorted(k["step"] for k in plan["keep"]) == [300, 500]
    assert cli("unpin", world.good, "300").code == 0
    plan = one_json_document(
        cli("prune", world.good, "--keep-last", "1", "--dry-run", "--json").stdout
    )
    assert [k["step"] for k in plan["keep"]] == [500]
    assert sorted(d["step"] for d in plan["delete"]) == [300, 400]


@pytest.mark.parametrize(("where", "step"), [("good", "7"), ("missing", "1")])
def test_no_such_step_exits_3_in_one_line(world: World, cli, where: str, step: str) -> None:  # type: ignore[no-untyped-def]
    r = cli("unpin", getattr(world, where), step)
    assert r.code == 3, r.stdout + r.stderr
    assert r.stdout == "" and r.stderr.startswith("ckpt: error:")
    assert len(r.stderr.strip().splitlines()) <= 2 and "Traceback" not in r.stderr


def test_a_step_that_is_no_number_is_a_usage_error(world: World, cli) -> None:  # type: ignore[no-untyped-def]
    assert cli("pin", world.good, "400").code == 0
    r = cli("unpin", world.good, "four-hundred")
    assert r.code == 2 and "Traceback" not in r.stderr
    assert (world.good / "400" / PIN_FILE).is_file()


def test_a_running_prune_refuses_the_unpin(world: World, cli) -> None:  # type: ignore[no-untyped-def]
    assert cli("pin", world.good, "400").code == 0
    with prune_lock(LocalLocation(str(world.good))):
        r = cli("unpin", world.good, "400")
    assert r.code == 3 and "is being pruned by another process" in r.stderr, r.stderr
    assert (world.good / "400" / PIN_FILE).is_file()
    assert cli("unpin", world.good, "400").code == 0
    assert not (world.good / "400" / PIN_FILE).exists()
