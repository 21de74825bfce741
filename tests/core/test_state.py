"""The training-state verdict of a step, across its items, on real saves of the installed
Orbax and Flax: which item holds which part, what is missing, what is only a note."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import ckpt_cli
from ckpt_cli.core.inspect import InspectResult, StepInspection
from ckpt_cli.core.inspect.step import inspect_path
from ckpt_cli.core.state import StatePart
from ckpt_cli.core.step_state import is_data_iterator
from ckpt_cli.core.storage import open_location


@pytest.fixture(scope="module")
def roots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from tests.support import training_states as ts

    base = tmp_path_factory.mktemp("states")
    ts.nnx_run(base / "nnx")
    ts.linen_run(base / "linen")
    ts.linen_run(base / "linen_rng", rng=True, data_iter=False)
    ts.cnn_run(base / "cnn")
    ts.save_params_only(base / "params")
    return {p.name: p for p in base.iterdir()}


def verdict(root: Path, item: str | None = None) -> dict[str, Any]:
    result = inspect_path(open_location(str(root)), item=item)
    assert isinstance(result, InspectResult | StepInspection)
    doc: dict[str, Any] = result.to_json()["training_state"]  # type: ignore[assignment]
    doc["by_part"] = {p["part"]: p for p in doc["parts"]}
    assert set(doc["by_part"]) == {"params", "opt_state", "step", "rng", "data_order"}
    return doc


def test_nnx_model_and_optimizer_items_are_one_complete_state(roots: dict[str, Path]) -> None:
    v = verdict(roots["nnx"])
    assert (v["scope"], v["items"], v["complete"]) == ("step", ["model", "optimizer"], True)
    parts = v["by_part"]
    assert parts["params"]["items"] == ["model"]
    assert parts["params"]["subtrees"] == ["linear1", "linear2"]
    assert parts["opt_state"]["items"] == ["optimizer"]
    assert (parts["step"]["items"], parts["step"]["note"]) == (["optimizer"], "step.value = 3")
    # No optimizer state is reported missing beside the optimizer item.
    assert v["missing"] == [] and "no optimizer state" not in str(v)
    assert v["notes"] == ["rng", "data_order"]


def test_one_item_asked_for_still_gets_the_steps_verdict(roots: dict[str, Path]) -> None:
    v = verdict(roots["nnx"], item="model")
    assert v["complete"] is True and v["items"] == ["model", "optimizer"]
    assert v["by_part"]["opt_state"]["items"] == ["optimizer"]
    api = ckpt_cli.open(str(roots["nnx"])).item(item="optimizer").report.to_json()
    assert api["training_state"]["complete"] is True
    params = [p for p in api["training_state"]["parts"] if p["part"] == "params"]
    assert params and params[0]["items"] == ["model"]


def test_data_iterator_item_is_the_data_order(roots: dict[str, Path]) -> None:
    v = verdict(roots["linen"])
    assert v["complete"] is True and v["items"] == ["data_iter", "state"]
    order = v["by_part"]["data_order"]
    assert (order["present"], order["items"], order["source"]) == (True, ["data_iter"], "item")
    assert order["note"] == "JSON item: epoch, index"
    assert v["by_part"]["params"]["items"] == ["state"]
    assert v["by_part"]["step"]["note"] == "step = 3"
    rng = v["by_part"]["rng"]
    assert not rng["present"] and not rng["required"]
    assert "the data order is kept (data_iter)" in rng["note"]
    assert v["notes"] == ["rng"]


def test_cnn_without_dropout_is_complete_with_an_rng_note(roots: dict[str, Path]) -> None:
    v = verdict(roots["cnn"])
    assert v["complete"] is True and v["missing"] == []
    assert v["items"] == ["default"]
    rng = v["by_part"]["rng"]
    assert rng["present"] is False and "dropout masks" in rng["note"]
    assert v["notes"] == ["rng", "data_order"]


def test_params_alone_are_incomplete(roots: dict[str, Path]) -> None:
    v = verdict(roots["params"])
    assert v["complete"] is False and v["missing"] == ["opt_state"]
    step = v["by_part"]["step"]
    # The step is the directory's name: present, but no counter in the state.
    assert (step["present"], step["source"], step["items"]) == (True, "directory", [])
    assert "latest_step" in step["note"]


def test_trainstate_with_its_dropout_key_holds_the_rng(roots: dict[str, Path]) -> None:
    v = verdict(roots["linen_rng"])
    rng = v["by_part"]["rng"]
    assert v["complete"] is True
    assert (rng["present"], rng["items"], rng["subtrees"]) == (True, ["state"], ["rng"])
    assert v["notes"] == ["data_order"]


def test_a_save_outside_a_step_is_judged_alone(tmp_path: Path) -> None:
    import numpy as np
    import orbax.checkpoint as ocp

    ck = ocp.StandardCheckpointer()
    ck.save(tmp_path / "ck", {"params": {"w": np.ones(3, np.float32)}})
    ck.wait_until_finished()
    v = verdict(tmp_path / "ck")
    assert (v["scope"], v["items"], v["missing"]) == ("item", ["default"], ["opt_state", "step"])


@pytest.mark.parametrize(
    ("name", "handler", "expected"),
    [
        ("data_iter", None, True),
        ("train_ds", None, True),
        ("dataloader", None, True),
        ("loader", "grain._src.python.checkpoint_handlers.CheckpointHandler", True),
        ("extra", None, False),
        ("metadata", None, False),
        ("state", None, False),
    ],
)
def test_data_iterator_items_by_name(name: str, handler: str | None, expected: bool) -> None:
    assert is_data_iterator(name, handler, ()) is expected


def test_an_item_named_data_that_holds_parameters_is_no_iterator() -> None:
    params = StatePart("params", True, ("params",), ("params.w",), "1 leaves")
    assert not is_data_iterator("data_parallel_state", None, (params,))
