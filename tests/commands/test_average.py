"""``ckpt average`` through the real entry point, on steps saved by the installed Orbax: the
averaged step restored by Orbax (into the user's abstract state) equals numpy's (weighted) mean
of the restored steps; bfloat16 and float64 leaves; integer leaves, PRNG keys and optimizer
state taken from the last step; ``--filter``, ``--weights``, ``--ema``; ``--optimizer drop``
on a linen TrainState and on an nnx model + optimizer; one training step resumes from the
output; every bad request is one line with its exit code and nothing written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from ckpt_cli.commands import command
from tests.support import linen_train_state as linen
from tests.support.average_runs import (
    MIXED_STEPS,
    ema,
    flat,
    linen_steps,
    mixed_steps,
    nnx_steps,
    restore_raw,
    weighted,
)

PLAN_KEYS = {
    "schema_version", "ok", "steps", "weights", "ema", "match", "optimizer", "step_out", "items",
    "dropped_items", "averaged_bytes", "total_bytes", "leaves",
}  # fmt: skip


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    root = tmp_path_factory.mktemp("mixed") / "run"
    return root, [flat(t) for t in mixed_steps(root)]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Any]]:
    root = tmp_path_factory.mktemp("linen") / "run"
    return root, linen_steps(root)


def _steps(tree_list: list[dict[str, Any]], name: str) -> list[np.ndarray]:
    values = [t[name] for t in tree_list]
    assert values
    return values


def test_the_mean_restores_with_orbax_and_keeps_counters_keys_and_moments(
    cli: Any, mixed: tuple[Path, list[dict[str, Any]]], tmp_path: Path
) -> None:
    root, saved = mixed
    out = tmp_path / "avg"
    r = cli("average", root, out, "--steps", "10,20,30", "--json")
    assert r.code == 0, r.stderr
    doc = r.json()
    assert doc["output"] == str(out / "30") and doc["step"] == 30
    got = flat(restore_raw(out, 30))
    kernel = got["params.dense.kernel"]
    assert kernel.dtype == np.float32
    want = weighted(_steps(saved, "params.dense.kernel"), [1, 1, 1])
    np.testing.assert_allclose(kernel, want, rtol=1e-6, atol=1e-6)
    assert not np.array_equal(kernel, saved[-1]["params.dense.kernel"])
    embed = got["params.embed"]
    assert embed.dtype.name == "bfloat16"
    want_bf16 = weighted(_steps(saved, "params.embed"), [1, 1, 1]).astype(embed.dtype)
    same = np.mean(embed.astype(np.float32) == want_bf16.astype(np.float32))
    assert same > 0.95, same  # rounded once, from float32: at most a last-bit tie differs
    np.testing.assert_allclose(embed.astype(np.float32), want_bf16.astype(np.float32), rtol=2**-7)
    scale = got["params.scale"]
    assert scale.dtype == np.float64
    np.testing.assert_allclose(scale, weighted(_steps(saved, "params.scale"), [1, 1, 1]), 1e-13)
    for name in ("counter", "rng", "opt_state.mu"):
        np.testing.assert_array_equal(got[name], saved[-1][name])
        assert got[name].dtype == saved[-1][name].dtype
    actions = {leaf["name"]: leaf["action"] for leaf in doc["leaves"]}
    assert actions == {
        "params.dense.kernel": "average", "params.embed": "average", "params.scale": "average",
        "counter": "last", "rng": "last", "opt_state.mu": "last",
    }  # fmt: skip
    history = json.loads((out / "30" / "_CHECKPOINT_METADATA").read_text())["custom_metadata"]
    entry = history["ckpt_history"][-1]
    assert entry["operation"] == "average" and entry["steps"] == [10, 20, 30]
    assert entry["weights"] == pytest.approx([1 / 3] * 3) and entry["optimizer"] == "carry"


@pytest.mark.parametrize(
    ("args", "coefficients"),
    [
        (["--weights", "1,2,5"], [1 / 8, 2 / 8, 5 / 8]),
        (["--ema", "0.9"], None),
        (["--weights", "0.5,0.5,3"], [0.125, 0.125, 0.75]),
    ],
)
def test_weights_and_ema_match_numpy(
    cli: Any,
    mixed: tuple[Path, list[dict[str, Any]]],
    tmp_path: Path,
    args: list[str],
    coefficients: list[float] | None,
) -> None:
    root, saved = mixed
    out = tmp_path / "avg"
    r = cli("average", root, out, "--steps", "10,20,30", *args, "--json")
    assert r.code == 0, r.stderr
    values = _steps(saved, "params.dense.kernel")
    if coefficients is None:
        want = ema(values, 0.9)
        coefficients = [0.81, 0.09, 0.1]
    else:
        want = weighted(values, coefficients)
    assert r.json()["weights"] == pytest.approx(coefficients)
    got = flat(restore_raw(out, 30))
    np.testing.assert_allclose(got["params.dense.kernel"], want, rtol=1e-5, atol=1e-6)


def test_steps_are_weighed_in_the_order_listed(
    cli: Any, mixed: tuple[Path, list[dict[str, Any]]], tmp_path: Path
) -> None:
    """--ema over 30,10,20: the last listed (20) weighs most and gives the counter."""
    root, saved = mixed
    out = tmp_path / "avg"
    assert cli("average", root, out, "--steps", "30,10,20", "--ema", "0.5").code == 0
    got = flat(restore_raw(out, 20))
    by_step = dict(zip(MIXED_STEPS, saved, strict=True))
    values = [by_step[s]["params.dense.kernel"] for s in (30, 10, 20)]
    np.testing.assert_allclose(got["params.dense.kernel"], ema(values, 0.5), rtol=1e-5, atol=1e-6)
    assert int(got["counter"]) == 60


def test_filter_limits_the_averaged_leaves(
    cli: Any, mixed: tuple[Path, list[dict[str, Any]]], tmp_path: Path
) -> None:
    root, saved = mixed
    out = tmp_path / "avg"
    r = cli("average", f"{root}@10,20,30", out, "--filter", "params.dense", "--json")
    assert r.code == 0, r.stderr
    averaged = [leaf["name"] for leaf in r.json()["leaves"] if leaf["action"] == "average"]
    assert averaged == ["params.dense.kernel"]
    got = flat(restore_raw(out, 30))
    for name in ("params.embed", "params.scale"):
        np.testing.assert_array_equal(got[name], saved[-1][name])
    want = weighted(_steps(saved, "params.dense.kernel"), [1, 1, 1])
    np.testing.assert_allclose(got["params.dense.kernel"], want, rtol=1e-6, atol=1e-6)


def test_a_small_memory_limit_streams_the_same_values(cli: Any, tmp_path: Path) -> None:
    """A leaf of 8 MiB under --memory-limit 16MiB: read and written in many blocks."""
    root = tmp_path / "run"
    rng = np.random.default_rng(0)
    values = [rng.standard_normal((2048, 1024)).astype(np.float32) for _ in range(3)]
    with ocp.CheckpointManager(str(root)) as mgr:
        for step, v in enumerate(values, start=1):
            mgr.save(step, args=ocp.args.StandardSave({"params": {"w": v}}))
        mgr.wait_until_finished()
    out = tmp_path / "avg"
    r = cli(
        "average", root, out, "--steps", "1,2,3", "--memory-limit", "16MiB",
        "--max-chunk-bytes", "1MiB",
    )  # fmt: skip
    assert r.code == 0, r.stderr
    got = flat(restore_raw(out, 3))["params.w"]
    np.testing.assert_allclose(got, weighted(values, [1, 1, 1]), rtol=1e-6, atol=1e-6)


def test_linen_train_state_restores_into_its_abstract_state_and_resumes(
    cli: Any, trained: tuple[Path, list[Any]], tmp_path: Path
) -> None:
    root, saved = trained
    out = tmp_path / "avg"
    assert cli("average", root, out, "--steps", "1,2,3").code == 0
    with ocp.CheckpointManager(str(out)) as mgr:
        restored = mgr.restore(3, args=ocp.args.StandardRestore(linen.abstract_state()))
    assert int(restored.step) == 3
    for part in ("params", "batch_stats"):
        got = flat(getattr(restored, part))
        runs = [flat(getattr(s, part)) for s in saved]
        for name, value in got.items():
            want = weighted([r[name] for r in runs], [1, 1, 1])
            np.testing.assert_allclose(value, want, rtol=1e-6, atol=1e-7)
    last_opt, got_opt = flat(saved[-1].opt_state), flat(restored.opt_state)
    assert got_opt.keys() == last_opt.keys()
    for name, value in got_opt.items():
        np.testing.assert_array_equal(value, last_opt[name])
    resumed, loss = linen.train_step(restored, seed=4)
    params = jax.tree.map(
        lambda *v: weighted([np.asarray(x) for x in v], [1, 1, 1]).astype(np.float32),
        *[s.params for s in saved],
    )
    stats = jax.tree.map(
        lambda *v: weighted([np.asarray(x) for x in v], [1, 1, 1]).astype(np.float32),
        *[s.batch_stats for s in saved],
    )
    _, want_loss = linen.train_step(saved[-1].replace(params=params, batch_stats=stats), seed=4)
    assert int(resumed.step) == 4
    assert float(loss) == pytest.approx(float(want_loss), rel=1e-5)


def test_optimizer_drop_restores_the_parameters_and_a_fresh_optimizer_trains(
    cli: Any, trained: tuple[Path, list[Any]], tmp_path: Path
) -> None:
    """What a user restores after --optimizer drop: the state without ``opt_state``, then
    ``TrainState.create`` with their optimizer (docs/how-to/average.md)."""
    root, saved = trained
    out = tmp_path / "avg"
    r = cli("average", root, out, "--steps", "1,2,3", "--optimizer", "drop", "--json")
    assert r.code == 0, r.stderr
    dropped = [leaf["name"] for leaf in r.json()["leaves"] if leaf["action"] == "drop"]
    assert dropped and all(name.startswith("opt_state.") for name in dropped)
    abstract = linen.abstract_state()
    target = {"params": abstract.params, "batch_stats": abstract.batch_stats, "step": 0}
    with ocp.CheckpointManager(str(out)) as mgr:
        restored = mgr.restore(3, args=ocp.args.StandardRestore(target))
    assert set(restored) == {"params", "batch_stats", "step"}
    fresh = linen.make_state()
    state = linen.TrainState.create(
        apply_fn=fresh.apply_fn,
        params=restored["params"],
        tx=fresh.tx,
        batch_stats=restored["batch_stats"],
    )
    want = weighted([np.asarray(s.params["Dense_0"]["kernel"]) for s in saved], [1, 1, 1])
    np.testing.assert_allclose(state.params["Dense_0"]["kernel"], want, rtol=1e-6, atol=1e-7)
    resumed, loss = linen.train_step(state, seed=4)
    assert int(resumed.step) == 1 and np.isfinite(float(loss))


@pytest.mark.parametrize("optimizer", ["carry", "drop"])
def test_nnx_model_and_optimizer_items(cli: Any, tmp_path: Path, optimizer: str) -> None:
    from flax import nnx

    from tests.support.training_states import TX, DataIter, NnxMLP, nnx_step

    root = tmp_path / "run"
    saved = nnx_steps(root)
    out = tmp_path / "avg"
    r = cli("average", root, out, "--steps", "1,2,3", "--optimizer", optimizer, "--json")
    assert r.code == 0, r.stderr
    doc = r.json()
    if optimizer == "drop":
        assert doc["items"] == ["model"] and doc["dropped_items"] == ["optimizer"]
        assert not (out / "3" / "optimizer").exists()
    else:
        assert doc["items"] == ["model", "optimizer"] and doc["dropped_items"] == []
    meta = json.loads((out / "3" / "_CHECKPOINT_METADATA").read_text())
    assert sorted(meta["item_handlers"]) == sorted(doc["items"])
    graphdef, abstract = nnx.split(nnx.eval_shape(lambda: NnxMLP(nnx.Rngs(0))))
    with ocp.CheckpointManager(str(out)) as mgr:
        restored = mgr.restore(3, args=ocp.args.Composite(model=ocp.args.StandardRestore(abstract)))
    model = nnx.merge(graphdef, restored["model"])
    got = flat(nnx.state(model).to_pure_dict())
    assert got.keys() == saved[-1].keys()
    for name, value in got.items():
        np.testing.assert_allclose(value, weighted([s[name] for s in saved], [1, 1, 1]), 1e-6)
    loss = nnx_step(model, nnx.Optimizer(model, TX, wrt=nnx.Param), next(DataIter()))
    assert np.isfinite(float(loss))
    only = cli("average", root, tmp_path / "only", "--steps", "2,3", "--item", "model",
               "--optimizer", optimizer, "--json")  # fmt: skip
    assert only.code == 0, only.stderr
    assert only.json()["items"] == ["model"]
    meta = json.loads((tmp_path / "only" / "3" / "_CHECKPOINT_METADATA").read_text())
    kept = ["model"] if optimizer == "drop" else ["model", "optimizer"]
    assert sorted(meta["item_handlers"]) == kept  # the other item is copied unless dropped


def test_dry_run_json_is_the_plan_and_writes_nothing(
    cli: Any, mixed: tuple[Path, list[dict[str, Any]]], tmp_path: Path
) -> None:
    root, _ = mixed
    out = tmp_path / "avg"
    r = cli("average", root, out, "--steps", "10,20,30", "--dry-run", "--json")
    assert r.code == 0, r.stderr
    doc = r.json()
    assert set(doc) == PLAN_KEYS and doc["ok"] is True
    assert doc["schema_version"] == command("average").schema_version()
    assert doc["steps"] == [10, 20, 30] and doc["step_out"] == 30 and doc["items"] == ["default"]
    averaged = [leaf for leaf in doc["leaves"] if leaf["action"] == "average"]
    assert averaged and doc["averaged_bytes"] == sum(leaf["size_bytes"] for leaf in averaged)
    assert not out.exists()
    text = cli("average", root, out, "--steps", "10,20,30", "--dry-run")
    assert "params.embed" in text.stdout and "mean" in text.stdout
    assert "3 leaves averaged over steps 10: 0.3333, 20: 0.3333, 30: 0.3333" in text.stdout
    assert not out.exists()


def test_step_out_and_root_slash_n_name_the_step(
    cli: Any, mixed: tuple[Path, list[dict[str, Any]]], tmp_path: Path
) -> None:
    root, _ = mixed
    out = tmp_path / "avg"
    assert cli("average", root, out, "--steps", "10,20", "--step-out", "7").code == 0
    assert cli("average", root, out / "8", "--steps", "20,30").code == 0
    listed = cli("ls", out, "--json").json()
    assert [s["step"] for s in listed["steps"]] == [7, 8]
    again = cli("average", root, out, "--steps", "10,20", "--step-out", "7")
    assert again.code == 3 and "already exists" in again.stderr
    before = sorted(p.name for p in root.iterdir())
    inside = cli("average", root, root / "40", "--steps", "10,20")
    assert inside.code == 2 and not inside.stdout
    assert "lies inside the source root" in inside.stderr
    assert sorted(p.name for p in root.iterdir()) == before


@pytest.mark.parametrize(
    ("args", "phrase"),
    [
        (["--steps", "10,20,30", "--weights", "1,2"], "gives 2 weights for 3 steps"),
        (["--steps", "10,20,30", "--weights", "1,0,1"], "0.0 is not a positive number"),
        (["--steps", "10,20,30", "--weights", "1,-2,1"], "-2.0 is not a positive number"),
        (["--steps", "10,20,30", "--weights", "1,nan,1"], "nan is not a positive number"),
        (["--steps", "10,20,30", "--weights", "a,b,c"], "give one positive number per step"),
        (["--steps", "10,20", "--weights", "1,1", "--ema", "0.9"], "give one"),
        (["--steps", "10,20", "--ema", "1.5"], "strictly between 0 and 1"),
        (["--steps", "10"], "at least two steps"),
        (["--steps", "10,10"], "lists step 10 twice"),
        (["--steps", "10;20"], "step numbers separated by commas"),
        (["--steps", "10,20", "--optimizer", "reset"], "use carry or drop"),
        (["--steps", "10,20", "--filter", "(x"], "--filter '(x' is not a valid pattern"),
        (["--steps", "10,20", "--match", "(x"], "--filter '(x' is not a valid pattern"),
        ([], "average needs the steps to average"),
    ],
)
def test_bad_requests_are_one_line_exit_2_and_write_nothing(
    cli: Any,
    mixed: tuple[Path, list[dict[str, Any]]],
    tmp_path: Path,
    args: list[str],
    phrase: str,
) -> None:
    root, _ = mixed
    out = tmp_path / "avg"
    r = cli("average", root, out, *args)
    assert r.code == 2, r.stderr
    assert phrase in r.stderr
    assert len(r.stderr.strip().splitlines()) <= 2 and "Traceback" not in r.stderr  # error, hint
    assert not out.exists()


def test_a_missing_step_is_exit_3_and_writes_nothing(
    cli: Any, mixed: tuple[Path, list[dict[str, Any]]], tmp_path: Path
) -> None:
    root, _ = mixed
    out = tmp_path / "avg"
    r = cli("average", root, out, "--steps", "10,25,30")
    assert r.code == 3
    assert r.stderr.splitlines()[0].startswith(f"ckpt: error: step 25 not found in {root}")
    assert "committed steps: 10, 20, 30" in r.stderr and "Traceback" not in r.stderr
    assert not out.exists()


def test_leaves_that_differ_between_steps_are_named_and_nothing_is_written(
    cli: Any, tmp_path: Path
) -> None:
    root = tmp_path / "run"
    with ocp.CheckpointManager(str(root)) as mgr:
        mgr.save(1, args=ocp.args.StandardSave({"w": np.ones((4, 4), np.float32)}))
        mgr.save(2, args=ocp.args.StandardSave({"w": np.ones((4, 5), np.float32)}))
        mgr.save(3, args=ocp.args.StandardSave({"v": np.ones(3, np.float32)}))
        mgr.wait_until_finished()
    out = tmp_path / "avg"
    shape = cli("average", root, out, "--steps", "1,2")
    assert shape.code == 2
    assert "leaf w is float32[4, 4] in step 1 but float32[4, 5] in step 2" in shape.stderr
    missing = cli("average", root, out, "--steps", "1,3", "--json")
    assert missing.code == 2
    assert "leaf v is not in step 1" in missing.json()["error"]["message"]
    assert not out.exists()


def test_a_recorded_source_gets_a_recorded_average(cli: Any, tmp_path: Path) -> None:
    """The last step has a digest record: the new step's digests are recorded (its averaged
    values are new), and `verify --deep` checks them."""
    import shutil

    from tests.support.paths import FIXTURES

    root = shutil.copytree(FIXTURES / "seed_mlp", tmp_path / "run")
    assert cli("verify", root, "--step", "500", "--record").code == 0
    out = tmp_path / "avg"
    r = cli("average", root, out, "--steps", "300,400,500", "--json")
    assert r.code == 0, r.stderr
    assert r.json()["digests"] == "recorded"
    checked = cli("verify", out, "--deep", "--json")
    assert checked.code == 0, checked.stdout
    assert checked.json()["checked"]["digests"] == {"500/default": "checked"}
