"""``verify --deep --max-duration`` on a 1 GiB checkpoint saved by real Orbax: it stops within
10 % of its budget, reports what it covered, and ``--rotate`` runs together read every block.

Termination is measured on a clock driven by the bytes decoded (1 s per 32 MiB), so the
assertion is about where the run stops, not about this machine's speed; one run on the real
clock only checks that a short budget really stops a run part way (no timing assertion).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ckpt_cli.core.digest.records import STATE_FILE
from ckpt_cli.core.format import scan
from ckpt_cli.core.progress import Progress
from ckpt_cli.core.storage import open_location
from ckpt_cli.core.verify.run import verify_path
from ckpt_cli.core.verify.types import VerifyOptions, VerifyReport
from tests.support.gib_checkpoint import make_big
from tests.support.world import one_json_document

pytestmark = pytest.mark.slow

RATE = 32 << 20  # simulated bytes per second
GIB = 1 << 30


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = make_big(tmp_path_factory.mktemp("big") / "run")
    yield root
    shutil.rmtree(root, ignore_errors=True)


class BytesClock:
    """Simulated time: t0 + bytes decoded so far / RATE."""

    def __init__(self) -> None:
        self.done = 0
        self.t0 = 1000.0

    def __call__(self) -> float:
        return self.t0 + self.done / RATE

    def on_progress(self, event: Progress) -> None:
        if event.action == "data" and event.unit == "bytes":
            self.done = event.done


def budgeted(root: Path, budget: float, rotate: bool = False) -> tuple[VerifyReport, BytesClock]:
    clock = BytesClock()
    options = VerifyOptions(deep=True, max_duration=budget, rotate=rotate, clock=clock)
    report = verify_path(open_location(str(root)), options, clock.on_progress)
    return report, clock


def test_stops_within_ten_percent_of_its_budget(big: Path) -> None:
    budget = 12.0  # 384 MiB at the simulated rate: about 37 % of the checkpoint
    report, _ = budgeted(big, budget)
    cov = report.coverage
    assert cov is not None and cov.stopped == "max-duration" and not cov.complete
    assert cov.of_bytes == GIB
    assert 0.9 * budget <= cov.elapsed_s <= 1.1 * budget, cov
    assert abs(cov.bytes - budget * RATE) <= 0.1 * budget * RATE, cov
    assert 0 < cov.leaves < cov.of_leaves == 16
    assert report.ok  # what it saw is clean: exit 0


class BlockSpy:
    """Which (leaf, block) reads the scan engine submits."""

    def __init__(self, monkeypatch: Any) -> None:
        self.read: list[tuple[str, tuple[tuple[int, int], ...]]] = []
        self.names: dict[int, str] = {}
        real_open, real_read = scan.open_readers, scan.read_block

        def open_readers(store: Any, tasks: Any, *rest: Any) -> Any:
            for task, reader in real_open(store, tasks, *rest):
                self.names[id(reader)] = task.name
                yield task, reader

        def read_block(reader: Any, block: Any) -> Any:
            spans = tuple((s.start, s.stop) for s in block)
            self.read.append((self.names[id(reader)], spans))
            return real_read(reader, block)

        monkeypatch.setattr(scan, "open_readers", open_readers)
        monkeypatch.setattr(scan, "read_block", read_block)
        # A whole pass streams chunks larger than the budget; budgeted runs read blocks (their
        # cursor counts blocks): the reference pass reads blocks too.
        monkeypatch.setattr(scan, "_chunk_streams", lambda *args, **kwargs: None)


def test_rotations_read_every_block(big: Path, tmp_path: Path, monkeypatch: Any) -> None:
    """The budgeted runs of one cycle read exactly the blocks of one unbudgeted deep pass: every
    block of every leaf, none twice; the cycle completes after about size / budget runs."""
    root = Path(shutil.copytree(big, tmp_path / "run"))
    spy = BlockSpy(monkeypatch)
    verify_path(open_location(str(root)), VerifyOptions(deep=True))
    full = sorted(spy.read)
    assert len(full) == len(set(full)) >= 16 * 8  # 8 chunks of 8 MiB per leaf
    spy.read.clear()
    runs = []
    for _ in range(8):  # 1 GiB, 10 s x 32 MiB/s a run: the cycle ends on the 4th
        report, _ = budgeted(root, 10.0, rotate=True)
        assert report.rotation is not None and report.coverage is not None and report.ok
        runs.append((report.coverage, report.rotation))
        if report.rotation.cycle_complete:
            break
    assert len(runs) == 4, runs
    assert sorted(spy.read) == full  # every block once over the cycle
    covered = [rot.covered_bytes for _, rot in runs]
    assert covered == sorted(covered) and covered[-1] == GIB
    assert [rot.cycle_complete for _, rot in runs] == [False, False, False, True]
    state = json.loads((root / "1" / "default" / STATE_FILE).read_text())
    assert state["format"] == "ckpt-verify-state" and state["cycle"] == 1 and state["cursor"] == 0


def test_a_short_real_budget_stops_part_way(big: Path, cli) -> None:  # type: ignore[no-untyped-def]
    r = cli("verify", big, "--deep", "--max-duration", "1s", "--json")
    assert r.code == 0, r.stderr
    doc = one_json_document(r.stdout)
    cov = doc["checked"]["coverage"]
    assert cov["of_bytes"] == GIB
    if cov["stopped"] is None:  # the whole GiB was read within the second: no stop is due
        assert cov["complete"] and cov["bytes"] == GIB and doc["elapsed_s"] <= 1.0, (cov, doc)
    else:
        assert cov["stopped"] == "max-duration" and 0 < cov["bytes"] < GIB, cov
    print(f"real clock: budget 1 s, elapsed {doc['elapsed_s']} s, {cov['bytes']} bytes")
