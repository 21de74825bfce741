"""Two commands at once on one bucket root: every pair that may meet there, each forced into
its worst interleaving by holding one request of one command at the S3 test server
(``tests/support/race_harness.py``) while the other runs to its end.

The invariants, whatever the interleaving: no committed step missing a file, no pin reported on
a step that is gone (nor a pin object left as the only object of a dead step), no deleted step
the user wanted, and a refused or failed command says in one line what happened (exit 3).
(Local-disk pairs: tests/hostile/test_writer_races.py and tests/hostile/test_two_writers_one_root.py.)
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support.ckpt_process import (
    INTERNAL_ERROR,
    Run,
    ckpt,
    finish,
    kill,
    save_orbax,
    start,
    wait_stopped_or_exited,
)
from tests.support.paths import FIXTURES
from tests.support.race_harness import hold
from tests.support.remote_servers import BUCKET, keys

SRC = FIXTURES / "seed_mlp"
STEP = "500"
MESH = ["--mesh", "data=8"]


def _url(prefix: str, name: str = "dst") -> str:
    return f"s3://{BUCKET}/{prefix}/{name}"


def _rel_files(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*") if p.is_file()}


def _step_keys(s3: Any, prefix: str, step: str = STEP) -> set[str]:
    base = f"{prefix}/dst/{step}/"
    return {k[len(base) :] for k in keys(s3.client, base)}


def _committed(dst: str) -> list[int]:
    run = ckpt("ls", dst, "--json", mem_limit=None)
    assert run.code == 0, run.stderr
    return [s["step"] for s in run.json()["steps"] if s["status"] == "committed"]


def _one_line(run: Run) -> str:
    assert INTERNAL_ERROR not in run.stderr, run.stderr
    assert len(run.lines) == 1, run.stderr
    return run.lines[0]


def _while_held(
    s3: Any, method: str, key_regex: str, first: list[Any], second: list[Any]
) -> tuple[subprocess.Popen[str], Run]:
    """``ckpt FIRST`` started and held at its request ``method key_regex``, ``ckpt SECOND`` run
    to its end meanwhile, then FIRST released: (FIRST's process, SECOND's run)."""
    with hold(s3.server, method, key_regex) as held:
        p = start(*first, mem_limit=None)
        held.wait_reached(p)
        other = ckpt(*second, mem_limit=None)
    return p, other


def _deleted_while_held(s3: Any, prefix: str, put_regex: str, command: list[Any]) -> Run:
    """``ckpt COMMAND`` held at its PUT ``put_regex`` while every object below ``prefix`` is
    deleted (a trainer's retention, a person: nothing that knows ckpt's locks); its run."""
    with hold(s3.server, "PUT", put_regex) as held:
        p = start(*command, mem_limit=None)
        held.wait_reached(p)
        doomed = keys(s3.client, prefix)
        assert doomed, prefix
        for key in doomed:
            s3.client.delete_object(Bucket=BUCKET, Key=key)
    return finish(p)


def _killed_cp(s3: Any, dst: str) -> None:
    """A root with committed step 400 and a SIGKILLed cp's leftover of step 500: all its data,
    its ``.ckpt-writing`` record, no marker (killed at its ``_CHECKPOINT_METADATA`` PUT)."""
    assert ckpt("cp", SRC, dst, "--step", "400", mem_limit=None).code == 0
    with hold(s3.server, "PUT", rf"/{STEP}/_CHECKPOINT_METADATA$") as held:
        a = start("cp", SRC, dst, "--step", STEP, mem_limit=None)
        held.wait_reached(a)
        kill(a)
    s3.server.wait_idle()


def _resume_held_while(s3: Any, prefix: str, dst: str, meanwhile: Any) -> tuple[int, Run, Any]:
    """The rerun of the cp held as it re-marks its step (``.ckpt-writing``, after its plan),
    ``meanwhile()`` run to its end, then the rerun released: (its pid, its run, what
    ``meanwhile`` returned)."""
    _killed_cp(s3, dst)
    assert ".ckpt-writing" in _step_keys(s3, prefix)
    with hold(s3.server, "PUT", rf"/{STEP}/\.ckpt-writing$") as held:
        b = start("cp", SRC, dst, "--step", STEP, mem_limit=None)
        held.wait_reached(b)
        other = meanwhile()
    return b.pid, finish(b), other


@pytest.mark.moto_only
def test_resumed_cp_racing_prune_clean_tmp_commits_a_whole_step(s3: Any, s3_prefix: str) -> None:
    """prune --clean-tmp sees the leftover old enough, but the rerun holds the root's write
    claim: prune leaves it (naming the writer), the rerun commits the whole step."""
    dst = _url(s3_prefix)

    def prune() -> Run:
        return ckpt(
            "prune", dst, "--clean-tmp", "--tmp-min-age", "0s", "--yes", "--json", mem_limit=None
        )

    pid, rb, pruned = _resume_held_while(s3, s3_prefix, dst, prune)
    assert pruned.code == 0, pruned.stderr
    assert rb.code == 0, rb.stderr
    assert _committed(dst) == [400, 500]
    want = _rel_files(SRC / STEP)
    assert want, SRC
    missing = sorted(set(want) - _step_keys(s3, s3_prefix))
    assert missing == [], f"committed step {STEP} lacks {len(missing)} files: {missing[:3]}"
    assert ckpt("verify", dst, "--deep", mem_limit=None).code == 0
    skipped = {s["name"]: s["why"] for s in pruned.json()["outcome"]["skipped"]}
    assert f"cp pid {pid}" in skipped.get(STEP, ""), pruned.stdout


@pytest.mark.moto_only
def test_writer_never_commits_a_step_whose_file_vanished(s3: Any, s3_prefix: str) -> None:
    """Something that knows no claim (a person, a trainer's cleanup) deletes a file the rerun
    planned to keep: the rerun checks its step just before the markers and fails, naming the
    file and saying to rerun; the step is not committed. The next rerun completes it."""
    dst = _url(s3_prefix)
    victim = f"{s3_prefix}/dst/{STEP}/default/_METADATA"

    def delete() -> None:
        s3.client.delete_object(Bucket=BUCKET, Key=victim)

    _, rb, _ = _resume_held_while(s3, s3_prefix, dst, delete)
    assert rb.code == 3, rb.stderr
    line = _one_line(rb)
    assert "default/_METADATA" in line and "not committed" in line and "rerun" in line, line
    assert "commit_success.txt" not in _step_keys(s3, s3_prefix)
    assert _committed(dst) == [400]
    again = ckpt("cp", SRC, dst, "--step", STEP, mem_limit=None)
    assert again.code == 0, again.stderr
    assert _committed(dst) == [400, 500]
    assert ckpt("verify", dst, "--deep", mem_limit=None).code == 0


@pytest.mark.moto_only
@pytest.mark.parametrize("command", ["reshard", "migrate"])
def test_step_writer_racing_prune_clean_tmp(
    s3: Any, s3_prefix: str, tmp_path: Path, command: str
) -> None:
    """A reshard or migrate writing a step in place (held before its ``_METADATA``: its arrays
    are in the bucket) looks like an unfinished save to prune --clean-tmp --tmp-min-age 0s;
    it holds the root's claim, so prune leaves it and the writer commits a valid step."""
    dst = _url(s3_prefix)
    assert ckpt("reshard", SRC, dst, *MESH, "--step", "400", mem_limit=None).code == 0
    if command == "migrate":
        spec = tmp_path / "spec.yaml"
        spec.write_text("rules:\n  - {op: rename, from: 'step', to: 'step'}\n")
        args = ["--spec", str(spec)]
    else:
        args = MESH
    w, pruned = _while_held(
        s3, "PUT", rf"/{STEP}/default/_METADATA$",
        [command, SRC, dst, *args],
        ["prune", dst, "--clean-tmp", "--tmp-min-age", "0s", "--yes", "--json"],
    )  # fmt: skip
    rw = finish(w)
    assert pruned.code == 0, pruned.stderr
    assert rw.code == 0, rw.stderr
    assert _committed(dst) == [400, 500]
    deep = ckpt("verify", dst, "--deep", mem_limit=None)
    assert deep.code == 0, deep.stdout[-600:]
    skipped = {s["name"]: s["why"] for s in pruned.json()["outcome"]["skipped"]}
    assert f"{command} pid {w.pid}" in skipped.get(STEP, ""), pruned.stdout


@pytest.mark.moto_only
def test_pin_never_reports_a_step_that_prune_deleted(s3: Any, s3_prefix: str) -> None:
    """pin looks at the root, then waits for the lock (held at its lock read) while a prune
    deletes step 400: under the lock pin lists again, finds step 400 gone and says so; no pin
    object is left where step 400 was."""
    url = s3.put_dir(SRC, f"{s3_prefix}/dst")
    p, pruned = _while_held(
        s3, "GET", r"/\.ckpt-prune\.lock$",
        ["pin", url, "400", "--note", "paper"],
        ["prune", url, "--keep-last", "1", "--yes"],
    )  # fmt: skip
    rp = finish(p)
    assert pruned.code == 0, pruned.stderr
    assert _committed(url) == [500]
    assert rp.code == 3, rp.stdout + rp.stderr
    assert "step 400" in _one_line(rp) and "not found" in rp.stderr, rp.stderr
    assert _step_keys(s3, s3_prefix, "400") == set()


@pytest.mark.moto_only
def test_pin_while_a_prune_runs_is_refused_naming_it(s3: Any, s3_prefix: str) -> None:
    """A prune holds the root (held at its first tombstone): pin is refused in one line that
    says the root is being pruned, by whom, and to retry the pin; the prune then finishes."""
    url = s3.put_dir(SRC, f"{s3_prefix}/dst")
    pr, refused = _while_held(
        s3, "PUT", r"/\.ckpt-deleting$", ["prune", url, "--keep-last", "1", "--yes"],
        ["pin", url, "500"],
    )  # fmt: skip
    assert finish(pr).code == 0
    assert refused.code == 3
    line = _one_line(refused)
    assert "being pruned by another process" in line and f"prune pid {pr.pid}" in line, line
    assert "retry the pin when it finishes" in line and "run this prune" not in line, line
    assert _committed(url) == [500]


@pytest.mark.moto_only
def test_recorder_racing_prune_on_a_bucket(s3: Any, s3_prefix: str) -> None:
    """verify --record holds the root while it writes its digests (held at the first): a prune
    is refused naming it; the recorder finishes clean, without taking its own lock object for
    an unknown file; nothing was deleted."""
    url = s3.put_dir(SRC, f"{s3_prefix}/dst")
    rec, pruned = _while_held(
        s3, "PUT", r"/_CKPT_DIGESTS\.json$", ["verify", url, "--record", "--strict", "--json"],
        ["prune", url, "--keep-last", "1", "--yes"],
    )  # fmt: skip
    recorded = finish(rec)
    assert pruned.code == 3
    assert "verify --record" in _one_line(pruned), pruned.stderr
    assert recorded.code == 0, recorded.stdout[-600:]
    codes = [p["code"] for p in json.loads(recorded.stdout)["problems"]]
    assert "unknown-file" not in codes, recorded.stdout[-600:]
    assert _committed(url) == [300, 400, 500]


@pytest.mark.moto_only
def test_two_cps_into_one_bucket_root(s3: Any, s3_prefix: str) -> None:
    """cp A holds the root (held at its first marker); cp B to the same root is refused in one
    line naming A; A commits every step whole."""
    dst = _url(s3_prefix)
    a, rb = _while_held(s3, "PUT", r"/_CHECKPOINT_METADATA$", ["cp", SRC, dst], ["cp", SRC, dst])
    ra = finish(a)
    assert rb.code == 3
    assert f"cp pid {a.pid}" in _one_line(rb), rb.stderr
    assert ra.code == 0, ra.stderr
    assert _committed(dst) == [300, 400, 500]
    assert ckpt("verify", dst, "--deep", mem_limit=None).code == 0


@pytest.fixture(scope="module")
def big_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real Orbax step whose largest file is over one multipart part (8 MiB)."""
    return save_orbax(tmp_path_factory.mktemp("big") / "S", step=5, mib=24)


@pytest.mark.moto_only
def test_source_object_deleted_during_cp_is_named(
    s3: Any, s3_prefix: str, big_source: Path
) -> None:
    """The source's largest object is deleted while cp reads it (its first ranged read held):
    cp fails in one line that names that source object and says to rerun, not the destination
    with a cause of "None"; nothing of the step is committed."""
    files = _rel_files(big_source)
    assert files
    rel, size = max(files.items(), key=lambda kv: kv[1])
    assert size > 8 << 20, files
    src = s3.put_dir(big_source, f"{s3_prefix}/src")
    dst = _url(s3_prefix)
    victim = f"{s3_prefix}/src/{rel}"
    with hold(s3.server, "GET", re.escape(victim) + "$") as held:
        c = start("cp", src, dst, mem_limit=None)
        held.wait_reached(c)
        s3.client.delete_object(Bucket=BUCKET, Key=victim)
    rc = finish(c)
    assert rc.code == 3, rc.stderr
    line = _one_line(rc)
    assert f"{src}/{rel}" in line and "vanished" in line and "rerun" in line, line
    assert "None" not in line, line
    assert not any(
        k.endswith("/5/commit_success.txt") for k in keys(s3.client, f"{s3_prefix}/dst/")
    )


def test_verify_record_strict_passes_on_a_clean_root_while_a_writer_holds_it(
    tmp_path: Path,
) -> None:
    """ckpt's own files are not unknown files: the recorder's own ``.ckpt-prune.lock`` and a
    running writer's ``.ckpt-write.lock`` beside clean steps pass ``--record --strict``."""
    from ckpt_cli.core.storage import open_location
    from ckpt_cli.core.write.claim import claim_root
    from tests.support.prune_roots import copy_steps

    root = copy_steps(tmp_path / "R", [1, 2])
    claim = claim_root(open_location(str(root)), "cp")
    try:
        run = ckpt("verify", root, "--record", "--strict", "--json", mem_limit=None)
    finally:
        claim.release()
    assert run.code == 0, run.stdout[-600:] + run.stderr
    doc = run.json()
    assert doc["problems"] == [], doc["problems"]


def test_resumed_cp_racing_prune_clean_tmp_on_local_disk(tmp_path: Path) -> None:
    """The same pair on local disk, forced by the shim: a killed cp's tmp step (its owner record
    inside) is resumed by a rerun stopped as it re-marks it; prune --clean-tmp --tmp-min-age 0s
    leaves it, naming the rerun, which then commits the whole step."""
    dst = tmp_path / "dst"
    assert ckpt("cp", SRC, dst, "--step", "400").code == 0
    killed = ckpt(
        "cp", SRC, dst, "--step", STEP, spec={"on_write": "_CHECKPOINT_METADATA", "signal": "KILL"}
    )
    assert killed.code == -9, killed.stderr
    leftovers = [p for p in dst.iterdir() if p.name.startswith(f"{STEP}.orbax-checkpoint-tmp")]
    assert len(leftovers) == 1 and (leftovers[0] / ".ckpt-owner").is_file(), leftovers
    b = start("cp", SRC, dst, "--step", STEP, spec={"on_write": ".ckpt-owner", "signal": "STOP"})
    assert wait_stopped_or_exited(b), finish(b).stderr
    pruned = ckpt("prune", dst, "--clean-tmp", "--tmp-min-age", "0s", "--yes", "--json")
    rb = finish(b)
    assert pruned.code == 0, pruned.stderr
    assert rb.code == 0, rb.stderr
    assert _committed(str(dst)) == [400, 500]
    want = _rel_files(SRC / STEP)
    assert want and _rel_files(dst / STEP).keys() >= want.keys()
    assert ckpt("verify", dst, "--deep").code == 0
    skipped = {s["name"]: s["why"] for s in pruned.json()["outcome"]["skipped"]}
    assert f"cp pid {b.pid}" in skipped.get(leftovers[0].name, ""), pruned.stdout


@pytest.mark.moto_only
def test_pin_of_a_step_deleted_by_a_trainer_meanwhile_leaves_no_pin(
    s3: Any, s3_prefix: str
) -> None:
    """A trainer's own retention (no lock) deletes step 400 while pin writes its pin (held at
    that PUT): pin says the step was deleted (exit 3) and removes its pin object, which would
    otherwise be the only object left of a dead step."""
    url = s3.put_dir(SRC, f"{s3_prefix}/dst")
    rp = _deleted_while_held(
        s3, f"{s3_prefix}/dst/400/", r"/400/_CKPT_PINNED\.json$", ["pin", url, "400"]
    )
    assert rp.code == 3, rp.stdout + rp.stderr
    assert "deleted while it was being pinned" in _one_line(rp), rp.stderr
    assert _step_keys(s3, s3_prefix, "400") == set()
    assert _committed(url) == [300, 500]


@pytest.mark.moto_only
def test_step_writer_whose_step_was_deleted_meanwhile_says_so(s3: Any, s3_prefix: str) -> None:
    """Something that knows no claim deletes every object of the step a reshard is writing (held
    before its ``_METADATA``): the reshard fails in one line saying a file of its step is gone
    and the step is not committed, with the hint to rerun; nothing of step 500 is left."""
    dst = _url(s3_prefix)
    assert ckpt("reshard", SRC, dst, *MESH, "--step", "400", mem_limit=None).code == 0
    rw = _deleted_while_held(
        s3, f"{s3_prefix}/dst/{STEP}/", rf"/{STEP}/default/_METADATA$", ["reshard", SRC, dst, *MESH]
    )
    assert rw.code == 3, rw.stderr
    line = _one_line(rw)
    assert "gone just before step 500 was committed" in line and "rerun the reshard" in line, line
    assert _committed(dst) == [400]
    assert "commit_success.txt" not in _step_keys(s3, s3_prefix)
