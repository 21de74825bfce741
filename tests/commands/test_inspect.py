"""``ckpt inspect`` on every fixture layout: leaves, dtypes, shapes, sharding, state parts."""

from __future__ import annotations

import numpy as np
import pytest

from tests.support.paths import FIXTURES
from tests.support.world import World, one_json_document


def leaves_by_name(doc: dict) -> dict[str, dict]:  # type: ignore[type-arg]
    return {leaf["name"]: leaf for leaf in doc["leaves"]}


def test_inspect_json_contract_seed(cli) -> None:  # type: ignore[no-untyped-def]
    r = cli("inspect", FIXTURES / "seed_mlp", "--json")
    assert r.code == 0, r.stderr
    doc = r.json()
    # 2: JSON-item values as values; 3: kind, key_data, other_items; 4: the step's training
    # state across its items; 5: empty/unknown items; 6: the safetensors document
    assert doc["schema_version"] == 6 and doc["ok"] is True
    assert (doc["step"], doc["item"]) == (500, "default")
    assert doc["path"] == str(FIXTURES / "seed_mlp" / "500" / "default")
    leaves = leaves_by_name(doc)
    k = leaves["params.Dense_0.kernel"]
    assert k["keypath"] == ["params", "Dense_0", "kernel"]
    assert (k["dtype"], k["shape"], k["chunk_shape"]) == ("float32", [16, 64], [16, 64])
    assert k["size_bytes"] == 16 * 64 * 4
    assert leaves["opt_state.0.mu.Dense_0.kernel"]["state_part"] == "opt_state"
    assert leaves["opt_state.1"]["value_type"] == "None"
    assert leaves["opt_state.1"]["dtype"] is None
    assert leaves["rng"]["dtype"] == "uint32" and leaves["rng"]["shape"] == [2]
    parts = {p["part"]: p for p in doc["training_state"]["parts"]}
    assert doc["training_state"]["complete"] is True
    assert parts["step"]["note"] == "step = 500"
    assert parts["opt_state"]["subtrees"] == ["opt_state"]
    totals = doc["totals"]
    assert totals["size_bytes"] == sum(leaf["size_bytes"] for leaf in doc["leaves"])
    assert totals["parameters"] == sum(
        leaf["elements"] for leaf in doc["leaves"] if leaf["elements"] is not None
    )
    params = next(t for t in totals["subtrees"] if t["name"] == "params")
    assert params["parameters"] == 16 * 64 + 64 + 64 * 10 + 10


def test_inspect_missing_parts_say_what_resume_loses(cli) -> None:  # type: ignore[no-untyped-def]
    doc = cli("inspect", FIXTURES / "sharded_4x2", "--json").json()
    parts = {p["part"]: p for p in doc["training_state"]["parts"]}
    assert doc["training_state"]["complete"] is False
    assert parts["params"]["present"] is True
    assert not parts["opt_state"]["present"]
    assert "restarts the optimizer" in parts["opt_state"]["note"]
    assert "RNG" in parts["rng"]["note"]
    human = cli("inspect", FIXTURES / "sharded_4x2")
    assert "training state: incomplete" in human.stdout
    assert "no optimizer state" in human.stdout


def test_inspect_named_sharding(cli) -> None:  # type: ignore[no-untyped-def]
    leaves = leaves_by_name(cli("inspect", FIXTURES / "sharded_4x2", "--json").json())
    w = leaves["params.w"]
    assert w["sharding"] == {
        "type": "NamedSharding",
        "mesh": {"data": 4, "model": 2},
        "partition_spec": ["data", "model"],
        "device_ids": list(range(8)),
    }
    assert w["chunk_shape"] == [2, 2] and w["write_shape"] == [2, 2]
    assert leaves["params.b"]["sharding"]["partition_spec"] == [None, "model"]
    assert leaves["params.replicated"]["sharding"]["partition_spec"] == []
    assert leaves["scalar"]["sharding"] is None


def test_inspect_dtypes(cli) -> None:  # type: ignore[no-untyped-def]
    leaves = leaves_by_name(cli("inspect", FIXTURES / "bf16", "--json").json())
    assert {n: (v["dtype"], v["size_bytes"]) for n, v in leaves.items()} == {
        "bf16": ("bfloat16", 32),
        "f16": ("float16", 32),
        "i32": ("int32", 24),
        "i8": ("int8", 8),
        "mask": ("bool", 5),
        "u32": ("uint32", 16),
    }


def test_inspect_strings_and_empty_markers(cli) -> None:  # type: ignore[no-untyped-def]
    leaves = leaves_by_name(cli("inspect", FIXTURES / "strings", "--json").json())
    assert leaves["name"]["value"] == "mlp-experiment"
    assert leaves["meta.tags.1"]["value"] == "cpu"
    assert leaves["meta.tags.1"]["keypath"] == ["meta", "tags", "1"]
    assert {leaves[n]["value_type"] for n in ("empty_dict", "empty_list", "nothing")} == {
        "Dict",
        "List",
        "None",
    }
    assert leaves["int_scalar"]["dtype"] == "int64" and leaves["int_scalar"]["shape"] == []


@pytest.mark.parametrize(
    ("fixture", "storage", "zarr"),
    [
        ("v1_zarr3", "ocdbt", 3),
        ("no_ocdbt", "zarr", 2),
        ("no_ocdbt_zarr3", "zarr", 3),
        ("unmerged_ocdbt", "ocdbt-unmerged", 2),
        ("prefixed", "ocdbt", 2),
        ("single_checkpointer", "ocdbt", 2),
    ],
)
def test_inspect_every_layout(cli, fixture: str, storage: str, zarr: int) -> None:  # type: ignore[no-untyped-def]
    r = cli("inspect", FIXTURES / fixture, "--json")
    assert r.code == 0, r.stderr
    doc = r.json()
    assert (doc["storage"], doc["zarr_format"]) == (storage, zarr)
    arrays = [leaf for leaf in doc["leaves"] if leaf["value_type"] not in ("None", "Dict", "List")]
    assert arrays and all(leaf["dtype"] and leaf["chunk_shape"] is not None for leaf in arrays)
    assert all(leaf["problem"] is None for leaf in doc["leaves"])


def test_unmerged_reads_like_merged(cli) -> None:  # type: ignore[no-untyped-def]
    a = cli("inspect", FIXTURES / "multiprocess", "--json", "--stats").json()
    b = cli("inspect", FIXTURES / "unmerged_ocdbt", "--json", "--stats").json()
    strip = lambda doc: [{k: v for k, v in leaf.items()} for leaf in doc["leaves"]]  # noqa: E731
    assert strip(a) == strip(b)
    big = leaves_by_name(b)["params.big"]
    assert big["stats"]["finite"] == 64 * 64


def test_inspect_json_item(cli) -> None:  # type: ignore[no-untyped-def]
    doc = cli("inspect", FIXTURES / "composite_best", "--item", "extra", "--json").json()
    assert doc["storage"] == "json"
    values = {leaf["name"]: leaf["value"] for leaf in doc["leaves"]}
    assert values == {"epoch": 2, "note": "step 4", "lr": 0.001}  # JSON values, not JSON text


def test_inspect_filter(cli) -> None:  # type: ignore[no-untyped-def]
    doc = cli("inspect", FIXTURES / "seed_mlp", "--filter", "params.*kernel", "--json").json()
    assert [leaf["name"] for leaf in doc["leaves"]] == [
        "params.Dense_0.kernel",
        "params.Dense_1.kernel",
    ]
    # The four-part analysis still sees the whole tree.
    assert doc["training_state"]["complete"] is True
    regex = cli("inspect", FIXTURES / "seed_mlp", "--filter", r"^opt_state\.0\.mu\.", "--json")
    assert len(regex.json()["leaves"]) == 4
    none = cli("inspect", FIXTURES / "seed_mlp", "--filter", "nomatch")
    assert none.code == 3 and "no leaf" in none.stderr


def test_inspect_stats_match_numpy(cli) -> None:  # type: ignore[no-untyped-def]
    import tensorstore as ts

    doc = cli("inspect", FIXTURES / "seed_mlp", "--stats", "--json").json()
    kernel = leaves_by_name(doc)["params.Dense_0.kernel"]
    base = str(FIXTURES / "seed_mlp" / "500" / "default") + "/"
    arr = ts.open(
        {
            "driver": "zarr",
            "kvstore": {
                "driver": "ocdbt",
                "base": {"driver": "file", "path": base},
                "path": "params.Dense_0.kernel/",
            },
        }
    ).result()
    ref = np.asarray(arr.read().result(), dtype=np.float64)
    s = kernel["stats"]
    assert s["min"] == pytest.approx(ref.min())
    assert s["max"] == pytest.approx(ref.max())
    assert s["mean"] == pytest.approx(ref.mean(), rel=1e-9, abs=1e-12)
    assert s["std"] == pytest.approx(ref.std(), rel=1e-9)
    assert (s["nan"], s["inf"], s["finite"]) == (0, 0, ref.size)


def test_inspect_layout_json(cli) -> None:  # type: ignore[no-untyped-def]
    doc = cli("inspect", FIXTURES / "sharded_4x2", "--layout", "params.b", "--json").json()
    lay = doc["layout"]
    assert lay["grid"] == [1, 2] and lay["block_shape"] == [6, 2] and lay["replicas"] == 4
    assert [b["devices"] for b in lay["blocks"]] == [[0, 2, 4, 6], [1, 3, 5, 7]]
    human = cli("inspect", FIXTURES / "sharded_4x2", "--layout", "params.w")
    assert human.code == 0
    assert "4 x 2 blocks of [2,2]" in human.stdout
    assert "one chunk per block" in human.stdout


def test_inspect_human_tree(cli) -> None:  # type: ignore[no-untyped-def]
    r = cli("inspect", FIXTURES / "sharded_4x2")
    assert r.code == 0
    assert "float32[8,4]" in r.stdout and "P(data,model)" in r.stdout
    assert "mesh: data=4,model=2" in r.stdout
    flat = cli("inspect", FIXTURES / "sharded_4x2", "--flat")
    assert "params.replicated" in flat.stdout and "replicated" in flat.stdout


@pytest.fixture(scope="module")
def saved_states(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """Real saves: an nnx model + optimizer Composite, a linen TrainState + JSON data iterator."""
    from tests.support import training_states as ts

    base = tmp_path_factory.mktemp("states")
    ts.nnx_run(base / "nnx")
    ts.linen_run(base / "linen")
    ts.save_params_only(base / "params")
    return {p.name: p for p in base.iterdir()}


def state_lines(stdout: str) -> list[str]:
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("training state"))
    return lines[start : start + 6]


def test_inspect_judges_the_step_across_nnx_items(cli, saved_states) -> None:  # type: ignore[no-untyped-def]
    r = cli("inspect", saved_states["nnx"])
    assert r.code == 0, r.stderr
    lines = state_lines(r.stdout)
    assert lines[0] == "training state of the step, across items model, optimizer: complete"
    by_part = {line.split()[1]: line for line in lines[1:]}
    assert "model: linear1, linear2" in by_part["parameters"]
    assert "optimizer: opt_state" in by_part["optimizer"]
    assert "optimizer: step.value" in by_part["step"] and "step.value = 3" in by_part["step"]
    # A missing RNG key is a note, not a failure mark.
    assert by_part["RNG"].split()[0] == "-" and "note: no RNG key" in by_part["RNG"]
    assert "✗" not in r.stdout and "no optimizer state" not in r.stdout
    # Every item is shown, the verdict once.
    assert r.stdout.count("training state") == 1
    assert "item 'model'" in r.stdout and "item 'optimizer'" in r.stdout


def test_inspect_one_item_names_the_parts_in_its_siblings(cli, saved_states) -> None:  # type: ignore[no-untyped-def]
    r = cli("inspect", saved_states["nnx"], "--item", "model")
    assert r.code == 0, r.stderr
    lines = state_lines(r.stdout)
    assert lines[0].endswith("across items model, optimizer: complete")
    assert "optimizer: opt_state" in lines[2]
    doc = cli("inspect", saved_states["nnx"], "--item", "model", "--json").json()
    assert doc["item"] == "model" and doc["training_state"]["complete"] is True
    assert doc["training_state"]["items"] == ["model", "optimizer"]


def test_inspect_names_the_data_iterator_item(cli, saved_states) -> None:  # type: ignore[no-untyped-def]
    r = cli("inspect", saved_states["linen"])
    assert r.code == 0, r.stderr
    lines = state_lines(r.stdout)
    assert lines[0] == "training state of the step, across items data_iter, state: complete"
    order = next(line for line in lines if line.split()[1:3] == ["data", "order"])
    assert "data_iter" in order and "JSON item: epoch, index" in order
    rng = next(line for line in lines if line.split()[1:3] == ["RNG", "state"])
    assert "note:" in rng and "the data order is kept (data_iter)" in rng
    doc = cli("inspect", saved_states["linen"], "--json").json()
    ts = doc["training_state"]
    assert (ts["missing"], ts["notes"]) == ([], ["rng"])
    assert [o["item"] for o in doc["other_items"]] == ["data_iter"]


def test_inspect_params_alone_still_incomplete(cli, saved_states) -> None:  # type: ignore[no-untyped-def]
    r = cli("inspect", saved_states["params"])
    assert r.code == 0, r.stderr
    lines = state_lines(r.stdout)
    assert lines[0] == "training state: incomplete"
    optimizer = next(line for line in lines if "optimizer state" in line)
    assert "✗" in optimizer and "no optimizer state" in optimizer
    step = next(line for line in lines if " step " in line)
    assert "✓" in step and "directory name" in step
    doc = cli("inspect", saved_states["params"], "--json").json()
    assert doc["training_state"]["missing"] == ["opt_state"]


def test_json_item_values_are_json_values(world: World, cli) -> None:  # type: ignore[no-untyped-def]
    doc = one_json_document(cli("inspect", world.composite, "--item", "extra", "--json").stdout)
    values = {leaf["name"]: leaf["value"] for leaf in doc["leaves"]}
    assert values == {"epoch": 2, "note": "step 4", "lr": 0.001}
    strings = one_json_document(cli("inspect", FIXTURES / "strings", "--json").stdout)
    assert {leaf["name"]: leaf["value"] for leaf in strings["leaves"]}["name"] == "mlp-experiment"


def test_filter_dot_star_keeps_every_leaf(cli) -> None:  # type: ignore[no-untyped-def]
    seed = FIXTURES / "seed_mlp"
    every = cli("inspect", seed, "--json").json()["leaves"]
    matched = cli("inspect", seed, "--filter", ".*", "--json").json()["leaves"]
    assert {leaf["name"] for leaf in every} >= {"step", "rng"}
    assert [leaf["name"] for leaf in matched] == [leaf["name"] for leaf in every]
