"""The ``ld1`` leaf digest written straight from its specification (docs/reference/digest.md),
word by word in plain Python: slow, short, and independent of ``ckpt_cli`` (no import from it),
so the docs' test can hold the fast implementation to the text."""

from __future__ import annotations

import hashlib
import sys
from typing import Any

import numpy as np

MASK = (1 << 64) - 1
SUB_BYTE_BITS = {"int2": 2, "uint2": 2, "int4": 4, "uint4": 4, "float4_e2m1fn": 4}
SUB_BYTE_BITS |= {"float6_e2m3fn": 6, "float6_e3m2fn": 6}


def splitmix(x: int) -> int:
    x &= MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def m(x: int) -> int:
    x = (x * 0xFF51AFD7ED558CCD) & MASK
    x ^= x >> 32
    x = (x * 0xC4CEB9FE1A85EC53) & MASK
    return x ^ (x >> 32)


def stream(x: Any) -> bytes:
    """The leaf's byte stream: values in C order, little-endian, sub-byte codes masked."""
    x = np.ascontiguousarray(x)
    if x.dtype.itemsize > 1 and (x.dtype.byteorder == ">" or sys.byteorder == "big"):
        x = x.byteswap()
    out = bytearray(x.tobytes())
    bits = SUB_BYTE_BITS.get(x.dtype.name)
    if bits:
        out = bytearray(b & ((1 << bits) - 1) for b in out)
    return bytes(out)


def digest_stream(data: bytes, dtype: str, shape: tuple[int, ...]) -> str:
    l1 = l2 = 0
    for u in range(0, (len(data) + 7) // 8):
        w = int.from_bytes(data[8 * u : 8 * u + 8].ljust(8, b"\0"), "little")
        b, j = u >> 14, u & 16383
        a_j = splitmix(j + 0x9E3779B97F4A7C15)
        c_j = splitmix(j + 0xD1B54A32D192ED03) | 1
        r1 = splitmix(b + 0x8CB92BA72F3D8DD7) | 1
        r2 = splitmix(b + 0xABC98388FB8FAC03) | 1
        z = m(w + a_j)
        l1 = (l1 + r1 * z) & MASK
        l2 = (l2 + r2 * c_j * z) & MASK
    header = f"ld1\n{dtype}\n{','.join(str(n) for n in shape)}\n{len(data)}".encode()
    h = hashlib.sha256(header).digest()
    out1 = splitmix(l1 + int.from_bytes(h[0:8], "little"))
    out2 = splitmix(l2 + int.from_bytes(h[8:16], "little"))
    return f"ld1:{out1:016x}{out2:016x}"


def reference_digest(x: Any) -> str:
    x = np.asarray(x)
    return digest_stream(stream(x), x.dtype.name, tuple(x.shape))


def reference_text_digest(value: str) -> str:
    return digest_stream(value.encode(), "string", ())


def spec_numpy_reference() -> dict[str, Any]:
    """The spec's vectorised numpy implementation (its "In numpy" block), run as written: a
    namespace with ``ld1(array)`` and ``ld1_of_bytes(data, dtype, shape)``. Its own asserts
    check the spec's test vectors as it loads."""
    from pathlib import Path

    spec = Path(__file__).resolve().parents[2] / "docs" / "reference" / "digest-spec.md"
    section = spec.read_text().split("\n## In numpy\n", 1)[1].split("\n## ", 1)[0]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    namespace: dict[str, Any] = {}
    exec(compile(code, str(spec), "exec"), namespace)
    return namespace
