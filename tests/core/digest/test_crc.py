"""``crc.crc32`` is zlib's CRC-32 (every record ever written holds zlib's values), from ISA-L
when the ``isal`` wheel is installed (a dependency: the test environment has it) and from zlib
without it."""

from __future__ import annotations

import os
import sys
import zlib

import numpy as np
import pytest

from ckpt_cli.core.digest import crc


def _inputs() -> list[bytes]:
    rng = np.random.default_rng(7)
    sizes = [0, 1, 3, 15, 16, 17, 63, 64, 65, 255, 4096, 4099, (1 << 20) + 13]
    return [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in sizes] + [os.urandom(999)]


def _check_equals_zlib() -> None:
    inputs = _inputs()
    assert len(inputs) > 10
    for data in inputs:
        assert crc.crc32(data) == zlib.crc32(data), len(data)
        cut = len(data) // 3
        assert crc.crc32(data[cut:], crc.crc32(data[:cut])) == zlib.crc32(data), len(data)
        view = memoryview(bytearray(data))
        assert crc.crc32(view) == zlib.crc32(data)
        assert crc.crc32(np.frombuffer(data, np.uint8)) == zlib.crc32(data)


def test_the_dependency_sums_and_gives_zlibs_values() -> None:
    assert crc.backend() == "isal"
    _check_equals_zlib()


def test_without_isal_zlib_sums_the_same_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "isal", None)  # import isal raises ImportError
    monkeypatch.setattr(crc, "_crc32", None)
    assert crc.backend() == "zlib"
    _check_equals_zlib()
