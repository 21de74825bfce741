"""Blocks of one leaf that ckpt decodes itself instead of TensorStore (``arrays.LeafReader``):

- whole chunks of a leaf cut along its first axis, each at least
  ``chunkread.ROWS_MIN_CHUNK_BYTES``, decoded on the read pool straight into the returned array
  (``chunkread.read_rows``): TensorStore decodes each chunk into fresh memory of its own and
  copies it out, which on a many-core host costs more in page faults than the decoding
  (docs/explanation/performance.md). A block of several such chunks is decoded a chunk a task,
  so on as many threads at once: a sharded migrate of 6 GiB (blocks of four 8 MiB chunks) on
  the 13-core host took 7.33-7.50 s against 8.72-9.02 s when one thread decoded a block.
  ``CKPT_ROW_READS=0`` turns it off;
- a block over such chunks, one of them only in part: each piece copied from one pass over its
  chunk that the other reads of that chunk share (``chunkparts``; up to ``MAX_PIECES`` chunks a
  block): TensorStore decodes each chunk whole into its cache for every part. A block of whole
  chunks only is TensorStore's (no cache needed). ``CKPT_PART_READS=0`` turns it off.

Both decode into buffers the writers hand back once TensorStore is done with a block
(``buffers``). Only layouts that stream (``chunkread.chunk_layout``: zstd or none, what Orbax
writes). A read that fails here is read by TensorStore, whose values or error the caller gets.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from ckpt_cli.core.format import buffers, chunkread
from ckpt_cli.core.format.chunkparts import ChunkParts

Block = tuple[slice, ...]


class OwnReads:
    """The reads of one leaf (``array``, TensorStore's; ``info``, its header) that ckpt decodes
    itself: ``read`` returns a future of the block's values, or None (TensorStore's to read)."""

    def __init__(self, array: Any, info: Any) -> None:
        self.array = array
        self.info = info
        self._layout: Any = False  # the chunks' streamable layout, once asked (None: none)
        #: Chunk key -> its place in a local file, or None: chunks read through the kvstore.
        self.locate: Any = None
        #: The passes over large chunks read in parts, once a part is read.
        self.parts: ChunkParts | None = None

    def read(self, block: Block) -> Any:
        """A future of ``block``'s values, or None (TensorStore's to read)."""
        if self.info.decoded_chunk_bytes < chunkread.ROWS_MIN_CHUNK_BYTES or not self.info.shape:
            return None
        fut = self._rows(block)
        return fut if fut is not None else self._part(block)

    def reads_part(self, block: Block) -> bool:
        """Whether ``read`` would copy ``block`` from passes over the large chunks it meets, one
        of them only in part: a writer then reads it here rather than have TensorStore copy it,
        which decodes such a chunk whole into its cache for each part."""
        info = self.info
        if info.decoded_chunk_bytes < chunkread.ROWS_MIN_CHUNK_BYTES or not info.shape:
            return False
        if os.environ.get("CKPT_PART_READS") == "0" or self.layout() is None:
            return False
        if chunkread.rows_region(info.shape, info.chunk_shape, block) is not None:
            return False
        return self._passes().only_part(block)

    def _passes(self) -> ChunkParts:
        if self.parts is None:
            info, dtype = self.info, self.array.dtype.numpy_dtype
            kv, layout = self.array.kvstore, self.layout()
            assert layout is not None
            self.parts = ChunkParts(kv, layout, info.shape, info.chunk_shape, dtype, self._where)
        return self.parts

    def _where(self, key: str) -> Any:
        """``locate(key)`` as the reader says now (it may be set after the passes are made)."""
        return self.locate(key) if self.locate is not None else None

    def layout(self) -> chunkread.ChunkLayout | None:
        """The chunks' streamable layout (``chunkread.chunk_layout``), asked once, or None."""
        if self._layout is False:
            try:
                metadata = self.array.spec().to_json()["metadata"]
                kv = self.array.kvstore
                self._layout = (
                    chunkread.chunk_layout(metadata, self.info) if kv is not None else None
                )
            except Exception:
                self._layout = None
        layout: chunkread.ChunkLayout | None = self._layout
        return layout

    def _rows(self, block: Block) -> Any:
        rows = chunkread.rows_region(self.info.shape, self.info.chunk_shape, block)
        if rows is None or os.environ.get("CKPT_ROW_READS") == "0":
            return None
        layout = self.layout()
        if layout is None:
            return None
        from ckpt_cli.core.threads import read_pool

        pool = read_pool()
        step = self.info.chunk_shape[0]
        parts = [(a, min(rows[1], a + step)) for a in range(rows[0], rows[1], step)]
        shape = (rows[1] - rows[0], *self.info.shape[1:])
        done = _Rows(len(parts), self.array, block, shape, self.array.dtype.numpy_dtype)
        for part in parts:
            try:
                pool.submit(self._decode_rows, layout, rows[0], part, done)
            except RuntimeError:  # the interpreter is exiting: nobody waits for the block
                done.future.cancel()
                raise
        return done.future

    def _decode_rows(
        self, layout: chunkread.ChunkLayout, first: int, rows: tuple[int, int], done: _Rows
    ) -> None:
        """Decode the chunks of ``rows`` into their place in the block's buffer (the block
        from row ``first``); the last part of the block to finish completes its future."""
        failed = False
        try:
            kv, chunk_rows = self.array.kvstore, self.info.chunk_shape[0]
            place = done.buffer()[rows[0] - first : rows[1] - first]
            chunkread.read_rows(kv, layout, chunk_rows, rows, place, self.locate)
        except Exception:
            failed = True
        done.part_done(failed)

    def _part(self, block: Block) -> Any:
        """A future of a block over large chunks, one of them only in part, or None (whole
        chunks, a region a chunk's pass has dropped, a failed pass, a layout that does not
        stream): TensorStore's to read."""
        if not self.reads_part(block):
            return None
        claims = self._passes().claims(block)
        if claims is None:
            return None
        from ckpt_cli.core.threads import read_pool

        return read_pool().submit(self._decode_part, claims, block)

    def _decode_part(self, claims: list[tuple[Block, Any]], block: Block) -> Any:
        out = buffers.empty(tuple(s.stop - s.start for s in block), self.array.dtype.numpy_dtype)
        left = list(claims)
        try:
            while left:
                local, claim = left[0]
                claim.fill(out[local])
                left.pop(0)
            return out
        except Exception:
            for _, claim in left[1:]:
                claim.drop()
            return self.array[block].read().result()  # TensorStore's values, or its error


class _Rows:
    """The future of a block of whole rows decoded a chunk a task on the read pool, so that a
    block of several chunks is decoded on as many threads: its buffer made when the first part
    starts (a block waiting in the pool's queue holds no memory), the future set by the last
    part to finish, to the block, or where a part failed to TensorStore's values of it (or its
    error)."""

    def __init__(
        self, parts: int, array: Any, block: Block, shape: tuple[int, ...], dtype: Any
    ) -> None:
        from concurrent.futures import Future

        self.future: Future[Any] = Future()
        self.left = parts
        self.failed = False
        self.lock = threading.Lock()
        self.array, self.block, self.shape, self.dtype = array, block, shape, dtype
        self.out: Any = None

    def buffer(self) -> Any:
        with self.lock:
            if self.out is None:
                self.out = buffers.empty(self.shape, self.dtype)
            return self.out

    def part_done(self, failed: bool) -> None:
        with self.lock:
            self.failed |= failed
            self.left -= 1
            if self.left:
                return
            out, self.out = self.out, None  # the future's reference is the block's only one
        if self.future.done():  # cancelled: the interpreter is exiting
            return
        try:
            if self.failed:
                out = self.array[self.block].read().result()
            self.future.set_result(out)
        except Exception as e:
            self.future.set_exception(e)
