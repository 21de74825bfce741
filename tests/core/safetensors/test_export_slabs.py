"""Export streams a leaf whose chunks are large (``tensor_slab``) as a job of its own (``export_slabs``): the
same file bytes and digests at 1 and 4 threads, casts applied per slab, a job per such tensor
(counted), a job's error raised as one line with nothing left behind, and the slabs and jobs
sized under the memory limit."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ckpt_cli.core.safetensors import export_slabs
from tests.support.cli import run_cli
from tests.support.read_count import file_values_opened, save_one_chunk_leaves

pytestmark = pytest.mark.xdist_group("export_slabs")


@pytest.fixture(scope="module")
def one_chunk_src(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, object]]:
    root = tmp_path_factory.mktemp("one_chunk") / "src"
    return root, save_one_chunk_leaves(root)


def _jobs_counted(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    made: list[str] = []
    real = export_slabs.SlabJob.run

    def run(self: export_slabs.SlabJob, *args: Any) -> Any:
        made.append(self.name)
        return real(self, *args)

    monkeypatch.setattr(export_slabs.SlabJob, "run", run)
    return made


def _export(src: Path, out: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> None:
    result = run_cli(["export", str(src / "0"), str(out), *extra], capsys)
    assert result.code == 0, result.stderr


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _params(state: dict[str, object]) -> dict[str, np.ndarray]:
    params = state["params"]
    assert isinstance(params, dict) and params
    return params


def test_streamed_tensors_equal_at_one_and_four_threads(
    one_chunk_src: tuple[Path, dict[str, object]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import safetensors.numpy

    src, state = one_chunk_src
    made = _jobs_counted(monkeypatch)
    # 32 MiB: slabs of 4 MiB on one thread (the 8 MiB chunk of params.w streams in them, the
    # 2 MiB one of params.b in halves: ``tensor_slab``), 1 MiB on four: both stream either way.
    _export(src, tmp_path / "t1", capsys, "--threads", "1", "--memory-limit", "32MiB")
    assert made == ["params.b", "params.w"]  # file order
    made.clear()
    _export(src, tmp_path / "t4", capsys, "--threads", "4", "--memory-limit", "32MiB")
    assert sorted(made) == ["params.b", "params.w"]
    one, four = tmp_path / "t1" / "model.safetensors", tmp_path / "t4" / "model.safetensors"
    assert _sha(one) == _sha(four)
    out = safetensors.numpy.load_file(str(four))
    for name, value in _params(state).items():
        assert np.array_equal(out[f"params.{name}"], value), name
    # The ld1 digests the export recorded are the source's, as `ckpt digest` computes them.
    verified = run_cli(["verify", str(tmp_path / "t4"), "--deep", "--json"], capsys)
    assert verified.code == 0, verified.stdout
    digest = run_cli(["digest", str(src / "0"), "--json"], capsys)
    assert digest.code == 0, digest.stderr
    import json

    from ckpt_cli.core.safetensors.ld1 import decode

    with safetensors.safe_open(str(four), "np") as f:
        recorded = decode(f.metadata())
    leaves = {d["name"]: d["digest"] for d in json.loads(digest.stdout)["items"][0]["leaves"]}
    assert len(leaves) == 2 and leaves == recorded


def test_a_cast_is_applied_slab_by_slab(
    one_chunk_src: tuple[Path, dict[str, object]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import ml_dtypes
    import safetensors.numpy

    src, state = one_chunk_src
    made = _jobs_counted(monkeypatch)
    _export(
        src,
        tmp_path / "bf",
        capsys,
        "--dtype",
        "bfloat16",
        "--threads",
        "4",
        "--memory-limit",
        "32MiB",
    )
    assert sorted(made) == ["params.b", "params.w"]
    out = safetensors.numpy.load_file(str(tmp_path / "bf" / "model.safetensors"))
    for name, value in _params(state).items():
        want = np.asarray(value).astype(ml_dtypes.bfloat16)
        got = out[f"params.{name}"]
        assert got.dtype == want.dtype and np.array_equal(got.view(np.uint16), want.view(np.uint16))


def test_a_read_failing_midway_stops_the_export_with_one_line(
    one_chunk_src: tuple[Path, dict[str, object]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The disk fails under a job after some slabs were written: the writer raises the job's
    error as one line, the other jobs stop, and no output or temporary directory is left."""
    from ckpt_cli.core.format import chunkread

    src, _ = one_chunk_src
    real = chunkread.ChunkReader.fill
    calls = [0]

    def fill(self: chunkread.ChunkReader, out: object) -> None:
        calls[0] += 1
        if calls[0] == 5:
            raise OSError(5, "Input/output error")
        real(self, out)

    monkeypatch.setattr(chunkread.ChunkReader, "fill", fill)
    out = tmp_path / "out"
    args = ["export", str(src / "0"), str(out), "--threads", "4", "--memory-limit", "32MiB"]
    result = run_cli(args, capsys)
    assert calls[0] >= 5
    assert result.code == 3, result.stderr
    assert "Input/output error" in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not out.exists() and not list(tmp_path.iterdir())


def test_cast_chain_takes_only_casts_of_a_whole_leaf() -> None:
    from ckpt_cli.core.format.arrays import ArrayInfo
    from ckpt_cli.core.spec import ops

    shape = (64, 32)
    info = ArrayInfo("float32", shape, shape, zarr_format=2, compression="zstd")
    source = ops.Source(shape, "float32", "w", info, "")
    cast = ops.Cast(shape, "bfloat16", source, None, "export", "w")
    assert export_slabs.cast_chain(source) == (source, [])
    assert export_slabs.cast_chain(cast) == (source, [cast])
    assert export_slabs.cast_chain(ops.Transpose((32, 64), "float32", source, (1, 0))) is None


def test_whether_a_tensor_streams_hangs_on_its_chunks_not_on_the_threads() -> None:
    """A chunk larger than the slab streams in slabs; one of two minimum slabs up to the slab
    in halves (8 MiB chunks of a sharded save used to stream at 8 threads and go through
    TensorStore's ordered blocks at 4, twice as slow); a smaller one does not stream."""
    mib = 1 << 20
    assert export_slabs.tensor_slab(4 * mib, 32 * mib) == 4 * mib
    assert export_slabs.tensor_slab(4 * mib, 8 * mib) == 4 * mib
    assert export_slabs.tensor_slab(8 * mib, 8 * mib) == 4 * mib
    assert export_slabs.tensor_slab(8 * mib, 2 * mib) == mib
    assert export_slabs.tensor_slab(8 * mib, 2 * mib - 1) is None
    assert export_slabs.tensor_slab(mib, 512 * 1024) is None
    for threads in (1, 4, 8, 13):
        slab = export_slabs.slab_bytes(256 * mib, threads)
        assert export_slabs.tensor_slab(slab, 8 * mib) is not None, threads


def test_a_small_chunked_tensor_goes_through_tensorstore_beside_streamed_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunks under two minimum slabs are read as blocks through TensorStore, written in the
    same file as the streamed tensors: the same bytes at 1 and 4 threads."""
    import orbax.checkpoint as ocp
    import safetensors.numpy

    rng = np.random.default_rng(1)
    state = {
        "w": rng.standard_normal((1024, 2048), dtype=np.float32),  # 8 MiB: streams
        "c": rng.standard_normal((256, 1024), dtype=np.float32),  # 1 MiB: TensorStore
    }
    with ocp.CheckpointManager(tmp_path / "src") as mgr:
        mgr.save(0, args=ocp.args.StandardSave(state))
        mgr.wait_until_finished()
    made = _jobs_counted(monkeypatch)
    for n in ("1", "4"):
        _export(tmp_path / "src", tmp_path / f"t{n}", capsys, "--threads", n)
        assert made == ["w"], n
        made.clear()
    one, four = tmp_path / "t1" / "model.safetensors", tmp_path / "t4" / "model.safetensors"
    assert _sha(one) == _sha(four)
    out = safetensors.numpy.load_file(str(four))
    assert sorted(out) == ["c", "w"]
    for name, value in state.items():
        assert np.array_equal(out[name], value), name


@pytest.mark.parametrize("threads", [1, 2, 4, 13, 64])
@pytest.mark.parametrize("limit", [16 << 20, 256 << 20, 4 << 30])
def test_jobs_and_slabs_fit_half_the_memory_limit(threads: int, limit: int) -> None:
    from ckpt_cli.core.format.chunkread import RANGE_BYTES

    slab = export_slabs.slab_bytes(limit // 4, threads)
    assert export_slabs.MIN_SLAB <= slab <= export_slabs.MAX_SLAB
    assert export_slabs.job_bytes(slab) == 2 * slab + RANGE_BYTES
    jobs = export_slabs.jobs_for(limit, slab, threads)
    assert 1 <= jobs <= threads
    assert jobs == 1 or jobs * export_slabs.job_bytes(slab) <= limit // 2


def test_streamed_chunks_are_read_from_the_data_files(
    one_chunk_src: tuple[Path, dict[str, object]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Locally, the source's structure check lists where each chunk lies: a streamed chunk is
    read from its data file (``FileValue``), not through the OCDBT kvstore."""
    from ckpt_cli.core.format import chunkstream

    src, _ = one_chunk_src
    opened = file_values_opened(monkeypatch, chunkstream)
    _export(src, tmp_path / "out", capsys, "--threads", "4", "--memory-limit", "32MiB")
    assert len(opened) == 2 and all("/d/" in p for p in opened), opened
