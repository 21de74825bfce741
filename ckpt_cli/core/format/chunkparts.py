"""Parts of a large stored chunk, every part from one pass over the chunk: its stored bytes read
in ranges and zstd decoded front to back once (``chunkread.ChunkReader``), in slabs of whole
rows of the chunk, each slab copied into every part read that needs it and dropped once they
all have it.

TensorStore reads a part of a chunk by decoding the whole chunk into its cache (fresh memory
of the chunk's size, faulted in page by page, one thread) and copying the part out: a reshard
of 128 MiB chunks to (2, 4) on 2 cores peaked at 838-890 MiB with 760,000 minor faults, where
the same bytes in 32 MiB chunks (whole chunks a read, decoded here by ``read_rows``) took
357-365 MiB and 57,000-70,000 faults.

A pass keeps each slab it decoded until every value of it (inside the array) has been copied
into some read and no claim on it is left: a read claims the slabs its rows meet when it is
issued (``ChunkParts.claim``), and the parts of a band of rows read side by side (a reshard's
output blocks cut along the columns too) each find the band there, however their reads are
scheduled. A pass never goes back: a claim on rows the pass has dropped (a region read twice)
gets None and is read by TensorStore (its cache), as is any read of a chunk whose pass failed.
A chunk is decoded here at most once per pass; a new pass starts only after the last one
finished. A block over several chunks claims a piece of each (``claims``), all or none.

Memory: the slabs (``SLAB_BYTES``, a row of the chunk at least) from the oldest not yet read
whole to the newest decoded: a band of rows where reads go in C order, at most the chunk (what
TensorStore holds for any read of it); zstd's window and one stored range. This module's
callers are the readers of ``arrays.LeafReader``; it imports only ``chunkread`` of ``format``.
"""

from __future__ import annotations

import itertools
import math
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

from ckpt_cli.core.format.chunkread import ChunkLayout, ChunkReader, FileValue, Place
from ckpt_cli.errors import StorageError

Block = tuple[slice, ...]
#: Chunks one block may meet and still be read from their passes (more: TensorStore).
MAX_PIECES = 64
#: Decoded bytes of one slab of a pass (whole rows of the chunk; one row at least). 8 MiB
#: first: a reshard of one 64 MiB chunk under ``--memory-limit 32MiB`` peaked at 115 MiB, with
#: 2 MiB at 106 MiB, and larger chunks took the same time either way (2 cores).
SLAB_BYTES = 2 << 20


class _Pass:
    """One pass over one stored chunk: its reader, the slabs decoded and still claimed."""

    def __init__(self, index: tuple[int, ...], rows: int, slab_rows: int, row_values: int):
        self.index = index
        self.rows = rows  # rows of the chunk inside the array (an edge chunk's padding: never)
        self.slab_rows = slab_rows
        self.row_values = row_values  # values of one row inside the array
        self.slabs = -(-rows // slab_rows)
        self.next = 0  # the next slab the reader decodes
        self.reader: ChunkReader | None = None
        self.kept: dict[int, Any] = {}
        self.wanted: Counter[int] = Counter()  # claims that have yet to copy from each slab
        self.copied: Counter[int] = Counter()  # values of each slab copied into reads so far
        self.failed = False
        self.decoding = threading.Lock()  # one decoder a pass; other chunks decode meanwhile

    def span(self, i: int) -> tuple[int, int]:
        return i * self.slab_rows, min(self.rows, (i + 1) * self.slab_rows)

    def read_whole(self, i: int) -> bool:
        a, b = self.span(i)
        return self.copied[i] >= (b - a) * self.row_values

    def close(self) -> None:
        reader, self.reader = self.reader, None
        if reader is not None:
            reader.close()


class Claim:
    """One read's part of a chunk: the slabs it will copy from (``fill``)."""

    def __init__(self, parts: ChunkParts, index: tuple[int, ...], block: Block, p: _Pass):
        self.parts, self.index, self.p = parts, index, p
        origin = parts.origin(index)
        self.local = tuple(
            slice(s.start - o, s.stop - o) for s, o in zip(block, origin, strict=True)
        )
        first, stop = self.local[0].start, self.local[0].stop
        self.slabs = range(first // p.slab_rows, -(-stop // p.slab_rows))
        self.open = set(self.slabs)  # slabs not copied yet (released on ``fill`` or ``drop``)
        self.row_values = math.prod(s.stop - s.start for s in self.local[1:])

    def fill(self, out: Any) -> Any:
        """Copy the block's values into ``out`` (its shape), decoding the slabs it needs as
        the pass reaches them; returns ``out``. Raises what the pass raised."""
        rows = self.local[0]
        try:
            for i in self.slabs:
                slab = self.parts._slab(self.p, i)
                a, b = self.p.span(i)
                lo, hi = max(a, rows.start), min(b, rows.stop)
                part = (slice(lo - a, hi - a), *self.local[1:])
                out[lo - rows.start : hi - rows.start] = slab[part]
                del slab
                self.parts._release(self, i, (hi - lo) * self.row_values)
        except BaseException:
            self.drop()
            raise
        return out

    def drop(self) -> None:
        """Give up the slabs not copied yet (a failed read: the caller reads elsewhere)."""
        for i in sorted(self.open):
            self.parts._release(self, i, 0)


class ChunkParts:
    """The passes over one leaf's stored chunks (chunk shape ``chunk``, array ``shape``)."""

    def __init__(
        self,
        kv: Any,
        layout: ChunkLayout,
        shape: tuple[int, ...],
        chunk: tuple[int, ...],
        dtype: Any,
        locate: Callable[[str], Place | None] | None = None,
        slab_bytes: int | None = None,
    ) -> None:
        import numpy as np

        self.kv, self.layout, self.shape, self.chunk = kv, layout, shape, chunk
        self.dtype = np.dtype(dtype)
        self.locate = locate
        row = math.prod(chunk[1:]) * self.dtype.itemsize
        self.slab_rows = max(1, (slab_bytes or SLAB_BYTES) // max(1, row))
        self.lock = threading.Lock()  # the passes' bookkeeping (not their decoding)
        self.passes: dict[tuple[int, ...], _Pass] = {}
        #: Slabs decoded, and claims that found their rows already passed (read elsewhere).
        self.decoded = 0
        self.refused = 0

    def origin(self, index: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(i * c for i, c in zip(index, self.chunk, strict=True))

    def chunk_of(self, block: Block) -> tuple[int, ...] | None:
        """The index of the one chunk ``block`` lies in, or None (it meets several)."""
        if not self.chunk or len(block) != len(self.chunk):
            return None
        index = tuple(s.start // c for s, c in zip(block, self.chunk, strict=True))
        inside = all(
            s.stop > s.start and (s.stop - 1) // c == i
            for s, c, i in zip(block, self.chunk, index, strict=True)
        )
        return index if inside else None

    def pieces(self, block: Block) -> list[tuple[tuple[int, ...], Block]] | None:
        """The chunks ``block`` meets, each with the piece of the block inside it; None for an
        empty block or one over more than ``MAX_PIECES`` chunks."""
        if not self.chunk or len(block) != len(self.chunk):
            return None
        if any(s.stop <= s.start for s in block):
            return None
        spans = [
            range(s.start // c, (s.stop - 1) // c + 1)
            for s, c in zip(block, self.chunk, strict=True)
        ]
        if math.prod(len(r) for r in spans) > MAX_PIECES:
            return None
        return [
            (
                index,
                tuple(
                    slice(max(s.start, i * c), min(s.stop, (i + 1) * c))
                    for s, i, c in zip(block, index, self.chunk, strict=True)
                ),
            )
            for index in itertools.product(*spans)
        ]

    def only_part(self, block: Block) -> bool:
        """Whether some chunk ``block`` meets is only partly inside it (then TensorStore would
        decode that chunk whole for the part); False where it is whole chunks, or None."""
        found = self.pieces(block)
        return found is not None and any(
            any(
                s.start != i * c or s.stop != min((i + 1) * c, n)
                for s, i, c, n in zip(piece, index, self.chunk, self.shape, strict=True)
            )
            for index, piece in found
        )

    def claims(self, block: Block) -> list[tuple[Block, Claim]] | None:
        """A claim on every chunk ``block`` meets, each with the place of its piece in the
        block; None (and no claim kept) when any of them cannot be served (``claim``)."""
        found = self.pieces(block)
        if found is None:
            return None
        out: list[tuple[Block, Claim]] = []
        for _, piece in found:
            claim = self.claim(piece)
            if claim is None:
                for _, taken in out:
                    taken.drop()
                return None
            local = tuple(
                slice(p.start - s.start, p.stop - s.start)
                for p, s in zip(piece, block, strict=True)
            )
            out.append((local, claim))
        return out

    def claim(self, block: Block) -> Claim | None:
        """Claim the slabs ``block`` needs from its chunk's pass (started here when the chunk
        has none). None when the block meets several chunks, when the pass has dropped rows it
        needs, or when the pass failed: the caller reads it another way."""
        index = self.chunk_of(block)
        if index is None:
            return None
        with self.lock:
            p = self.passes.get(index)
            if p is None:
                origin = self.origin(index)
                inside = [
                    min(c, n - o) for c, n, o in zip(self.chunk, self.shape, origin, strict=True)
                ]
                row_values = math.prod(inside[1:])
                p = self.passes[index] = _Pass(index, inside[0], self.slab_rows, row_values)
            claim = Claim(self, index, block, p)
            if p.failed or any(i < p.next and i not in p.kept for i in claim.slabs):
                self.refused += 1
                return None
            p.wanted.update(claim.slabs)
            return claim

    def _slab(self, p: _Pass, i: int) -> Any:
        """Slab ``i`` of pass ``p``, decoding up to it (on this thread) when not yet there."""
        import numpy as np

        with p.decoding:
            while p.next <= i and not p.failed:
                a, b = p.span(p.next)
                buf = np.empty((b - a, *self.chunk[1:]), self.dtype)
                try:
                    self._reader(p).fill(buf)
                except BaseException:
                    with self.lock:
                        p.failed = True
                    p.close()
                    raise
                with self.lock:
                    p.kept[p.next] = buf
                    p.next += 1
                    self.decoded += 1
                    if p.next == p.slabs:
                        p.close()
            with self.lock:
                slab = p.kept.get(i)
        if slab is None:  # the pass failed on another claim's thread: read elsewhere
            raise StorageError(f"chunk {self.layout.key(p.index)} could not be decoded")
        return slab

    def _reader(self, p: _Pass) -> ChunkReader:
        if p.reader is None:
            key = self.layout.key(p.index)
            place = self.locate(key) if self.locate is not None else None
            p.reader = ChunkReader(FileValue(place) if place else self.kv, key, self.layout)
        return p.reader

    def _release(self, claim: Claim, i: int, copied: int) -> None:
        """``claim`` is done with slab ``i`` (``copied``: the values it took): the slab is
        dropped once no claim is left on it and every value of it has been read."""
        if i not in claim.open:
            return
        claim.open.discard(i)
        p = claim.p
        with self.lock:
            p.wanted[i] -= 1
            p.copied[i] += copied
            if p.wanted[i] <= 0:
                del p.wanted[i]
                if p.read_whole(i) or p.failed:
                    p.kept.pop(i, None)
                    del p.copied[i]
            done = p.next >= p.slabs or p.failed
            if done and not p.wanted and not p.kept and self.passes.get(claim.index) is p:
                del self.passes[claim.index]  # the next claim on this chunk starts a new pass

    def close(self) -> None:
        """Close every pass's reader (a pass left unfinished holds a file open)."""
        with self.lock:
            passes, self.passes = list(self.passes.values()), {}
        for p in passes:
            p.close()

    def __del__(self) -> None:
        self.close()
