"""``frozen`` is a finding about a tensor the run should have moved: an optimizer's settings
(``optax.inject_hyperparams`` keeps its learning rate under ``hyperparams``) and scalars are
constant by design and never called frozen."""

from __future__ import annotations

from ckpt_cli.core.trend.findings import findings
from ckpt_cli.core.trend.types import LeafTrend, StepStats, TrendOptions, TrendReport


def _leaf(name: str, shape: tuple[int, ...], updates: list[float | None]) -> LeafTrend:
    steps = tuple(
        StepStats(i + 1, 1.0, 1.0, 1.0, 0.0, 0.0, 0, u, None if u is None else u / 1.0)
        for i, u in enumerate(updates)
    )
    return LeafTrend(name, "opt_state", "float32", shape, steps)


def _kinds(*leaves: LeafTrend) -> set[tuple[str, str]]:
    report = TrendReport("/r", "default", (1, 2, 3), leaves, (), (), TrendOptions())
    return {(f.kind, f.leaf) for f in findings(report)}


def test_settings_and_scalars_are_not_frozen() -> None:
    moving = _leaf("params.w", (4, 4), [None, 0.5, 0.4])
    lr = _leaf("opt_state.hyperparams.learning_rate", (), [None, 0.0, 0.0])
    table = _leaf("opt_state.1.hyperparams.schedule", (3,), [None, 0.0, 0.0])
    scalar = _leaf("opt_state.0.scale", (), [None, 0.0, 0.0])
    stuck = _leaf("params.frozen_layer", (4, 4), [None, 0.0, 0.0])
    assert _kinds(moving, lr, table, scalar, stuck) == {("frozen", "params.frozen_layer")}
