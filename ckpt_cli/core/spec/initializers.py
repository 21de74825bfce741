"""Seeded initialisers whose values do not depend on how an array is cut into blocks.

Every value is a pure function of (seed, leaf name, flat C-order index of the element in the
whole destination array): a block of any shape, read in any order, under any memory limit, gets
the same numbers. No stream state is carried between blocks.

Bits: the SplitMix64 output function (Steele, Lea and Flood's ``SplittableRandom`` finaliser)
applied to a counter, ``word(k, i) = mix64(key_k + (i + 1) * 0x9E3779B97F4A7C15)``: the i-th output
of a SplitMix64 stream, computable for any index set in one vectorised numpy expression. The key
is the first 8 bytes of ``sha256(f"{seed}:{name}")``; each further draw an element needs (the
second Box-Muller uniform, a resampling round of a truncated normal) uses its own key,
``key_k = mix64(key + k)``. A uniform is the top 53 bits of a word scaled to [0, 1).

Distributions (computed in float64, then rounded to the leaf's dtype):
  normal(stddev)            Box-Muller: stddev * sqrt(-2 ln(1-u1)) * cos(2 pi u2).
  truncated_normal(stddev)  a normal resampled (with the next keys) until |z| <= 2, times stddev:
                            jax.nn.initializers.truncated_normal (stddev of the untruncated law).
  lecun_normal              truncated_normal with stddev sqrt(1/fan_in) / 0.87962566103423978,
                            jax.nn.initializers.lecun_normal.
  glorot_uniform            uniform(-l, l), l = sqrt(3 / ((fan_in + fan_out) / 2)),
                            jax.nn.initializers.glorot_uniform.
  zeros, constant(value)    the value.
Fans as jax computes them: in axis -2, out axis -1, the other axes a receptive field;
fan_in = shape[-2] * receptive field, fan_out = shape[-1] * receptive field (rank >= 2).
The values are not those jax draws (jax uses threefry); they follow the same laws.
"""

from __future__ import annotations

import difflib
import hashlib
import math
import re
from dataclasses import dataclass
from typing import Any, TypedDict

from typing_extensions import NotRequired

from ckpt_cli.core.format.dtypes import EXTRA_DTYPES

GOLDEN = 0x9E3779B97F4A7C15
#: Standard deviation of a standard normal truncated to (-2, 2), as jax writes it.
TRUNCATED_STDDEV = 0.87962566103423978
KINDS = (
    "zeros",
    "constant",
    "normal",
    "truncated_normal",
    "lecun_normal",
    "glorot_uniform",
)
#: Kinds whose scale comes from the array's fans, which need rank >= 2.
FAN_KINDS = ("lecun_normal", "glorot_uniform")
PIECE = 1 << 20  # elements generated at once (about 8 MiB per float64 temporary)
MAX_ROUNDS = 64  # a value rejected 64 times in a row has probability 0.046**64


class InitializerJSON(TypedDict):
    name: str
    value: NotRequired[float | int | bool]
    stddev: NotRequired[float]
    seed: NotRequired[int]


@dataclass(frozen=True)
class Initializer:
    """How to fill new elements. ``stddev`` for normal/truncated_normal, ``value`` for constant."""

    kind: str
    stddev: float = 0.01
    value: float | int | bool = 0
    seed: int = 0

    def describe(self) -> str:
        if self.kind == "constant":
            return f"constant({self.value})"
        if self.kind in ("normal", "truncated_normal"):
            return f"{self.kind}({self.stddev:g}, seed {self.seed})"
        if self.kind in FAN_KINDS:
            return f"{self.kind}(seed {self.seed})"
        return self.kind

    def to_json(self) -> InitializerJSON:
        out: InitializerJSON = {"name": self.kind}
        if self.kind == "constant":
            out["value"] = self.value
        if self.kind in ("normal", "truncated_normal"):
            out["stddev"] = self.stddev
        if self.kind not in ("zeros", "constant"):
            out["seed"] = self.seed
        return out

    @property
    def random(self) -> bool:
        return self.kind not in ("zeros", "constant")


_TEXT = re.compile(r"\s*([A-Za-z_]\w*)\s*(?:\(\s*([^()]*?)\s*\))?\s*")
_FIELDS = {
    "constant": {"value"},
    "normal": {"stddev", "seed"},
    "truncated_normal": {"stddev", "seed"},
    "lecun_normal": {"seed"},
    "glorot_uniform": {"seed"},
}


def parse_init(value: Any, seed: int) -> Initializer:
    """``zeros``, ``normal(0.02)``, ``constant(1)`` or ``{name: normal, stddev: 0.02, seed: 1}``;
    ``seed`` unless the value names its own. A ``ValueError`` says what is wrong."""
    if isinstance(value, str):
        m = _TEXT.fullmatch(value)
        if not m:
            raise ValueError(f"expected e.g. zeros, normal(0.02) or constant(1), got {value!r}")
        doc: dict[str, Any] = {"name": m.group(1)}
        if m.group(2):
            number = _number(m.group(2))
            if number is None:
                raise ValueError(f"{m.group(2)!r} is not a number")
            doc["value" if m.group(1) == "constant" else "stddev"] = number
    elif isinstance(value, dict):
        doc = dict(value)
    else:
        raise ValueError(
            f"expected a name such as zeros or normal(0.02), or a mapping, got {value!r}"
        )
    kind = doc.pop("name", None)
    if kind not in KINDS:
        close = difflib.get_close_matches(str(kind), KINDS, n=1)
        maybe = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"unknown initialiser {kind!r}{maybe} (initialisers: {', '.join(KINDS)})")
    extra = set(doc) - _FIELDS.get(kind, set())
    if extra:
        raise ValueError(f"{kind} takes no {sorted(extra)[0]!r}")
    stddev = doc.get("stddev", 0.01)
    if not isinstance(stddev, (int, float)) or isinstance(stddev, bool) or stddev <= 0:
        raise ValueError(f"stddev must be a positive number, got {stddev!r}")
    if kind == "constant" and "value" not in doc:
        raise ValueError("constant needs a value, e.g. constant(1.0)")
    const = doc.get("value", 0)
    if not isinstance(const, (int, float, bool)):
        raise ValueError(f"constant value must be a number, got {const!r}")
    own = doc.get("seed", seed)
    if not isinstance(own, int) or isinstance(own, bool) or own < 0:
        raise ValueError(f"seed must be a non-negative integer, got {own!r}")
    return Initializer(kind, float(stddev), const, own)


def _number(text: str) -> float | int | None:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return None


def numpy_dtype(name: str) -> Any:
    """A numpy dtype from its name, ml_dtypes' (bfloat16, float8_*, int4) included."""
    import numpy as np

    if name in EXTRA_DTYPES:
        import ml_dtypes  # noqa: F401  (registers its dtypes with numpy)
    return np.dtype(name)


def fans(shape: tuple[int, ...]) -> tuple[float, float]:
    """(fan_in, fan_out) as ``jax.nn.initializers`` computes them with its default axes."""
    if len(shape) < 2:
        raise ValueError(f"fans need an array of rank >= 2, not shape {list(shape)}")
    receptive = math.prod(shape[:-2])
    return float(shape[-2] * receptive), float(shape[-1] * receptive)


def leaf_key(seed: int, name: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:8], "little")


def _mix64(z: Any) -> Any:
    import numpy as np

    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _uniform(key: int, index: Any) -> Any:
    """Uniforms in [0, 1) for each flat index (a uint64 array), from the stream ``key``."""
    import numpy as np

    with np.errstate(over="ignore"):
        z = np.uint64(key) + (index + np.uint64(1)) * np.uint64(GOLDEN)
        bits = _mix64(z)
    return (bits >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def _subkey(key: int, k: int) -> int:
    import numpy as np

    with np.errstate(over="ignore"):
        return int(_mix64(np.uint64(key) + np.uint64(k)))


def _normal(key: int, index: Any, round_: int = 0) -> Any:
    import numpy as np

    u1 = _uniform(_subkey(key, 2 * round_), index)
    u2 = _uniform(_subkey(key, 2 * round_ + 1), index)
    return np.sqrt(-2.0 * np.log1p(-u1)) * np.cos(2.0 * np.pi * u2)


def _truncated(key: int, index: Any) -> Any:
    import numpy as np

    flat = index.reshape(-1)
    z = _normal(key, flat)
    bad = np.flatnonzero(np.abs(z) > 2.0)
    for round_ in range(1, MAX_ROUNDS):
        if bad.size == 0:
            break
        again = _normal(key, flat[bad], round_)
        z[bad] = again
        bad = bad[np.abs(again) > 2.0]
    return np.clip(z, -2.0, 2.0).reshape(index.shape)


def flat_indices(shape: tuple[int, ...], region: tuple[slice, ...]) -> Any:
    """The flat C-order indices (uint64) of a region of an array of ``shape``, in region order."""
    import numpy as np

    flat = np.zeros([s.stop - s.start for s in region] or [], dtype=np.uint64)
    stride = 1
    for d in range(len(shape) - 1, -1, -1):
        axis = np.arange(region[d].start, region[d].stop, dtype=np.uint64) * np.uint64(stride)
        flat += axis.reshape([-1 if i == d else 1 for i in range(len(shape))])
        stride *= shape[d]
    return flat


def generate(
    init: Initializer,
    name: str,
    shape: tuple[int, ...],
    dtype: str,
    region: tuple[slice, ...],
) -> Any:
    """The values of ``region`` of a leaf ``name`` of ``shape``, filled by ``init``, as ``dtype``."""
    import numpy as np

    np_dtype = numpy_dtype(dtype)
    out_shape = tuple(s.stop - s.start for s in region)
    if init.kind == "zeros":
        return np.zeros(out_shape, dtype=np_dtype)
    if init.kind == "constant":
        return np.full(out_shape, init.value, dtype=np_dtype)
    if math.prod(out_shape) > PIECE:
        # Temporaries are float64/uint64, several per element: fill large regions piecewise.
        d = next(i for i, n in enumerate(out_shape) if n > 1)
        half = region[d].start + out_shape[d] // 2
        out = np.empty(out_shape, dtype=np_dtype)
        for part in (slice(region[d].start, half), slice(half, region[d].stop)):
            sub = tuple(part if i == d else s for i, s in enumerate(region))
            local = tuple(
                slice(p.start - r.start, p.stop - r.start) for p, r in zip(sub, region, strict=True)
            )
            out[local] = generate(init, name, shape, dtype, sub)
        return out
    index = flat_indices(shape, region)
    key = leaf_key(init.seed, name)
    if init.kind == "normal":
        values = _normal(key, index) * init.stddev
    elif init.kind == "truncated_normal":
        values = _truncated(key, index) * init.stddev
    elif init.kind == "lecun_normal":
        fan_in, _ = fans(shape)
        values = _truncated(key, index) * (math.sqrt(1.0 / fan_in) / TRUNCATED_STDDEV)
    elif init.kind == "glorot_uniform":
        fan_in, fan_out = fans(shape)
        limit = math.sqrt(3.0 / ((fan_in + fan_out) / 2))
        values = (_uniform(key, index) * 2.0 - 1.0) * limit
    else:
        raise ValueError(f"unknown initialiser {init.kind!r}")
    return values.astype(np_dtype)
