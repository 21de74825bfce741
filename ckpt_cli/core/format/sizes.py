"""A zarr header's sizes checked before anything is allocated (issue 14, item 5).

A header is a few bytes of JSON that can claim 1e15 elements in one-element chunks (a grid no
loop finishes, sets of chunk indices that exhaust memory) or one chunk of 1e15 elements
(TensorStore decodes a chunk whole: ``std::bad_alloc``). Every reader gets a leaf's header
through ``ItemStore.read_headers`` (``check_size``), and ``verify`` checks the same with
``size_problem`` as a finding, so the rule lives here once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from ckpt_cli.core.units import human_bytes, short_repr


class Sized(Protocol):
    """What of an ``arrays.ArrayInfo`` the check reads (this module sits below ``arrays``)."""

    @property
    def dtype(self) -> str: ...

    @property
    def decode_shape(self) -> tuple[int, ...]: ...

    @property
    def decoded_chunk_bytes(self) -> int: ...

    @property
    def num_decoded_chunks(self) -> int: ...


#: The largest rank TensorStore (and so Orbax) opens an array with.
MAX_RANK = 32
#: The largest dimension TensorStore takes (``kMaxFiniteSize``, 2**62 - 1).
MAX_DIM = (1 << 62) - 1


def shape_problem(shape: Sequence[Any]) -> str | None:
    """Why ``shape`` (read from outside: a safetensors header, a migrate spec) cannot be the
    shape of an array TensorStore opens, or None: a rank over ``MAX_RANK``, a dimension that is
    not an integer in ``[0, MAX_DIM]``. Checked in integers, before anything is allocated."""
    if len(shape) > MAX_RANK:
        return f"rank {len(shape)} is over the {MAX_RANK} dimensions TensorStore and Orbax support"
    for axis, d in enumerate(shape):
        if not isinstance(d, int) or isinstance(d, bool) or d < 0:
            return f"dimension {axis} is {short_repr(d)}, not a non-negative integer"
        if d > MAX_DIM:
            return f"dimension {axis} is {short_repr(d)}, over the largest TensorStore takes (2**62 - 1)"
    return None


#: Up to this many decoded chunks a grid is trusted without counting the bytes stored (no listing).
CHUNKS_TRUSTED = 1 << 16


def memory_limit() -> int:
    """Bytes this process may hold: the machine's memory, or less under an address-space limit."""
    import os

    limit = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    try:
        import resource
    except ImportError:  # not on POSIX
        return int(limit)
    for which in (resource.RLIMIT_AS, resource.RLIMIT_DATA):
        soft = resource.getrlimit(which)[0]
        if soft != resource.RLIM_INFINITY:
            limit = min(limit, soft)
    return int(limit)


def size_problem(info: Sized, stored_bytes: Callable[[], int]) -> str | None:
    """Why a header's sizes cannot be true or cannot be read here, computed in integers before
    anything is allocated: one decoded chunk larger than this process's memory (TensorStore
    decodes a chunk whole), or more chunks than the item has bytes on disk (Orbax stores every
    chunk, each takes at least one byte). ``stored_bytes`` is called only for a grid of more
    than ``CHUNKS_TRUSTED`` chunks, so ordinary headers cost no listing."""
    chunk, memory = info.decoded_chunk_bytes, memory_limit()
    if chunk > memory:
        return (
            f"one chunk of {list(info.decode_shape)} {info.dtype} decodes to "
            f"{human_bytes(chunk)}, more than the {human_bytes(memory)} of memory this process "
            "may use"
        )
    count = info.num_decoded_chunks
    if count > CHUNKS_TRUSTED:
        stored = stored_bytes()
        if count > stored:
            return (
                f"its header claims {count} chunks of {list(info.decode_shape)}, but the item "
                f"stores {human_bytes(stored)} in all (each stored chunk takes at least a byte)"
            )
    return None
