"""Synthetic steps for the retention rules' tests: a step number, a commit time, metrics."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from ckpt_cli.core.prune.policy import Policy, keep_reasons

NOW = datetime(2024, 3, 15, 12, 0, tzinfo=timezone.utc)


@dataclass(frozen=True)
class S:
    step: int
    committed_at: datetime
    metrics: dict[str, Any] | None = field(default=None)

    @property
    def name(self) -> str:
        return str(self.step)


def hourly_steps(n: int, *, every: timedelta = timedelta(hours=1), start: int = 100) -> list[S]:
    """Steps start, start+100, ... committed ``every`` apart, the newest at NOW."""
    return [S(start + 100 * i, NOW - every * (n - 1 - i)) for i in range(n)]


def kept(steps: list[S], policy: Policy, now: datetime = NOW) -> set[int]:
    return {int(name) for name in keep_reasons(steps, policy, now)}
