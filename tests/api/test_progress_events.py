"""Progress moves from the first block to the end, in many steps: counted on the events the
library sends (``on_progress``), which do not depend on how fast the machine is. The terminal
tests (tests/commands/test_progress.py) check how the bar shows them: units, rate, time left."""

from __future__ import annotations

from pathlib import Path

import ckpt_cli
from ckpt_cli import Progress


def _moves(events: list[Progress], action: str) -> list[int]:
    steps = [e for e in events if e.action == action]
    assert steps, [e.action for e in events]
    total = steps[-1].total
    done = [e.done for e in steps]
    assert all(e.total == total for e in steps)
    assert done == sorted(done), "progress went backwards"
    assert done[-1] == total, (done[-5:], total)
    return [d for d in done if 0 < d < total]


def test_a_deep_verify_reports_every_block_it_reads(big_root: Path) -> None:
    events: list[Progress] = []
    report = ckpt_cli.verify(big_root, step=1, deep=True, on_progress=events.append)
    assert report.ok
    between = _moves(events, "data")
    # A 256 MiB leaf read in blocks of a few MiB: dozens of states, the first after one block.
    assert len(set(between)) >= 20, sorted(set(between))
    assert min(between) <= 8 << 20


def test_a_reshard_reports_its_writes_before_it_ends(big_root: Path, tmp_path: Path) -> None:
    plan = ckpt_cli.plan_reshard(
        big_root, tmp_path / "out", mesh="data=2", rules=["params.embed=[data, null]"], step=1
    )
    events: list[Progress] = []
    ckpt_cli.execute(plan, on_progress=events.append)
    actions = {e.action for e in events}
    assert actions, events
    action = max(actions, key=lambda a: sum(1 for e in events if e.action == a))
    assert len(set(_moves(events, action))) >= 10
