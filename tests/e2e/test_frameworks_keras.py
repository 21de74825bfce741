"""Keras 3 checkpoints, as ``keras.callbacks.OrbaxCheckpoint`` writes them (Keras 3.15.1, JAX
backend; ``fixtures/frameworks/keras/``), through every command, against what Keras's own
loaders restored from them (``truth.json``) and restore from ckpt's outputs.

``epochs``: steps 1-3 of a per-epoch run, items ``pytree`` (trainable, non-trainable, optimizer
and metrics variables) and ``model_config`` (one string leaf). ``weights_bf16_ema``: one
weights-only step, a bfloat16 layer, trained with AdamW + EMA. The read commands are checked
without Keras; each writer's output is loaded by ``keras.saving.load_model`` (or
``model_from_json(...).load_weights``) in a Keras process of the dev environment, and what
Keras reads equals the source, casts as asked.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import yaml

import ckpt_cli
from tests.support.cli import run_cli
from tests.support.docs_examples import console_commands, first_mismatch, prepare_workdir
from tests.support.keras_loader import KERAS_FIXTURES, KerasLoader, keras_truth
from tests.support.ldigest_reference import reference_digest
from tests.support.matrix import value_sha256s
from tests.support.paths import REPO
from tests.support.savetime import flip_a_byte, recorded

FIXTURES = ("epochs", "weights_bf16_ema", "model_parallel")
#: The how-to whose Keras section shows the command lines this module runs.
DOCS = REPO / "docs" / "how-to" / "frameworks.md"
SPEC = REPO / "examples" / "keras_kernels_bf16.yaml"
Keypath = tuple[str, ...]
#: The cast of the how-to: every kernel to bfloat16, with its Adam slots, which Keras names after
#: the variable's path (``hidden_kernel_momentum``). A weights-only step has no optimizer slots.
SPEC_RULES: list[dict[str, Any]] = yaml.safe_load(SPEC.read_text())["rules"]
CAST_RULES = {
    "epochs": SPEC_RULES,
    "weights_bf16_ema": SPEC_RULES[:1],
    "model_parallel": SPEC_RULES,
}


def truth(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = keras_truth()["fixtures"][name]
    return doc


def latest(name: str) -> int:
    return max(int(s) for s in truth(name)["steps"])


def truth_leaves(name: str, step: int) -> dict[Keypath, dict[str, Any]]:
    return {tuple(leaf["keypath"]): leaf for leaf in truth(name)["steps"][str(step)]["leaves"]}


def by_keypath(leaves: list[dict[str, Any]]) -> dict[Keypath, dict[str, Any]]:
    return {tuple(leaf["keypath"]): leaf for leaf in leaves}


def load(loader: KerasLoader, name: str, root: Path) -> dict[str, Any]:
    """The latest step of ``root`` as a Keras user loads it: ``load_model`` where the step holds
    ``model_config``, else the fixture's model (its JSON) and ``load_weights``."""
    if (root / str(latest_step_of(root)) / "model_config").is_dir():
        return loader.load(root)
    if "model_json" in truth(name):
        return loader.load(root, model_json=truth(name)["model_json"])
    config = KERAS_FIXTURES / name / str(latest(name)) / "model_config" / "_strings.json"
    return loader.load(root, model_json=json.loads(config.read_text())["config"])


def latest_step_of(root: Path) -> int:
    return max(int(p.name) for p in root.iterdir() if p.name.isdigit())


def copy(name: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(KERAS_FIXTURES / name, tmp_path / name))


def spec(tmp_path: Path, name: str) -> Path:
    if CAST_RULES[name] == SPEC_RULES:
        return SPEC
    path = tmp_path / f"cast-{name}.json"  # JSON is YAML
    path.write_text(json.dumps({"version": 1, "rules": CAST_RULES[name]}))
    return path


def cast_names(name: str) -> set[str]:
    import re

    return {
        ".".join(kp)
        for kp, leaf in truth_leaves(name, latest(name)).items()
        if any(re.fullmatch(rule["match"], ".".join(kp)) for rule in CAST_RULES[name])
        and leaf["dtype"] != "bfloat16"  # the bfloat16 layer's kernel: a cast to itself
    }


# Read commands: no Keras -------------------------------------------------------------------


def test_the_fixtures_are_keras_3_15_outputs() -> None:
    doc = keras_truth()
    assert doc["pins"]["keras"] == "3.15.1" and doc["pins"]["orbax-checkpoint"] == "0.12.8"
    assert sorted(truth("epochs")["steps"]) == ["1", "2", "3"]
    assert sorted(truth("weights_bf16_ema")["steps"]) == ["2"]
    assert sorted(truth("model_parallel")["steps"]) == ["1"]
    dtypes = {leaf["dtype"] for leaf in truth_leaves("weights_bf16_ema", 2).values()}
    assert "bfloat16" in dtypes


@pytest.mark.parametrize("name", FIXTURES)
def test_ls_lists_the_steps_keras_kept_with_their_items(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    r = run_cli(["ls", str(KERAS_FIXTURES / name), "--json"], capsys)
    assert r.code == 0, r.stderr
    steps = {s["step"]: s for s in r.json()["steps"]}
    assert sorted(steps) == sorted(int(s) for s in truth(name)["steps"])
    for step, s in steps.items():
        assert s["status"] == "committed" and s["problem"] is None
        assert s["items"] == truth(name)["steps"][str(step)]["items"]
        assert set(s["formats"].values()) == {"ocdbt+zarr3"}


@pytest.mark.parametrize("name", FIXTURES)
def test_inspect_reads_every_value_keras_reads(name: str) -> None:
    ck = ckpt_cli.open(KERAS_FIXTURES / name)
    for step in truth(name)["steps"]:
        item = ck.item(step=int(step), item="pytree")
        want = truth_leaves(name, int(step))
        doc = item.report.to_json()
        got = {tuple(leaf["keypath"]): leaf for leaf in doc["leaves"] if leaf["dtype"]}
        assert sorted(got) == sorted(want)
        for kp, leaf in want.items():
            assert (got[kp]["dtype"], got[kp]["shape"]) == (leaf["dtype"], leaf["shape"]), kp
            assert got[kp]["problem"] is None
        sha = value_sha256s(item)
        names = {leaf.keypath: leaf.name for leaf in item.leaves}
        assert {kp: sha[names[kp]] for kp in want} == {kp: v["sha256"] for kp, v in want.items()}


def test_inspect_shows_model_config_and_a_complete_training_state(
    capsys: pytest.CaptureFixture[str],
) -> None:
    root = str(KERAS_FIXTURES / "epochs")
    r = run_cli(["inspect", root, "--step", "3", "--item", "model_config", "--json"], capsys)
    assert r.code == 0, r.stderr
    (leaf,) = r.json()["leaves"]
    assert (leaf["keypath"], leaf["value_type"]) == (["config"], "string")
    config = json.loads(leaf["value"])  # the model's JSON, that load_model rebuilds it from
    assert (config["class_name"], config["config"]["name"]) == ("Functional", "mlp")
    r = run_cli(["inspect", root, "--step", "3", "--item", "pytree", "--json"], capsys)
    state = r.json()["training_state"]
    parts = {p["part"]: p for p in state["parts"]}
    assert state["complete"] is True, state
    assert parts["params"]["subtrees"] == ["non_trainable_variables", "trainable_variables"]
    assert parts["opt_state"]["subtrees"] == ["optimizer_variables"]
    assert parts["step"]["leaves"] == 1 and "optimizer_variables.adam.iteration" in str(parts)
    assert parts["rng"]["present"] is True  # the Dropout's seed_generator_state


@pytest.mark.parametrize("name", FIXTURES)
def test_digest_is_the_ld1_of_what_keras_reads(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for step, st in truth(name)["steps"].items():
        r = run_cli(["digest", str(KERAS_FIXTURES / name), "--step", step, "--json"], capsys)
        assert r.code == 0, r.stderr
        items = {it["item"]: it for it in r.json()["items"]}
        got = {leaf["name"]: leaf["digest"] for leaf in items["pytree"]["leaves"]}
        want = {".".join(leaf["keypath"]): leaf["ld1"] for leaf in st["leaves"]}
        assert {k: got[k] for k in want} == want
        if "model_config" in st["items"]:
            (config,) = items["model_config"]["leaves"]
            assert config["digest"] == st["model_config_ld1"]


@pytest.mark.parametrize("name", FIXTURES)
def test_verify_deep_finds_no_problem(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    r = run_cli(["verify", str(KERAS_FIXTURES / name), "--deep", "--json"], capsys)
    assert r.json()["problems"] == [] and r.code == 0, r.stdout


@pytest.mark.parametrize("name", FIXTURES)
def test_verify_record_then_a_flipped_byte_is_caught(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = copy(name, tmp_path)
    r = run_cli(["verify", str(root), "--record"], capsys)
    assert r.code == 0, r.stdout + r.stderr
    data = flip_middle_byte(root / str(latest(name)) / "pytree")
    r = run_cli(["verify", str(root), "--deep", "--json"], capsys)
    assert r.code == 1, r.stdout
    problems = r.json()["problems"]
    assert problems and all(p["severity"] == "error" for p in problems)
    files = [p["file"] for p in problems if p["file"]]
    assert all(f.startswith(f"{latest(name)}/pytree/") for f in files), problems
    assert any(data.name in f for f in files) or any(p["leaf"] for p in problems), problems


def flip_middle_byte(item: Path) -> Path:
    """One byte flipped in the middle of the item's largest data file. Keras's variables are
    small: every chunk is inline in a b-tree node, whose CRC-32C the flip breaks."""
    files = [*item.glob("ocdbt.process_*/d/*"), *item.glob("d/*")]
    target = max(files, key=lambda p: p.stat().st_size)
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0x40
    target.write_bytes(bytes(data))
    return target


def test_diff_of_two_epochs_names_what_training_changed(capsys: pytest.CaptureFixture[str]) -> None:
    root = KERAS_FIXTURES / "epochs"
    r = run_cli(["diff", f"{root}@1:pytree", f"{root}@3:pytree", "--json"], capsys)
    assert r.code == 1, r.stderr
    one, three = truth_leaves("epochs", 1), truth_leaves("epochs", 3)
    differ = {".".join(kp) for kp in one if one[kp]["sha256"] != three[kp]["sha256"]}
    assert differ and "optimizer_variables.adam.iteration" in differ
    assert {d["name"] for d in r.json()["leaves"] if d["status"] != "equal"} == differ


# Writers: each output loaded by Keras ------------------------------------------------------

slow = pytest.mark.slow


def assert_keras_reads_the_source(got: dict[str, Any], name: str, cast: set[str]) -> dict[str, str]:
    """Every leaf Keras reads from an output equals the source's truth; ``cast`` leaves are
    the source values rounded to bfloat16. Returns the ld1 digest each leaf must have."""
    want = truth_leaves(name, latest(name))
    read = by_keypath(got["read"])
    source = by_keypath(got["source"]["read"])
    assert sorted(read) == sorted(want)
    ld1 = {}
    for kp, leaf in want.items():
        r, dotted = read[kp], ".".join(kp)
        if dotted not in cast:
            assert (r["dtype"], r["shape"], r["sha256"]) == (
                leaf["dtype"],
                leaf["shape"],
                leaf["sha256"],
            ), kp
            ld1[dotted] = leaf["ld1"]
            continue
        assert (r["dtype"], r["shape"]) == ("bfloat16", leaf["shape"]), kp
        values = np.asarray(source[kp]["values"], np.float32).astype(ml_dtypes.bfloat16)
        assert np.array_equal(np.asarray(r["values"], np.float32), values.astype(np.float32))
        ld1[dotted] = reference_digest(values.reshape(leaf["shape"]))
    return ld1


def assert_digests(out: Path, name: str, ld1: dict[str, str], capsys: Any) -> None:
    """``ckpt digest`` of the output's step: the ld1 digests of what Keras reads."""
    r = run_cli(["digest", str(out), "--step", str(latest(name)), "--json"], capsys)
    assert r.code == 0, r.stderr
    items = {it["item"]: it for it in r.json()["items"]}
    got = {leaf["name"]: leaf["digest"] for leaf in items["pytree"]["leaves"]}
    assert {k: got[k] for k in ld1} == ld1


def assert_same_prediction(got: dict[str, Any], name: str) -> None:
    """The loaded model predicts what the source did: the same values, laid out on other
    devices (or on a CPU with other vector instructions than the fixture's), so matmuls may sum
    in another order (float32 rounding, never more)."""
    want = truth(name)["steps"][str(latest(name))]["prediction"]
    assert np.allclose(got["prediction"], want, rtol=0, atol=1e-6)


def source_and(loader: KerasLoader, name: str, out: Path) -> dict[str, Any]:
    """Keras's load of ``out``, with its load of the fixture itself (checked against the
    truth first) under ``source``."""
    source = load(loader, name, KERAS_FIXTURES / name)
    want = truth_leaves(name, latest(name))
    assert {kp: leaf["sha256"] for kp, leaf in by_keypath(source["read"]).items()} == {
        kp: leaf["sha256"] for kp, leaf in want.items()
    }
    # The weights are equal bit for bit (above); the prediction is float32 arithmetic, which
    # XLA compiles for this host's CPU: another instruction set rounds a sum differently.
    assert_same_prediction(source, name)
    return load(loader, name, out) | {"source": source}


@slow
@pytest.mark.parametrize("name", FIXTURES)
def test_migrate_casts_the_kernels_and_keras_loads_the_step(
    name: str, tmp_path: Path, keras_loader: KerasLoader, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bf16"
    src = str(KERAS_FIXTURES / name)
    r = run_cli(["migrate", src, str(out), "--spec", str(spec(tmp_path, name)), "--json"], capsys)
    assert r.code == 0, r.stderr
    assert (
        sorted(p.name for p in (out / str(latest(name))).iterdir() if p.is_dir())
        == (truth(name)["steps"][str(latest(name))]["items"])
    )
    got = source_and(keras_loader, name, out)
    cast = cast_names(name)
    assert_digests(out, name, assert_keras_reads_the_source(got, name, cast), capsys)
    # The model's float32 kernels hold the bfloat16-rounded values: its outputs move a little.
    want = np.asarray(truth(name)["steps"][str(latest(name))]["prediction"])
    assert np.allclose(got["prediction"], want, atol=0.05)
    # and the whole-step diff says exactly which leaves changed dtype
    r = run_cli(["diff", f"{src}@{latest(name)}", str(out), "--json"], capsys)
    assert r.code == 1
    changed = {d["name"] for d in r.json()["leaves"] if d["status"] != "equal"}
    assert changed == cast
    r = run_cli(
        ["diff", f"{src}@{latest(name)}", str(out), "--compare-cast", "--atol", "0.01"], capsys
    )
    assert r.code == 0, r.stdout


@slow
@pytest.mark.parametrize("name", FIXTURES)
def test_reshard_onto_two_devices_and_keras_loads_the_step(
    name: str, tmp_path: Path, keras_loader: KerasLoader, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "data2"
    rule = "trainable_variables.hidden.kernel=[null, data]"
    args = ["reshard", str(KERAS_FIXTURES / name), str(out), "--mesh", "data=2", "--rule", rule]
    r = run_cli(args, capsys)
    assert r.code == 0, r.stderr
    sharding = json.loads((out / str(latest(name)) / "pytree" / "_sharding").read_text())
    specs = [json.loads(v).get("partition_spec") for v in sharding.values()]
    assert [None, "data"] in specs
    got = source_and(keras_loader, name, out)
    assert_digests(out, name, assert_keras_reads_the_source(got, name, set()), capsys)
    assert_same_prediction(got, name)
    r = run_cli(["diff", f"{KERAS_FIXTURES / name}@{latest(name)}", str(out)], capsys)
    assert r.code == 0, r.stdout
    r = run_cli(["verify", str(out), "--deep", "--json"], capsys)
    assert r.code == 0 and r.json()["problems"] == []


@slow
@pytest.mark.parametrize("name", FIXTURES)
def test_export_then_import_restores_the_pytree_item_in_keras(
    name: str, tmp_path: Path, keras_loader: KerasLoader, capsys: pytest.CaptureFixture[str]
) -> None:
    step = str(latest(name))
    src = KERAS_FIXTURES / name
    r = run_cli(["export", str(src), str(tmp_path / "st"), "--item", "pytree"], capsys)
    assert r.code == 0, r.stderr
    out = tmp_path / "back"
    r = run_cli(["import", str(tmp_path / "st"), str(out), "--step", step], capsys)
    assert r.code == 0, r.stderr
    # export recorded the item's name: the step holds `pytree`, the item Keras asks for
    assert sorted(p.name for p in (out / step).iterdir() if p.is_dir()) == ["pytree"]
    got = source_and(keras_loader, name, out)
    assert_digests(out, name, assert_keras_reads_the_source(got, name, set()), capsys)
    assert_same_prediction(got, name)
    r = run_cli(["doctor", str(out), "--like", str(src), "--json"], capsys)
    assert r.code == 0 and r.json()["verdict"] == "restores", r.stdout
    r = run_cli(["diff", f"{src}@{step}:pytree", f"{out}@{step}:pytree"], capsys)
    assert r.code == 0, r.stdout


@slow
def test_export_defaults_to_the_pytree_item_beside_model_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``model_config`` holds one string and no array: ``pytree`` is the step's state item."""
    r = run_cli(["export", str(KERAS_FIXTURES / "epochs"), str(tmp_path / "st")], capsys)
    assert r.code == 0, r.stderr
    assert (tmp_path / "st" / "model.safetensors").is_file()


@slow
def test_doctor_like_a_migrated_step_says_it_restores(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A step of the run against its bfloat16 migration: a dtype alone is cast on restore."""
    src = str(KERAS_FIXTURES / "epochs")
    out = tmp_path / "bf16"
    r = run_cli(["migrate", src, str(out), "--spec", str(spec(tmp_path, "epochs"))], capsys)
    assert r.code == 0, r.stderr
    r = run_cli(["doctor", src, "--step", "1", "--like", str(out), "--json"], capsys)
    assert r.code == 0 and r.json()["verdict"] == "restores", r.stdout
    r = run_cli(
        ["doctor", str(KERAS_FIXTURES / "weights_bf16_ema"), "--like", src, "--json"], capsys
    )
    assert r.code == 1 and r.json()["verdict"] != "restores", r.stdout


@slow
def test_the_how_to_runs_as_written(tmp_path: Path) -> None:
    """The console blocks of the Keras section, as written: the model-parallel step resharded
    for one device, ls, verify, the bfloat16 migration with examples/keras_kernels_bf16.yaml,
    and Keras's load_model of each output (on a machine of one device: the test above)."""
    commands = console_commands(DOCS, section="Keras 3 OrbaxCheckpoint")
    assert [c.text.split()[:2] for c in commands] == [
        ["ckpt", "reshard"],
        ["python", "-c"],
        ["ckpt", "ls"],
        ["ckpt", "verify"],
        ["ckpt", "migrate"],
        ["python", "-c"],
    ]
    prepare_workdir(tmp_path)
    mismatch = first_mismatch(commands, tmp_path, ".")
    assert mismatch is None, mismatch
    got = ckpt_cli.open(tmp_path / "runs" / "keras-bf16").item(item="pytree").report.to_json()
    dtypes = {".".join(leaf["keypath"]): leaf["dtype"] for leaf in got["leaves"]}
    cast = {name for name, dtype in dtypes.items() if dtype == "bfloat16"}
    assert cast == cast_names("epochs")


def test_recorded_digests_catch_a_value_changed_in_a_data_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The model-parallel step's 64x64 kernel lives in ``d/`` data files, outside the CRC of
    any b-tree node: a flipped byte there restores without an error, with other values. Only
    the digests ``--record`` stored catch it, and verify names the leaf."""
    root = copy("model_parallel", tmp_path)
    r = run_cli(["verify", str(root), "--record"], capsys)
    assert r.code == 0, r.stdout + r.stderr
    record = recorded(root / "1" / "pytree")
    changed = flip_a_byte(root, 1, "pytree", record)
    assert changed
    r = run_cli(["verify", str(root), "--deep", "--json"], capsys)
    assert r.code == 1, r.stdout
    named = {leaf for p in r.json()["problems"] for leaf in [p["leaf"], *p["leaves"]] if leaf}
    assert set(changed) <= named, r.json()["problems"]


@slow
def test_reshard_lets_one_device_load_a_model_parallel_step(
    tmp_path: Path, keras_loader: KerasLoader, capsys: pytest.CaptureFixture[str]
) -> None:
    """Saved under ModelParallel on 8 devices, the step names 8 devices in ``_sharding``:
    Keras 3.15.1 on a machine with one device cannot load it ("Failed to load checkpointable:
    pytree due to incompatible handler"). ``reshard --mesh data=1`` writes it for one device,
    and Keras loads every value."""
    src = KERAS_FIXTURES / "model_parallel"
    out = tmp_path / "one"
    r = run_cli(["reshard", str(src), str(out), "--mesh", "data=1"], capsys)
    assert r.code == 0, r.stderr
    one = KerasLoader(devices=1)
    try:
        refused = one.ask(op="load_model", root=str(src))
        assert not refused["ok"] and "incompatible handler" in refused["error"], refused
        got = one.load(out)
    finally:
        one.close()
    got["source"] = load(keras_loader, "model_parallel", src)
    assert_keras_reads_the_source(got, "model_parallel", set())
    assert_same_prediction(got, "model_parallel")


@slow
def test_export_params_only_keeps_the_weights_keras_loads(
    tmp_path: Path, keras_loader: KerasLoader, capsys: pytest.CaptureFixture[str]
) -> None:
    """--params-only keeps Keras's trainable and non-trainable variables (BatchNorm's
    statistics too), not the optimizer, the metrics or the seed-generator state; imported
    back, ``load_weights`` gives the model every weight of the step."""
    src = KERAS_FIXTURES / "epochs"
    r = run_cli(["export", str(src), str(tmp_path / "st"), "--params-only"], capsys)
    assert r.code == 0, r.stderr
    out = tmp_path / "weights"
    assert run_cli(["import", str(tmp_path / "st"), str(out), "--step", "3"], capsys).code == 0
    want = {
        kp: leaf
        for kp, leaf in truth_leaves("epochs", 3).items()
        if kp[0] in ("trainable_variables", "non_trainable_variables")
        and kp[-1] != "seed_generator_state"
    }
    assert len(want) == 8
    got = load(keras_loader, "epochs", out)
    read = {kp: leaf["sha256"] for kp, leaf in by_keypath(got["read"]).items()}
    assert read == {kp: leaf["sha256"] for kp, leaf in want.items()}
    state = by_keypath(got["state"])
    assert all(state[kp]["sha256"] == leaf["sha256"] for kp, leaf in want.items())
