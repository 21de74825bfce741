"""Prune beside a live trainer: a real async ``CheckpointManager`` subprocess saves a step
every 40 ms while prune runs again and again (``--keep-last 2 --clean-tmp``, default tmp age).

Counted: trials (prune runs), survived (exit 0, the newest step the run saw kept, no young
tmp dir cleaned, no internal error), steps lost (steps the trainer saved that neither a prune deleted
on purpose nor exist at the end). The trainer itself must finish cleanly: a save in progress
that prune touched would fail it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.ckpt_process import INTERNAL_ERROR, ckpt, committed_steps, env
from tests.support.fault_trials import trials
from tests.support.paths import REPO

TRAINER = Path(__file__).resolve().parents[1] / "support" / "trainer.py"


def test_prune_beside_an_async_trainer(
    request: pytest.FixtureRequest, record_faults: Any, tmp_path: Path
) -> None:
    steps = trials(request.config, fast=100, long=1000)
    root = tmp_path / "run"
    trainer = subprocess.Popen(
        [sys.executable, str(TRAINER), str(root), str(steps), "40"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env(),
        cwd=REPO,
    )
    runs, survived, failures, deleted = 0, 0, [], set()
    saved_all = tmp_path / "run.saved"
    try:
        # Prune until every save has finished; the trainer's final listing runs after that.
        while trainer.poll() is None and not saved_all.exists():
            if not root.is_dir() or not any(p.name.isdigit() for p in root.iterdir()):
                time.sleep(0.1)
                continue
            run = ckpt(
                "prune", root, "--keep-last", "2", "--clean-tmp", "--yes", "--json", mem_limit=None
            )
            runs += 1
            why = None
            if INTERNAL_ERROR in run.stderr:
                why = "internal error"
            elif run.code != 0:
                why = f"exit {run.code}: {run.stderr.strip()[-200:]}"
            else:
                doc = run.json()
                gone = {d["step"] for d in doc["delete"]} & set(
                    int(n) for n in doc["outcome"]["deleted"] if n.isdigit()
                )
                deleted |= gone
                seen = [k["step"] for k in doc["keep"]] + [d["step"] for d in doc["delete"]]
                if seen and max(seen) in gone:
                    why = f"deleted the newest step {max(seen)}"
                if any(c["kind"] == "tmp" for c in doc["clean"]):
                    why = f"cleaned a young tmp dir: {doc['clean']}"
            if why is None:
                survived += 1
            else:
                failures.append(why)
        (tmp_path / "run.go").touch()
        out, err = trainer.communicate(timeout=120)
    finally:
        if trainer.poll() is None:
            trainer.kill()
            trainer.communicate()
    assert trainer.returncode == 0, err[-2000:]
    saved = {int(line.split()[1]) for line in out.splitlines() if line.startswith("saved ")}
    final = set(json.loads(next(x for x in out.splitlines() if x.startswith("steps "))[6:]))
    on_disk = set(committed_steps(root))
    lost = saved - deleted - on_disk
    record_faults(
        trials=runs, survived=survived, steps_lost=len(lost), saves=len(saved),
        deleted=len(deleted), failures=failures,
    )  # fmt: skip
    assert runs > 0
    assert saved == set(range(1, steps + 1))
    assert not lost, sorted(lost)
    assert max(saved) in on_disk and final >= {max(saved)}
    assert survived == runs, failures
