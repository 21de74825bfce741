"""A float cast refuses a finite value that becomes Inf in the target dtype and carries NaN and
Inf over as they are: the check asks ``all_finite`` first (bfloat16 by its bits) and looks
closer only where that finds something."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from ckpt_cli.core.spec import ops
from ckpt_cli.errors import RefusedError

TARGETS = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
#: A float32 value that rounds to Inf in each target.
BEYOND = {"bfloat16": 3.4e38, "float16": 1.0e6}


def _cast(dtype: str, values: np.ndarray) -> np.ndarray:
    inner = ops.Const(values.shape, "float32", 0.0)
    node = ops.Cast(values.shape, dtype, inner, None, "rule 1 (cast)", "w")
    out = node._cast(values)
    assert out.dtype == np.dtype(TARGETS[dtype])
    return np.asarray(out)


@pytest.mark.parametrize("dtype", sorted(TARGETS))
def test_nan_and_inf_are_carried_over(dtype: str) -> None:
    x = np.linspace(-4, 4, 64, dtype=np.float32).reshape(8, 8)
    x[1, 2], x[5, 0], x[7, 7] = np.nan, -np.inf, np.inf
    out = _cast(dtype, x).astype(np.float32)
    assert math.isnan(out[1, 2]) and out[5, 0] == -np.inf and out[7, 7] == np.inf
    finite = np.isfinite(x)
    assert int(np.isfinite(out).sum()) == int(finite.sum()) == 61
    assert np.allclose(out[finite], x[finite], rtol=1e-2)


@pytest.mark.parametrize("dtype", sorted(TARGETS))
@pytest.mark.parametrize("sign", [1, -1])
def test_a_value_beyond_the_range_is_refused(dtype: str, sign: int) -> None:
    x = np.zeros((4, 4), dtype=np.float32)
    x[2, 3], x[0, 0] = sign * BEYOND[dtype], np.nan  # the NaN alone would pass
    with pytest.raises(RefusedError) as e:
        _cast(dtype, x)
    assert f"{BEYOND[dtype]:g} is beyond the range of {dtype}" in str(e.value)  # its magnitude


def test_an_empty_block_casts() -> None:
    assert _cast("bfloat16", np.zeros((0, 3), dtype=np.float32)).shape == (0, 3)
