"""A directory of checkpoints saved without a CheckpointManager, as the Flax NNX guide makes
them (``ocp.StandardCheckpointer().save(ckpt_dir / 'state', state)``), with a second save
beside it: listed and verified locally and on a bucket, and one save copied to a bucket and back
still restores with Orbax. Saves and restores run the installed Orbax and Flax."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.buckets import listing_view, normalized
from tests.support.remote_servers import BUCKET
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
