"""Real Orbax and recorded digests: Orbax keeps working on roots that carry them, and the
digest follows values, not layout. Saves and restores run the installed orbax-checkpoint."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.paths import REPO

pytestmark = pytest.mark.slow

DIGESTS = "_CKPT_DIGESTS.json"


def _tree(step: int) -> dict[str, Any]:
    rng = np.random.default_rng(step)
    return {
        "params": {"w": rng.standard_normal((16, 8)).astype(np.float32), "b": np.arange(8.0)},
        "step": np.array(step, np.int64),
    }


def _equal(a: Any, b: Any) -> bool:
    import jax

    return all(
        np.array_equal(np.asarray(x), np.asarray(y))
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )


def test_orbax_saves_restores_and_prunes_roots_with_digests(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import orbax.checkpoint as ocp

    root = tmp_path / "run"
    options = ocp.CheckpointManagerOptions(max_to_keep=2)
    with ocp.CheckpointManager(root, options=options) as mgr:
        for step in (0, 1):
            mgr.save(step, args=ocp.args.StandardSave(_tree(step)))
        mgr.wait_until_finished()
    assert cli("verify", root, "--record").code == 0
    assert (root / "0" / "default" / DIGESTS).is_file()
    assert (root / "1" / "default" / DIGESTS).is_file()

    # A resumed run: a new manager over the same root saves on and prunes the recorded steps.
    with ocp.CheckpointManager(root, options=options) as mgr:
        assert mgr.all_steps() == [0, 1]
        restored = mgr.restore(1, args=ocp.args.StandardRestore(_tree(0)))
        assert _equal(restored, _tree(1))
        for step in (2, 3):
            mgr.save(step, args=ocp.args.StandardSave(_tree(step)))
        mgr.wait_until_finished()
        assert mgr.all_steps() == [2, 3]
    assert not (root / "0").exists() and not (root / "1").exists()
    assert cli("verify", root, "--record").code == 0
    with ocp.CheckpointManager(root, options=options) as mgr:
        assert _equal(mgr.restore(3, args=ocp.args.StandardRestore(_tree(0))), _tree(3))
    r = cli("verify", root, "--deep", "--json")
    assert r.code == 0 and set(r.json()["checked"]["digests"].values()) == {"checked"}


def test_orbax_saves_over_an_item_with_digests(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import orbax.checkpoint as ocp

    path = tmp_path / "single"
    ckptr = ocp.StandardCheckpointer()
    ckptr.save(path, _tree(1))
    ckptr.wait_until_finished()
    assert cli("verify", path, "--record").code == 0
    ckptr.save(path, _tree(2), force=True)
    ckptr.wait_until_finished()
    assert _equal(ckptr.restore(path, _tree(0)), _tree(2))
    assert not (path / DIGESTS).exists()  # the save replaced the directory, record and all
    assert cli("verify", path, "--deep").code == 0


def test_orbax_restores_the_flipped_byte_silently(cli) -> None:  # type: ignore[no-untyped-def]
    # Why digests exist: Orbax restores damaged bytes as if nothing happened.
    import orbax.checkpoint as ocp

    damaged = REPO / "fixtures" / "damaged" / "flipped-byte" / "500" / "default"
    clean = REPO / "fixtures" / "ckpts" / "seed_mlp" / "500" / "default"
    got = ocp.StandardCheckpointer().restore(damaged)
    want = ocp.StandardCheckpointer().restore(clean)
    leaf = "kernel"
    assert not np.array_equal(
        got["opt_state"][0]["nu"]["Dense_0"][leaf], want["opt_state"][0]["nu"]["Dense_0"][leaf]
    )
    assert np.array_equal(got["params"]["Dense_0"][leaf], want["params"]["Dense_0"][leaf])
    assert cli("verify", damaged.parent.parent, "--deep").code == 1


def test_digests_survive_a_different_sharding(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import jax
    import orbax.checkpoint as ocp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    mesh = Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("data", "model"))
    values = np.arange(64 * 32, dtype=np.float32).reshape(64, 32)
    layouts = {
        "rows": NamedSharding(mesh, PartitionSpec("data", None)),
        "cols": NamedSharding(mesh, PartitionSpec(None, "model")),
        "cols8": NamedSharding(mesh, PartitionSpec(None, ("data", "model"))),
    }
    digests = {}
    chunks = set()
    for name, sharding in layouts.items():
        path = tmp_path / name
        ckptr = ocp.StandardCheckpointer()
        ckptr.save(path, {"x": jax.device_put(values, sharding)})
        ckptr.wait_until_finished()
        assert cli("verify", path, "--record").code == 0
        doc = json.loads((path / DIGESTS).read_text())
        digests[name] = doc["leaves"]["x"]["ld1"]
        chunks.add(json.dumps(json.loads((path / "array_metadatas" / "process_0").read_text())))
    assert len(chunks) == 3  # three different chunkings on disk...
    assert len(set(digests.values())) == 1  # ...one digest of the values
    from tests.support.ldigest_reference import reference_digest

    assert digests["rows"] == reference_digest(values)
    assert cli("diff", tmp_path / "rows", tmp_path / "cols").code == 0


def test_orbax_keeps_managing_composite_items_with_digests(cli, fixture_copy) -> None:  # type: ignore[no-untyped-def]
    # Digest files in a StandardSave item, a JsonSave item and the metrics item.
    import orbax.checkpoint as ocp

    root = fixture_copy("composite_best")
    assert cli("verify", root, "--record").code == 0
    for item in ("state", "extra", "metrics"):
        assert (root / "4" / item / DIGESTS).is_file()
    options = ocp.CheckpointManagerOptions(
        max_to_keep=2, best_fn=lambda m: m["loss"], best_mode="min"
    )
    with ocp.CheckpointManager(root, options=options, item_names=("state", "extra")) as mgr:
        restored = mgr.restore(
            4,
            args=ocp.args.Composite(state=ocp.args.StandardRestore(), extra=ocp.args.JsonRestore()),
        )
        assert restored.extra == {"epoch": 2, "note": "step 4", "lr": 0.001}
        assert np.asarray(restored.state["w"]).shape == (4, 3)
        state = {"w": np.zeros((4, 3), np.float32), "step": 6}
        mgr.save(
            6,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(state), extra=ocp.args.JsonSave({"epoch": 3})
            ),
            metrics={"loss": 0.1},
        )
        mgr.wait_until_finished()
        assert mgr.all_steps() == [4, 6]  # best-2 pruned step 2, digest files and all
    assert not (root / "2").exists()
    r = cli("verify", root, "--deep", "--json")
    assert r.code == 0, r.stdout
    digests = r.json()["checked"]["digests"]
    assert digests["4/state"] == "checked" and digests["6/state"] == "absent"
