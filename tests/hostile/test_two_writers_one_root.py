"""Two writers, one destination. A writer owns its temporary step exclusively;
a second writer is refused at once (exit 3, one line naming the first: pid, host, start time);
a leftover is removed only when its owner is provably gone. Locally and on a bucket.

The interleaving is forced, not timed: the shim stops writer A (SIGSTOP) when it is about to
write the item's ``_METADATA`` (its arrays are written), then writer B runs against the same
destination. Before the fix B deleted A's tmp step as a dead run's leftover and wrote its own into
the same directory; A, continued, committed B's arrays under A's metadata.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.support.ckpt_process import (
    INTERNAL_ERROR,
    ckpt,
    committed_steps,
    finish,
    orbax_restore,
    start,
    wait_stopped_or_exited,
)
from tests.support.paths import FIXTURES

SRC = FIXTURES / "seed_mlp"
A_ARGS = ["--mesh", "data=8"]
B_ARGS = ["--mesh", "data=4,model=2", "--rule", "params.*kernel=[null, model]"]
PAUSE_AT_METADATA = {"on_write": "_METADATA", "nth": 1, "signal": "STOP"}


def _interleave(cmd: str, src: Path, dst: Any, extra: list[str] | None = None) -> tuple[Any, Any]:
    """A stops before its metadata; B runs (stopping at the same point if it gets there); then
    A is continued to its end, then B."""
    a = start(cmd, src, dst, *(extra or A_ARGS), spec=PAUSE_AT_METADATA)
    assert wait_stopped_or_exited(a), finish(a).stderr
    b = start(cmd, src, dst, *B_ARGS, spec=PAUSE_AT_METADATA)
    wait_stopped_or_exited(b)
    return a, b


def test_second_reshard_is_refused_and_the_first_commits_a_valid_step(tmp_path: Path) -> None:
    dst = tmp_path / "dst"
    a, b = _interleave("reshard", SRC, dst)
    ra = finish(a)
    rb = finish(b)
    # The second writer: refused at once, one line naming the first (pid, host, start time).
    assert rb.code == 3, rb.stderr
    assert len(rb.lines) == 1, rb.stderr
    assert f"pid {a.pid}" in rb.stderr and socket.gethostname() in rb.stderr, rb.stderr
    # The first writer: its step is committed, verifies and restores with Orbax.
    assert ra.code == 0, ra.stderr
    assert committed_steps(dst) == [500]
    deep = ckpt("verify", dst, "--deep")
    assert deep.code == 0, deep.stdout
    assert orbax_restore(dst, 500) == ""
    assert sorted(p.name for p in dst.iterdir() if not p.name.startswith(".")) == ["500"]


def test_second_migrate_is_refused(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text("rules:\n  - {op: rename, from: 'step', to: 'step'}\n")
    dst = tmp_path / "dst"
    a = start("migrate", SRC, dst, "--spec", spec, spec=PAUSE_AT_METADATA)
    assert wait_stopped_or_exited(a), finish(a).stderr
    rb = ckpt("migrate", SRC, dst, "--spec", spec)
    ra = finish(a)
    assert rb.code == 3 and f"pid {a.pid}" in rb.stderr, rb.stderr
    assert ra.code == 0, ra.stderr
    assert ckpt("verify", dst, "--deep").code == 0


def test_leftover_of_a_killed_writer_is_replaced(tmp_path: Path) -> None:
    """The owner is provably gone (SIGKILLed): the next writer removes its leftover and writes."""
    dst = tmp_path / "dst"
    a = start("reshard", SRC, dst, *A_ARGS, spec=PAUSE_AT_METADATA)
    assert wait_stopped_or_exited(a)
    os.kill(a.pid, signal.SIGKILL)
    finish(a)
    assert committed_steps(dst) == []
    rb = ckpt("reshard", SRC, dst, *B_ARGS)
    assert rb.code == 0, rb.stderr
    assert committed_steps(dst) == [500]
    assert ckpt("verify", dst, "--deep").code == 0
    assert [p.name for p in dst.iterdir() if "tmp" in p.name] == []


def test_an_unfinished_save_of_someone_else_is_not_deleted(tmp_path: Path) -> None:
    """A ``500.orbax-checkpoint-tmp`` in the destination that no ckpt writer owns (a trainer's
    save in progress, or one whose owner cannot be proven gone) is left alone."""
    dst = tmp_path / "dst"
    theirs = dst / "500.orbax-checkpoint-tmp"
    (theirs / "default").mkdir(parents=True)
    (theirs / "default" / "partial").write_bytes(b"a trainer is writing this")
    run = ckpt("reshard", SRC, dst, *A_ARGS)
    assert (theirs / "default" / "partial").read_bytes() == b"a trainer is writing this"
    assert run.code in (0, 3), run.stderr
    assert INTERNAL_ERROR not in run.stderr


@pytest.mark.moto_only
def test_two_writers_on_a_bucket(s3: Any, s3_prefix: str) -> None:
    """On S3 the step is written in place: writer A is held at its ``_METADATA`` PUT by the test
    server; writer B must be refused (the bucket's lock object names A), not replace A's step."""
    dst = f"s3://ckpt-test/{s3_prefix}/dst"
    held: list[threading.Event] = []
    lock = threading.Lock()

    def hold(method: str, path: str) -> None:
        if method == "PUT" and path.endswith("/default/_METADATA"):
            gate = threading.Event()
            with lock:
                held.append(gate)
            gate.wait(120)

    s3.server.before_request = hold
    try:
        a = start("reshard", SRC, dst, *A_ARGS, mem_limit=None)
        _wait_for(lambda: len(held) >= 1 or a.poll() is not None)
        assert held, finish(a).stderr
        b = start("reshard", SRC, dst, *B_ARGS, mem_limit=None)
        _wait_for(lambda: len(held) >= 2 or b.poll() is not None)
    finally:
        s3.server.before_request = None
        for gate in list(held):
            gate.set()
    ra, rb = finish(a), finish(b)
    assert rb.code == 3 and f"pid {a.pid}" in rb.stderr, rb.stderr
    assert ra.code == 0, ra.stderr
    assert ckpt("verify", dst, "--deep", mem_limit=None).code == 0


def _wait_for(cond: Any, timeout: float = 120) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.02)


def test_second_export_to_one_output_is_refused(tmp_path: Path) -> None:
    """``export`` claims its output like the step writers: A is stopped as it opens its first
    safetensors file (in its tmp dir beside OUT); B, to the same OUT, is refused at once naming
    A; A then completes a valid export and leaves neither tmp dir nor lock behind."""
    from safetensors.numpy import load_file

    out = tmp_path / "out"
    a = start(
        "export", SRC, out, "--params-only",
        spec={"on_write": "model", "nth": 1, "signal": "STOP"},
    )  # fmt: skip
    assert wait_stopped_or_exited(a), finish(a).stderr
    assert a.poll() is None, "A exited before it wrote a file"
    rb = ckpt("export", SRC, out, "--params-only")
    ra = finish(a)
    assert rb.code == 3, rb.stderr
    assert len(rb.lines) == 1 and "another ckpt writer" in rb.stderr, rb.stderr
    assert f"export pid {a.pid}" in rb.stderr, rb.stderr
    assert ra.code == 0, ra.stderr
    files = sorted(p.name for p in out.iterdir())
    assert "model.safetensors" in files, files
    tensors = load_file(out / "model.safetensors")
    assert tensors and all(v.size for v in tensors.values())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
