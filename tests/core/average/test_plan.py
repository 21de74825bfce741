"""``plan_average``: the coefficients (weights normalised, the EMA's closed form against the
recurrence), which leaves are averaged on real Orbax saves (floats yes; counters, keys and
optimizer state never), and what it refuses before anything is read."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from ckpt_cli.core.average.plan import coefficients, parse_steps, parse_weights, plan_average
from ckpt_cli.errors import NotFoundError, UsageError
from tests.support.average_runs import ema, mixed_steps


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("mixed") / "run"
    mixed_steps(path)
    return path


def test_equal_and_normalised_weights() -> None:
    assert coefficients(4) == pytest.approx((0.25,) * 4)
    assert coefficients(3, [2, 2, 4]) == pytest.approx((0.25, 0.25, 0.5))
    assert math.fsum(coefficients(3, [1e-9, 3.5, 7])) == pytest.approx(1.0)


@pytest.mark.parametrize("decay", [0.5, 0.9, 0.999])
@pytest.mark.parametrize("count", [2, 3, 7])
def test_ema_coefficients_are_the_recurrence(decay: float, count: int) -> None:
    """e1 = x1, ek = d*e(k-1) + (1-d)*xk: applied to unit vectors, the recurrence gives each
    step's coefficient."""
    units = list(np.eye(count))
    assert units
    assert coefficients(count, ema=decay) == pytest.approx(tuple(ema(units, decay)), rel=1e-12)
    assert math.fsum(coefficients(count, ema=decay)) == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("count", "weights", "decay", "phrase"),
    [
        (3, [1, 2], None, "gives 2 weights for 3 steps"),
        (2, [1, 0], None, "0 is not a positive number"),
        (2, [1, math.inf], None, "inf is not a positive number"),
        (2, None, 0.0, "strictly between 0 and 1"),
        (2, None, 1.0, "strictly between 0 and 1"),
        (2, [1, 1], 0.5, "give one"),
    ],
)
def test_bad_weights_are_usage_errors(
    count: int, weights: list[float] | None, decay: float | None, phrase: str
) -> None:
    with pytest.raises(UsageError, match=phrase):
        coefficients(count, weights, decay)


def test_parsing_steps_and_weights() -> None:
    assert parse_steps("400, 500,600") == [400, 500, 600]
    assert parse_weights("1,2.5,1e-3") == [1.0, 2.5, 0.001]
    for bad in ("4-6", "a", "1,,2", "-1,2"):
        with pytest.raises(UsageError):
            parse_steps(bad)


def test_floats_are_averaged_counters_keys_and_moments_are_the_last_steps(root: Path) -> None:
    plan = plan_average(root, root.parent / "out", [10, 20, 30])
    (item,) = plan.items
    actions = {leaf.name: a for leaf, a in zip(item.report.leaves, item.actions, strict=True)}
    assert actions == {
        "params.dense.kernel": "average", "params.embed": "average", "params.scale": "average",
        "counter": "last", "rng": "last", "opt_state.mu": "last",
    }  # fmt: skip
    assert [ref.step for ref, _ in item.steps] == [10, 20, 30]
    assert plan.step_out == 30 and plan.coefficients == pytest.approx((1 / 3,) * 3)
    assert plan.averaged_bytes == 48 * 40 * 4 + 32 * 16 * 2 + 7 * 8
    assert plan.operation["steps"] == [10, 20, 30] and plan.operation["operation"] == "average"
    assert not (root.parent / "out").exists()


def test_drop_leaves_the_optimizer_state_out_of_the_layout(root: Path) -> None:
    plan = plan_average(root, root.parent / "out", [10, 30], optimizer="drop", match="*kernel")
    (item,) = plan.items
    kept = [p.leaf.name for p in item.layout.leaves]
    assert kept and "opt_state.mu" not in kept and "counter" in kept
    averaged = [
        lf.name for lf, a in zip(item.report.leaves, item.actions, strict=True) if a == "average"
    ]
    assert averaged == ["params.dense.kernel"]
    assert plan.warnings == ()


def test_a_match_of_nothing_is_a_warning(root: Path) -> None:
    plan = plan_average(root, root.parent / "out", [10, 30], match="nothing.here")
    assert plan.averaged_bytes == 0
    assert plan.warnings == ("no leaf is averaged: the new step is a copy of the last step listed",)


def test_a_step_not_in_the_root_is_not_found(root: Path) -> None:
    with pytest.raises(NotFoundError, match="step 15 not found"):
        plan_average(root, root.parent / "out", [10, 15])
