"""ScaleOptions: the scale flags of a command as one object, carried whole into a writer."""

from __future__ import annotations

import pytest

from ckpt_cli.core.executor import ExecutorSpec
from ckpt_cli.core.scale import DEFAULT_UNIT_BYTES, ScaleOptions
from ckpt_cli.errors import UsageError


def test_the_flags_become_one_object() -> None:
    scale = ScaleOptions.from_flags("local", 4, None, True, 8 << 20, 3)
    assert scale.executor == ExecutorSpec("local", 4, None, force_split=True)
    assert (scale.unit_bytes, scale.threads, scale.scaled) == (8 << 20, 3, True)


def test_the_defaults_run_in_this_process() -> None:
    scale = ScaleOptions()
    assert scale == ScaleOptions.from_flags()
    assert (scale.executor.kind, scale.executor.workers, scale.scaled) == ("local", 1, False)
    assert (scale.unit_bytes, scale.threads) == (DEFAULT_UNIT_BYTES, None)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"scheduler": "tcp://127.0.0.1:1"}, "--scheduler applies to --executor dask"),
        ({"workers": 0}, "--workers 0"),
        ({"executor": "ray"}, "--executor 'ray'"),
    ],
)
def test_a_bad_combination_is_a_usage_error(flags: dict[str, object], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        ScaleOptions.from_flags(**flags)  # type: ignore[arg-type]
