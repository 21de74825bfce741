"""The local tier of Orbax's emergency checkpointing is told apart from damage
(``format/emergency.py``), on real saves of the three emergency managers of orbax-checkpoint
0.12.8 (``fixtures/orbax012/emergency/``, written by ``fixtures/orbax012/make_emergency.py``:
four JAX processes, mesh (replica=2, data=4), replica 0 = processes 0 and 1)."""

from __future__ import annotations

import base64
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import tensorstore as ts

from ckpt_cli.core.format.arrays import parse_zarr_header
from ckpt_cli.core.format.emergency import (
    LeafChunks,
    LocalTier,
    ProcessMetadata,
    assess_local_tier,
    chunks_by_device,
    infer_host_devices,
    is_local_root_entry,
    is_process_metadata_handler,
    local_tier_of_step,
    parse_process_metadata,
    writer_processes,
)
from ckpt_cli.core.format.names import parse_chunk_part, split_key
from ckpt_cli.core.format.sharding import decode_sharding_entry
from ckpt_cli.errors import InvalidMetadataError
from tests.support.paths import FIXTURES, REPO

EMERGENCY = REPO / "fixtures" / "orbax012" / "emergency"
TRUTH: dict[str, Any] = json.loads((EMERGENCY / "truth.json").read_text())
SHARDED = {"params.w", "params.b", "params.big"}  # `params.replicated` is P(): on every host


def _steps(root: Path) -> list[Path]:
    return sorted((p for p in root.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))


def _local_dirs(manager: str) -> list[Path]:
    return sorted(p for p in (EMERGENCY / manager).iterdir() if p.name.startswith("local_p"))


def _process_of(local_dir: Path) -> int:
    return int(local_dir.name.removeprefix("local_p"))


def _items(step: Path) -> dict[str, list[str]]:
    return {p.name: sorted(c.name for c in p.iterdir()) for p in step.iterdir() if p.is_dir()}


def _handlers(step: Path) -> dict[str, str]:
    handlers: dict[str, str] = json.loads((step / "_CHECKPOINT_METADATA").read_text())[
        "item_handlers"
    ]
    return handlers


def _process_metadata(step: Path) -> ProcessMetadata | None:
    pm = step / "process_metadata"
    if not pm.is_dir():
        return None
    return parse_process_metadata(
        json.loads((pm / "global_process_metadata.json").read_text()),
        json.loads((pm / "mesh_metadata.json").read_text()),
    )


def _leaves(item: Path) -> list[LeafChunks]:
    """Every array of an OCDBT + zarr3 item with the chunk indices its merged root stores."""
    kv = ts.KvStore.open({"driver": "ocdbt", "base": f"file://{item}/"}).result()
    keys = [bytes(k) for k in kv.list().result()]
    raw_sharding = json.loads((item / "_sharding").read_text())
    shardings = {
        base64.urlsafe_b64decode(k).decode(): decode_sharding_entry(v)
        for k, v in raw_sharding.items()
    }
    headers = {split_key(k, True)[0] for k in keys if split_key(k, True)[1] == "zarr.json"}
    out = []
    for name in sorted(headers):
        info = parse_zarr_header(name, kv.read(f"{name}/zarr.json".encode()).result().value, "")
        present = set()
        for key in keys:
            where, part = split_key(key, True)
            if where == name and (i := parse_chunk_part(part, True, len(info.shape))) is not None:
                present.add(i)
        out.append(
            LeafChunks(name, info.shape, info.chunk_shape, shardings.get(name), frozenset(present))
        )
    return out


def _tier(step: Path) -> LocalTier | None:
    return local_tier_of_step(_items(step), _handlers(step), _process_metadata(step))


@pytest.mark.parametrize("manager", sorted(TRUTH["managers"]))
def test_orbax_restored_every_step_it_lists_as_it_was_saved(manager: str) -> None:
    m = TRUTH["managers"][manager]
    assert sorted(int(s) for s in m["restored"]) == m["all_steps"]
    for step, restored in m["restored"].items():
        assert restored["leaves"] == m["expected_leaves"][step]


LOCAL_WITH_METADATA = [d for m in ("ecm", "replicator") for d in _local_dirs(m)]


@pytest.mark.parametrize("local", LOCAL_WITH_METADATA, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_local_tier_with_process_metadata_is_recognised_with_its_devices(local: Path) -> None:
    process = _process_of(local)
    for step in _steps(local):
        tier = _tier(step)
        assert tier is not None and tier.marker == "process-metadata"
        assert tier.process == process  # the one ocdbt.process_<i> of its `state` item
        pm = _process_metadata(step)
        assert pm is not None and tier.devices == pm.devices_by_process[process]
        assert "local tier" in tier.describe() and f"process {process}" in tier.describe()


@pytest.mark.parametrize("local", LOCAL_WITH_METADATA, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_missing_chunks_of_a_local_tier_are_other_hosts_shards_not_damage(local: Path) -> None:
    for step in _steps(local):
        leaves = _leaves(step / "state")
        verdict = assess_local_tier(_tier(step), leaves)
        assert verdict is not None and verdict.devices is not None
        assert verdict.lost == ()
        assert {h.name for h in verdict.partial} == SHARDED
        for leaf, h in zip(leaves, verdict.leaves, strict=True):
            assert leaf.present == h.expected  # exactly this host's shards, nothing more
        # the inference that p2p needs agrees on these dirs (it also names replica peers)
        inferred = infer_host_devices(leaves)
        assert inferred is not None and verdict.devices <= inferred


@pytest.mark.parametrize("manager", ["ecm", "replicator", "p2p"])
def test_hosts_of_one_replica_together_hold_every_chunk(manager: str) -> None:
    """What each host lacks is really on another host: the union over one replica is whole."""
    by_step: dict[str, dict[str, set[tuple[int, ...]]]] = {}
    every: dict[str, frozenset[tuple[int, ...]]] = {}
    replica_of = {p: r for r, ps in TRUTH["replicas"].items() for p in ps}
    for local in _local_dirs(manager):
        for step in _steps(local):
            key = f"{replica_of[_process_of(local)]}/{step.name}"
            for leaf in _leaves(step / "state"):
                by_step.setdefault(key, {}).setdefault(leaf.name, set()).update(leaf.present)
                every[leaf.name] = leaf.all_chunks()
    assert by_step
    for leaves in by_step.values():
        assert {n: frozenset(c) for n, c in leaves.items()} == every


@pytest.mark.parametrize("local", _local_dirs("p2p"), ids=lambda p: p.name)
def test_p2p_local_tier_has_no_marker_and_is_confirmed_by_its_chunks(local: Path) -> None:
    (step,) = _steps(local)
    assert set(_items(step)) == {"state"}
    tier = _tier(step)
    assert tier == LocalTier("single-writer", _process_of(local))
    verdict = assess_local_tier(tier, _leaves(step / "state"))
    assert verdict is not None and verdict.lost == ()
    assert {h.name for h in verdict.partial} == SHARDED
    # the devices holding these shards: 2 of this host and their 2 peers in the other replica
    assert verdict.devices is not None and len(verdict.devices) == 4


def test_a_single_writer_item_missing_chunks_in_another_pattern_is_damage() -> None:
    (step,) = _steps(EMERGENCY / "p2p" / "local_p1")
    leaves = _leaves(step / "state")
    big = next(i for i, leaf in enumerate(leaves) if leaf.name == "params.big")
    lost = sorted(leaves[big].present)[0]
    leaves[big] = replace(leaves[big], present=leaves[big].present - {lost})
    assert infer_host_devices(leaves) is None
    assert assess_local_tier(_tier(step), leaves) is None  # not a local tier: report damage


def test_a_chunk_of_the_hosts_own_shards_missing_is_still_damage() -> None:
    step = _steps(EMERGENCY / "ecm" / "local_p2")[-1]
    leaves = _leaves(step / "state")
    w = next(i for i, leaf in enumerate(leaves) if leaf.name == "params.w")
    lost = sorted(leaves[w].present)[0]
    leaves[w] = replace(leaves[w], present=leaves[w].present - {lost})
    verdict = assess_local_tier(_tier(step), leaves)
    assert verdict is not None
    assert [(h.name, h.lost) for h in verdict.lost] == [("params.w", frozenset({lost}))]


@pytest.mark.parametrize("manager", ["ecm", "p2p"])
def test_the_persistent_tier_is_a_normal_root(manager: str) -> None:
    persistent = EMERGENCY / manager / "persistent"
    for step in _steps(persistent):
        assert _tier(step) is None
        for item in _items(step):
            leaves = _leaves(step / item)
            assert all(leaf.present == leaf.all_chunks() for leaf in leaves)
            assert infer_host_devices(leaves) is None


@pytest.mark.parametrize("name", ["seed_mlp", "sharded_4x2", "multiprocess", "v1_zarr3"])
def test_ordinary_checkpoints_are_not_local_tiers(name: str) -> None:
    for step in _steps(FIXTURES / name):
        handlers = _handlers(step)
        assert (
            local_tier_of_step(_items(step), handlers if isinstance(handlers, dict) else {}) is None
        )


def test_all_steps_of_the_emergency_manager_is_the_union_of_both_tiers() -> None:
    ecm = TRUTH["managers"]["ecm"]
    on_disk = {int(s.name) for d in (EMERGENCY / "ecm").iterdir() for s in _steps(d)}
    assert sorted(on_disk) == ecm["all_steps"]
    local_steps = {s for d in _local_dirs("ecm") for s in (int(p.name) for p in _steps(d))}
    assert {s for s, r in ecm["restored"].items() if r["tier"].startswith("local")} == {
        str(s) for s in local_steps
    }
    # the processes of replica 0 write no local tier at all
    assert [_process_of(d) for d in _local_dirs("ecm")] == TRUTH["replicas"]["1"]


def test_chunks_by_device_follows_the_mesh() -> None:
    step = _steps(EMERGENCY / "ecm" / "local_p2")[0]
    w = next(leaf for leaf in _leaves(step / "state") if leaf.name == "params.w")
    by_device = chunks_by_device(w)  # w: [8,4] P('data', None) on (replica=2, data=4)
    assert by_device[4096] == by_device[0] == frozenset({(0, 0)})
    assert by_device[6145] == by_device[2049] == frozenset({(3, 0)})


@pytest.mark.parametrize(
    ("name", "local"),
    [
        ("replicator.yaml", True),
        ("replicator.errors", True),
        ("replicator.failed", True),
        ("jax-init-info.txt", True),
        ("run-s100-n0-w3.restore", True),
        ("p2p_restore", True),
        ("100", False),
        ("metadata", False),
        ("100.orbax-checkpoint-tmp", False),
    ],
)
def test_entries_of_the_emergency_machinery_at_a_local_root(name: str, local: bool) -> None:
    assert is_local_root_entry(name) is local


def test_names_and_handlers() -> None:
    assert writer_processes(["ocdbt.process_3", "d", "manifest.ocdbt", "ocdbt.process_10"]) == (
        3,
        10,
    )
    assert writer_processes(["ocdbt.process_replica_1"]) == ()
    handler = _handlers(_steps(EMERGENCY / "ecm" / "local_p2")[0])["process_metadata"]
    assert is_process_metadata_handler(handler)
    assert is_process_metadata_handler(
        "orbax.checkpoint.experimental.emergency.process_metadata_checkpoint_handler."
        "ProcessMetadataCheckpointHandler"
    )
    assert not is_process_metadata_handler(
        "orbax.checkpoint._src.handlers.pytree_checkpoint_handler.PyTreeCheckpointHandler"
    )
    assert not is_process_metadata_handler(None)


@pytest.mark.parametrize(
    ("global_raw", "mesh_raw"),
    [({"0": [0]}, [0]), ([[0, "1"]], [0, 1]), ([[0, 1]], "0,1"), ([0, 1], [0, 1])],
)
def test_invalid_process_metadata_is_refused(global_raw: Any, mesh_raw: Any) -> None:
    with pytest.raises(InvalidMetadataError):
        parse_process_metadata(global_raw, mesh_raw)
