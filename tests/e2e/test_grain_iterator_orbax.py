"""A step that holds a grain data iterator beside its TrainState, saved by the installed grain
(``grain.checkpoint.CheckpointSave``: one ``process_<i>-of-<n>.json`` per process, no
``_METADATA``): ``ls``, ``inspect``, ``verify`` and ``diff`` read it, ``reshard``, ``migrate`` and
``cp`` carry it as is, and the run resumes from their output: grain's ``CheckpointRestore``
yields the uninterrupted run's next batch and one training step equals the uninterrupted one."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("grain")
pytestmark = pytest.mark.slow

GRAIN_FILE = Path("3/data_iter/process_0-of-1.json")


def assert_resumes(root: Path, run: Any) -> None:
    """Restore ``root`` as the user does and check the run continues where it stopped."""
    import jax

    from tests.support import training_states as ts

    state, data = ts.restore_grain_run(root)
    assert int(state.step) == ts.SAVED_STEP
    batch, expected_batch = next(data), next(run.data)
    np.testing.assert_array_equal(batch[0], expected_batch[0])
    np.testing.assert_array_equal(batch[1], expected_batch[1])
    state, loss = ts.linen_step(state, batch)
    expected_state, expected_loss = ts.linen_step(run.state, expected_batch)
    assert int(state.step) == ts.SAVED_STEP + 1
    assert np.isfinite(float(loss)) and float(loss) == pytest.approx(float(expected_loss), rel=1e-6)
    leaves = jax.tree.leaves(state.params)
    assert leaves
    for a, b in zip(leaves, jax.tree.leaves(expected_state.params), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6)


def test_inspect_names_the_grain_item_as_the_data_order(cli: Any, tmp_path: Path) -> None:
    from tests.support import training_states as ts

    root = tmp_path / "run"
    ts.grain_run(root)
    listed = cli("ls", root, "--json")
    assert listed.code == 0, listed.stderr
    assert listed.json()["steps"][0]["items"] == ["data_iter", "state"]

    r = cli("inspect", root, "--json")
    assert r.code == 0, r.stderr
    doc = r.json()["training_state"]
    order = next(p for p in doc["parts"] if p["part"] == "data_order")
    assert doc["complete"] is True and doc["items"] == ["data_iter", "state"]
    assert order["present"] is True and order["items"] == ["data_iter"]
    assert order["note"] == "grain iterator state, 1 process: next_index"

    item = cli("inspect", root, "--item", "data_iter", "--json")
    assert item.code == 0, item.stderr
    assert item.json()["kind"] == "json"
    assert [(leaf["name"], leaf["value"]) for leaf in item.json()["leaves"]] == [
        ("process_0-of-1.next_index", ts.SAVED_STEP)
    ]
    text = cli("inspect", root)
    assert text.code == 0
    assert re.search(r"data order +data_iter +grain iterator state", text.stdout), text.stdout


def test_verify_finds_no_problem_and_records_digests_grain_still_restores(
    cli: Any, tmp_path: Path
) -> None:
    from tests.support import training_states as ts

    root = tmp_path / "run"
    run = ts.grain_run(root)
    r = cli("verify", root, "--json")
    assert r.code == 0, r.stdout + r.stderr
    assert r.json()["problems"] == []
    assert cli("verify", root, "--record").code == 0
    deep = cli("verify", root, "--deep", "--json")
    assert deep.code == 0 and deep.json()["problems"] == []
    assert_resumes(root, run)


def test_verify_reports_a_damaged_grain_state_file(cli: Any, tmp_path: Path) -> None:
    from tests.support import training_states as ts

    root = tmp_path / "run"
    ts.grain_run(root)
    (root / GRAIN_FILE).write_text('{"next_index": ')
    r = cli("verify", root, "--json")
    assert r.code == 1
    found = [(p["code"], p["file"]) for p in r.json()["problems"]]
    assert ("json-invalid", "3/data_iter/process_0-of-1.json") in found, found


def test_reshard_then_cp_resumes_the_run(cli: Any, tmp_path: Path) -> None:
    from tests.support import training_states as ts

    root, resharded, copied = tmp_path / "run", tmp_path / "resharded", tmp_path / "copied"
    run = ts.grain_run(root)
    r = cli("reshard", root, resharded, "--mesh", "data=1")
    assert r.code == 0, r.stderr
    c = cli("cp", resharded, copied)
    assert c.code == 0, c.stderr
    assert (copied / GRAIN_FILE).read_bytes() == (root / GRAIN_FILE).read_bytes()
    handlers = json.loads((copied / "3" / "_CHECKPOINT_METADATA").read_text())["item_handlers"]
    assert handlers["data_iter"].startswith("grain.")
    assert cli("verify", copied).code == 0
    assert_resumes(copied, run)


def test_migrate_round_trip_keeps_the_grain_item_and_resumes(cli: Any, tmp_path: Path) -> None:
    from tests.support import training_states as ts

    root, there, back = tmp_path / "run", tmp_path / "there", tmp_path / "back"
    run = ts.grain_run(root)
    for src, dst, a, b in ((root, there, "Dense_0", "hidden"), (there, back, "hidden", "Dense_0")):
        spec = tmp_path / f"{a}.yaml"
        rule = f"{{op: rename, from: 'params\\.{a}\\.(.*)', to: 'params.{b}.\\1'}}"
        spec.write_text(f"rules:\n  - {rule}\n")
        r = cli("migrate", src, dst, "--spec", spec)
        assert r.code == 0, r.stderr
        assert (dst / GRAIN_FILE).read_bytes() == (root / GRAIN_FILE).read_bytes()
        names = [leaf["name"] for leaf in cli("inspect", dst, "--json").json()["leaves"]]
        assert f"params.{b}.kernel" in names, names
    assert_resumes(back, run)


def test_diff_of_two_steps_shows_where_the_iterator_moved(cli: Any, tmp_path: Path) -> None:
    import grain
    import orbax.checkpoint as ocp

    from tests.support import training_states as ts

    root = tmp_path / "run"
    run = ts.grain_run(root)
    state, _ = ts.linen_step(run.state, next(run.data))
    with ocp.CheckpointManager(root) as mgr:
        items = ocp.args.Composite(
            state=ocp.args.StandardSave(state), data_iter=grain.checkpoint.CheckpointSave(run.data)
        )
        mgr.save(ts.SAVED_STEP + 1, args=items)
        mgr.wait_until_finished()
    r = cli("diff", f"{root}@3:data_iter", f"{root}@4:data_iter", "--json")
    assert r.code == 1, r.stderr
    leaves = r.json()["leaves"]
    assert [leaf["name"] for leaf in leaves] == ["process_0-of-1.next_index"]
    assert "3 vs 4" in cli("diff", f"{root}@3:data_iter", f"{root}@4:data_iter").stdout
    assert cli("diff", f"{root}@3", f"{root}@4").code == 1  # the TrainState moved too
