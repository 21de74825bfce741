"""Reading a local tier's evidence from storage (``format/tiers.py``) on the real saves of
Orbax 0.12.8's emergency managers (``fixtures/orbax012/emergency/``): the step's tier from its
names and ``process_metadata``, the item's partial leaves from its chunk keys, and the one-line
refusal for readers that need whole leaves."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckpt_cli.core.format.tiers import (
    item_local_tier,
    listed_local_tier,
    partial_leaf_refusal,
    tier_of_step_dir,
)
from ckpt_cli.core.storage import LocalLocation
from tests.support.paths import FIXTURES, REPO

EMERGENCY = REPO / "fixtures" / "orbax012" / "emergency"


def _loc(path: Path) -> LocalLocation:
    return LocalLocation(str(path))


def test_a_marked_step_is_a_local_tier_with_its_devices() -> None:
    tier = tier_of_step_dir(_loc(EMERGENCY / "ecm" / "local_p2" / "4"))
    assert tier is not None and tier.marker == "process-metadata"
    assert (tier.process, tier.devices) == (2, (4096, 4097))
    assert tier.short() == "local tier of Orbax's emergency manager, process 2's shards"


def test_the_partial_leaves_come_from_the_chunk_keys() -> None:
    found = item_local_tier(_loc(EMERGENCY / "replicator" / "local_p1" / "0" / "state"))
    assert found is not None and found.verdict is not None
    assert sorted(h.name for h in found.verdict.partial) == ["params.b", "params.big", "params.w"]
    assert found.is_partial("params.w") and not found.is_partial("params.replicated")


def test_a_p2p_step_is_a_tier_only_once_its_chunks_confirm_it() -> None:
    step = _loc(EMERGENCY / "p2p" / "local_p2" / "2")
    tier = tier_of_step_dir(step)
    assert tier is not None and tier.marker == "single-writer"
    found = item_local_tier(step.child("state"), tier)
    assert found is not None and found.tier.short().startswith("looks like the local tier")
    entries = step.list()
    assert listed_local_tier(step, entries, None, confirm=True) == tier
    assert listed_local_tier(step, entries, None, confirm=False) is None
    # process 0's steps look like a one-process save's: ls does not read their chunks
    p0 = _loc(EMERGENCY / "p2p" / "local_p0" / "2")
    assert listed_local_tier(p0, p0.list(), None, confirm=True) is None


@pytest.mark.parametrize(
    "step",
    [
        EMERGENCY / "ecm" / "persistent" / "4",
        EMERGENCY / "p2p" / "persistent" / "2",
        FIXTURES / "seed_mlp" / "500",
        FIXTURES / "multiprocess" / "3",
    ],
    ids=lambda p: f"{p.parent.name}/{p.name}",
)
def test_whole_saves_are_no_local_tier(step: Path) -> None:
    loc = _loc(step)
    for item in (e.name for e in loc.list() if e.is_dir):
        assert item_local_tier(loc.child(item)) is None
        assert partial_leaf_refusal(loc.child(item), "params.w") is None


def test_the_refusal_names_the_leaf_the_tier_and_where_to_read() -> None:
    refusal = partial_leaf_refusal(
        _loc(EMERGENCY / "ecm" / "local_p3" / "4" / "state"), "params.big"
    )
    assert refusal is not None and refusal.exit_code == 3
    assert refusal.message == (
        "params.big is only partly on this host (local tier of Orbax's emergency manager, "
        "process 3's shards): read the persistent tier"
    )
    whole = _loc(EMERGENCY / "ecm" / "local_p3" / "4" / "state")
    assert partial_leaf_refusal(whole, "params.replicated") is None
