"""Ctrl-C and SIGTERM stop every long command cleanly.

Each test starts a real ``ckpt`` process on the big checkpoint, interrupts it once it is reading
data, and checks what a person and a script see: exit 130 (SIGINT, sent to the process group as
a terminal's Ctrl-C) or 143 (SIGTERM, sent to the process as ``timeout`` and schedulers do),
``ckpt: interrupted`` on stderr, no verdict about the data it did not finish, no process left
running, nothing left behind (unfinished steps, locks, digest files) and the source untouched.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.interrupts import (
    CAST_SPEC,
    CKPT,
    EXIT_FOR,
    MIGRATE_BIG,
    RESHARD_BIG,
    Interrupted,
    assert_stopped_cleanly,
    interrupt,
    leftovers,
    tree_state,
)
from tests.support.paths import FIXTURES
from tests.support.remote_servers import BUCKET, S3Server, keys, s3_environment, upload
from tests.support.terminal import Terminal

SIGNALS = [signal.SIGINT, signal.SIGTERM]


def _ids(sig: signal.Signals) -> str:
    return sig.name


@pytest.mark.parametrize("sig", SIGNALS, ids=_ids)
@pytest.mark.parametrize(
    "args",
    [
        pytest.param(["verify", "{root}", "--deep"], id="verify-deep"),
        pytest.param(["verify", "{root}", "--deep", "--json"], id="verify-deep-json"),
        pytest.param(["diff", "{root}@1", "{root}@2", "--filter", "embed"], id="diff"),
        pytest.param(["inspect", "{root}", "--stats", "--flat"], id="inspect-stats"),
        # its one-chunk embedding streams at both steps at once (core/trend/read.py's _stream)
        pytest.param(["trend", "{root}", "--json"], id="trend-streamed"),
        pytest.param(
            ["trend", "{root}", "--workers", "2", "--force-split", "--json"], id="trend-workers"
        ),
        pytest.param(
            ["verify", "{root}", "--deep", "--workers", "2", "--force-split"], id="verify-workers"
        ),
    ],
)
def test_read_command_stops(big_root: Path, args: list[str], sig: signal.Signals) -> None:
    before = tree_state(big_root)
    run = interrupt([a.format(root=big_root) for a in args], sig)
    assert_stopped_cleanly(run)
    assert_no_verdict(run)
    assert tree_state(big_root) == before


#: Keys of a JSON result that describe the data: an interrupted run has nothing to say there.
DATA_KEYS = {"problems", "summary", "equal", "leaves", "checked", "outcome", "recorded"}


def assert_no_verdict(run: Interrupted) -> None:
    """Nothing on stdout about the data it did not finish: no text; with --json at most an
    error document saying it was interrupted (a JSON document for every outcome)."""
    if "--json" in run.args and run.stdout.strip():
        doc = json.loads(run.stdout)
        assert doc.get("error", {}).get("code") == "interrupted", run.describe()
        assert not DATA_KEYS & doc.keys(), run.describe()
    else:
        assert run.stdout == "", run.describe()


@pytest.mark.parametrize("sig", SIGNALS, ids=_ids)
def test_verify_record_stops_without_recording(
    big_copy: Callable[[], Path], sig: signal.Signals
) -> None:
    root = big_copy()
    before = tree_state(root)
    run = interrupt(["verify", root, "--record"], sig)
    assert_stopped_cleanly(run)
    assert_no_verdict(run)
    # Not even the steps checked before the signal get a record: the run did not finish, and a
    # later run records them all.
    assert tree_state(root) == before, leftovers(root)


@pytest.mark.parametrize("sig", SIGNALS, ids=_ids)
@pytest.mark.parametrize(
    "args",
    [
        pytest.param(RESHARD_BIG, id="reshard"),
        pytest.param(MIGRATE_BIG, id="migrate"),
        pytest.param(["average", "{root}", "{dst}", "--steps", "1,2"], id="average"),
        # The big leaf is one 256 MiB chunk: export streams it as a job of its own.
        pytest.param(["export", "{root}", "{dst}", "--threads", "2"], id="export"),
        pytest.param(
            [*RESHARD_BIG, "--workers", "2", "--unit-bytes", "32MiB", "--force-split"],
            id="reshard-workers",
        ),
    ],
)
def test_writer_stops_and_leaves_nothing(
    big_root: Path, tmp_path: Path, args: list[str], sig: signal.Signals
) -> None:
    spec = tmp_path / "cast.yaml"
    spec.write_text(CAST_SPEC)
    dst = tmp_path / "out"
    before = tree_state(big_root)
    run = interrupt([a.format(root=big_root, dst=dst, spec=spec) for a in args], sig)
    assert_stopped_cleanly(run)
    assert "wrote" not in run.stdout, run.describe()
    # No step, finished or not, and no worker database: an empty destination at most.
    assert [rel for rel in tree_state(dst)] == [], run.describe()
    assert not [p.name for p in tmp_path.iterdir() if "ckpt-tmp" in p.name], run.describe()
    assert tree_state(big_root) == before


@pytest.mark.parametrize("sig", SIGNALS, ids=_ids)
def test_reshard_on_dask_stops_its_tasks(
    big_root: Path, tmp_path: Path, sig: signal.Signals
) -> None:
    from tests.support.cluster import local_cluster

    dst = tmp_path / "out"
    with local_cluster() as cluster:
        args = [a.format(root=big_root, dst=dst) for a in RESHARD_BIG]
        args += ["--executor", "dask", "--scheduler", cluster.scheduler_address]
        args += ["--unit-bytes", "16MiB", "--force-split"]
        # The workers read, not the driver: wait for the first data they write (a data file of
        # a worker's database, not 16 MiB of them: on a loaded host the poll saw that much only
        # as the last unit committed, and the signal came after the step was written).
        run = interrupt(args, sig, started=lambda pid: _data_written(dst) > 0, settle_s=0.05)
        assert_stopped_cleanly(run)
        assert _tasks_left(cluster.scheduler_address) == 0
        assert tree_state(dst) == {}, run.describe()


def _data_written(dst: Path) -> int:
    """Bytes of OCDBT data files (``d/``) under ``dst``."""
    total = 0
    for dirpath, _, files in os.walk(dst):
        if Path(dirpath).name != "d":
            continue
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                total += (Path(dirpath) / name).stat().st_size
    return total


def _tasks_left(address: str, wait_s: float = 30) -> int:
    """Tasks still held by the scheduler or running on a worker (a cancelled task runs to its
    end there), once they had ``wait_s`` to stop."""
    import time

    from distributed import Client

    def scheduler_tasks(dask_scheduler: Any) -> int:
        return sum(1 for ts in dask_scheduler.tasks.values() if ts.state != "released")

    def running(dask_worker: Any) -> int:
        return len(dask_worker.state.executing)

    with Client(address, timeout="20s") as client:
        deadline = time.monotonic() + wait_s
        while True:
            n = client.run_on_scheduler(scheduler_tasks) + sum(client.run(running).values())
            if n == 0 or time.monotonic() > deadline:
                return int(n)
            time.sleep(0.2)


# --- prune ---------------------------------------------------------------------------------


@pytest.fixture
def slow_bucket() -> Iterator[tuple[S3Server, str]]:
    """moto S3 on 127.0.0.1 holding a root of 12 real steps; each delete takes 30 ms, as a
    remote bucket's round trip does, so a prune takes seconds."""
    server = S3Server().start()
    client = server.client()
    client.create_bucket(Bucket=BUCKET)
    for n in range(1, 13):
        upload(client, FIXTURES / "seed_mlp" / "300", f"root/{n * 100}")
    try:
        yield server, f"s3://{BUCKET}/root"
    finally:
        server.before_request = None
        server.stop()


def _objects(server: S3Server) -> dict[str, bytes]:
    client = server.client()
    return {
        k: client.get_object(Bucket=BUCKET, Key=k)["Body"].read() for k in keys(client, "root/")
    }


@pytest.mark.parametrize("sig", SIGNALS, ids=_ids)
def test_prune_in_a_bucket_stops_and_says_what_is_left(
    slow_bucket: tuple[S3Server, str], sig: signal.Signals
) -> None:
    server, url = slow_bucket
    before = _objects(server)
    kept = {k: v for k, v in before.items() if k.startswith("root/1200/")}
    assert kept
    deleting = threading.Event()

    def slow(kind: str, path: str) -> None:
        if kind in ("DELETE", "POST"):
            deleting.set()
            time.sleep(0.5)  # held long enough that the signal lands while it is in flight

    server.before_request = slow
    env = s3_environment(server.endpoint)
    args = ["prune", url, "--keep-last", "1", "--yes"]
    run = interrupt(args, sig, env=env, started=lambda pid: deleting.is_set())
    server.before_request = None
    assert_stopped_cleanly(run)
    assert "deleted" not in run.stdout and "freed" not in run.stdout, run.describe()
    left = _objects(server)
    assert not [k for k in left if k.endswith(".ckpt-prune.lock")], run.describe()
    assert {k: v for k, v in left.items() if k.startswith("root/1200/")} == kept
    # A step is either untouched or named as half deleted, with the way to finish it.
    named = set(re.findall(r"\d+", run.stderr.split("left half deleted:", 1)[-1]))
    for step in sorted({k.split("/")[1] for k in left} - {"1200"}):
        mine = {k: v for k, v in left.items() if k.startswith(f"root/{step}/")}
        intact = mine == {k: v for k, v in before.items() if k.startswith(f"root/{step}/")}
        assert intact or step in named, f"step {step} half deleted, not named\n{run.describe()}"
    if named:
        assert "run the same ckpt prune again" in run.stderr, run.describe()
    again = subprocess.run(
        [CKPT, *args], env={**os.environ, **env}, capture_output=True, text=True, check=False
    )
    assert again.returncode == 0, again.stderr
    assert {k.split("/")[1] for k in _objects(server)} == {"1200"}


@pytest.mark.parametrize("sig", SIGNALS, ids=_ids)
def test_a_signal_during_the_lock_release_still_releases_it(
    slow_bucket: tuple[S3Server, str], sig: signal.Signals
) -> None:
    """The signal lands while the prune's last request, the DELETE of its lock object, is on
    the wire (held at the server, then failed): the lock is released all the same, so the
    next prune is not refused by a lock nobody holds."""
    server, url = slow_bucket
    held, sent = threading.Event(), threading.Event()
    first = [True]

    def hold_the_lock_delete(kind: str, path: str) -> None:
        if kind == "DELETE" and path.endswith(".ckpt-prune.lock") and first[0]:
            first[0] = False
            held.set()
            sent.wait(30)
            time.sleep(0.3)  # the client has taken the signal by now
            raise ConnectionResetError("held request dropped by the test")

    server.before_request = hold_the_lock_delete
    env = s3_environment(server.endpoint)
    args = ["prune", url, "--keep-last", "1", "--yes"]

    def at_the_lock_delete(pid: int) -> bool:
        if held.is_set():
            sent.set()
            return True
        return False

    run = interrupt(args, sig, env=env, started=at_the_lock_delete, settle_s=0.05)
    server.before_request = None
    assert held.is_set() and not first[0]
    assert run.code == EXIT_FOR[sig], run.describe()
    assert not [k for k in _objects(server) if k.endswith(".ckpt-prune.lock")], run.describe()


@pytest.mark.parametrize(
    "sig",
    [
        signal.SIGINT,
        signal.SIGTERM,
    ],
    ids=_ids,
)
def test_prune_interrupted_at_its_question_deletes_nothing(
    fixture_copy: Callable[[str], Path], sig: signal.Signals
) -> None:
    root = fixture_copy("seed_mlp")
    before = tree_state(root)
    term = Terminal(["prune", root, "--keep-last", "1"], 80)
    term.expect("Delete 2 steps")
    term.signal(sig)
    screen = term.finish()
    assert screen.code == EXIT_FOR[sig], screen.text
    assert "ckpt: interrupted" in screen.text
    assert tree_state(root) == before  # nothing deleted, no lock file left


_ASK_WHILE_ANOTHER_THREAD_GETS_SIGINT = """
import signal, sys, threading, time
from ckpt_cli import app, signals
from ckpt_cli.commands.prune import _ask
from ckpt_cli.errors import Interrupted
signal.signal(signal.SIGINT, signals.on_signal)

def poke():
    time.sleep(0.3)
    signal.pthread_kill(threading.get_ident(), signal.SIGINT)  # to this thread, not main

threading.Thread(target=poke, daemon=True).start()
t0 = time.monotonic()
try:
    _ask("Delete 2 steps?")
    print("answered")
except Interrupted:
    print(f"interrupted after {time.monotonic() - t0:.1f} s")
"""


def test_the_question_stops_on_a_signal_another_thread_received() -> None:
    """The kernel hands a process's signal to any of its threads; one that lands in a worker
    thread does not interrupt the main thread's read of the answer, yet prune stops at once."""
    import sys

    answer_r, answer_w = os.pipe()  # the write end stays open and unwritten: no answer comes
    proc = subprocess.Popen(
        [sys.executable, "-c", _ASK_WHILE_ANOTHER_THREAD_GETS_SIGINT],
        stdin=answer_r,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    os.close(answer_r)
    try:
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        os.close(answer_w)
    assert out.startswith("interrupted after "), (out, err)
    assert "Delete 2 steps? [y/N]: " in err
