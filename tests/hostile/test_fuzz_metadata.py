"""The metadata fuzz harness: every parser of Orbax metadata, driven through the CLI, never
exits other than 0, 1 or 3 and never reports an internal error.

Each target runs ``fuzz_child.py`` in its own process under a 2 GiB address-space limit: a
fixed corpus of lethal values at every top-level key, then hypothesis examples (derandomized in
the fast suite; ``--long`` / ``CKPT_FAULTS_LONG=1``: 300 random examples per target, a fresh
seed each run).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.ckpt_process import env
from tests.support.paths import REPO

CHILD = Path(__file__).resolve().parents[1] / "support" / "fuzz_child.py"
TARGETS = [
    "_METADATA",
    "_CHECKPOINT_METADATA",
    "_sharding",
    "array_metadatas",
    ".zarray",
    "zarr.json",
    "metrics",
    "_ROOT_METADATA",
]


def _long() -> bool:
    return os.environ.get("CKPT_FAULTS_LONG", "") not in ("", "0")


@pytest.mark.parametrize("target", TARGETS)
def test_fuzz_metadata_parser(request: pytest.FixtureRequest, target: str) -> None:
    long = _long() or bool(request.config.getoption("--long", default=False))
    examples = 300 if long else 8
    seed = random.randrange(1, 1 << 30) if long else 0
    proc = subprocess.run(
        [sys.executable, str(CHILD), target, str(examples), str(seed), str(2 << 30)],
        capture_output=True,
        text=True,
        env=env(),
        cwd=REPO,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["examples"] + result["corpus"] > 0
    assert result["failure"] is None, json.dumps(result["failure"], indent=1)
