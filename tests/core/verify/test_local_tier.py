"""``verify`` on the local tier of Orbax 0.12.8's emergency checkpoint managers (real saves in
``fixtures/orbax012/emergency/``, ``make_emergency.py``): the chunks other hosts hold are not
damage, the host's own are still checked (structure, ``--deep``, ``--record``), and the
persistent tiers read as any root."""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import tensorstore as ts

from ckpt_cli.core.format.emergency import LocalTier
from ckpt_cli.core.format.tiers import tier_of_step_dir
from ckpt_cli.core.storage import LocalLocation
from ckpt_cli.core.verify.run import verify_path
from ckpt_cli.core.verify.structure import check_item
from ckpt_cli.core.verify.tier import Stored, settle_chunks
from ckpt_cli.core.verify.types import ItemFacts, SampleSpec, VerifyOptions, VerifyReport
from tests.support.paths import REPO

EMERGENCY = REPO / "fixtures" / "orbax012" / "emergency"
TRUTH: dict[str, Any] = json.loads((EMERGENCY / "truth.json").read_text())
#: Sharded over 'data' (4 chunks, 2 of them on each host); `params.replicated` is on every host.
PARTIAL = ["params.b", "params.big", "params.w"]
MARKED = [
    EMERGENCY / m / f"local_p{p}"
    for m, ps in (("ecm", (2, 3)), ("replicator", (0, 1, 2, 3)))
    for p in ps
]
P2P = [EMERGENCY / "p2p" / f"local_p{p}" for p in range(4)]


def _verify(path: Path, **options: Any) -> VerifyReport:
    return verify_path(LocalLocation(str(path)), VerifyOptions(**options))


def _codes(report: VerifyReport) -> list[tuple[str, str]]:
    return [(p.severity, p.code) for p in report.problems]


def _steps(local: Path) -> list[Path]:
    return sorted((p for p in local.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))


def _copy(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / src.name
    shutil.copytree(src, dst)
    return dst


def _process(local: Path) -> int:
    return int(local.name.removeprefix("local_p"))


@pytest.mark.parametrize("local", MARKED, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_marked_local_tier_is_clean_with_a_note_per_item(local: Path) -> None:
    report = _verify(local)
    assert report.ok and report.problems == ()
    doc = report.to_json()
    states = [i for i in report.items if i.name == "state"]
    assert [t["item"] for t in doc["local_tiers"]] == [i.path for i in states]
    for entry in doc["local_tiers"]:
        assert entry["marker"] == "process-metadata" and entry["process"] == _process(local)
        assert entry["partial_leaves"] == PARTIAL
        assert (entry["chunks_stored"], entry["of_chunks"]) == (6, 12)
        assert entry["devices"] is not None and len(entry["devices"]) == 2
        assert f"process {_process(local)}" in entry["note"] and "local tier" in entry["note"]
        assert "3 of 4 arrays are partial by design" in entry["note"]
    # process_metadata is a known item: its JSON files parsed, no "unknown handler" note
    assert doc["notes"] == []
    assert {i.kind for i in report.items if i.name == "process_metadata"} == {"json"}


@pytest.mark.parametrize("local", P2P, ids=lambda p: p.name)
def test_a_p2p_local_tier_is_a_warning_not_an_error_nor_silence(local: Path) -> None:
    report = _verify(local)
    assert report.ok and _codes(report) == [("warning", "chunk-missing")]
    (p,) = report.problems
    assert "looks like the local tier of Orbax's p2p manager" in p.message
    assert "If it is not one, those chunks are lost data" in p.message
    assert list(p.leaves) == PARTIAL
    (entry,) = report.to_json()["local_tiers"]
    assert entry["marker"] == "single-writer" and entry["process"] == _process(local)


@pytest.mark.parametrize("manager", ["ecm", "p2p"])
def test_the_persistent_tier_reads_as_any_root(manager: str) -> None:
    report = _verify(EMERGENCY / manager / "persistent", deep=True)
    assert report.ok and report.problems == ()
    assert report.to_json()["local_tiers"] == []
    assert report.coverage is not None and report.coverage.complete
    chunks = sum(i.chunks for i in report.items)
    assert sum(i.chunks_decoded for i in report.items) == chunks


def test_deep_decodes_every_stored_chunk_of_the_partial_leaves() -> None:
    report = _verify(EMERGENCY / "ecm" / "local_p2", deep=True)
    assert report.ok and report.problems == ()
    checked = report.checked_json()
    # 2 steps x (3 partial leaves x 2 of 4 chunks + 1 replicated chunk) = 14 of 26
    assert (checked["chunks_decoded"], checked["chunks"]) == (14, 26)
    assert report.coverage is not None and report.coverage.complete
    for entry in report.to_json()["local_tiers"]:
        assert "their stored chunks are the ones decoded" in entry["note"]


def _chunk_place(item: Path, key: bytes) -> tuple[Path, int, int]:
    facts = check_item(LocalLocation(str(item)), ".", LocalLocation(str(item.parent)))
    ref = facts.keys[key]
    assert ref is not None  # stored out of line (params.big: 4 KiB chunks)
    return item / ref.file, ref.offset, ref.length


def test_deep_reports_a_stored_chunk_of_a_partial_leaf_that_does_not_decode(
    tmp_path: Path,
) -> None:
    step = _copy(EMERGENCY / "ecm" / "local_p2" / "4", tmp_path)
    path, offset, _ = _chunk_place(step / "state", b"params.big/c/0/0")
    data = bytearray(path.read_bytes())
    data[offset : offset + 4] = b"\0\0\0\0"  # the zstd frame's magic number
    path.write_bytes(bytes(data))
    assert _verify(step).ok  # the structure level does not decode
    report = _verify(step, deep=True)
    assert [(p.code, p.leaf) for p in report.problems] == [("decode-error", "params.big")]


def test_a_missing_chunk_of_the_hosts_own_shards_is_an_error(tmp_path: Path) -> None:
    step = _copy(EMERGENCY / "ecm" / "local_p2" / "4", tmp_path)
    kv = ts.KvStore.open({"driver": "ocdbt", "base": f"file://{step / 'state'}/"}).result()
    own = b"params.w/c/1/0"  # process 2 holds rows 0-3 of w: chunks [0,0] and [1,0]
    assert own in list(kv.list().result())
    kv.delete_range(ts.KvStore.KeyRange(own, own + b"\0")).result()
    report = _verify(step)
    assert not report.ok
    assert [(p.severity, p.code, p.leaf) for p in report.problems] == [
        ("error", "chunk-missing", "params.w")
    ]
    message = report.problems[0].message
    assert "1 of the 2 chunks of this host's own shards are not stored (first: [1,0])" in message
    assert "the other hosts' chunks are missing by design" in message
    (entry,) = report.to_json()["local_tiers"]
    assert entry["partial_leaves"] == ["params.b", "params.big"]  # w is damaged, not partial


def test_a_truncated_data_file_of_the_host_is_an_error(tmp_path: Path) -> None:
    step = _copy(EMERGENCY / "ecm" / "local_p2" / "4", tmp_path)
    path, offset, length = _chunk_place(step / "state", b"params.big/c/1/0")
    with path.open("r+b") as f:
        f.truncate(offset + length // 2)
    codes = {(p.code, p.leaf) for p in _verify(step, deep=True).problems}
    assert ("data-file-truncated", "params.big") in codes


def test_record_skips_the_partial_leaves_and_then_catches_a_flipped_byte(
    tmp_path: Path,
) -> None:
    local = _copy(EMERGENCY / "ecm" / "local_p2", tmp_path)
    recorded = _verify(local, record=True)
    assert recorded.ok and recorded.problems == ()
    assert sorted(recorded.recorded) == [
        "3/process_metadata",
        "3/state",
        "4/process_metadata",
        "4/state",
    ]
    for entry in recorded.to_json()["local_tiers"]:
        assert "no digest is recorded for them (no whole leaf here)" in entry["note"]
    digests = json.loads((local / "4" / "state" / "_CKPT_DIGESTS.json").read_text())
    assert sorted(digests["leaves"]) == ["params.replicated"]
    # a later check: no "digest-incomplete" for the leaves partial by design
    again = _verify(local, deep=True)
    assert again.ok and again.problems == ()
    path, offset, length = _chunk_place(local / "4" / "state", b"params.big/c/0/0")
    data = bytearray(path.read_bytes())
    data[offset + length // 2] ^= 0x40  # inside a stored chunk of a partial leaf
    path.write_bytes(bytes(data))
    flipped = _verify(local, deep=True)
    assert [(p.code, p.file) for p in flipped.problems] == [
        ("datafile-checksum-mismatch", f"4/state/{path.relative_to(local / '4' / 'state')}")
    ]


def test_a_sample_draws_only_from_the_stored_chunks() -> None:
    report = _verify(EMERGENCY / "ecm" / "local_p2", sample=SampleSpec(percent=100))
    assert report.ok and report.problems == ()
    assert report.sample is not None and (report.sample.chunks, report.sample.of_chunks) == (14, 14)


def test_an_item_given_alone_knows_its_step_is_a_local_tier() -> None:
    report = _verify(EMERGENCY / "replicator" / "local_p3" / "1" / "state", deep=True)
    assert report.ok and report.problems == ()
    (entry,) = report.to_json()["local_tiers"]
    assert entry["item"] == "." and entry["process"] == 3


def test_damaged_process_metadata_is_reported(tmp_path: Path) -> None:
    step = _copy(EMERGENCY / "ecm" / "local_p3" / "3", tmp_path)
    (step / "process_metadata" / "global_process_metadata.json").write_text('{"0": [0]}')
    report = _verify(step)
    assert [(p.code, p.file) for p in report.problems] == [
        ("metadata-invalid", "process_metadata/global_process_metadata.json")
    ]


def test_the_emergency_machinerys_files_at_a_local_root_are_not_unknown(tmp_path: Path) -> None:
    local = _copy(EMERGENCY / "replicator" / "local_p1", tmp_path)
    for name in ("replicator.yaml", "replicator.errors", "jax-init-info.txt"):
        (local / name).write_text("x")
    (local / "p2p_restore").mkdir()
    (local / "run-s1-n0-w1.restore").symlink_to(local / "1")
    report = _verify(local)
    assert report.ok and report.problems == ()
    (local / "notes.txt").write_text("x")
    assert [p.file for p in _verify(local).problems] == ["notes.txt"]


def _settled(tier: LocalTier, shardings: dict[str, Any]) -> ItemFacts:
    """The real arrays of ecm/local_p2's step 4, settled again under ``tier``."""
    item = EMERGENCY / "ecm" / "local_p2" / "4" / "state"
    step = LocalLocation(str(item.parent))
    facts = check_item(step.child("state"), ".", step, tier=tier_of_step_dir(step))
    stored: list[Stored] = []
    for name, (info, label) in sorted(facts.arrays.items()):
        every = frozenset(itertools.product(*(range(g) for g in info.chunk_grid)))
        stored.append((name, info, label, facts.partial.get(name, every), True))
    missing: list[str] = []
    fresh = ItemFacts(".", tier=tier)
    settle_chunks(fresh, stored, shardings, lambda f, name, *_: missing.append(name))
    fresh.leaves = missing  # what was reported as plain damage
    return fresh


def test_a_marked_tier_whose_chunks_cannot_be_told_apart_warns() -> None:
    """No mesh recorded: the marker says local tier, the chunks cannot say whose are missing."""
    fresh = _settled(LocalTier("process-metadata", 2), {})
    assert fresh.leaves == [] and sorted(fresh.partial) == PARTIAL
    assert [(p.severity, p.code) for p in fresh.problems] == [("warning", "chunk-missing")]
    assert "which chunks this host's devices hold cannot be told" in fresh.problems[0].message


def test_a_candidate_without_marker_and_without_mesh_is_damage() -> None:
    fresh = _settled(LocalTier("single-writer", 2), {})
    assert fresh.leaves == PARTIAL and fresh.partial == {} and fresh.problems == []
