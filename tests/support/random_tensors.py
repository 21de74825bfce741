"""Random tensors of any dtype safetensors holds, for the format and reader tests."""

from __future__ import annotations

from typing import Any

import numpy as np

from ckpt_cli.core.safetensors.dtypes import numpy_dtype


def random_array(rng: np.random.Generator, dtype: str, shape: tuple[int, ...]) -> Any:
    dt = numpy_dtype(dtype)
    if dtype == "bool":
        return rng.integers(0, 2, size=shape).astype(bool)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return rng.integers(info.min, info.max, size=shape, dtype=dt, endpoint=True)
    # Floats from random bits: NaNs, infinities and subnormals included, compared as bytes.
    bits = rng.integers(0, 256, size=(*shape, dt.itemsize), dtype=np.uint8)
    return bits.view(dt).reshape(shape)
