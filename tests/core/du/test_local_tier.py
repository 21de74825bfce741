"""``du`` of the local tier of Orbax 0.12.8's emergency checkpoint managers
(``fixtures/orbax012/emergency/``): a leaf that holds only this host's shards counts the logical
bytes of the chunks stored, the item says how many chunks the tier holds; the persistent tier
is counted as any root."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckpt_cli.core.du import disk_usage
from ckpt_cli.core.du.types import ItemUsage
from ckpt_cli.core.storage import LocalLocation
from tests.support.paths import REPO

EMERGENCY = REPO / "fixtures" / "orbax012" / "emergency"
#: Whole logical sizes: b int32[6,4], big float32[64,64], replicated float32[5], w float32[8,4].
WHOLE = {"params.b": 96, "params.big": 16384, "params.replicated": 20, "params.w": 128}


def _states(path: Path) -> list[ItemUsage]:
    report = disk_usage(LocalLocation(str(path)))
    return [i for s in report.steps for i in s.items if i.name in ("state", "default")]


@pytest.mark.parametrize(
    "local",
    ["ecm/local_p2", "ecm/local_p3", "replicator/local_p0", "p2p/local_p0", "p2p/local_p3"],
)
def test_a_local_tier_counts_the_chunks_it_stores(local: str) -> None:
    items = _states(EMERGENCY / local)
    assert items
    for item in items:
        partial = {leaf.name for leaf in item.leaves if leaf.partial}
        assert partial == {"params.b", "params.big", "params.w"}
        for leaf in item.leaves:
            whole = WHOLE[leaf.name]
            assert leaf.logical_bytes == (whole // 2 if leaf.name in partial else whole)
        assert item.note is not None and "holds 7 of 13 chunks" in item.note
        assert ("looks like" in item.note) == local.startswith("p2p")


@pytest.mark.parametrize("root", ["ecm/persistent", "p2p/persistent"])
def test_a_persistent_tier_counts_whole_leaves(root: str) -> None:
    for item in _states(EMERGENCY / root):
        assert item.note is None
        assert {leaf.name: leaf.logical_bytes for leaf in item.leaves} == WHOLE
        assert not any(leaf.partial for leaf in item.leaves)
