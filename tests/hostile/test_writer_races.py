"""Two writers against one destination, and a recorder (``verify --record``) racing prune:
random start offsets, plus one forced interleaving each (the shim stops the first process at a
chosen write) so that the outcome does not depend on luck.

A two-writer trial survives when exactly one writer commits, its step passes ``verify --deep``,
and the other is refused with one line. A recorder trial survives when no pruned step comes
back (no directory holding only digest files) and Orbax lists the same steps as ckpt.
"""

from __future__ import annotations

import random
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.ckpt_process import (
    INTERNAL_ERROR,
    Run,
    ckpt,
    committed_steps,
    finish,
    orbax_steps,
    phantoms,
    save_orbax,
    start,
    wait_stopped_or_exited,
)
from tests.support.fault_trials import trials
from tests.support.prune_roots import copy_steps

A_ARGS = ["--mesh", "data=8"]
B_ARGS = ["--mesh", "data=4,model=2", "--rule", "params.*kernel=[null, model]"]


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_orbax(tmp_path_factory.mktemp("src") / "S", step=5, mib=8)


def _judge_writers(ra: Run, rb: Run, dst: Path) -> str | None:
    codes = sorted([ra.code, rb.code])
    if INTERNAL_ERROR in ra.stderr + rb.stderr:
        return "internal error"
    if codes != [0, 3]:
        return f"exit codes {ra.code}, {rb.code}"
    loser = rb if rb.code == 3 else ra
    if len([x for x in loser.stderr.splitlines() if x.strip()]) != 1:
        return f"loser said: {loser.stderr[-200:]}"
    if committed_steps(dst) != [5]:
        return f"committed {committed_steps(dst)}"
    deep = ckpt("verify", dst, "--deep")
    if deep.code != 0:
        return f"committed step fails verify --deep ({deep.stdout.count('error ')} errors)"
    return None


def test_two_writers_one_destination(
    request: pytest.FixtureRequest, record_faults: Any, tmp_path: Path, source: Path
) -> None:
    n = trials(request.config, fast=3, long=30)
    rng = random.Random(n)
    survived, failures = 0, []
    for i in range(n):
        dst = tmp_path / f"dst{i}"
        if i == 0:  # forced: A stopped before its metadata, B runs and stops there too
            pause = {"on_write": "_METADATA", "nth": 1, "signal": "STOP"}
            a = start("reshard", source, dst, *A_ARGS, spec=pause)
            assert wait_stopped_or_exited(a)
            b = start("reshard", source, dst, *B_ARGS, spec=pause)
            wait_stopped_or_exited(b)
            ra = finish(a)
            rb = finish(b)
            how = "forced"
        else:
            offset = rng.uniform(0, 1.5)
            a = start("reshard", source, dst, *A_ARGS)
            time.sleep(offset)
            b = start("reshard", source, dst, *B_ARGS)
            ra, rb = finish(a), finish(b)
            how = f"offset {offset:.2f} s"
        why = _judge_writers(ra, rb, dst)
        if why is None:
            survived += 1
        else:
            failures.append(f"{how}: {why}")
        shutil.rmtree(dst, ignore_errors=True)
    record_faults(trials=n, survived=survived, steps_lost=0, failures=failures)
    assert survived == n, failures


def test_recorder_racing_prune(
    request: pytest.FixtureRequest, record_faults: Any, tmp_path: Path
) -> None:
    n = trials(request.config, fast=3, long=30)
    rng = random.Random(n)
    survived, failures, phantom_steps = 0, [], 0
    for i in range(n):
        root = copy_steps(tmp_path / f"R{i}", range(1, 9))
        if i == 0:  # forced: the recorder stopped after its deep pass, before writing
            rec = start(
                "verify", root, "--record", spec={"on_write": "*", "nth": 1, "signal": "STOP"}
            )
            assert wait_stopped_or_exited(rec)
            pruned = ckpt("prune", root, "--keep-last", "2", "--keep-step", "1", "--yes")
            recorded = finish(rec)
            how = "forced"
        else:
            offset = rng.uniform(0, 1.5)
            rec = start("verify", root, "--record")
            time.sleep(offset)
            pruned = ckpt("prune", root, "--keep-last", "2", "--keep-step", "1", "--yes")
            recorded = finish(rec)
            how = f"offset {offset:.2f} s"
        ghosts = phantoms(root)
        phantom_steps += len(ghosts)
        listed = committed_steps(root)
        why = None
        if INTERNAL_ERROR in pruned.stderr + recorded.stderr:
            why = "internal error"
        elif ghosts:
            why = f"phantom steps {ghosts}"
        elif listed != orbax_steps(root):
            why = f"ckpt lists {listed}, Orbax {orbax_steps(root)}"
        elif pruned.code == 0 and listed != [1, 7, 8]:
            why = f"after prune: {listed}"
        if why is None:
            survived += 1
        else:
            failures.append(f"{how}: {why} (prune {pruned.code}, record {recorded.code})")
        shutil.rmtree(root, ignore_errors=True)
    record_faults(
        trials=n, survived=survived, steps_lost=0, phantom_steps=phantom_steps, failures=failures
    )
    assert survived == n, failures
