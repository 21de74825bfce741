"""The ``ld1`` specification (docs/reference/digest-spec.md) holds: its test vectors are what the
plain-Python reference (``tests/support/ldigest_reference.py``, written from the text) and the
fast implementation both compute, the spec's own vectorised numpy implementation (its "In
numpy" block, run as written) agrees with both on every dtype, and the fast one gives the
reference's digest from any partition of the array into boxes, merged in any order and
grouping."""

from __future__ import annotations

import random
import re
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckpt_cli.core.digest import ld1, ld1_fold, ld1_kernel
from tests.support.ldigest_reference import (
    reference_digest,
    reference_text_digest,
    spec_numpy_reference,
)
from tests.support.paths import REPO

SPEC = REPO / "docs" / "reference" / "digest-spec.md"
VECTOR = re.compile(r"^\| `(?P<expr>[^`]+)` \| `(?P<digest>ld1:[0-9a-f]{32})` \|$", re.M)
STRING_VECTOR = re.compile(
    r'^\| string `"(?P<text>[^"`]*)"` \| `(?P<digest>ld1:[0-9a-f]{32})` \|$', re.M
)

DTYPES = [
    np.dtype(np.float32),
    np.dtype(np.float64),
    np.dtype(np.float16),
    np.dtype(ml_dtypes.bfloat16),
    np.dtype(ml_dtypes.float8_e4m3fn),
    np.dtype(ml_dtypes.int4),
    np.dtype(ml_dtypes.uint4),
    np.dtype(np.bool_),
    np.dtype(np.int8),
    np.dtype(np.uint16),
    np.dtype(np.int32),
    np.dtype(np.int64),
    np.dtype(np.complex64),
    np.dtype(np.complex128),
]


def test_the_specs_test_vectors_hold() -> None:
    text = SPEC.read_text()
    vectors = [(m["expr"], m["digest"]) for m in VECTOR.finditer(text)]
    assert len(vectors) >= 8
    for expr, digest in vectors:
        x = eval(expr, {"np": np, "ml_dtypes": ml_dtypes})
        assert reference_digest(x) == digest, expr
        assert ld1.digest_array(x) == digest, expr
    strings = [(m["text"], m["digest"]) for m in STRING_VECTOR.finditer(text)]
    assert strings
    for value, digest in strings:
        assert reference_text_digest(value) == ld1.digest_text(value) == digest


def _values(dtype: np.dtype[Any], shape: tuple[int, ...], seed: int) -> Any:
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=int(np.prod(shape)) * dtype.itemsize, dtype=np.uint8)
    x = raw.view(dtype).reshape(shape) if dtype.kind != "b" else (raw > 127).reshape(shape)
    if dtype.name in ld1.CODE_BITS:  # ml_dtypes' sub-byte values keep their code low
        x = (raw & np.uint8(7)).astype(np.int8).astype(dtype).reshape(shape)
    return x


def _partition(
    shape: tuple[int, ...], rnd: random.Random, depth: int
) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Random boxes (origin, size) that tile ``shape``: cut along a random dim, recursively."""
    boxes = [((0,) * len(shape), shape)]
    for _ in range(depth):
        origin, size = boxes.pop(rnd.randrange(len(boxes)))
        dims = [d for d, n in enumerate(size) if n > 1]
        if not dims:
            boxes.append((origin, size))
            continue
        d = rnd.choice(dims)
        cut = rnd.randrange(1, size[d])
        lo = (*size[:d], cut, *size[d + 1 :])
        hi = (*size[:d], size[d] - cut, *size[d + 1 :])
        boxes.append((origin, lo))
        boxes.append(((*origin[:d], origin[d] + cut, *origin[d + 1 :]), hi))
    return boxes


def _merge_randomly(parts: list[ld1.Partial], rnd: random.Random) -> ld1.Partial:
    """Merge in a random order and grouping (a tree of merges, as hosts and workers would)."""
    parts = list(parts)
    while len(parts) > 1:
        rnd.shuffle(parts)
        k = rnd.randrange(2, len(parts) + 1)
        parts = [ld1.merge(parts[:k]), *parts[k:]]
    return parts[0]


shapes = st.lists(st.integers(0, 9), min_size=0, max_size=3).map(tuple) | st.sampled_from(
    [(3, 700), (2, 5000), (130, 33), (9000,), (1, 1, 17000)]
)


@settings(max_examples=150, deadline=None)
@given(
    dtype=st.sampled_from(DTYPES),
    shape=shapes,
    seed=st.integers(0, 2**32 - 1),
    depth=st.integers(0, 12),
)
def test_any_partition_merged_in_any_order_gives_the_reference_digest(
    dtype: np.dtype[Any], shape: tuple[int, ...], seed: int, depth: int
) -> None:
    x = _values(dtype, shape, seed)
    expected = reference_digest(x)
    assert ld1.digest_array(x) == expected
    rnd = random.Random(seed)
    boxes = _partition(x.shape, rnd, depth)
    assert boxes
    parts = [
        ld1.partial(o, x[tuple(slice(a, a + n) for a, n in zip(o, s, strict=True))], x.shape)
        for o, s in boxes
    ]
    assert ld1.finish(_merge_randomly(parts, rnd)) == expected


NUMPY_REFERENCE = spec_numpy_reference()


@settings(max_examples=150, deadline=None)
@given(dtype=st.sampled_from(DTYPES), shape=shapes, seed=st.integers(0, 2**32 - 1))
def test_the_specs_numpy_implementation_is_the_reference(
    dtype: np.dtype[Any], shape: tuple[int, ...], seed: int
) -> None:
    x = _values(dtype, shape, seed)
    assert NUMPY_REFERENCE["ld1"](x) == reference_digest(x) == ld1.digest_array(x)
    y = x.T  # not C-contiguous: the stream is still the C order of the values
    assert NUMPY_REFERENCE["ld1"](y) == reference_digest(y)


def test_the_specs_numpy_implementation_takes_the_vectors_and_strings() -> None:
    text = SPEC.read_text()
    ld1, of_bytes = NUMPY_REFERENCE["ld1"], NUMPY_REFERENCE["ld1_of_bytes"]
    vectors = [(m["expr"], m["digest"]) for m in VECTOR.finditer(text)]
    assert len(vectors) >= 8
    for expr, digest in vectors:
        assert ld1(eval(expr, {"np": np, "ml_dtypes": ml_dtypes})) == digest, expr
    for m in STRING_VECTOR.finditer(text):
        data = np.frombuffer(m["text"].encode(), np.uint8)
        assert of_bytes(data, "string", ()) == m["digest"]


@settings(max_examples=60, deadline=None)
@given(dtype=st.sampled_from(DTYPES), shape=shapes, seed=st.integers(0, 2**32 - 1), data=st.data())
def test_one_flipped_bit_changes_the_digest(
    dtype: np.dtype[Any], shape: tuple[int, ...], seed: int, data: st.DataObject
) -> None:
    x = _values(dtype, shape, seed)
    if x.size == 0:
        return
    code_bits = ld1.CODE_BITS.get(dtype.name, 8 * (1 if dtype.kind == "b" else dtype.itemsize))
    flat = np.ascontiguousarray(x).reshape(-1).copy()
    i = data.draw(st.integers(0, flat.size - 1))
    raw = flat.view(np.uint8).reshape(flat.size, -1)
    bit = data.draw(st.integers(0, (1 if dtype.kind == "b" else code_bits) - 1))
    raw[i, bit // 8] ^= np.uint8(1 << (bit % 8))
    assert ld1.digest_array(flat.reshape(x.shape)) != ld1.digest_array(x)


def test_dtype_and_shape_are_part_of_the_digest() -> None:
    x = np.arange(12, dtype=np.int32)
    same_bytes = [x.reshape(3, 4), x.reshape(4, 3), x.view(np.float32), x.view(np.uint8)]
    digests = {ld1.digest_array(y) for y in [x, *same_bytes]}
    assert len(digests) == 5


def test_a_missing_or_overlapping_box_is_refused() -> None:
    x = np.arange(30, dtype=np.float32).reshape(5, 6)
    top = ld1.partial((0, 0), x[:2], x.shape)
    rest = ld1.partial((2, 0), x[2:], x.shape)
    assert ld1.finish(ld1.merge([rest, top])) == ld1.digest_array(x)
    with pytest.raises(ValueError, match="missing or counted twice"):
        ld1.finish(top)
    with pytest.raises(ValueError, match="missing or counted twice"):
        ld1.finish(ld1.merge([top, rest, top]))
    odd = ld1.partial((0, 0), x[:, :3], x.shape)  # ends mid-word: bytes 8-11 of row 0
    with pytest.raises(ValueError, match="overlap"):
        ld1.merge([odd, ld1.partial((0, 2), x[:, 2:3], x.shape)])
    with pytest.raises(ValueError, match="cannot merge"):
        ld1.merge([top, ld1.partial((0,), x.reshape(-1), (30,))])


#: Leaves cut along their last axis (a shard of a leaf sharded on it): many short rows per box,
#: hashed by the strided kernel. (dtype, shape, column cuts, row cuts); the row strides cover a
#: step that stays in its block, a negative and a zero step modulo a block, rows that cross
#: into the next block, cut words (odd widths) and a box taken in several chunks.
SHORT_ROWS = [
    (np.dtype(np.float32), (160, 1024), 4, 1),
    (np.dtype(ml_dtypes.bfloat16), (48, 3000), 3, 2),
    (np.dtype(np.float64), (6, 12000), 4, 2),
    (np.dtype(ml_dtypes.int4), (64, 700), 2, 1),
    (np.dtype(np.float32), (6, 32768), 2, 3),
    (np.dtype(np.float16), (4, 6, 1030), 2, 2),
    (np.dtype(np.float32), (33, 4099), 8, 1),
]


@pytest.mark.parametrize("route", ["kernel", "numpy"])
@pytest.mark.parametrize(("dtype", "shape", "col_cuts", "row_cuts"), SHORT_ROWS)
def test_boxes_of_short_rows_give_the_reference_digest(
    dtype: np.dtype[Any],
    shape: tuple[int, ...],
    col_cuts: int,
    row_cuts: int,
    route: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The rows of a box: every run in one call of the compiled kernel (``run_sums``), or,
    where it was not built, numpy's strided pass (``_fold_strided``); both the reference."""
    x = _values(dtype, shape, seed=sum(shape))
    strided: list[bool] = []
    real = ld1_fold._fold_strided if route == "numpy" else ld1_kernel.run_sums

    def counted(*args: Any) -> Any:
        out = real(*args)
        strided.append(out is not None)
        return out

    if route == "numpy":
        monkeypatch.setattr(ld1_kernel, "run_sums", lambda *a: None)
        monkeypatch.setattr(ld1_fold, "_fold_strided", counted)
    else:
        monkeypatch.setattr(ld1_kernel, "run_sums", counted)
    rows, cols = shape[0], shape[-1]
    parts = []
    for i in range(row_cuts):
        for j in range(col_cuts):
            r0, r1 = rows * i // row_cuts, rows * (i + 1) // row_cuts
            c0 = cols * j // col_cuts + (j % 2)  # odd widths: edges cut words
            c1 = cols * (j + 1) // col_cuts + ((j + 1) % 2)
            c1 = cols if j == col_cuts - 1 else c1
            origin = (r0, *(0,) * (len(shape) - 2), c0)
            parts.append(ld1.partial(origin, x[r0:r1, ..., c0:c1], x.shape))
    assert strided and all(strided)
    assert ld1.finish(_merge_randomly(parts, random.Random(len(parts)))) == reference_digest(x)
