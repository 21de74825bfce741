"""The preflight's arithmetic: boxes as JAX lays out a NamedSharding, chunk rounding as Orbax
estimates a read, hosts in JAX's device order."""

from __future__ import annotations

import itertools

import pytest

from ckpt_cli.core.doctor.preflight import (
    RESHARD_BASELINE,
    Placement,
    _Host,
    chunk_rounded,
    device_boxes,
    hosts_split,
    orbax_peak,
    reshard_peak,
)
from ckpt_cli.core.format.sharding import MeshSpec
from ckpt_cli.errors import UsageError


def test_boxes_follow_the_mesh_order_and_the_partition_spec() -> None:
    p = Placement(MeshSpec(("data", "model"), (2, 4)), (None, "model"), tuple(range(8)))
    boxes = dict(device_boxes((64, 256), p))
    assert boxes[0] == ((0, 64), (0, 64)) and boxes[3] == ((0, 64), (192, 256))
    assert boxes[4] == boxes[0]  # replicated over data
    both = Placement(MeshSpec(("a", "b"), (2, 2)), (("a", "b"),), (3, 2, 1, 0))
    assert [b for _, b in device_boxes((8,), both)] == [((0, 2),), ((2, 4),), ((4, 6),), ((6, 8),)]
    assert [d for d, _ in device_boxes((8,), both)] == [3, 2, 1, 0]


def test_a_box_is_widened_to_the_chunks_it_touches() -> None:
    assert chunk_rounded(((0, 64), (0, 64)), (8, 256)) == 64 * 256
    assert chunk_rounded(((0, 8), (0, 256)), (8, 256)) == 8 * 256
    assert chunk_rounded(((4, 12), (0, 10)), (8, 256)) == 16 * 256


def test_hosts_must_divide_the_devices() -> None:
    assert hosts_split(8, 4) == 2
    with pytest.raises(UsageError, match="--hosts 3"):
        hosts_split(8, 3)


def test_the_peak_counts_device_arrays_and_the_buffers_in_flight() -> None:
    h = _Host({0}, device_bytes=1 << 30, kept_bytes=1 << 29, read_bytes=1 << 31)
    h.assembled_bytes, h.largest_chunk = 1 << 29, 1 << 20
    assert orbax_peak(h) == (1 << 30) + (1 << 28) + (4 << 20) + (128 << 20)
    # restore_concurrent_gb caps the buffers at what it lets in flight (chunk-rounded: x4)
    assert orbax_peak(h, concurrent_bytes=1 << 28) == (1 << 30) + (1 << 26) + (132 << 20)


def test_the_reshard_peak_grows_with_a_small_item_and_the_limit_caps_it() -> None:
    mib = 1 << 20
    # below the limit: the process plus the item 2.5 times (decoded/encoded beside the values)
    assert reshard_peak(64 * mib) == RESHARD_BASELINE + 160 * mib
    sizes = [mib * 2**k for k in range(16)]  # 1 MiB .. 32 GiB
    peaks = [reshard_peak(n, (16 * mib,), threads_=8) for n in sizes]
    assert peaks and all(a <= b for a, b in itertools.pairwise(peaks))
    assert peaks[0] < peaks[1] < peaks[2]  # a small item: it grows with the item
    # above it: blocks in flight (a quarter of the 1 GiB limit, 1.5 times, and 144 MiB of
    # working memory) + the source cache (an eighth, which holds two 16 MiB chunks read in
    # parts), whatever the item's size
    capped = RESHARD_BASELINE + 384 * mib + 144 * mib + 128 * mib
    assert peaks[-1] == peaks[-2] == capped
    # one thread holds two blocks of 32 MiB (a sixteenth of the limit)
    one = RESHARD_BASELINE + 96 * mib + 144 * mib + 128 * mib
    assert reshard_peak(1 << 40, (16 * mib,), threads_=1) == one
    # 32 MiB chunks under a 256 MiB limit: the cache holds two (64 MiB, past its eighth by
    # 32), and the blocks' quarter gives those 32 MiB back
    tight = reshard_peak(1 << 40, (32 * mib,), memory_limit=256 * mib, threads_=8)
    assert tight == RESHARD_BASELINE + 48 * mib + 144 * mib + 64 * mib
    small = reshard_peak(1 << 40, (), memory_limit=256 * mib, threads_=8)
    # a 256 MiB limit: 64 MiB of blocks 1.5 times, the working memory, a 32 MiB cache
    assert small == RESHARD_BASELINE + 96 * mib + 144 * mib + 32 * mib
    assert small < reshard_peak(1 << 40, (), threads_=8)
