"""A chunk larger than the read budget streams (``format.chunkstream``): stored bytes in ranges,
zstd decoded as a stream, C-order slabs. ``verify --deep`` gives the same NaN/Inf counts and
checks the same ld1 and SHA-256 digests as when TensorStore decodes the chunk whole, on real
Orbax saves (zarr2 and zarr3's one-inner-chunk shards), and its peak memory does not follow the
chunk size."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorstore as ts

from ckpt_cli.core.digest.records import DigestRecord, LeafDigest, write_digests
from ckpt_cli.core.format import scan
from ckpt_cli.core.storage import LocalLocation
from ckpt_cli.core.verify.run import verify_path
from ckpt_cli.core.verify.types import VerifyOptions

ROWS, COLS = 600, 1024  # 2.3 MiB of float32, one chunk; 600 rows: slabs do not divide it
BUDGET = 256 << 10
REPO = Path(__file__).resolve().parents[3]


def _save(root: Path, zarr3: bool) -> Path:
    import orbax.checkpoint as ocp

    embed = np.random.default_rng(0).standard_normal((ROWS, COLS), dtype=np.float32)
    embed[3, 5] = np.nan
    embed[100, 7] = np.inf
    embed[599, 1023] = -np.inf
    tree = {"embed": embed, "bias": np.arange(8, dtype=np.float32)}
    with ocp.Checkpointer(ocp.PyTreeCheckpointHandler(use_zarr3=zarr3)) as ckptr:
        ckptr.save(root / "item", args=ocp.args.PyTreeSave(tree))
    return root / "item"


def _verify(item: Path, **options: Any) -> dict[str, Any]:
    report = verify_path(LocalLocation(str(item)), VerifyOptions(deep=True, **options))
    return dict(report.to_json())


def _nonfinite(report: dict[str, Any]) -> list[tuple[str, int, int]]:
    return [(n["leaf"], n["nan"], n["inf"]) for n in report["nonfinite"]]


def _codes(report: dict[str, Any], code: str) -> list[str]:
    return [p["leaf"] for p in report["problems"] if p["code"] == code]


def _values(item: Path) -> Any:
    spec = {"kvstore": {"driver": "ocdbt", "base": f"file://{item}/", "path": "embed/"}}
    for driver in ("zarr", "zarr3"):
        try:
            return ts.open({**spec, "driver": driver}).result()
        except ValueError:
            continue
    raise AssertionError("no zarr array named embed")


@pytest.fixture
def streamed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The leaves ``chunk_slabs`` streamed (a spy: the test fails if TensorStore read them)."""
    seen: list[str] = []
    real = scan.chunk_slabs

    def spy(kv: Any, layout: Any, info: Any, dtype: Any, budget: int, locate: Any = None) -> Any:
        seen.append(f"{info.shape}")
        return real(kv, layout, info, dtype, budget, locate)

    monkeypatch.setattr(scan, "chunk_slabs", spy)
    return seen


@pytest.mark.parametrize("zarr3", [False, True], ids=["zarr2", "zarr3"])
def test_streamed_chunk_gives_the_counts_and_ld1_of_a_whole_decode(
    tmp_path: Path, zarr3: bool, streamed: list[str]
) -> None:
    item = _save(tmp_path, zarr3)
    recorded = _verify(item, record=True)  # 4 MiB blocks: TensorStore decodes the chunk whole
    assert streamed == []
    report = _verify(item, budget=BUDGET)
    assert streamed == [f"{(ROWS, COLS)}"]
    assert _nonfinite(report) == _nonfinite(recorded) == [("embed", 1, 2)]
    assert report["checked"]["digests"], "no record was checked"
    assert set(report["checked"]["digests"].values()) == {"checked"}
    assert _codes(report, "digest-mismatch") == []
    assert report["checked"]["bytes_decoded"] == recorded["checked"]["bytes_decoded"] > 0


@pytest.mark.parametrize("zarr3", [False, True], ids=["zarr2", "zarr3"])
def test_streamed_chunk_checks_a_sha256_record_and_catches_changed_values(
    tmp_path: Path, zarr3: bool, streamed: list[str]
) -> None:
    item = _save(tmp_path, zarr3)
    x = np.ascontiguousarray(_values(item).read().result())
    digest = LeafDigest("float32", x.shape, hashlib.sha256(x.tobytes()).hexdigest())
    write_digests(LocalLocation(str(item)), DigestRecord({"embed": digest}, {}, version=1))
    report = _verify(item, budget=BUDGET)
    assert streamed, "the chunk was not streamed"
    assert _codes(report, "digest-mismatch") == []
    assert set(report["checked"]["digests"].values()) == {"checked"}
    arr = _values(item)
    x[400, 2] += 1.0
    arr.write(x).result()
    changed = _verify(item, budget=BUDGET)
    assert _codes(changed, "digest-mismatch") == ["embed"]


@pytest.mark.parametrize("zarr3", [False, True], ids=["zarr2", "zarr3"])
def test_diff_of_streamed_chunks_counts_what_a_whole_decode_counts(
    tmp_path: Path, zarr3: bool, streamed: list[str]
) -> None:
    from ckpt_cli.core.diff.items import diff_paths

    a, b = _save(tmp_path / "a", zarr3), _save(tmp_path / "b", zarr3)
    arr = _values(b)
    x = arr.read().result()
    x[10:12, :3] += 0.5
    x[599, 0] = 7.0
    arr.write(x).result()
    whole = diff_paths(str(a), str(b), atol=1e-3).to_json()  # 16 MiB blocks: TensorStore
    assert streamed == []
    slabs = diff_paths(str(a), str(b), atol=1e-3, memory_limit=16 << 20).to_json()
    assert streamed == [f"{(ROWS, COLS)}"] * 2  # both sides
    leaves = {d["name"]: d for d in slabs["leaves"]}
    assert leaves["embed"]["mismatched"] == 7
    assert slabs == whole


_PEAK = """
import os, subprocess, sys
child = subprocess.Popen([sys.executable, "-m", "ckpt_cli", *sys.argv[1:]],
                         stdout=subprocess.DEVNULL)
_, status, usage = os.wait4(child.pid, 0)
print(os.waitstatus_to_exitcode(status), usage.ru_maxrss)
"""


def _peak_kib(root: Path) -> int:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-c", _PEAK, "verify", str(root), "--step", "1", "--deep"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert out[0] == "0", out
    return int(out[1])


@pytest.mark.slow
def test_verify_deep_peak_memory_does_not_follow_the_chunk_size(tmp_path: Path) -> None:
    """One-chunk leaves of 16 and 64 MiB saved by Orbax (make_big.py): TensorStore's whole
    decode would cost the 64 MiB chunk twice (stored and decoded), about 96 MiB more."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    env.pop("XLA_FLAGS", None)
    peaks = []
    for mib in (16, 64):
        root = tmp_path / f"r{mib}"
        builder = REPO / "tests" / "support" / "make_big.py"
        subprocess.run([sys.executable, str(builder), str(root), str(mib)], check=True, env=env)
        peaks.append(_peak_kib(root))
    assert peaks[1] - peaks[0] < 16 << 10, f"peak RSS {peaks} KiB for 16 and 64 MiB chunks"


@pytest.mark.parametrize(
    "codecs",
    [
        {"driver": "zarr", "metadata": {"compressor": {"id": "zstd", "level": 1}}},
        {"driver": "zarr", "metadata": {"compressor": None}},
        {
            "driver": "zarr3",
            "metadata": {
                "codecs": [
                    {
                        "name": "sharding_indexed",
                        "configuration": {
                            "chunk_shape": [64, 16],
                            "codecs": [{"name": "bytes"}, {"name": "zstd"}],
                        },
                    }
                ]
            },
        },
    ],
    ids=["zarr2-zstd", "zarr2-raw", "zarr3-shard"],
)
def test_chunk_slabs_rebuild_edge_chunks_of_every_layout(
    tmp_path: Path, codecs: dict[str, Any]
) -> None:
    """Edge chunks are stored padded: the slabs, clipped and put together, are the array."""
    from ckpt_cli.core.format.arrays import ArrayInfo
    from ckpt_cli.core.format.chunkread import chunk_layout
    from ckpt_cli.core.format.chunkstream import chunk_slabs

    x = np.random.default_rng(1).standard_normal((100, 30), dtype=np.float32)
    meta = {**codecs["metadata"], "shape": [100, 30]}
    if codecs["driver"] == "zarr":
        meta.update(chunks=[64, 16], dtype="<f4")
    else:
        meta.update(chunk_grid={"name": "regular", "configuration": {"chunk_shape": [64, 16]}})
        meta.update(data_type="float32")
    spec = {"driver": codecs["driver"], "kvstore": f"file://{tmp_path}/a/", "metadata": meta}
    arr = ts.open(spec, create=True).result()
    arr.write(x).result()
    info = ArrayInfo("float32", (100, 30), (64, 16), 2 if codecs["driver"] == "zarr" else 3, None)
    layout = chunk_layout(arr.spec().to_json()["metadata"], info)
    assert layout is not None
    out = np.full_like(x, np.nan)
    slabs = list(chunk_slabs(arr.kvstore, layout, info, np.float32, 16 * 4 * 5))
    assert len(slabs) > info.num_chunks  # several slabs a chunk
    for origin, values in slabs:
        out[tuple(slice(o, o + n) for o, n in zip(origin, values.shape, strict=True))] = values
    assert np.array_equal(out, x)


def test_a_truncated_chunk_is_a_storage_error(tmp_path: Path) -> None:
    from ckpt_cli.core.format.arrays import ArrayInfo
    from ckpt_cli.core.format.chunkread import chunk_layout
    from ckpt_cli.core.format.chunkstream import chunk_slabs
    from ckpt_cli.errors import StorageError

    x = np.random.default_rng(2).standard_normal((64, 64), dtype=np.float32)
    meta = {"compressor": {"id": "zstd"}, "shape": [64, 64], "chunks": [64, 64], "dtype": "<f4"}
    arr = ts.open(
        {"driver": "zarr", "kvstore": f"file://{tmp_path}/", "metadata": meta}, create=True
    ).result()
    arr.write(x).result()
    chunk = tmp_path / "0.0"
    chunk.write_bytes(chunk.read_bytes()[: chunk.stat().st_size // 2])
    info = ArrayInfo("float32", (64, 64), (64, 64), 2, "zstd")
    layout = chunk_layout(arr.spec().to_json()["metadata"], info)
    assert layout is not None
    with pytest.raises(StorageError, match="ends early"):
        list(chunk_slabs(arr.kvstore, layout, info, np.float32, 1024))


class _CountedKv:
    """A TensorStore kvstore whose range reads are recorded (their sizes)."""

    def __init__(self, kv: Any) -> None:
        self.kv = kv
        self.sizes: list[int] = []

    def read(self, key: str, byte_range: slice) -> Any:
        got = self.kv.read(key, byte_range=byte_range)
        value = got.result()
        if byte_range.start >= 0 and value.state == "value":
            self.sizes.append(len(value.value))
        return got


@pytest.mark.parametrize(("budget", "biggest"), [(1 << 20, 1 << 20), (16 << 20, 4 << 20)])
def test_stored_bytes_are_read_in_ranges_no_larger_than_a_slab(
    tmp_path: Path, budget: int, biggest: int
) -> None:
    """A job holds its range reads beside its slab: with a small budget (many threads under a
    small ``--memory-limit``) the ranges shrink with the slabs; a larger one keeps 4 MiB reads
    (an object store pays a request per range)."""
    from ckpt_cli.core.format.arrays import ArrayInfo
    from ckpt_cli.core.format.chunkread import RANGE_BYTES, chunk_layout
    from ckpt_cli.core.format.chunkstream import chunk_slabs

    assert RANGE_BYTES == 4 << 20
    rows, cols = 3 << 10, 1 << 10  # 12 MiB of float32, one chunk (random: zstd keeps ~11 MiB)
    x = np.random.default_rng(3).standard_normal((rows, cols), dtype=np.float32)
    meta = {"compressor": {"id": "zstd"}, "shape": [rows, cols], "chunks": [rows, cols]}
    meta["dtype"] = "<f4"
    arr = ts.open(
        {"driver": "zarr", "kvstore": f"file://{tmp_path}/", "metadata": meta}, create=True
    ).result()
    arr.write(x).result()
    info = ArrayInfo("float32", (rows, cols), (rows, cols), 2, "zstd")
    layout = chunk_layout(arr.spec().to_json()["metadata"], info)
    assert layout is not None
    kv = _CountedKv(arr.kvstore)
    out = np.concatenate([v for _, v in chunk_slabs(kv, layout, info, np.float32, budget)])
    assert np.array_equal(out, x)
    assert len(kv.sizes) > 1 and sum(kv.sizes) == (tmp_path / "0.0").stat().st_size
    assert max(kv.sizes) == biggest
