"""Byte codecs the metadata paths need without TensorStore: zstd, CRC-32C, one zarr scalar.

``inspect`` of a bucket reads zarr headers and the saved step counter out of OCDBT nodes and
zarr chunks; decoding them here spares importing TensorStore (with numpy and ml_dtypes: 1-1.5 s
of a short command). zstd comes from the system's libzstd through ctypes and CRC-32C from
``google_crc32c`` where installed; without either, ``available()`` is False and callers read
through TensorStore as before. Nothing here raises on damage: it returns None, and the caller
falls back to TensorStore, whose error messages ``verify`` and the tests know.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import struct
import threading
from typing import Any

#: ZSTD_getFrameContentSize's answers for "unknown" and "error" (as unsigned 64-bit values).
_ZSTD_UNKNOWN = (1 << 64) - 1
_ZSTD_ERROR = (1 << 64) - 2
#: Decoded bytes one zstd frame may claim at most here (OCDBT nodes are limited to 8 MiB by
#: default; a forged header must not make us allocate gigabytes).
MAX_DECODED_BYTES = 64 << 20


@functools.lru_cache(maxsize=1)
def _libzstd() -> Any:
    name = ctypes.util.find_library("zstd") or "libzstd.so.1"
    try:
        lib = ctypes.CDLL(name)
    except OSError:
        return None
    lib.ZSTD_getFrameContentSize.restype = ctypes.c_ulonglong
    lib.ZSTD_getFrameContentSize.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    lib.ZSTD_isError.restype = ctypes.c_uint
    lib.ZSTD_isError.argtypes = [ctypes.c_size_t]
    lib.ZSTD_createDCtx.restype = ctypes.c_void_p
    lib.ZSTD_createDCtx.argtypes = []
    lib.ZSTD_freeDCtx.restype = ctypes.c_size_t
    lib.ZSTD_freeDCtx.argtypes = [ctypes.c_void_p]
    lib.ZSTD_decompressDCtx.restype = ctypes.c_size_t
    lib.ZSTD_decompressDCtx.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
    lib.ZSTD_decompressDCtx.argtypes += [ctypes.c_char_p, ctypes.c_size_t]
    return lib


class Handle:
    """A C object made by ``lib.<make>()`` and freed by ``lib.<free>(ptr)`` with this object
    (a zstd context, a zstd stream). A signal can stop ``__init__`` before ``ptr`` is assigned
    (Ctrl-C or SIGTERM raise where the call returns): ``__del__`` then has nothing to free and
    says nothing (it printed a traceback after "ckpt: interrupted")."""

    def __init__(self, lib: Any, make: str, free: str) -> None:
        self.lib, self.free, self.ptr = lib, free, None
        self.ptr = getattr(lib, make)()

    def __del__(self) -> None:
        ptr, self.ptr = getattr(self, "ptr", None), None
        if ptr:
            getattr(self.lib, self.free)(ptr)


#: One context a thread, made at its first decode and kept: ``ZSTD_decompress`` made and freed
#: one each call, 15 of its 20 us for a 1.4 KiB OCDBT node here (``du`` decodes 3 a step).
_contexts = threading.local()


def _dctx(lib: Any) -> Any:
    ctx = getattr(_contexts, "ctx", None)
    if ctx is None:
        ctx = _contexts.ctx = Handle(lib, "ZSTD_createDCtx", "ZSTD_freeDCtx")
    return ctx.ptr


@functools.lru_cache(maxsize=1)
def _crc32c() -> Any:
    try:
        import google_crc32c
    except ImportError:
        return None
    return google_crc32c.value


def available() -> bool:
    """Whether zstd and CRC-32C can be decoded here without TensorStore."""
    return _libzstd() is not None and _crc32c() is not None


def zstd_decompress(data: bytes) -> bytes | None:
    """One zstd frame, decoded; None when it cannot be decoded here (or claims more than
    ``MAX_DECODED_BYTES``). A frame that does not record its decoded size (TensorStore's
    streamed nodes) is tried into buffers of growing size."""
    lib = _libzstd()
    dctx = _dctx(lib) if lib is not None else None
    if not dctx:  # no libzstd, or no memory for a context
        return None
    size = int(lib.ZSTD_getFrameContentSize(data, len(data)))
    if size == _ZSTD_ERROR or (size != _ZSTD_UNKNOWN and size > MAX_DECODED_BYTES):
        return None
    known = size != _ZSTD_UNKNOWN
    capacity = size if known else max(4 << 10, 8 * len(data))
    while True:
        out = ctypes.create_string_buffer(max(1, capacity))
        n = int(lib.ZSTD_decompressDCtx(dctx, out, capacity, data, len(data)))
        if not lib.ZSTD_isError(n):
            return out.raw[:n] if not known or n == size else None
        if known or capacity >= MAX_DECODED_BYTES:
            return None
        capacity = min(MAX_DECODED_BYTES, capacity * 4)


def crc32c_matches(data: bytes) -> bool:
    """Whether the last 4 bytes of ``data`` are the CRC-32C (little-endian) of the rest."""
    crc = _crc32c()
    if crc is None or len(data) < 4:
        return False
    return int(crc(data[:-4])) == int.from_bytes(data[-4:], "little")


_INTS = {1: "b", 2: "h", 4: "i", 8: "q"}
_FLOATS = {"float16": "e", "float32": "f", "float64": "d"}


def scalar_value(raw: bytes, dtype: str, big_endian: bool = False) -> int | float | None:
    """The one element of a decoded chunk of ``dtype`` (bool, ints, floats); None otherwise."""
    order = ">" if big_endian else "<"
    if dtype == "bool" and len(raw) == 1:
        return int(raw[0] != 0)
    if dtype in _FLOATS:
        fmt = order + _FLOATS[dtype]
    elif dtype.startswith(("int", "uint")):
        bits = dtype.removeprefix("u").removeprefix("int")
        size = int(bits) // 8 if bits.isdigit() else 0
        if size not in _INTS:
            return None
        letter = _INTS[size]
        fmt = order + (letter.upper() if dtype.startswith("uint") else letter)
    else:
        return None
    if len(raw) != struct.calcsize(fmt):
        return None
    value: int | float = struct.unpack(fmt, raw)[0]
    return value


def zarr_scalar(header: dict[str, Any], chunk: bytes, dtype: str) -> int | float | None:
    """The value of a rank-0 zarr array from its one chunk, as its header describes it: zarr2
    with no compressor or zstd; zarr3 with ``bytes`` + ``zstd``, inside ``sharding_indexed`` or
    not. None for any other encoding (TensorStore then reads it)."""
    if header.get("zarr_format") == 2:
        if header.get("filters"):
            return None
        comp = header.get("compressor")
        raw = chunk if comp is None else _codec_zstd(comp.get("id"), chunk)
        typestr = str(header.get("dtype", ""))
        return None if raw is None else scalar_value(raw, dtype, typestr.startswith(">"))
    if header.get("zarr_format") == 3:
        return _zarr3_chunk(header.get("codecs", []), chunk, dtype)
    return None


def _codec_zstd(name: Any, data: bytes) -> bytes | None:
    return zstd_decompress(data) if name == "zstd" else None


def _zarr3_chunk(codecs: Any, chunk: bytes, dtype: str) -> int | float | None:
    if not isinstance(codecs, list) or not codecs:
        return None
    first = codecs[0] if isinstance(codecs[0], dict) else {}
    if first.get("name") == "sharding_indexed" and len(codecs) == 1:
        conf = first.get("configuration", {})
        at_start = conf.get("index_location", "end") == "start"
        index = chunk[:20] if at_start else chunk[-20:]
        # One inner chunk (a scalar): its (offset, nbytes) as two uint64le, then a CRC-32C.
        if len(index) != 20 or not crc32c_matches(index):
            return None
        offset, nbytes = struct.unpack("<QQ", index[:16])
        inner = chunk[offset : offset + nbytes]
        if len(inner) != nbytes:
            return None
        return _zarr3_chunk(conf.get("codecs", []), inner, dtype)
    big = False
    data: bytes | None = chunk
    for codec in reversed(codecs):
        if not isinstance(codec, dict) or data is None:
            return None
        name = codec.get("name")
        if name == "bytes":
            big = codec.get("configuration", {}).get("endian", "little") == "big"
        elif name == "zstd":
            data = zstd_decompress(data)
        else:
            return None
    return None if data is None else scalar_value(data, dtype, big)
