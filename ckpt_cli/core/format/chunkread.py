"""A stored chunk's decoded bytes, front to back: its stored bytes in ranges, zstd decoded as a
stream (``ChunkReader``), for chunks stored uncompressed or as one zstd frame (``chunk_layout``).
``chunkstream`` hands a large chunk out slab by slab with it; ``read_rows`` decodes whole chunks
of a leaf straight into the array a read returns (``arrays.LeafReader``). This module imports
no other module of ``format``: the readers above it use it.
"""

from __future__ import annotations

import ctypes
import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from ckpt_cli.core.format import codecs
from ckpt_cli.core.threads import Spare
from ckpt_cli.errors import StorageError

#: Stored bytes fetched per range request while a chunk streams.
RANGE_BYTES = 4 << 20
_NO_INNER = (1 << 64) - 1

Block = tuple[slice, ...]


@dataclass(frozen=True)
class ChunkLayout:
    """How a leaf's chunks are stored, when they can be streamed here."""

    zstd: bool
    sharded: bool  # a zarr3 shard of one inner chunk: the payload's place is in its index
    separator: str
    prefix: str  # "c" for zarr3's default chunk keys, "" otherwise

    def key(self, index: tuple[int, ...]) -> str:
        parts = [self.prefix] if self.prefix else []
        return self.separator.join(parts + [str(i) for i in index]) or "0"


def _inner_codecs(codecs_: list[Any]) -> bool | None:
    """zstd (True), none (False) or None when the chain is anything else."""
    names = [c.get("name") for c in codecs_]
    endian: dict[str, Any] = next(
        (c.get("configuration", {}) for c in codecs_ if c.get("name") == "bytes"), {}
    )
    if endian.get("endian", "little") != "little" or names not in (["bytes"], ["bytes", "zstd"]):
        return None
    return names == ["bytes", "zstd"]


def chunk_layout(metadata: dict[str, Any], info: Any) -> ChunkLayout | None:
    """The streamable layout of a leaf's chunks (the zarr metadata TensorStore opened), or None."""
    if not info.shape or not codecs.available():
        return None
    if metadata.get("zarr_format") == 2:
        comp, dtype = metadata.get("compressor"), str(metadata.get("dtype", ""))
        if metadata.get("order", "C") != "C" or metadata.get("filters"):
            return None
        if (comp is not None and comp.get("id") != "zstd") or dtype.startswith(">"):
            return None
        return ChunkLayout(comp is not None, False, metadata.get("dimension_separator", "."), "")
    chain = metadata.get("codecs", [])
    sharded = len(chain) == 1 and chain[0].get("name") == "sharding_indexed"
    if sharded:
        conf = chain[0].get("configuration", {})
        if tuple(conf.get("chunk_shape", ())) != info.chunk_shape:
            return None  # several inner chunks: TensorStore reads only those a box needs
        if conf.get("index_location", "end") != "end":
            return None
        chain = conf.get("codecs", [])
    zstd = _inner_codecs(chain)
    if zstd is None:
        return None
    enc = metadata.get("chunk_key_encoding", {})
    sep = enc.get("configuration", {}).get("separator")
    if enc.get("name", "default") == "v2":
        return ChunkLayout(zstd, sharded, sep or ".", "")
    return ChunkLayout(zstd, sharded, sep or "/", "c")


class _Buf(ctypes.Structure):
    _fields_ = (("ptr", ctypes.c_void_p), ("size", ctypes.c_size_t), ("pos", ctypes.c_size_t))


@functools.lru_cache(maxsize=1)
def _zstd_stream_lib() -> Any:
    """libzstd with its streaming decoder's signatures declared (once)."""
    lib = codecs._libzstd()
    lib.ZSTD_createDStream.restype = ctypes.c_void_p
    lib.ZSTD_freeDStream.argtypes = [ctypes.c_void_p]
    lib.ZSTD_initDStream.argtypes = [ctypes.c_void_p]
    lib.ZSTD_initDStream.restype = ctypes.c_size_t
    lib.ZSTD_decompressStream.argtypes = [
        ctypes.c_void_p,
        ctypes.POINTER(_Buf),
        ctypes.POINTER(_Buf),
    ]
    lib.ZSTD_decompressStream.restype = ctypes.c_size_t
    lib.ZSTD_DCtx_setParameter.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    lib.ZSTD_DCtx_setParameter.restype = ctypes.c_size_t
    return lib


#: ``ZSTD_d_stableOutBuffer`` (zstd's experimental parameter 2, since 1.4.4): the output buffer
#: holds the whole frame and stays put between calls, so zstd decodes straight into it instead
#: of into its window buffer and copying out (a level-1 frame of 32 MiB: a 1 MiB window).
_STABLE_OUT = 1001


#: One idle stream a thread, kept between chunks instead of a stream made and freed a chunk
#: (its tables and window allocated, faulted in and zeroed again each time).
_idle_streams: Spare[codecs.Handle] = Spare()


def _take_stream(lib: Any) -> codecs.Handle:
    """This thread's idle zstd stream, reset, else a new one (freed with its object)."""
    stream = _idle_streams.take()
    if stream is None or not stream.ptr:
        stream = codecs.Handle(lib, "ZSTD_createDStream", "ZSTD_freeDStream")
    lib.ZSTD_initDStream(stream.ptr)
    return stream


#: Told of every range a ``FileValue`` read: (offset in the file, the bytes, valid only
#: during the call).
Tap = Callable[[int, memoryview], None]


class Place(NamedTuple):
    """Where a chunk's stored bytes are in a local file; ``tap``: told of each range read
    (``verify --deep`` sums the file's CRC-32 from them instead of reading the file again)."""

    path: str
    offset: int
    length: int
    tap: Tap | None = None


class FileValue:
    """A stored value at a known place of a local file, with ``kv.read``'s interface (a range
    of the value; negative starts count from its end), read with ``preadv`` into one buffer
    reused for every range: a range is consumed (decoded, copied) before the next is read.
    (A mapping of the file would save that copy but count every page read in the RSS.)"""

    def __init__(self, place: Place) -> None:
        path, self.offset, self.length, self.tap = place
        self.fd = os.open(path, os.O_RDONLY)
        self.buf = bytearray()
        if self.offset + self.length > os.fstat(self.fd).st_size:
            self.close()
            raise StorageError(f"{path} is shorter than the chunk it should hold")

    def read(self, key: str, byte_range: slice) -> Any:
        a, b = byte_range.start, byte_range.stop
        a = self.length + a if a < 0 else a
        b = self.length if b is None else min(b, self.length)
        n = max(0, b - a)
        if len(self.buf) < n:
            self.buf = bytearray(n)
        view = memoryview(self.buf)[:n]
        got = os.preadv(self.fd, [view], self.offset + a) if n else 0
        if self.tap is not None and got:
            self.tap(self.offset + a, view[:got])
        return _Ready(view[:got])

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class _Ready:
    def __init__(self, value: Any) -> None:
        self.value, self.state = value, "value"

    def result(self) -> _Ready:
        return self


class ChunkReader:
    """The decoded bytes of one stored chunk, front to back (``fill``)."""

    def __init__(self, kv: Any, key: str, layout: ChunkLayout, range_bytes: int = RANGE_BYTES):
        self.kv, self.key, self.range_bytes = kv, key, range_bytes
        self.start, self.end = self._payload(layout)
        self.pos = self.start
        self.lib: Any = _zstd_stream_lib() if layout.zstd else None
        self.stream: codecs.Handle | None = _take_stream(self.lib) if self.lib is not None else None
        self.started = False  # whether the stream has been given any input
        self.pending: Any = None
        self.inbuf = _Buf(None, 0, 0)

    def _read(self, a: int, b: int | None) -> Any:
        got = self.kv.read(self.key, byte_range=slice(a, b)).result()
        if got.state != "value":
            raise StorageError(f"chunk {self.key} is missing")
        return got.value if isinstance(got.value, memoryview) else bytes(got.value)

    def _payload(self, layout: ChunkLayout) -> tuple[int, int]:
        if not layout.sharded:  # to the end of the value (its length when known)
            return 0, self.kv.length if isinstance(self.kv, FileValue) else -1
        tail = bytes(self._read(-20, None))
        crc = codecs._crc32c()
        if len(tail) != 20 or (
            crc is not None and crc(tail[:16]) != int.from_bytes(tail[16:], "little")
        ):
            raise StorageError(f"shard {self.key}: its index is damaged (CRC-32C mismatch)")
        offset, size = int.from_bytes(tail[:8], "little"), int.from_bytes(tail[8:16], "little")
        if offset == _NO_INNER:
            raise StorageError(f"shard {self.key} holds no chunk")
        return offset, offset + size

    def _next_input(self, want: int) -> bytes:
        if self.end >= 0:
            stop = min(self.end, self.pos + want)
            data = self._read(self.pos, stop) if stop > self.pos else b""
        else:  # the value's size is unknown: a range past its end is refused, not clipped
            try:
                data = self._read(self.pos, self.pos + want)
            except ValueError as e:
                if "OUT_OF_RANGE" not in str(e):
                    raise
                data = self._read(self.pos, None)
                self.end = self.pos + len(data)
        self.pos += len(data)
        return data

    def fill(self, out: Any) -> None:
        """Write the next ``out.nbytes`` decoded bytes into ``out`` (a C-contiguous array)."""
        import numpy as np

        view = out.reshape(-1).view("uint8")
        if self.lib is None:
            data = self._next_input(view.size)
            if len(data) != view.size:
                raise StorageError(f"chunk {self.key} is shorter than its shape")
            view[:] = memoryview(data)
            return
        assert self.stream is not None
        outbuf = _Buf(view.ctypes.data, view.size, 0)
        while outbuf.pos < outbuf.size:
            if self.inbuf.pos >= self.inbuf.size:
                data = self._next_input(self.range_bytes)
                if not len(data):
                    raise StorageError(f"chunk {self.key}: its zstd stream ends early")
                self.pending = np.frombuffer(data, np.uint8)  # read-only: zstd only reads it
                self.inbuf = _Buf(self.pending.ctypes.data, self.pending.size, 0)
                if not self.started:
                    self.started = True
                    self._stable_if_whole(data, view.size)
            ret = self.lib.ZSTD_decompressStream(
                self.stream.ptr, ctypes.byref(outbuf), ctypes.byref(self.inbuf)
            )
            if self.lib.ZSTD_isError(ret):
                raise StorageError(f"chunk {self.key}: zstd cannot decode it (damaged data)")

    def _stable_if_whole(self, first: Any, out_size: int) -> None:
        """Let zstd decode straight into this fill's output when that output is the whole
        frame (its content size, read from the frame's header in the first input): the fill
        then decodes it all in one buffer, as ``ZSTD_d_stableOutBuffer`` requires. Otherwise
        (slabs, an edge chunk's rows, no size in the header) the stream keeps its window."""
        assert self.stream is not None
        head = bytes(memoryview(first)[:18])
        size = int(self.lib.ZSTD_getFrameContentSize(head, len(head)))
        # Set either way: a stream kept from an earlier chunk may hold the other value. A
        # libzstd without the parameter refuses it, and the stream keeps its window.
        self.lib.ZSTD_DCtx_setParameter(self.stream.ptr, _STABLE_OUT, int(size == out_size))

    def close(self) -> None:
        if self.stream is not None:
            stream, self.stream = self.stream, None
            _idle_streams.give(stream)  # the next chunk's ``_take_stream`` resets it
        self.pending = None
        if isinstance(self.kv, FileValue):
            self.kv.close()


#: Chunks at least this large are decoded here when a read asks for whole ones
#: (``read_rows``): below it TensorStore's whole-chunk decode costs no more.
ROWS_MIN_CHUNK_BYTES = 4 << 20


def rows_region(
    shape: tuple[int, ...], chunk: tuple[int, ...], block: tuple[slice, ...]
) -> tuple[int, int] | None:
    """The rows ``[a, b)`` when ``block`` is whole chunks of a leaf cut along its first axis
    only (each chunk full width, so its decoded bytes are the block's rows in C order)."""
    if not shape or len(block) != len(shape) or chunk[1:] != shape[1:]:
        return None
    if any(s.start != 0 or s.stop != n for s, n in zip(block[1:], shape[1:], strict=True)):
        return None
    a, b = block[0].start, block[0].stop
    if a is None or b is None or a % chunk[0] or (b % chunk[0] and b != shape[0]) or b <= a:
        return None
    return a, b


def read_rows(
    kv: Any,
    layout: ChunkLayout,
    chunk_rows: int,
    rows: tuple[int, int],
    out: Any,
    locate: Callable[[str], Place | None] | None = None,
) -> Any:
    """Decode the chunks holding rows ``[a, b)`` straight into ``out`` (their values, C order;
    the padding of an edge chunk never decoded); returns ``out``. Each chunk streams (its
    stored bytes in ranges of ``RANGE_BYTES``): decoding a whole chunk in one call ran 10 %
    faster on the 13-core host but held each chunk's stored bytes too, 380 MiB more at 13
    threads on 32 MiB chunks. ``locate(chunk key)``: where a chunk lies in a local file (read
    from the file, ``FileValue``), or None (through ``kv``)."""
    a, b = rows
    for first in range(a, b, chunk_rows):
        last = min(b, first + chunk_rows)
        index = (first // chunk_rows,) + (0,) * (out.ndim - 1)
        key = layout.key(index)
        place = locate(key) if locate is not None else None
        reader = ChunkReader(FileValue(place) if place else kv, key, layout)
        try:
            reader.fill(out[first - a : last - a])
        finally:
            reader.close()
    return out
