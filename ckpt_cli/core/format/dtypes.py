"""Zarr dtype names as numpy-style names, and their element sizes (ml_dtypes' included)."""

from __future__ import annotations

import functools
from typing import Any

# Element sizes of dtypes numpy does not know by name (ml_dtypes'); the rest come from numpy.
EXTRA_DTYPES = {
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e4m3fnuz": 1,
    "float8_e4m3b11fnuz": 1,
    "float8_e5m2": 1,
    "float8_e5m2fnuz": 1,
    "float8_e3m4": 1,
    "float8_e4m3": 1,
    "float8_e8m0fnu": 1,
    "float6_e2m3fn": 1,
    "float6_e3m2fn": 1,
    "float4_e2m1fn": 1,
    "int2": 1,
    "uint2": 1,
    "int4": 1,
    "uint4": 1,
}


def dtype_itemsize(name: str) -> int:
    if name in EXTRA_DTYPES:
        return EXTRA_DTYPES[name]
    import numpy as np

    return int(np.dtype(name).itemsize)


@functools.lru_cache(maxsize=256)
def normalize_dtype(raw: Any) -> str:
    """A zarr dtype ('<f4', '|b1', 'bfloat16', 'float32') as a numpy-style name ('float32')."""
    if not isinstance(raw, str):
        raise ValueError(f"unsupported dtype {raw!r}")
    if raw in EXTRA_DTYPES:
        return raw
    import numpy as np

    return str(np.dtype(raw).name)
