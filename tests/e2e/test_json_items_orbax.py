"""JSON items saved by the installed Orbax (a JsonSave item, the metrics a CheckpointManager
writes): ``inspect`` prints their text as written, ``diff`` shows both values that differ."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

NOTE = {1: "café 東京", 2: "naïve ✓"}
LOSS = {1: 0.75, 2: 0.25}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two steps of a state, a JsonSave item with non-ASCII text, and metrics."""
    import numpy as np
    import orbax.checkpoint as ocp

    path = tmp_path_factory.mktemp("orbax") / "run"
    options = ocp.CheckpointManagerOptions(
        best_fn=lambda m: m["loss"], best_mode="min", enable_async_checkpointing=False
    )
    with ocp.CheckpointManager(path, options=options, item_names=("state", "extra")) as mgr:
        for step in (1, 2):
            args = ocp.args.Composite(
                state=ocp.args.StandardSave({"w": np.full((2, 2), step, np.float32)}),
                extra=ocp.args.JsonSave({"note": NOTE[step], "epochs": 3}),
            )
            mgr.save(step, args=args, metrics={"loss": LOSS[step]})
    return path


def test_inspect_prints_unicode_of_a_json_item_as_written(cli, run: Path) -> None:  # type: ignore[no-untyped-def]
    r = cli("inspect", run / "1" / "extra")
    assert r.code == 0, r.stderr
    assert json.dumps(NOTE[1], ensure_ascii=False) in r.stdout
    assert "\\u" not in r.stdout
    leaves = {
        lf["name"]: lf["value"]
        for lf in cli("inspect", run / "1" / "extra", "--json").json()["leaves"]
    }
    assert leaves["note"] == NOTE[1]


def test_diff_of_a_json_item_shows_both_values(cli, run: Path) -> None:  # type: ignore[no-untyped-def]
    r = cli("diff", run / "1", run / "2", "--item", "extra")
    assert r.code == 1, r.stderr
    assert f'"{NOTE[1]}" vs "{NOTE[2]}"' in r.stdout
    doc = cli("diff", run / "1", run / "2", "--item", "extra", "--json").json()
    by_name = {d["name"]: d for d in doc["leaves"]}
    assert by_name["note"]["status"] == "different"
    assert by_name["note"]["message"] == f'"{NOTE[1]}" vs "{NOTE[2]}"'
    assert by_name["epochs"]["status"] == "equal" and by_name["epochs"]["message"] is None


@pytest.mark.parametrize("structure", [False, True])
def test_diff_of_metrics_shows_both_losses(cli, run: Path, structure: bool) -> None:  # type: ignore[no-untyped-def]
    flags = ["--structure"] if structure else []
    r = cli("diff", run / "1", run / "2", "--item", "metrics", *flags)
    assert r.code == 1, r.stderr
    assert "0.75 vs 0.25" in r.stdout
    doc = cli("diff", run / "1", run / "2", "--item", "metrics", "--json", *flags).json()
    assert [(d["name"], d["message"]) for d in doc["leaves"]] == [("loss", "0.75 vs 0.25")]
