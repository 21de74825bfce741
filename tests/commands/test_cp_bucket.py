"""``ckpt cp`` with buckets: moto's S3 and gcp-storage-emulator on 127.0.0.1.

Round trip local -> s3 -> gs -> local (byte-identical, restored by real Orbax); the order of
writes seen by the server (every marker after every data object of its step); a ``cp`` killed
with SIGKILL mid-copy, then rerun: nothing written twice; SIGTERM: exit 143, resumable;
``--verify`` against recorded digests; copies in flight.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.buckets import bucket_tree, tree
from tests.support.paths import FIXTURES, REPO
from tests.support.remote_servers import BUCKET, GcsServer, keys
from tests.support.storage_fixtures import S3

BOOKKEEPING = (".ckpt-write.lock", ".ckpt-writing")
MARKERS = ("commit_success.txt", "_CHECKPOINT_METADATA")


def key_of(path: str) -> str:
    """The object key of a path-style request path (``/BUCKET/KEY``)."""
    head = f"/{BUCKET}/"
    return path[len(head) :] if path.startswith(head) else path.lstrip("/")


class Writes:
    """Every PUT and DELETE the S3 server receives, in arrival order (optionally slowed)."""

    def __init__(self, s3: S3, delay: float = 0.0) -> None:
        self.log: list[tuple[str, str]] = []
        self.delay = delay
        self.active = 0
        self.max_active = 0
        self.writes = 0
        self._lock = threading.Lock()
        self.on_put: Any = None
        #: Set when the writing process is killed: what it still has on the wire is refused.
        self.dead = False
        s3.server.before_request = self

    def __call__(self, method: str, path: str) -> None:
        if method == "GET":  # reads are logged, never slowed or refused
            with self._lock:
                self.log.append((method, key_of(path)))
            return
        if method not in ("PUT", "DELETE", "POST"):
            return
        if self.dead:
            raise ConnectionError("the writer was killed")
        key = key_of(path)
        with self._lock:
            self.log.append((method, key))
            self.active += 1
            self.max_active = max(self.max_active, self.active)
            self.writes += 1
            n = self.writes
        try:
            if self.on_put is not None and method == "PUT":
                self.on_put(n, key)
            if self.delay:
                time.sleep(self.delay)
            if self.dead:
                raise ConnectionError("the writer was killed")
        finally:
            with self._lock:
                self.active -= 1

    def puts(self, prefix: str, method: str = "PUT") -> list[str]:
        return [
            k[len(prefix) + 1 :] for m, k in self.log if m == method and k.startswith(prefix + "/")
        ]


def restore_500(root: Path) -> dict[str, np.ndarray]:
    import jax
    import orbax.checkpoint as ocp

    with ocp.CheckpointManager(root.absolute()) as mgr:
        assert 500 in mgr.all_steps()
        restored = mgr.restore(500)
    flat = jax.tree_util.tree_flatten_with_path(restored)[0]
    return {
        ".".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path): np.asarray(v)
        for path, v in flat
    }


def test_round_trip_local_s3_gs_local(
    cli: Any, s3: S3, s3_prefix: str, gcs: GcsServer, tmp_path: Path
) -> None:
    src = FIXTURES / "seed_mlp"
    up = f"s3://{BUCKET}/{s3_prefix}/run"
    across = f"gs://{BUCKET}/cp-{uuid.uuid4().hex[:8]}/run"
    back = tmp_path / "back"
    for a, b in ((src, up), (up, across), (across, back)):
        r = cli("cp", a, b, "--json")
        assert r.code == 0, (a, b, r.stderr)
        assert r.json()["outcome"]["copied_objects"] == len(tree(src)), (a, b)
    for url in (up, across):
        listed = cli("ls", url, "--json")
        assert listed.code == 0, listed.stderr
        assert [(s["step"], s["status"]) for s in listed.json()["steps"]] == [
            (300, "committed"), (400, "committed"), (500, "committed"),
        ]  # fmt: skip
    assert bucket_tree(s3, f"{s3_prefix}/run", tmp_path) == tree(src)
    assert tree(back) == tree(src)
    assert cli("verify", across, "--deep").code == 0
    want, got = restore_500(src), restore_500(back)
    assert want and set(got) == set(want)
    for name, value in want.items():
        assert got[name].dtype == value.dtype and got[name].tobytes() == value.tobytes(), name


@pytest.mark.moto_only
def test_markers_go_after_every_data_object(
    cli: Any, s3: S3, s3_prefix: str, tmp_path: Path
) -> None:
    """The server's arrival order: in each step every data object, then _CHECKPOINT_METADATA,
    the item's commit_success.txt, the step's; .ckpt-writing first and deleted last. A local
    step without commit_success.txt (Orbax before 0.12.3) gets one in the bucket."""
    src = tmp_path / "src"
    shutil.copytree(FIXTURES / "seed_mlp", src)
    for marker in src.rglob("commit_success.txt"):
        if marker.parent.name == "300" or marker.parent.parent.name == "300":
            marker.unlink()
    writes = Writes(s3, delay=0.01)
    dst = f"s3://{BUCKET}/{s3_prefix}"
    r = cli("cp", src, dst, "--concurrency", "8", "--json")
    s3.server.before_request = None
    assert r.code == 0, r.stderr
    assert [s["adds_commit_marker"] for s in r.json()["steps"]] == [True, False, False]
    log = [(m, k[len(s3_prefix) + 1 :]) for m, k in writes.log if k.startswith(s3_prefix + "/")]
    for step in ("300", "400", "500"):
        mine = [
            (i, m, k[len(step) + 1 :]) for i, (m, k) in enumerate(log) if k.startswith(step + "/")
        ]
        data = [
            i
            for i, m, k in mine
            if m == "PUT" and k.rsplit("/", 1)[-1] not in (*MARKERS, *BOOKKEEPING)
        ]
        assert len(data) >= 10, step
        order = [k for i, m, k in mine if m == "PUT" and k.rsplit("/", 1)[-1] in MARKERS]
        first_marker = min(i for i, m, k in mine if k.rsplit("/", 1)[-1] in MARKERS)
        assert max(data) < first_marker, step
        assert order[0] == "_CHECKPOINT_METADATA" and order[-1] == "commit_success.txt", order
        if step != "300":
            assert order[1:-1] == ["default/commit_success.txt"], order
        writing = [i for i, m, k in mine if k == ".ckpt-writing"]
        assert [log[i][0] for i in writing] == ["PUT", "DELETE"], step
        assert writing[0] < min(data) and writing[1] > max(
            i for i, m, k in mine if k == "commit_success.txt"
        )
    assert writes.max_active >= 4  # copies in flight
    assert writes.max_active <= 8 + 1  # bounded: --concurrency, plus the step's marker
    got = bucket_tree(s3, s3_prefix, tmp_path)
    assert got.pop("300/commit_success.txt").startswith(b"Checkpoint commit was successful")
    assert got == tree(src)


def _cp_process(src: Path | str, dst: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "ckpt_cli", "cp", str(src), dst, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ),
        cwd=REPO,
    )


def _data_puts(keys_: list[str]) -> list[str]:
    return [k for k in keys_ if k.rsplit("/", 1)[-1] not in BOOKKEEPING]


@pytest.mark.moto_only
def test_killed_copy_reruns_without_copying_anything_twice(
    cli: Any, s3: S3, s3_prefix: str, tmp_path: Path
) -> None:
    src = FIXTURES / "seed_mlp"
    dst = f"s3://{BUCKET}/{s3_prefix}"
    writes = Writes(s3, delay=0.02)
    proc: list[subprocess.Popen[str]] = []

    def kill_at_the_12th(n: int, key: str) -> None:
        if n == 12 and proc:
            writes.dead = True
            proc[0].send_signal(signal.SIGKILL)
            proc[0].wait()
            raise ConnectionError("killed by the test")

    writes.on_put = kill_at_the_12th
    proc.append(_cp_process(src, dst, "--concurrency", "4"))
    proc[0].communicate(timeout=120)
    assert proc[0].returncode == -signal.SIGKILL
    # The server may still hold requests the process sent before it died: those past the
    # hook finish storing, the rest are refused (``writes.dead``); list only after that.
    s3.server.wait_idle()
    first = _data_puts(writes.puts(s3_prefix))
    present = {k[len(s3_prefix) + 1 :] for k in keys(s3.client, s3_prefix + "/")}
    present_data = {k for k in present if k.rsplit("/", 1)[-1] not in BOOKKEEPING}
    total = set(tree(src))
    assert present_data and present_data < total
    # Nothing looks committed that is not whole.
    for step in ("300", "400", "500"):
        if f"{step}/commit_success.txt" in present:
            assert {k for k in total if k.startswith(step + "/")} <= present_data, step

    again = Writes(s3)
    r = cli("cp", src, dst, "--json")
    s3.server.before_request = None
    assert r.code == 0, r.stderr
    second = _data_puts(again.puts(s3_prefix))
    assert not set(second) & present_data, "copied twice"
    assert len(second) == len(set(second)), "one object written twice in the rerun"
    assert set(second) | present_data == total
    # What was there is known from the listing's ETags and the source's bytes: not read back.
    read_back = set(again.puts(s3_prefix, "GET")) & present_data
    assert not read_back, sorted(read_back)
    assert r.json()["outcome"]["copied_objects"] == len(second)
    assert r.json()["outcome"]["skipped_objects"] == len(present_data)
    assert len(first) >= len(present_data) >= 1
    assert bucket_tree(s3, s3_prefix, tmp_path) == tree(src)
    assert [s["status"] for s in cli("ls", dst, "--json").json()["steps"]] == ["committed"] * 3


@pytest.mark.moto_only
def test_sigterm_mid_copy_exits_143_and_the_rerun_finishes(
    cli: Any, s3: S3, s3_prefix: str, tmp_path: Path
) -> None:
    src = FIXTURES / "seed_mlp"
    dst = f"s3://{BUCKET}/{s3_prefix}"
    writes = Writes(s3, delay=0.1)
    proc: list[subprocess.Popen[str]] = []

    def term_at_the_8th(n: int, key: str) -> None:
        if n == 8 and proc:
            proc[0].send_signal(signal.SIGTERM)

    writes.on_put = term_at_the_8th
    proc.append(_cp_process(src, dst, "--concurrency", "4"))
    out, err = proc[0].communicate(timeout=120)
    s3.server.before_request = None
    assert proc[0].returncode == 143, err
    assert err.strip().splitlines()[-1] == "ckpt: interrupted", err
    assert "copied" not in out  # the plan, printed before the copy, and no result
    listed = cli("ls", dst, "--json")
    steps = listed.json()["steps"] if listed.code == 0 else []
    assert all(s["status"] != "committed" for s in steps if s["step"] == 500)
    r = cli("cp", src, dst)
    assert r.code == 0, r.stderr
    assert bucket_tree(s3, s3_prefix, tmp_path) == tree(src)


@pytest.mark.moto_only
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=lambda s: s.name)
def test_interrupted_copy_says_which_partial_step_it_keeps_and_the_rerun_resumes_it(
    cli: Any, s3: S3, s3_prefix: str, tmp_path: Path, sig: signal.Signals
) -> None:
    """Ctrl-C or SIGTERM while step 400 is being copied (its first data object held at the
    server): the steps done are committed, step 400's files stay in ckpt's tmp dir, which no
    reader takes for a step, and stderr says so and where, since a rerun resumes from them."""
    from tests.support.interrupts import EXIT_FOR, interrupt

    for n in (100, 200, 300, 400, 500):
        s3.put_dir(FIXTURES / "seed_mlp" / "300", f"{s3_prefix}/src/{n}")
    src, dst = f"s3://{BUCKET}/{s3_prefix}/src", tmp_path / "dst"
    held, sent = threading.Event(), threading.Event()

    def hold_a_data_read_of_400(method: str, path: str) -> None:
        ours = method == "GET" and f"/{s3_prefix}/src/400/" in path and "/d/" in path
        if ours and not held.is_set():
            held.set()
            sent.wait(30)
            time.sleep(0.3)  # the signal has landed: this copy stops at its next piece

    def others_committed_400_held(pid: int) -> bool:
        done = all((dst / str(n)).is_dir() for n in (100, 200, 300, 500))
        if held.is_set() and done:
            sent.set()
            return True
        return False

    s3.server.before_request = hold_a_data_read_of_400
    run = interrupt(["cp", src, dst], sig, started=others_committed_400_held, settle_s=0.05)
    s3.server.before_request = None
    assert run.code == EXIT_FOR[sig], run.describe()
    lines = run.stderr.strip().splitlines()
    assert lines[-1] == "ckpt: interrupted", run.describe()
    said = next((x for x in lines if x.startswith("ckpt: interrupted: ")), "")
    kept = next(dst.glob("400.orbax-checkpoint-tmp-*"))
    assert said == (
        f"ckpt: interrupted: 4 of 5 steps copied; the partial step 400 is kept in {kept} "
        "so a rerun resumes it"
    ), run.describe()
    assert any(p.is_file() for p in kept.rglob("*"))
    listed = cli("ls", dst, "--json").json()["steps"]
    assert [s["step"] for s in listed if s["status"] == "committed"] == [100, 200, 300, 500]

    again = cli("cp", src, dst, "--json")
    assert again.code == 0, again.stderr
    doc = again.json()
    assert {s["name"]: s["state"] for s in doc["steps"]}["400"] == "resume"
    assert not list(dst.glob("*.orbax-checkpoint-tmp*"))
    step = tree(FIXTURES / "seed_mlp" / "300")
    for n in (100, 200, 300, 400, 500):
        assert tree(dst / str(n)) == step, n


def test_verify_against_the_record_in_a_bucket(
    cli: Any, s3: S3, s3_prefix: str, tmp_path: Path
) -> None:
    src = tmp_path / "src"
    shutil.copytree(FIXTURES / "seed_mlp", src)
    assert cli("verify", src, "--record").code == 0
    up = f"s3://{BUCKET}/{s3_prefix}/up"
    ok = cli("cp", src, up, "--verify", "--json")
    assert ok.code == 0, ok.stderr
    assert ok.json()["outcome"]["verified_objects"] > 0
    # Bucket -> local with the record carried along; then a damaged source object.
    data = sorted(keys(s3.client, f"{s3_prefix}/up/500/default/d/"))
    assert data
    body = bytearray(s3.client.get_object(Bucket=BUCKET, Key=data[0])["Body"].read())
    body[len(body) // 2] ^= 0xFF
    s3.client.put_object(Bucket=BUCKET, Key=data[0], Body=bytes(body))
    dst = f"s3://{BUCKET}/{s3_prefix}/down"
    bad = cli("cp", up, dst, "--verify")
    assert bad.code == 1
    lines = bad.stderr.strip().splitlines()
    assert len(lines) == 1 and "step 500 not copied" in lines[0], lines
    left = {k.split("/")[3] for k in keys(s3.client, f"{s3_prefix}/down/")} - {".ckpt-write.lock"}
    assert left == {"300", "400"}


def test_uncommitted_bucket_steps_are_not_copied(
    cli: Any, s3: S3, s3_prefix: str, tmp_path: Path
) -> None:
    """Orbax #394 from the other side: a bucket step without commit_success.txt may be a save
    in progress; cp leaves it, says so, and refuses it when asked for by number."""
    url = s3.put_dir(
        FIXTURES / "seed_mlp", s3_prefix, skip=lambda rel: rel == "400/commit_success.txt"
    )
    r = cli("cp", url, tmp_path / "copy", "--json")
    assert r.code == 0, r.stderr
    assert [s["step"] for s in r.json()["steps"]] == [300, 500]
    assert r.json()["skipped"] == [{"name": "400", "reason": "uncommitted (no commit_success.txt)"}]
    assert sorted(p.name for p in (tmp_path / "copy").iterdir()) == ["300", "500"]
    asked = cli("cp", url, tmp_path / "other", "--step", "400")
    assert asked.code == 3 and "uncommitted" in asked.stderr


def test_grain_iterator_step_round_trips_a_bucket_and_resumes(
    cli: Any, s3: S3, s3_prefix: str, tmp_path: Path
) -> None:
    """A step of a TrainState and grain's data-iterator item (``process_0-of-1.json``, no
    ``_METADATA``) goes up, is listed, inspected and verified on the bucket, comes back by cp byte
    for byte and by reshard, and resumes: grain yields the next batch, one training step equals the uninterrupted one."""
    pytest.importorskip("grain")
    from tests.support import training_states as ts

    src, back = tmp_path / "run", tmp_path / "back"
    run = ts.grain_run(src)
    url = f"s3://{BUCKET}/{s3_prefix}/run"
    up = cli("cp", src, url)
    assert up.code == 0, up.stderr
    assert bucket_tree(s3, f"{s3_prefix}/run", tmp_path) == tree(src)
    assert cli("ls", url, "--json").json()["steps"][0]["items"] == ["data_iter", "state"]
    parts = cli("inspect", url, "--json").json()["training_state"]["parts"]
    assert next(p for p in parts if p["part"] == "data_order")["items"] == ["data_iter"]
    checked = cli("verify", url, "--json")
    assert checked.code == 0 and checked.json()["problems"] == [], checked.stdout
    copied_back = cli("cp", url, tmp_path / "down")
    assert copied_back.code == 0, copied_back.stderr
    assert tree(tmp_path / "down") == tree(src)
    down = cli("reshard", url, back, "--mesh", "data=1")
    assert down.code == 0, down.stderr
    grain_file = Path("3/data_iter/process_0-of-1.json")
    assert (back / grain_file).read_bytes() == (src / grain_file).read_bytes()

    state, data = ts.restore_grain_run(back)
    batch, expected_batch = next(data), next(run.data)
    np.testing.assert_array_equal(batch[0], expected_batch[0])
    state, loss = ts.linen_step(state, batch)
    _, expected_loss = ts.linen_step(run.state, expected_batch)
    assert int(state.step) == ts.SAVED_STEP + 1
    assert np.isfinite(float(loss)) and float(loss) == pytest.approx(float(expected_loss), rel=1e-6)
