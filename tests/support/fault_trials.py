"""Print the counts the fault tests stored: ``python -m tests.support.fault_trials``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.support.paths import REPO

DEFAULT = REPO / ".pytest_cache" / "d" / "faults"


def lines(directory: Path = DEFAULT, since: float = 0.0) -> list[str]:
    """One line per stored result (only those written after ``since``, a time.time())."""
    if not directory.is_dir():
        return []
    out = []
    for path in sorted(directory.glob("*.json")):
        if path.stat().st_mtime < since:
            continue
        doc = json.loads(path.read_text())
        extra = {
            k: v
            for k, v in doc.items()
            if k not in ("test", "trials", "survived", "steps_lost", "long", "failures")
        }
        out.append(
            f"{doc['test']}: trials {doc.get('trials')}, survived {doc.get('survived')}, "
            f"steps lost {doc.get('steps_lost', 0)}"
            + (f", {json.dumps(extra)}" if extra else "")
            + (" (long)" if doc.get("long") else "")
        )
        for failure in doc.get("failures", [])[:5]:
            out.append(f"    failed: {failure}")
    return out


if __name__ == "__main__":
    print("\n".join(lines()) or "no fault results stored yet")


RESULTS = "faults"


def long_mode(config: pytest.Config) -> bool:
    try:
        flag = bool(config.getoption("--long"))
    except ValueError:
        flag = False
    return flag or os.environ.get("CKPT_FAULTS_LONG", "") not in ("", "0")


def trials(config: pytest.Config, fast: int, long: int) -> int:
    if os.environ.get("CKPT_FAULT_TRIALS"):
        return int(os.environ["CKPT_FAULT_TRIALS"])
    return long if long_mode(config) else fast


def results_dir(config: pytest.Config) -> Path:
    cache = getattr(config, "cache", None)
    if cache is not None:
        return Path(cache.mkdir(RESULTS))
    out = Path(config.rootpath) / ".pytest_cache" / "d" / RESULTS
    out.mkdir(parents=True, exist_ok=True)
    return out
