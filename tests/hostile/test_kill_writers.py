"""Writers killed at random points (SIGKILL, SIGINT): the source is unchanged and nothing that
looks committed is partial.

A point is either the N-th file write the writer makes (N drawn from all of them, counted by a
full run first, so every phase is reached: tmp dir, arrays, metadata, commit, rename) or a
random time after start. After each trial: the source's snapshot is unchanged; every step
directory the destination shows is committed for ckpt and passes ``verify --deep`` (a killed
writer may leave its tmp dir behind, which is not a step). On S3 likewise: a step either has
``commit_success.txt`` and verifies, or is ``uncommitted``.
"""

from __future__ import annotations

import random
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.ckpt_process import (
    ckpt,
    committed_steps,
    finish,
    kill,
    orbax_restore,
    save_orbax,
    snapshot,
    start,
)
from tests.support.fault_trials import long_mode, trials

SPEC = """rules:
  - {op: rename, from: 'params\\.Dense_(\\d+)\\.(.*)', to: 'params.layer_\\1.\\2'}
  - {op: cast, match: 'params\\..*kernel', dtype: bfloat16}
"""


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_orbax(tmp_path_factory.mktemp("src") / "S", step=5, mib=4)


def _args(command: str, src: Path, dst: Any, spec: Path) -> list[Any]:
    if command == "reshard":
        return [
            "reshard",
            src,
            dst,
            "--mesh",
            "data=4,model=2",
            "--rule",
            "params.*kernel=[data, model]",
        ]
    return ["migrate", src, dst, "--spec", spec]


def _count_writes(command: str, src: Path, tmp: Path, spec: Path) -> int:
    count = tmp / "count"
    run = ckpt(
        *_args(command, src, tmp / "count-dst", spec),
        spec={"on_write": "*", "nth": 0, "count_to": str(count)},
    )
    assert run.code == 0, run.stderr
    shutil.rmtree(tmp / "count-dst")
    return int(count.read_text())


def _judge_local(src: Path, before: dict[str, str], dst: Path, deep_restore: bool) -> str | None:
    if snapshot(src) != before:
        return "source changed"
    if not dst.exists():
        return None
    steps = [p for p in dst.iterdir() if p.is_dir() and p.name.isdigit()]
    if not steps:
        return None
    committed = committed_steps(dst)
    for p in steps:
        if int(p.name) not in committed:
            return f"step dir {p.name} is not committed for ckpt"
    deep = ckpt("verify", dst, "--deep")
    if deep.code != 0:
        return f"verify --deep {deep.code}: {deep.stdout[-300:]}"
    if deep_restore:
        for step in committed:
            why = orbax_restore(dst, step)
            if why:
                return f"orbax cannot restore {step}: {why}"
    return None


@pytest.mark.parametrize("command", ["reshard", "migrate"])
def test_killed_writer_leaves_no_committed_partial_step(
    request: pytest.FixtureRequest, record_faults: Any, tmp_path: Path, source: Path, command: str
) -> None:
    n = trials(request.config, fast=4, long=40)
    rng = random.Random(f"{command}-{n}")
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    before = snapshot(source)
    total = _count_writes(command, source, tmp_path, spec)
    assert total > 3
    survived, failures, leftovers, committed_runs = 0, [], 0, 0
    for i in range(n):
        dst = tmp_path / f"dst{i}"
        sig = rng.choice(["KILL", "INT"])
        if i % 2 == 0:
            nth = rng.randint(1, total)
            proc = start(
                *_args(command, source, dst, spec),
                spec={"on_write": "*", "nth": nth, "signal": sig},
            )
            point = f"write {nth}/{total}"
            run = finish(proc)
        else:
            delay = rng.uniform(0.3, 3.0)
            proc = start(*_args(command, source, dst, spec))
            time.sleep(delay)
            point = f"{delay:.2f} s"
            run = kill(proc, getattr(signal, "SIG" + sig)) if proc.poll() is None else finish(proc)
        why = _judge_local(source, before, dst, deep_restore=long_mode(request.config))
        if dst.exists() and any("tmp" in p.name for p in dst.iterdir()):
            leftovers += 1
        committed_runs += bool(dst.exists() and committed_steps(dst))
        if why is None:
            survived += 1
        else:
            failures.append(f"{sig} at {point} (exit {run.code}): {why}")
        shutil.rmtree(dst, ignore_errors=True)
    record_faults(
        trials=n, survived=survived, steps_lost=0, failures=failures,
        tmp_left_by_kill=leftovers, finished_before_kill=committed_runs,
    )  # fmt: skip
    assert survived == n, failures


def test_killed_writer_on_s3(
    request: pytest.FixtureRequest, record_faults: Any, s3: Any, s3_prefix: str, source: Path
) -> None:
    """On a bucket the step is written in place: a kill leaves it ``uncommitted``, never a
    committed partial step."""
    n = trials(request.config, fast=1, long=10)
    rng = random.Random(n)
    survived, failures = 0, []
    for i in range(n):
        dst = f"s3://ckpt-test/{s3_prefix}/dst{i}"
        proc = start(*_args("reshard", source, dst, Path("-")), mem_limit=None)
        delay = rng.uniform(0.5, 3.5)
        time.sleep(delay)
        if proc.poll() is None:
            kill(proc)
        listed = ckpt("ls", dst, "--json", mem_limit=None)
        committed = (
            [s["step"] for s in listed.json()["steps"] if s["status"] == "committed"]
            if listed.code == 0
            else []
        )
        why = None
        if committed:
            deep = ckpt("verify", dst, "--deep", mem_limit=None)
            why = None if deep.code == 0 else f"verify --deep {deep.code}"
        if why is None:
            survived += 1
        else:
            failures.append(f"SIGKILL at {delay:.2f} s: {why}")
    record_faults(trials=n, survived=survived, steps_lost=0, failures=failures)
    assert survived == n, failures
