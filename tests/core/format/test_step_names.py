"""``step_dir_name``: a writer names its step in the source step's form (prefix, padding)."""

from __future__ import annotations

import pytest

from ckpt_cli.core.format.names import parse_step_name, step_dir_name


@pytest.mark.parametrize(
    ("step", "like", "expected"),
    [
        (6, None, "6"),
        (6, "6", "6"),
        (7, "6", "7"),
        (6, "checkpoint_6", "checkpoint_6"),
        (12, "checkpoint_6", "checkpoint_12"),
        (7, "0006", "0007"),
        (123456, "0006", "123456"),
        (7, "ckpt_00006", "ckpt_00007"),
        (0, "0", "0"),
        (100, "1234", "100"),  # no leading zero: no width to keep
        (6, "state", "6"),  # a bare save's directory is no step name
        (6, "6.orbax-checkpoint-tmp", "6"),
    ],
)
def test_step_dir_name_keeps_the_source_form(step: int, like: str | None, expected: str) -> None:
    name = step_dir_name(step, like)
    assert name == expected
    parsed = parse_step_name(name)
    assert parsed is not None and parsed.step == step
