"""Digests taken while Orbax saves (``ckpt_cli.orbax.DigestingCheckpointManager``): an async
``Composite`` save on a (4, 2) mesh, by one process (8 CPU devices) and by two JAX processes
(4 CPU devices each); the record equals ``ckpt digest`` of the saved step, a flipped byte
shows, and the step restores into the trainer's abstract state and trains on."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support import savetime
from tests.support.paths import REPO

STEP = savetime.SAVED_STEP


def _restore(root: Path) -> dict[str, Any]:
    """The saved state, restored by Orbax into the trainer's abstract state (sharded)."""
    import jax
    import orbax.checkpoint as ocp

    abstract = jax.tree.map(
        ocp.utils.to_shape_dtype_struct, savetime.initial_state(savetime.make_mesh())
    )
    with ocp.CheckpointManager(root) as mngr:
        args = ocp.args.Composite(state=ocp.args.StandardRestore(abstract))
        return dict(mngr.restore(STEP, args=args)["state"])


def _assert_resumes(root: Path, want: dict[str, Any], exact: bool = True) -> None:
    """One training step from the restored state equals the uninterrupted run's next step
    (``want``: the state at the save, trained here). Two processes reduce in another order
    and Adam magnifies the last bits of near-zero gradients: then the loss agrees to 1e-4
    and the parameters are not compared (the digests already prove the saved values)."""
    import jax

    restored = _restore(root)
    resumed, loss = savetime.train_step(restored)
    expected, expected_loss = savetime.train_step(want)
    assert int(resumed["step"]) == STEP + 1
    assert np.isfinite(loss) and loss == pytest.approx(expected_loss, rel=1e-6 if exact else 1e-4)
    got, ref = jax.tree.leaves(resumed["params"]), jax.tree.leaves(expected["params"])
    assert len(got) == 3
    for a, b in zip(got, ref, strict=True):
        if exact:
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6)


def _total_bytes(state: dict[str, Any]) -> int:
    import jax

    return sum(x.nbytes for x in jax.tree.leaves(state))


def test_one_process_records_what_ckpt_digest_computes(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    state, digested = savetime.train_and_save(tmp_path)
    record = savetime.recorded(tmp_path / str(STEP) / "state")
    assert len(record) == 11  # params (3), adam's mu and nu (6) and count, the step
    assert record == savetime.digested(tmp_path, STEP, "state")
    assert digested == _total_bytes(state)  # every shard once, replicas skipped
    # The JSON item is recorded by its files' checksums, as `verify --record` records it.
    meta = json.loads((tmp_path / str(STEP) / "meta" / "_CKPT_DIGESTS.json").read_text())
    assert meta["leaves"] == {} and meta["files"]
    # verify --deep checks the trainer's record: no --record pass was run
    r = cli("verify", tmp_path, "--deep", "--json")
    assert r.code == 0, r.stdout
    # The record holds values, not file checksums: no file reads as "appeared after" it.
    assert not r.json()["problems"], r.json()["problems"]
    digests = r.json()["checked"]["digests"]
    [status] = [v for path, v in digests.items() if path.endswith("/state")]
    assert status == "checked", digests  # values checked against the record
    [status] = [v for path, v in digests.items() if path.endswith("/meta")]
    assert status == "checked", digests  # the JSON item's file, against its checksum
    _assert_resumes(tmp_path, state)


def test_a_byte_flipped_after_the_save_no_longer_matches_the_record(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    savetime.train_and_save(tmp_path)
    record = savetime.recorded(tmp_path / str(STEP) / "state")
    assert record == savetime.digested(tmp_path, STEP, "state")
    # A changed value or a chunk that no longer decodes (digest None): either way the leaf
    # that holds the byte no longer matches what the trainer saved; the others still do.
    changed = savetime.flip_a_byte(tmp_path, STEP, "state", record)
    assert 1 <= len(changed) < len(record), changed
    assert cli("verify", tmp_path, "--deep").code == 1  # caught without a --record pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_two_processes_each_digest_their_shards_into_one_record(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO), "XLA_FLAGS": ""}
    cmd = [sys.executable, "-m", "tests.support.savetime", str(tmp_path), str(port)]
    procs = [
        subprocess.Popen([*cmd, str(i)], env=env, cwd=REPO, stdout=subprocess.PIPE, text=True)
        for i in range(2)
    ]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    lines = [json.loads(out.strip().splitlines()[-1]) for out in outs]
    shares = {line["process"]: line["digested_bytes"] for line in lines}
    want = savetime.initial_state(savetime.make_mesh())
    for _ in range(STEP):
        want, _ = savetime.train_step(want)
    assert sorted(shares) == [0, 1] and min(shares.values()) > 0  # both hashed a share...
    assert sum(shares.values()) == _total_bytes(want)  # ...and together every byte once
    record = savetime.recorded(tmp_path / str(STEP) / "state")
    assert len(record) == 11
    assert record == savetime.digested(tmp_path, STEP, "state")
    _assert_resumes(tmp_path, want, exact=False)
    # verify --deep checks the two processes' record with no --record pass; a flipped byte shows.
    r = cli("verify", tmp_path, "--deep", "--json")
    assert r.code == 0 and not r.json()["problems"], r.stdout
    [status] = [v for path, v in r.json()["checked"]["digests"].items() if path.endswith("/state")]
    assert status == "checked"
    changed = savetime.flip_a_byte(tmp_path, STEP, "state", record)
    assert 1 <= len(changed) < len(record), changed
    r = cli("verify", tmp_path, "--deep", "--json")
    assert r.code == 1, r.stdout
    assert any(name in r.stdout for name in changed), r.stdout
