"""Hostile inputs and faults: no ckpt process outlives its test; the fault tests count trials.

The fault tests (kills, races and a live trainer) are fast by default (a few trials each, part
of ``make test``). More trials: ``CKPT_FAULTS_LONG=1 make pytest``, or ``.venv/bin/pytest
tests/hostile --long`` (the option exists when pytest starts in this directory), or
``CKPT_FAULT_TRIALS=N`` for an exact count.
Each test stores its counts (trials, survived, steps lost) under ``.pytest_cache/d/faults/``;
``python -m tests.support.fault_trials`` prints them, as does the end of a run without xdist.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from tests.support.ckpt_process import reap
from tests.support.fault_trials import long_mode, results_dir

_STARTED = time.time()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--long", action="store_true", default=False, help="more fault trials")


@pytest.fixture(autouse=True)
def _reap_processes() -> Any:
    """No ckpt process started by a test outlives it, even a stopped one."""
    yield
    reap()


@pytest.fixture
def record_faults(request: pytest.FixtureRequest) -> Any:
    """``record_faults(trials=..., survived=..., steps_lost=..., **more)``: kept for the summary."""

    def record(**counts: Any) -> None:
        name = request.node.nodeid.split("::", 1)[1]
        if name.rfind("@") > name.rfind("]"):  # the xdist group (tests/conftest.py)
            name = name.rsplit("@", 1)[0]
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
        doc = {"test": name, "long": long_mode(request.config), **counts}
        (results_dir(request.config) / f"{safe}.json").write_text(json.dumps(doc))

    return record


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    from tests.support.fault_trials import lines

    out = lines(results_dir(config), since=_STARTED)
    if out:
        terminalreporter.section("fault trials")
        for line in out:
            terminalreporter.write_line(line)
