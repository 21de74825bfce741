"""The safetensors dtype table: every name the format defines, and the ones ckpt maps to numpy.

The format (huggingface/safetensors ``Dtype``) lists its dtypes in increasing alignment order;
the reference writer lays tensors out by *decreasing* position in that list, then by name, so
every tensor starts at an offset aligned to its element size. ``ORDER`` keeps that list.

ckpt reads and writes the dtypes named in the format's README and understood by PyTorch and
numpy+ml_dtypes alike. The rest of the format's table (4- and 6-bit floats, E8M0, the FNUZ
float8 variants, C64) is known to the validator, so their sizes are checked, but refused when
converting, with a hint.
"""

from __future__ import annotations

from typing import Any

from ckpt_cli.errors import RefusedError

#: Every dtype of the format, in its alignment order, with its size in bits.
ORDER: tuple[tuple[str, int], ...] = (
    ("BOOL", 8),
    ("F4", 4),
    ("F6_E2M3", 6),
    ("F6_E3M2", 6),
    ("U8", 8),
    ("I8", 8),
    ("F8_E5M2", 8),
    ("F8_E4M3", 8),
    ("F8_E8M0", 8),
    ("F8_E4M3FNUZ", 8),
    ("F8_E5M2FNUZ", 8),
    ("I16", 16),
    ("U16", 16),
    ("F16", 16),
    ("BF16", 16),
    ("I32", 32),
    ("U32", 32),
    ("F32", 32),
    ("C64", 64),
    ("F64", 64),
    ("I64", 64),
    ("U64", 64),
)
BITS: dict[str, int] = dict(ORDER)
RANK: dict[str, int] = {name: i for i, (name, _) in enumerate(ORDER)}

#: safetensors name <-> numpy / ml_dtypes name, for the dtypes ckpt converts.
TO_NUMPY: dict[str, str] = {
    "BOOL": "bool",
    "U8": "uint8",
    "I8": "int8",
    "F8_E5M2": "float8_e5m2",
    "F8_E4M3": "float8_e4m3fn",
    "I16": "int16",
    "U16": "uint16",
    "F16": "float16",
    "BF16": "bfloat16",
    "I32": "int32",
    "U32": "uint32",
    "F32": "float32",
    "F64": "float64",
    "I64": "int64",
    "U64": "uint64",
}
FROM_NUMPY: dict[str, str] = {v: k for k, v in TO_NUMPY.items()}

_SUB_BYTE = ("int2", "uint2", "int4", "uint4", "float4_e2m1fn")


def safetensors_dtype(dtype: str, what: str) -> str:
    """The safetensors name of a numpy dtype name, or a refusal naming ``what`` and a way out."""
    if dtype in FROM_NUMPY:
        return FROM_NUMPY[dtype]
    hint = "cast it (a spec rule `op: cast`) or drop it (`op: drop`, or --params-only)"
    if dtype in _SUB_BYTE:
        reason = f"safetensors has no {dtype} (sub-byte integers are not in the format)"
        hint = "cast it to int8 or a float type (`op: cast`), or drop it"
    elif dtype.startswith("complex"):
        reason = "safetensors readers (PyTorch, numpy) take no complex dtype"
        hint = "split it into real and imaginary parts with an `op: python` rule, or drop it"
    elif dtype.startswith("float8") or dtype.startswith("float6"):
        reason = f"{dtype} is not a safetensors dtype ckpt writes (F8_E4M3 = float8_e4m3fn and F8_E5M2 = float8_e5m2 are)"
        hint = "cast it to float8_e4m3fn, float8_e5m2 or bfloat16 (`op: cast`)"
    elif dtype.startswith("key<") or dtype == "prng_key":
        reason = "a typed PRNG key has no safetensors dtype"
        hint = "drop it (`op: drop`, or --params-only keeps the parameters only)"
    else:
        reason = f"{dtype} has no safetensors dtype"
    raise RefusedError(f"{what} is {dtype}: {reason}", hint=hint)


def numpy_dtype_name(st_dtype: str, what: str) -> str:
    """The numpy / ml_dtypes name of a safetensors dtype ckpt converts, or a refusal."""
    if st_dtype in TO_NUMPY:
        return TO_NUMPY[st_dtype]
    if st_dtype in BITS:
        raise RefusedError(
            f"{what} is {st_dtype}: ckpt does not convert this safetensors dtype "
            f"(it converts {', '.join(TO_NUMPY)})",
            hint="convert that tensor with its own tool first, or leave it out of the import spec (`op: drop`)",
        )
    raise RefusedError(f"{what} has unknown safetensors dtype {st_dtype!r}")


def numpy_dtype(name: str) -> Any:
    """The ``numpy.dtype`` of a numpy or ml_dtypes name (bfloat16, float8_* come from ml_dtypes)."""
    import numpy as np

    if name in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, name))
    return np.dtype(name)


def itemsize(st_dtype: str) -> int:
    """Bytes per element of a dtype ckpt converts (all of them are whole bytes)."""
    return BITS[st_dtype] // 8
