"""Step selections (``core/step_ranges.py``): ``--steps`` ranges as ``cp`` and ``trend`` take
them, and the usage error of a list that is none."""

from __future__ import annotations

import pytest

from ckpt_cli.core.step_ranges import parse_steps, split_at
from ckpt_cli.errors import UsageError


def test_parse_steps() -> None:
    sel = parse_steps("100-300,500,700-")
    assert [s for s in (50, 100, 200, 300, 400, 500, 600, 700, 10**6) if sel.matches(s)] == [
        100, 200, 300, 500, 700, 10**6,
    ]  # fmt: skip
    assert parse_steps("-300").matches(0) and not parse_steps("-300").matches(301)
    for bad in ("", "a-b", "300-100", "1-2-3", "-"):
        with pytest.raises(UsageError):
            parse_steps(bad)


def test_a_bad_list_names_the_option_it_came_from() -> None:
    with pytest.raises(UsageError, match="ROOT@STEPS '3-1': the range 3-1 is empty"):
        parse_steps("3-1", "ROOT@STEPS")
    with pytest.raises(UsageError, match="--steps 'x' is not a list of steps"):
        parse_steps("x")


def test_split_at_reads_steps_and_an_item_after_the_last_at(tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert split_at("runs/exp7@6") == ("runs/exp7", "6", None)
    assert split_at("runs/exp7@6:state") == ("runs/exp7", "6", "state")
    assert split_at("gs://b/me@x/run@100-300,500") == ("gs://b/me@x/run", "100-300,500", None)
    for whole in ("runs/exp7", "user@host", "@6", "run@6:", "run@6:a/b", "run@v2"):
        assert split_at(whole) == (whole, None, None), whole
    odd = tmp_path / "run@6"
    odd.mkdir()  # a directory of that very name is that directory
    assert split_at(str(odd)) == (str(odd), None, None)
