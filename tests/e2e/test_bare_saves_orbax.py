"""A directory of checkpoints saved without a CheckpointManager, as the Flax NNX guide makes
them (``ocp.StandardCheckpointer().save(ckpt_dir / 'state', state)``), with a second save
beside it: listed (each entry's ``kind``) and verified locally and on a bucket; one save, or the
whole directory save by save, copied to a bucket and back still restores with Orbax and trains
on; a save on a bucket without the commit marker Orbax writes into it is left and named. Saves
and restores run the installed Orbax and Flax."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.support.buckets import listing_view, normalized, tree
from tests.support.remote_servers import BUCKET, keys
from tests.support.storage_fixtures import S3

pytestmark = pytest.mark.slow


@pytest.fixture
def bare_saves(tmp_path: Path) -> Path:
    """``ckpt_dir`` holding ``state`` (an nnx state, as the NNX guide saves it) and ``other``."""
    import jax.numpy as jnp
    import orbax.checkpoint as ocp
    from flax import nnx

    model = nnx.Linear(3, 4, rngs=nnx.Rngs(0))
    _, state = nnx.split(model)
    ckpt_dir = tmp_path / "ckpt_dir"
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(ckpt_dir / "state", state)
    checkpointer.save(ckpt_dir / "other", {"a": jnp.ones(3)})
    checkpointer.wait_until_finished()
    return ckpt_dir


def test_ls_of_bare_saves_on_a_bucket_matches_local(
    cli: Any, s3: S3, s3_prefix: str, bare_saves: Path
) -> None:
    url = s3.put_dir(bare_saves, f"{s3_prefix}/ckpt_dir")
    local = cli("ls", bare_saves, "--json")
    remote = cli("ls", url, "--json")
    assert local.code == 0, local.stderr
    assert remote.code == 0, remote.stderr
    steps = remote.json()["steps"]
    assert [(s["name"], s["step"], s["items"]) for s in steps] == [
        ("other", None, ["default"]),
        ("state", None, ["default"]),
    ]
    assert {s["time_source"] for s in steps} == {"commit_metadata"}
    assert listing_view(normalized(remote.json(), url, url)) == listing_view(
        normalized(local.json(), str(bare_saves), url)
    )


def test_ls_lists_each_save_by_name_without_a_step_number(cli: Any, bare_saves: Path) -> None:
    doc = cli("ls", bare_saves, "--json").json()
    assert doc["root"] == str(bare_saves) and doc["latest_step"] is None
    assert [(s["name"], s["step"], s["path"], s["latest"]) for s in doc["steps"]] == [
        ("other", None, str(bare_saves / "other"), False),
        ("state", None, str(bare_saves / "state"), False),
    ]
    text = cli("ls", bare_saves)
    assert text.code == 0, text.stderr
    rows = [line.split()[:2] for line in text.stdout.splitlines()[2:4]]
    assert rows == [["other", "committed"], ["state", "committed"]]
    assert "2 checkpoints without a step number" in text.stdout
    assert "no committed step" not in text.stdout
    # One save given by itself is still the one checkpoint it is.
    one = cli("ls", bare_saves / "state")
    assert one.stdout.splitlines()[2].split()[0] == "-"
    assert "1 checkpoint without a step number" in one.stdout


def test_verify_of_bare_saves_warns_of_nothing_orbax_wrote(
    cli: Any, s3: S3, s3_prefix: str, bare_saves: Path
) -> None:
    url = s3.put_dir(bare_saves, f"{s3_prefix}/ckpt_dir")
    for path in (bare_saves, url):
        result = cli("verify", path, "--deep", "--json")
        assert result.code == 0, result.stderr
        doc = result.json()
        assert doc["checked"]["items"] == 2
        assert doc["problems"] == []


def test_verify_of_bare_saves_still_flags_a_stray_file(cli: Any, bare_saves: Path) -> None:
    (bare_saves / "state" / "notes.txt").write_text("mine")
    result = cli("verify", bare_saves, "--json")
    problems = result.json()["problems"]
    assert [(p["code"], p["file"]) for p in problems] == [("unknown-file", "state/notes.txt")]


def test_a_save_copied_to_a_bucket_and_back_restores_with_orbax(
    cli: Any, s3: S3, s3_prefix: str, bare_saves: Path, tmp_path: Path
) -> None:
    import jax
    import numpy as np
    import orbax.checkpoint as ocp
    from flax import nnx

    url = f"s3://{BUCKET}/{s3_prefix}/ckpt_dir"
    up = cli("cp", bare_saves / "state", url)
    assert up.code == 0, up.stderr
    listed = cli("ls", url, "--json").json()["steps"]
    assert [(s["name"], s["step"], s["status"]) for s in listed] == [("state", None, "committed")]
    back = tmp_path / "back"
    down = cli("cp", url + "/state", back)
    assert down.code == 0, down.stderr
    abstract = nnx.eval_shape(lambda: nnx.Linear(3, 4, rngs=nnx.Rngs(0)))
    _, abstract_state = nnx.split(abstract)
    restored = ocp.StandardCheckpointer().restore(back / "state", abstract_state)
    _, state = nnx.split(nnx.Linear(3, 4, rngs=nnx.Rngs(0)))
    leaves = jax.tree.leaves(state)
    assert leaves
    for a, b in zip(jax.tree.leaves(restored), leaves, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _model() -> Any:
    from flax import nnx

    return nnx.Linear(3, 4, rngs=nnx.Rngs(0))


def _train_step(model: Any) -> tuple[float, int, Any]:
    """One adam step on a fixed batch: the loss before it, the optimizer's step counter after
    it, and the parameters it left."""
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
    x = jnp.arange(6.0).reshape(2, 3)
    y = jnp.ones((2, 4))
    loss, grads = nnx.value_and_grad(lambda m: ((m(x) - y) ** 2).mean())(model)
    optimizer.update(model, grads)
    params = jax.tree.map(jnp.asarray, nnx.state(model, nnx.Param))
    return float(loss), int(optimizer.step[...]), params


def _restores_and_trains(save_dir: Path, other_dir: Path) -> None:
    """``state`` restored as the NNX guide restores it (``nnx.eval_shape`` + split, then
    StandardCheckpointer().restore) trains one step exactly as the model that was saved;
    ``other`` restores to its values."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import orbax.checkpoint as ocp
    from flax import nnx

    graphdef, abstract_state = nnx.split(nnx.eval_shape(_model))
    restored = ocp.StandardCheckpointer().restore(save_dir, abstract_state)
    model = nnx.merge(graphdef, restored)
    before = jax.tree.map(jnp.asarray, nnx.state(model, nnx.Param))
    loss, step, params = _train_step(model)
    want_loss, want_step, want_params = _train_step(_model())
    assert np.isfinite(loss) and step == want_step == 1
    assert loss == want_loss
    pairs = list(zip(jax.tree.leaves(params), jax.tree.leaves(want_params), strict=True))
    assert pairs
    for a, b in pairs:
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    changed = [
        not np.array_equal(np.asarray(a), np.asarray(b))
        for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(before), strict=True)
    ]
    assert changed and all(changed), "the step left a parameter unchanged"
    abstract_other = {"a": jax.ShapeDtypeStruct((3,), jnp.float32)}
    other = ocp.StandardCheckpointer().restore(other_dir, abstract_other)
    np.testing.assert_array_equal(np.asarray(other["a"]), np.ones(3))


def test_a_directory_of_saves_copied_to_a_bucket_and_back_trains_on(
    cli: Any, s3: S3, s3_prefix: str, bare_saves: Path, tmp_path: Path
) -> None:
    """``cp ckpt_dir URL`` copies each save as its own entry (``URL/state``, ``URL/other``, each
    with the commit marker Orbax writes into a save), never the directory nested or marked as
    one; ``cp URL back`` brings each save back committed."""
    url = f"s3://{BUCKET}/{s3_prefix}/ckpt_dir"
    up = cli("cp", bare_saves, url, "--json")
    assert up.code == 0, up.stderr
    doc = up.json()
    assert doc["schema_version"] == 2
    assert [(s["step"], s["name"], s["destination"]) for s in doc["steps"]] == [
        (None, "other", f"{url}/other"),
        (None, "state", f"{url}/state"),
    ]
    objects = keys(s3.client, f"{s3_prefix}/ckpt_dir/")
    tops = {k[len(f"{s3_prefix}/ckpt_dir/") :].split("/")[0] for k in objects}
    assert tops == {"other", "state"}, tops
    for save in ("other", "state"):
        assert f"{s3_prefix}/ckpt_dir/{save}/commit_success.txt" in objects
    listed = cli("ls", url, "--json").json()["steps"]
    assert [(s["name"], s["kind"], s["status"]) for s in listed] == [
        ("other", "save", "committed"),
        ("state", "save", "committed"),
    ]
    back = tmp_path / "back"
    down = cli("cp", url, back, "--json")
    assert down.code == 0, down.stderr
    assert [s["name"] for s in down.json()["steps"]] == ["other", "state"]
    assert down.json()["skipped"] == []
    assert sorted(p.name for p in back.iterdir()) == ["other", "state"]
    for save in ("other", "state"):
        assert tree(back / save) == tree(bare_saves / save)
    _restores_and_trains(back / "state", back / "other")


def test_a_directory_of_saves_copied_locally_trains_on_and_reruns_as_present(
    cli: Any, bare_saves: Path, tmp_path: Path
) -> None:
    dst = tmp_path / "copy"
    plan = cli("cp", bare_saves, dst, "--dry-run")
    assert plan.code == 0, plan.stderr
    assert plan.stdout.splitlines()[0].split()[0] == "save"
    assert "2 saves: " in plan.stdout
    assert not dst.exists()
    first = cli("cp", bare_saves, dst)
    assert first.code == 0, first.stderr
    assert sorted(p.name for p in dst.iterdir()) == ["other", "state"]
    assert tree(dst) == tree(bare_saves)
    again = cli("cp", bare_saves, dst, "--json")
    assert again.code == 0, again.stderr
    assert [s["state"] for s in again.json()["steps"]] == ["present", "present"]
    assert again.json()["outcome"]["copied_objects"] == 0
    _restores_and_trains(dst / "state", dst / "other")


def test_a_killed_local_copy_of_a_save_resumes(cli: Any, bare_saves: Path, tmp_path: Path) -> None:
    """What a killed cp leaves of a save (``state.orbax-checkpoint-tmp-<µs>`` holding ckpt's
    owner record and some files) is resumed, not left beside a second copy."""
    from ckpt_cli.core.storage.locks import Owner

    dst = tmp_path / "copy"
    tmp = dst / "state.orbax-checkpoint-tmp-123"
    files = sorted(p for p in (bare_saves / "state").rglob("*") if p.is_file())
    kept = [p for p in files if p.name != "commit_success.txt"][:3]
    assert kept
    for p in kept:
        target = tmp / p.relative_to(bare_saves / "state")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(p, target)
    dead = Owner("cp", 2**22 + 7, "elsewhere", "2026-01-01T00:00:00+00:00")
    (tmp / ".ckpt-owner").write_text(dead.to_text())
    r = cli("cp", bare_saves, dst, "--json")
    assert r.code == 0, r.stderr
    assert [(s["name"], s["state"]) for s in r.json()["steps"]] == [
        ("other", "new"),
        ("state", "resume"),
    ]
    assert r.json()["outcome"]["skipped_objects"] == len(kept)
    assert sorted(p.name for p in dst.iterdir()) == ["other", "state"]
    assert tree(dst) == tree(bare_saves)


def test_step_options_on_a_directory_of_saves_are_a_usage_error(
    cli: Any, bare_saves: Path, tmp_path: Path
) -> None:
    for option in (["--step", "1"], ["--steps", "1-3"], ["--latest"]):
        r = cli("cp", bare_saves, tmp_path / "copy", *option)
        assert r.code == 2, (option, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in r.stderr
        assert "saves without step numbers (other, state)" in lines[0]
        assert str(bare_saves / "other") in lines[0]
    assert not (tmp_path / "copy").exists()


def test_a_save_alone_still_copies_as_itself(cli: Any, bare_saves: Path, tmp_path: Path) -> None:
    r = cli("cp", bare_saves / "state", tmp_path / "copy", "--json")
    assert r.code == 0, r.stderr
    assert [(s["step"], s["name"]) for s in r.json()["steps"]] == [(None, "state")]
    assert sorted(p.name for p in (tmp_path / "copy").iterdir()) == ["state"]
    assert tree(tmp_path / "copy" / "state") == tree(bare_saves / "state")


def test_a_save_on_a_bucket_without_its_marker_is_left_and_the_hint_marks_the_save(
    cli: Any, s3: S3, s3_prefix: str, bare_saves: Path, tmp_path: Path
) -> None:
    """Orbax writes a save's commit_success.txt into the save itself (CommitFileTemporaryPath
    on object stores): a save without it may be in progress. cp copies the others and names it;
    ls says how to mark it; the mark goes into the save, never beside the saves."""
    url = s3.put_dir(
        bare_saves, f"{s3_prefix}/ckpt_dir", skip=lambda rel: rel == "state/commit_success.txt"
    )
    r = cli("cp", url, tmp_path / "copy", "--json")
    assert r.code == 0, r.stderr
    assert [s["name"] for s in r.json()["steps"]] == ["other"]
    assert r.json()["skipped"] == [
        {"name": "state", "reason": "uncommitted (no commit_success.txt)"}
    ]
    assert sorted(p.name for p in (tmp_path / "copy").iterdir()) == ["other"]
    listed = cli("ls", url, "--json")
    assert [(s["name"], s["status"]) for s in listed.json()["steps"]] == [
        ("other", "committed"),
        ("state", "uncommitted"),
    ]
    hint = f"`ckpt verify {url}/state --mark-committed`"
    assert "save state has no commit_success.txt" in listed.stderr and hint in listed.stderr
    alone = cli("cp", f"{url}/state", tmp_path / "alone")
    assert alone.code == 3 and "uncommitted" in alone.stderr and hint in alone.stderr
    whole = cli("verify", url, "--mark-committed")
    assert whole.code == 2 and "marks one save" in whole.stderr
    assert hint in whole.stderr
    marked = cli("verify", f"{url}/state", "--mark-committed")
    assert marked.code == 0, marked.stderr
    objects = keys(s3.client, f"{s3_prefix}/ckpt_dir/")
    assert f"{s3_prefix}/ckpt_dir/state/commit_success.txt" in objects
    assert f"{s3_prefix}/ckpt_dir/commit_success.txt" not in objects
    again = cli("cp", url, tmp_path / "copy", "--json")
    assert again.code == 0, again.stderr
    assert [(s["name"], s["state"]) for s in again.json()["steps"]] == [
        ("other", "present"),
        ("state", "new"),
    ]
    _restores_and_trains(tmp_path / "copy" / "state", tmp_path / "copy" / "other")


def test_ls_kind_tells_steps_saves_and_flax_steps(
    cli: Any, bare_saves: Path, tmp_path: Path
) -> None:
    import numpy as np
    import orbax.checkpoint as ocp
    from flax.training import checkpoints

    root = tmp_path / "run"
    checkpoints.save_checkpoint(str(root), {"w": np.ones(3, np.float32)}, step=1)
    with ocp.CheckpointManager(root) as manager:
        manager.save(2, args=ocp.args.StandardSave({"w": np.ones(3, np.float32)}))
    doc = cli("ls", root, "--json").json()
    assert [(s["name"], s["kind"]) for s in doc["steps"]] == [
        ("checkpoint_1", "flax"),
        ("2", "step"),
    ]
    text = cli("ls", root)
    assert text.code == 0, text.stderr
    header, flax_row, step_row = text.stdout.splitlines()[1:4]
    assert header.split()[:2] == ["step", "kind"]
    assert flax_row.split()[:2] == ["1", "flax"]
    assert step_row.split()[:3] == ["2", "*", "step"]
    alone = cli("ls", bare_saves / "state", "--json").json()["steps"]
    assert [s["kind"] for s in alone] == ["save"]
    plain = cli("ls", bare_saves)
    assert "kind" not in plain.stdout.splitlines()[1].split()


def test_an_unfinished_save_beside_the_others_is_listed_and_not_copied(
    cli: Any, bare_saves: Path, tmp_path: Path
) -> None:
    """Orbax writes a save into ``<name>.orbax-checkpoint-tmp`` and renames it when done: while
    it runs, the directory still lists and copies save by save, without the unfinished one."""
    tmp = bare_saves / "third.orbax-checkpoint-tmp"
    tmp.mkdir()
    shutil.copy(bare_saves / "state" / "_CHECKPOINT_METADATA", tmp)
    listed = cli("ls", bare_saves, "--json").json()["steps"]
    assert [(s["name"], s["status"], s["kind"]) for s in listed] == [
        ("other", "committed", "save"),
        ("state", "committed", "save"),
        ("third.orbax-checkpoint-tmp", "incomplete", "save"),
    ]
    r = cli("cp", bare_saves, tmp_path / "copy", "--json")
    assert r.code == 0, r.stderr
    assert [s["name"] for s in r.json()["steps"]] == ["other", "state"]
    assert r.json()["skipped"] == [
        {"name": "third.orbax-checkpoint-tmp", "reason": "unfinished save"}
    ]
    assert sorted(p.name for p in (tmp_path / "copy").iterdir()) == ["other", "state"]
