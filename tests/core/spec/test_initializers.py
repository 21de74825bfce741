"""Seeded initialisers: values depend on (seed, name, index) only, and follow jax's laws."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from ckpt_cli.core.spec.initializers import (
    KINDS,
    TRUNCATED_STDDEV,
    Initializer,
    fans,
    flat_indices,
    generate,
    parse_init,
)

SHAPE = (48, 40)


def full(init: Initializer, shape: tuple[int, ...] = SHAPE, name: str = "params.w") -> np.ndarray:
    return generate(init, name, shape, "float32", tuple(slice(0, n) for n in shape))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("block", [(48, 40), (7, 40), (48, 3), (5, 11), (1, 1)])
def test_values_do_not_depend_on_the_blocks(kind: str, block: tuple[int, int]) -> None:
    init = Initializer(kind, stddev=0.5, value=1.5, seed=3)
    whole = full(init)
    tiled = np.empty_like(whole)
    starts = itertools.product(range(0, SHAPE[0], block[0]), range(0, SHAPE[1], block[1]))
    # Blocks generated in reverse order: no state is carried from one block to the next.
    for r, c in reversed(list(starts)):
        region = (slice(r, min(r + block[0], SHAPE[0])), slice(c, min(c + block[1], SHAPE[1])))
        tiled[region] = generate(init, "params.w", SHAPE, "float32", region)
    assert tiled.tobytes() == whole.tobytes()


def test_flat_indices_are_c_order() -> None:
    region = (slice(1, 3), slice(2, 4), slice(0, 5))
    expected = np.arange(4 * 6 * 5).reshape(4, 6, 5)[region]
    assert (flat_indices((4, 6, 5), region) == expected).all()
    assert flat_indices((), ()).shape == ()


def test_seed_and_name_key_the_values() -> None:
    a = full(Initializer("normal", 1.0, seed=0))
    assert full(Initializer("normal", 1.0, seed=0)).tobytes() == a.tobytes()
    assert not np.array_equal(a, full(Initializer("normal", 1.0, seed=1)))
    assert not np.array_equal(a, full(Initializer("normal", 1.0, seed=0), name="params.v"))


def test_distributions_follow_their_laws() -> None:
    shape = (400, 500)
    normal = full(Initializer("normal", 0.02), shape)
    assert abs(normal.mean()) < 1e-3 and normal.std() == pytest.approx(0.02, rel=0.02)
    trunc = full(Initializer("truncated_normal", 1.0), shape)
    assert np.abs(trunc).max() <= 2.0
    assert trunc.std() == pytest.approx(TRUNCATED_STDDEV, rel=0.02)
    lecun = full(Initializer("lecun_normal"), shape)
    assert lecun.std() == pytest.approx(1 / np.sqrt(400), rel=0.02)  # fan_in = 400
    assert np.abs(lecun).max() <= 2 / np.sqrt(400) / TRUNCATED_STDDEV + 1e-6
    glorot = full(Initializer("glorot_uniform"), shape)
    limit = np.sqrt(6 / (400 + 500))
    assert np.abs(glorot).max() <= limit and glorot.max() > 0.99 * limit
    assert (full(Initializer("zeros"), shape) == 0).all()
    assert (full(Initializer("constant", value=2.5), shape) == 2.5).all()


def test_same_scales_as_jax() -> None:
    """Our lecun_normal / glorot_uniform have jax's spread on a conv-like kernel."""
    import jax

    shape = (3, 3, 32, 64)
    for kind, jax_init in (
        ("lecun_normal", jax.nn.initializers.lecun_normal()),
        ("glorot_uniform", jax.nn.initializers.glorot_uniform()),
    ):
        ours = full(Initializer(kind), shape)
        theirs = np.asarray(jax_init(jax.random.key(0), shape, np.float32))
        assert ours.std() == pytest.approx(theirs.std(), rel=0.03), kind
        assert np.abs(ours).max() == pytest.approx(np.abs(theirs).max(), rel=0.03), kind
    assert fans(shape) == (3 * 3 * 32, 3 * 3 * 64)
    with pytest.raises(ValueError, match="rank >= 2"):
        fans((5,))


def test_dtypes_and_scalars() -> None:
    bf16 = generate(Initializer("normal", 1.0), "x", (8,), "bfloat16", (slice(0, 8),))
    assert bf16.dtype.name == "bfloat16"
    scalar = generate(Initializer("constant", value=7), "x", (), "int32", ())
    assert scalar.shape == () and int(scalar) == 7


def test_parse_init_forms() -> None:
    assert parse_init("zeros", 0) == Initializer("zeros")
    assert parse_init("normal(0.02)", 5) == Initializer("normal", 0.02, seed=5)
    assert parse_init("constant(1)", 0).value == 1
    assert parse_init({"name": "truncated_normal", "stddev": 2, "seed": 9}, 0) == Initializer(
        "truncated_normal", 2.0, seed=9
    )
    for bad, message in (
        ("norml(0.1)", "did you mean 'normal'"),
        ("normal(x)", "not a number"),
        ("constant", "needs a value"),
        ({"name": "zeros", "stddev": 1}, "zeros takes no 'stddev'"),
        ({"name": "normal", "stddev": -1}, "positive"),
        ({"name": "lecun_normal", "seed": -1}, "non-negative"),
        (3, "expected a name"),
    ):
        with pytest.raises(ValueError, match=message):
            parse_init(bad, 0)


def test_large_regions_are_generated_piecewise_with_the_same_values() -> None:
    init = Initializer("truncated_normal", 1.0, seed=2)
    shape = (1200, 1000)  # 1.2M elements: above the piece size
    whole = generate(init, "w", shape, "float32", (slice(0, 1200), slice(0, 1000)))
    part = generate(init, "w", shape, "float32", (slice(333, 334), slice(0, 1000)))
    assert whole[333:334].tobytes() == part.tobytes()


@pytest.mark.parametrize(
    "region", [(slice(0, 8), slice(0, 9)), (slice(3, 8), slice(6, 9)), (slice(5, 8), slice(0, 2))]
)
def test_outside_boxes_cover_exactly_the_new_elements(region: tuple[slice, ...]) -> None:
    from ckpt_cli.core.spec.ops import outside

    old = (5, 6)
    covered = np.zeros((8, 9), int)
    for box in outside(region, old):
        covered[box] += 1
    expected = np.zeros((8, 9), int)
    expected[region] = 1
    expected[:5, :6] = 0
    assert (covered == expected).all()
