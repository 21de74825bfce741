"""Block buffers handed back by the writers once TensorStore has let go of them, for the next
block a reader decodes itself (``ownreads``): a fresh buffer of a block's size is mapped anew
and faulted in page by page, which on the 13-core host cost more than the decode.

The writers hand TensorStore each block read here without a copy
(``can_reference_source_data_indefinitely``). TensorStore keeps such an array alive through a
reference to the Python object for as long as it uses it, so once the block's write is done
the writer offers it back (``recycle``), and it is kept only if nothing but the writer still
refers to it or to any other view of its buffer. On the 13-core host (where system CPU
was half of the writers' CPU), a 2 GiB reshard of 32 MiB chunks at 13 threads took 3.60-3.76
s with 10.7-11.8 s user and 12.6-13.6 s system CPU, and 3.13-3.24 s, 8.7-8.8 s and 9.1-10.1 s
with a first version of this rule (a free list of 4 a size, the array's references checked,
not its buffer's), at the same peak RSS (726-744 MiB). On 2 cores (an ordinary kernel) the
time did not move; minor page faults halved.

At most ``KEEP`` buffers wait here, all of one size (a request for another size drops them),
and only blocks of at least ``MIN_BYTES``. ``CKPT_REUSE_BUFFERS=0`` turns it off.
"""

from __future__ import annotations

import os
import sys
import threading
import weakref
from typing import Any

#: Free buffers kept at most (the next reads take them as the writes finish).
KEEP = 4
#: Smaller blocks come from the allocator's heap, which reuses them already.
MIN_BYTES = 1 << 20

_lock = threading.Lock()
_free: list[Any] = []
#: Blocks decoded into a buffer handed back (for tests and benches).
reused = 0
#: Buffers handed out and not yet back, by id (weak: one dropped elsewhere is simply gone).
_out: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()


def _on() -> bool:
    return os.environ.get("CKPT_REUSE_BUFFERS") != "0"


def empty(shape: tuple[int, ...], dtype: Any) -> Any:
    """An uninitialized array of ``shape`` and ``dtype`` (``numpy.empty``), on a buffer handed
    back by a writer when one of its size is free."""
    import numpy as np

    dt = np.dtype(dtype)
    nbytes = dt.itemsize
    for n in shape:
        nbytes *= n
    if nbytes < MIN_BYTES or not _on():
        return np.empty(shape, dt)
    global reused
    with _lock:
        if _free and _free[-1].nbytes != nbytes:
            _free.clear()  # another block size: the old ones would only wait here
        raw = _free.pop() if _free else None
        reused += raw is not None
    if raw is None:
        raw = np.empty(nbytes, np.uint8)
    with _lock:
        _out[id(raw)] = raw
    return raw.view(dt).reshape(shape)


def recycle(values: Any) -> bool:
    """Offer back an array from ``empty`` that the caller is done with: kept for the next one
    when the caller's reference (the one passed here) is the only one left, so nobody else,
    TensorStore included, can still read or write it. The caller must not use ``values``
    afterwards. Whether it was kept."""
    base = getattr(values, "base", None)
    with _lock:
        ours = base is not None and _out.get(id(base)) is base
    if not ours:
        return False
    raw: Any = base
    del base
    # The caller's reference, this function's argument and getrefcount's own; the buffer's:
    # ``values``'s base, the local name and getrefcount's own (another view of it: more).
    if sys.getrefcount(values) > 3 or sys.getrefcount(raw) > 3 or not _on():
        return False
    with _lock:
        del _out[id(raw)]
        if _free and _free[-1].nbytes != raw.nbytes:
            _free.clear()
        if len(_free) >= KEEP:
            return False
        _free.append(raw)
    return True


def clear() -> None:
    """Drop the free buffers (a writer's run is over)."""
    with _lock:
        _free.clear()
