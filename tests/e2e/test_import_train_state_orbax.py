"""``export`` then ``import`` gives back a step that Orbax restores into the user's state.

A linen TrainState (BatchNorm statistics, ``clip_by_global_norm`` + ``inject_hyperparams(adamw)``)
is trained one step and saved by the installed Orbax CheckpointManager. Exported to one file and
to shards, imported with ``--target`` and without it (the ``ckpt.tree`` key export records),
it restores with ``StandardRestore(jax.eval_shape(...))``: same tree types (tuples, optax's
NamedTuples, ``EmptyState``), same values and dtypes, and the next training step equals the
step taken from the original checkpoint. Files from another tool, without ``ckpt.tree``, keep
the containers the names give unless a target is given. An nnx model and optimizer (mappings
with integer keys) come back the same way.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.exchange import export, import_

pytestmark = pytest.mark.slow

TARGET = "tests.support.linen_train_state:abstract_state"


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A root holding step 1 of the TrainState, saved by Orbax after one real training step."""
    import orbax.checkpoint as ocp

    from tests.support import linen_train_state as lts

    root = tmp_path_factory.mktemp("train") / "root"
    state, _ = lts.train_step(lts.make_state(), seed=1)
    assert state.step == 1
    with ocp.CheckpointManager(str(root)) as mgr:
        mgr.save(1, args=ocp.args.StandardSave(state))
        mgr.wait_until_finished()
    return root


def restore(root: Path, step: int) -> Any:
    import orbax.checkpoint as ocp

    from tests.support import linen_train_state as lts

    with ocp.CheckpointManager(str(root)) as mgr:
        return mgr.restore(step, args=ocp.args.StandardRestore(lts.abstract_state()))


def tree_metadata(step: Path) -> dict[str, tuple[list[int], str]]:
    """Each entry of the item's ``_METADATA``: its key types and value type."""
    doc = json.loads((step / "default" / "_METADATA").read_text())
    entries = doc["tree_metadata"]
    assert entries
    return {
        k: ([x["key_type"] for x in v["key_metadata"]], v["value_metadata"]["value_type"])
        for k, v in entries.items()
    }


def assert_same_state(got: Any, want: Any) -> None:
    """Same tree types (NamedTuples, EmptyState, tuples), same values, dtypes and shapes."""
    import jax
    import optax

    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
    assert type(got) is type(want)
    clip, inject = got.opt_state
    assert type(got.opt_state) is tuple and type(clip) is optax.EmptyState
    assert type(inject).__name__ == "InjectStatefulHyperparamsState"
    assert type(inject.inner_state[0]) is optax.ScaleByAdamState
    assert inject.hyperparams_states == {}
    leaves = jax.tree_util.tree_leaves_with_path(want)
    assert len(leaves) > 20
    for (path, w), g in zip(leaves, jax.tree_util.tree_leaves(got), strict=True):
        g, w = np.asarray(g), np.asarray(w)
        assert (g.dtype, g.shape) == (w.dtype, w.shape), jax.tree_util.keystr(path)
        assert g.tobytes() == w.tobytes(), jax.tree_util.keystr(path)


def assert_resumes(got: Any, want: Any) -> None:
    """One training step from the imported state equals the step from the original."""
    from tests.support import linen_train_state as lts

    ours, loss = lts.train_step(got, seed=2)
    theirs, their_loss = lts.train_step(want, seed=2)
    assert int(ours.step) == int(got.step) + 1 == 2
    assert np.isfinite(float(loss)) and float(loss) == float(their_loss)
    assert_same_state(ours, theirs)


@pytest.mark.parametrize("shards", [None, 600], ids=["one-file", "shards"])
@pytest.mark.parametrize("target", [TARGET, None], ids=["target", "ckpt.tree"])
def test_export_import_restores_into_the_train_state_and_resumes(
    saved: Path, tmp_path: Path, shards: int | None, target: str | None
) -> None:
    kw = {"max_shard_size": shards} if shards else {}
    written = export(saved, tmp_path / "st", **kw)
    files = written.plan.files.files
    assert len(files) > 2 if shards else len(files) == 1
    result = import_(tmp_path / "st", tmp_path / "back", step=1, target=target)
    assert result.plan.containers == ("target" if target else "ckpt.tree")
    empty = {n.name: n.value_type for n in result.plan.empties}
    assert empty == {
        "opt_state.0": "None",
        "opt_state.1.hyperparams_states": "Dict",
        "opt_state.1.inner_state.1": "None",
        "opt_state.1.inner_state.2": "None",
    }
    assert tree_metadata(tmp_path / "back" / "1") == tree_metadata(saved / "1")
    want = restore(saved, 1)
    got = restore(tmp_path / "back", 1)
    assert_same_state(got, want)
    assert_resumes(got, want)


def test_standard_checkpointer_restores_the_item(saved: Path, tmp_path: Path) -> None:
    import orbax.checkpoint as ocp

    from tests.support import linen_train_state as lts

    export(saved, tmp_path / "st")
    result = import_(tmp_path / "st", tmp_path / "back", step=1)
    with ocp.StandardCheckpointer() as ckptr:
        got = ckptr.restore(Path(result.path) / "default", lts.abstract_state())
    assert_same_state(got, restore(saved, 1))
    # Without any target Orbax gives the tree it recorded: lists for tuples, a Python int step.
    with ocp.CheckpointManager(str(tmp_path / "back")) as mgr:
        raw = mgr.restore(1)
    assert isinstance(raw["opt_state"], list) and raw["opt_state"][0] is None
    assert raw["step"] == 1 and isinstance(raw["step"], int)


def test_files_of_another_tool_take_the_target_containers(saved: Path, tmp_path: Path) -> None:
    """No ``ckpt.tree``: the names alone give dicts (as before); ``--target`` gives the tree."""
    import jax
    import safetensors.numpy

    from ckpt_cli.core.spec.target import key_name

    want = restore(saved, 1)
    tensors = {
        ".".join(key_name(k) for k in p): np.asarray(v)
        for p, v in jax.tree_util.tree_leaves_with_path(want)
    }
    assert tensors["step"].dtype == np.int32 and len(tensors) > 20
    (tmp_path / "hf").mkdir()
    safetensors.numpy.save_file(tensors, str(tmp_path / "hf" / "model.safetensors"), metadata={"format": "pt"})  # fmt: skip
    plain = import_(tmp_path / "hf", tmp_path / "plain", step=1)
    assert plain.plan.containers == "names" and plain.plan.empties == ()
    assert all(set(leaf.key_types) == {2} for leaf in plain.plan.leaves)
    result = import_(tmp_path / "hf", tmp_path / "back", step=1, target=TARGET)
    assert result.plan.containers == "target"
    got = restore(tmp_path / "back", 1)
    assert_same_state(got, want)
    assert_resumes(got, want)


def test_the_tree_key_is_compact_json(saved: Path, tmp_path: Path) -> None:
    written = export(saved, tmp_path / "st")
    doc = json.loads(written.plan.metadata["ckpt.tree"])
    assert doc["version"] == 1
    tree = doc["tree"]
    assert tree["step"] == "scalar" and tree["params"]["Dense_0"]["kernel"] == 1
    assert tree["opt_state"][0] == "None" and tree["opt_state"][1]["hyperparams_states"] == "Dict"
    assert tree["opt_state"][1]["inner_state"][0]["mu"]["Dense_1"]["bias"] == 1


@pytest.mark.parametrize("target", [None, "tests.support.linen_train_state:abstract_mixed"])
def test_every_kind_of_node_comes_back_as_orbax_saved_it(
    tmp_path: Path, target: str | None
) -> None:
    import jax
    import orbax.checkpoint as ocp

    from tests.support import linen_train_state as lts

    with ocp.CheckpointManager(str(tmp_path / "root")) as mgr:
        mgr.save(0, args=ocp.args.StandardSave(lts.mixed_tree()))
        mgr.wait_until_finished()
    export(tmp_path / "root", tmp_path / "st")
    import_(tmp_path / "st", tmp_path / "back", target=target)
    assert tree_metadata(tmp_path / "back" / "0") == tree_metadata(tmp_path / "root" / "0")
    abstract = lts.abstract_mixed()
    with ocp.CheckpointManager(str(tmp_path / "root")) as mgr:
        want = mgr.restore(0, args=ocp.args.StandardRestore(abstract))
    with ocp.CheckpointManager(str(tmp_path / "back")) as mgr:
        got = mgr.restore(0, args=ocp.args.StandardRestore(abstract))
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
    assert type(got["pair"]) is tuple and type(got["layers"]) is list
    assert got["empty"] == {"list": [], "tuple": (), "dict": {}, "none": None}
    leaves = jax.tree_util.tree_leaves(want)
    assert len(leaves) == 6
    for g, w in zip(jax.tree_util.tree_leaves(got), leaves, strict=True):
        assert type(g) is type(w)
        g, w = np.asarray(g), np.asarray(w)
        assert (g.dtype, g.shape, g.tobytes()) == (w.dtype, w.shape, w.tobytes())


def test_a_spec_moving_a_leaf_onto_an_empty_node_keeps_the_leaf(tmp_path: Path) -> None:
    import orbax.checkpoint as ocp

    from ckpt_cli.core.spec.language import parse_spec
    from tests.support import linen_train_state as lts

    with ocp.CheckpointManager(str(tmp_path / "root")) as mgr:
        mgr.save(0, args=ocp.args.StandardSave(lts.mixed_tree()))
        mgr.wait_until_finished()
    export(tmp_path / "root", tmp_path / "st")
    rules = b"version: 1\nrules:\n  - {op: rename, from: 'host', to: 'empty.none.host'}\n  - {op: rename, from: 'scale', to: 'empty.dict'}\n"  # fmt: skip
    result = import_(tmp_path / "st", tmp_path / "back", spec=parse_spec(rules, "move.yaml"))
    assert {n.name for n in result.plan.empties} == {"empty.list", "empty.tuple"}
    meta = tree_metadata(tmp_path / "back" / "0")
    assert meta["('empty', 'none', 'host')"] == ([2, 2, 2], "np.ndarray")
    assert meta["('empty', 'dict')"] == ([2, 2], "scalar")
    with ocp.CheckpointManager(str(tmp_path / "back")) as mgr:
        raw = mgr.restore(0)
    assert raw["empty"]["dict"] == 0.5 and raw["empty"]["list"] == []
    assert raw["empty"]["none"]["host"].tolist() == [0, 1, 2, 3]


def test_the_command_line_round_trip_restores_and_resumes(cli, saved: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    assert cli("export", saved, tmp_path / "st", "--max-shard-size", "1KB").code == 0
    r = cli("import", tmp_path / "st", tmp_path / "back", "--step", "1", "--target", TARGET, "--json")  # fmt: skip
    assert r.code == 0, r.stderr
    doc = r.json()
    assert doc["tree"]["containers"] == "target" and len(doc["tree"]["empty"]) == 4
    assert {leaf["name"]: leaf["value_type"] for leaf in doc["leaves"]}["step"] == "scalar"
    want = restore(saved, 1)
    got = restore(tmp_path / "back", 1)
    assert_same_state(got, want)
    assert_resumes(got, want)


@pytest.mark.parametrize("target", ["tests.support.nnx_train_state:abstract_state", None])
def test_an_nnx_model_and_optimizer_restore_and_resume(tmp_path: Path, target: str | None) -> None:
    import jax
    import orbax.checkpoint as ocp
    from flax import nnx

    from tests.support import nnx_train_state as nts

    model, optimizer = nts.make()
    nts.train_step(model, optimizer, seed=1)
    with ocp.CheckpointManager(str(tmp_path / "root")) as mgr:
        mgr.save(1, args=ocp.args.StandardSave(nts.state_of(model, optimizer)))
        mgr.wait_until_finished()
    export(tmp_path / "root", tmp_path / "st", max_shard_size=500)
    import_(tmp_path / "st", tmp_path / "back", step=1, target=target)
    assert tree_metadata(tmp_path / "back" / "1") == tree_metadata(tmp_path / "root" / "1")
    states = []
    for root in ("root", "back"):
        with ocp.CheckpointManager(str(tmp_path / root)) as mgr:
            states.append(mgr.restore(1, args=ocp.args.StandardRestore(nts.abstract_state())))
    want, got = states
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
    leaves = jax.tree_util.tree_leaves(want)
    assert len(leaves) > 20
    for g, w in zip(jax.tree_util.tree_leaves(got), leaves, strict=True):
        assert np.asarray(g).dtype == np.asarray(w).dtype
        assert np.asarray(g).tobytes() == np.asarray(w).tobytes()
    losses, params = [], []
    for state in (got, want):
        m, o = nts.make()
        nnx.update(m, state["model"])
        nnx.update(o, state["optimizer"])
        losses.append(float(nts.train_step(m, o, seed=2)))
        assert int(o.step[...]) == 2
        params.append(jax.tree_util.tree_leaves(nnx.state(m, nnx.Param)))
    assert np.isfinite(losses[0]) and losses[0] == losses[1]
    assert params[0] and all(np.array_equal(a, b) for a, b in zip(*params, strict=True))
