"""The zstd streams that decode stored chunks (``chunkread.ChunkReader``): a fill that is a
whole frame decodes straight into its output (``ZSTD_d_stableOutBuffer``: no copy out of a
window buffer), any other fill through the stream's window; a thread keeps its idle stream for
its next chunk, reset there, so a chunk left half decoded (an early stop, an error) leaves the
next one whole. Chunks written by TensorStore (zarr2, zstd level 1)."""

from __future__ import annotations

import ctypes
import threading
from typing import Any

import numpy as np
import pytest
import tensorstore as ts

from ckpt_cli.core.format import chunkread
from ckpt_cli.core.format.chunkread import ChunkLayout, ChunkReader

CHUNK_ROWS, COLS, CHUNKS = 512, 1024, 3  # 2 MiB chunks of float32
#: Stored bytes a read fetches: less than a frame, as for chunks of tens of MiB (a frame read
#: whole in one range is decoded in one pass by zstd itself, window or not).
RANGE = 256 << 10
LAYOUT = ChunkLayout(zstd=True, sharded=False, separator=".", prefix="")


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    """(the kvstore of a zarr2 array written by TensorStore, its values)."""
    path = tmp_path_factory.mktemp("streams") / "a"
    x = np.random.default_rng(3).standard_normal((CHUNK_ROWS * CHUNKS, COLS), dtype=np.float32)
    meta = {
        "shape": list(x.shape),
        "chunks": [CHUNK_ROWS, COLS],
        "dtype": "<f4",
        "compressor": {"id": "zstd", "level": 1},
    }
    ts.open(
        {"driver": "zarr", "kvstore": f"file://{path}/", "metadata": meta}, create=True
    ).result().write(x).result()
    return ts.KvStore.open(f"file://{path}/").result(), x


def _window_bytes(stream: Any) -> int:
    lib = chunkread._zstd_stream_lib()
    lib.ZSTD_sizeof_DStream.restype = ctypes.c_size_t
    lib.ZSTD_sizeof_DStream.argtypes = [ctypes.c_void_p]
    return int(lib.ZSTD_sizeof_DStream(stream.ptr))


def _fresh_thread_stream() -> None:
    chunkread._idle_streams.take()


def _read(kv: Any, chunk: int, slabs: int = 1, stop_after: int | None = None) -> Any:
    """Chunk ``chunk`` decoded in ``slabs`` fills (only ``stop_after`` of them, when given)."""
    out = np.empty((CHUNK_ROWS, COLS), np.float32)
    reader = ChunkReader(kv, f"{chunk}.0", LAYOUT, RANGE)
    try:
        for i, part in enumerate(np.array_split(out, slabs)):
            if stop_after is not None and i == stop_after:
                break
            reader.fill(part)
    finally:
        reader.close()
    return out


def test_a_whole_chunk_decodes_into_its_output_and_slabs_through_the_window(
    stored: tuple[Any, Any],
) -> None:
    kv, x = stored
    _fresh_thread_stream()
    np.testing.assert_array_equal(_read(kv, 0), x[:CHUNK_ROWS])
    direct = _window_bytes(chunkread._idle_streams.held())
    _fresh_thread_stream()
    np.testing.assert_array_equal(_read(kv, 0, slabs=4), x[:CHUNK_ROWS])
    windowed = _window_bytes(chunkread._idle_streams.held())
    # zstd level 1 on 2 MiB: a 512 KiB window and its blocks, allocated only for the slabs.
    assert windowed - direct >= 512 << 10, (direct, windowed)


def test_read_rows_of_whole_and_edge_chunks_equal_the_values(stored: tuple[Any, Any]) -> None:
    kv, x = stored
    _fresh_thread_stream()
    for a, b in ((0, 3 * CHUNK_ROWS), (CHUNK_ROWS, 2 * CHUNK_ROWS + 100)):
        out = np.empty((b - a, COLS), np.float32)
        chunkread.read_rows(kv, LAYOUT, CHUNK_ROWS, (a, b), out)
        np.testing.assert_array_equal(out, x[a:b])


def test_a_thread_keeps_its_stream_and_a_half_decoded_chunk_leaves_the_next_whole(
    stored: tuple[Any, Any],
) -> None:
    kv, x = stored
    _fresh_thread_stream()
    _read(kv, 0, slabs=4, stop_after=1)  # stopped a quarter in: the stream is mid-frame
    kept = chunkread._idle_streams.held()
    assert kept is not None and kept.ptr
    np.testing.assert_array_equal(_read(kv, 1), x[CHUNK_ROWS : 2 * CHUNK_ROWS])
    assert chunkread._idle_streams.held() is kept  # the same stream, reset, not a new one
    np.testing.assert_array_equal(_read(kv, 2, slabs=3), x[2 * CHUNK_ROWS :])
    np.testing.assert_array_equal(_read(kv, 0), x[:CHUNK_ROWS])  # stable again after slabs
    assert chunkread._idle_streams.held() is kept


def test_threads_decoding_at_once_each_use_their_own_stream(stored: tuple[Any, Any]) -> None:
    kv, x = stored
    wrong: list[tuple[int, int]] = []
    streams: list[Any] = []  # the streams themselves: ids of freed ones could repeat

    def work(t: int) -> None:
        for i in range(6):
            chunk = (t + i) % CHUNKS
            got = _read(kv, chunk, slabs=1 + (t + i) % 3)
            if not np.array_equal(got, x[chunk * CHUNK_ROWS : (chunk + 1) * CHUNK_ROWS]):
                wrong.append((t, chunk))
        streams.append(chunkread._idle_streams.held())

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert wrong == []
    assert len(streams) == 4 and None not in streams
    assert len({id(s) for s in streams}) == 4
