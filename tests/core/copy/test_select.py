"""Which steps ``ckpt cp`` takes (``core/copy/select.py``): ``--steps`` ranges (parsed by
``core/step_ranges.py``, tests/core/test_step_ranges.py), ``--step``, ``--latest`` and
``ROOT@STEPS``, one selection from them, and the usage errors of a list that is none."""

from __future__ import annotations

import re

import pytest

from ckpt_cli.core.copy.select import combine
from ckpt_cli.core.step_ranges import parse_steps
from ckpt_cli.errors import UsageError


def test_selection_is_described_as_it_was_given() -> None:
    assert parse_steps("100-300,500,700-").describe() == "500,100-300,700-"
    assert combine(None, None, False, None).everything
    assert combine(None, None, False, None).describe() == "all"
    assert combine(None, None, True, None).describe() == "latest"


def test_step_and_steps_combine_and_at_names_its_own() -> None:
    sel = combine([7, 9, 7], "100-200", False, None)
    assert sel.singles == (7, 9) and sel.ranges == ((100, 200),)
    assert [s for s in (7, 8, 9, 150, 201) if sel.matches(s)] == [7, 9, 150]
    at = combine(None, None, False, "5-6")
    assert at.ranges == ((5, 6),) and not at.matches(7)


@pytest.mark.parametrize(
    ("args", "phrase"),
    [
        (([1], None, True, None), "--latest and --step both choose steps"),
        ((None, "1-2", True, None), "--latest and --steps"),
        (([1], None, False, "5"), "the source names its steps (@5)"),
        ((None, None, False, "9-3"), "the range 9-3 is empty"),
    ],
)
def test_contradictory_selections_are_usage_errors(
    args: tuple[list[int] | None, str | None, bool, str | None], phrase: str
) -> None:
    with pytest.raises(UsageError, match=re.escape(phrase)):
        combine(*args)
