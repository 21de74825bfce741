"""``Location``: the one interface every listing, stat, read and write of checkpoint files uses.

Local paths are ``LocalLocation`` (``local.py``), object stores (``s3://``, ``gs://``)
``RemoteLocation`` (``remote.py``). TensorStore reaches the same places through
``kvstore_spec()``, so array and OCDBT access follow a location wherever it lives. What differs
between the kinds is a property of the location, not an ``if`` in each caller:
``requires_commit_marker`` (no rename: a writer writes in place and puts a commit marker last),
``refresh`` (drop cached listings), ``parallel_reads``. The storage layer knows nothing of the
Orbax format: file names with a meaning (commit markers, tombstones) are the callers' business.
"""

from __future__ import annotations

import builtins
import json
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ckpt_cli.core.storage.options import StorageOptions
from ckpt_cli.errors import CkptError, InvalidMetadataError, NotFoundError, first_line

#: Bytes of files ``copy_tree`` holds at once.
COPY_WINDOW_BYTES = 64 << 20
# A metadata file bigger than this is damage, not metadata: refuse before allocating for it.
MAX_METADATA_BYTES = 1 << 30
# Python refuses to turn more digits than this into an int (sys.get_int_max_str_digits).
_INT_DIGITS = 4000


def _parse_int(text: str) -> int | float:
    # A number too long for an int is kept as the float it is closest to (inf beyond 1e308),
    # shown as a value rather than refused: valid JSON, only absurd.
    return int(text) if len(text) <= _INT_DIGITS else float(text)


def loads_json(raw: bytes | str, where: object) -> Any:
    """``json.loads`` that turns every way valid-looking bytes can fail into one
    ``InvalidMetadataError`` naming ``where``: bad syntax or encoding, and valid JSON that
    Python cannot hold (nesting deeper than the interpreter's recursion limit)."""
    try:
        return json.loads(raw, parse_int=_parse_int)
    except (UnicodeDecodeError, ValueError) as e:  # JSONDecodeError is a ValueError
        text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
        what = "empty" if not text.strip() else f"not valid JSON ({first_line(e)})"
        raise InvalidMetadataError(
            f"{where} is {what}", hint="the checkpoint is damaged; run `ckpt verify` on it"
        ) from None
    except RecursionError:
        raise InvalidMetadataError(
            f"{where} nests JSON deeper than ckpt reads (valid JSON, but no Orbax metadata "
            "is shaped like this)",
            hint="the checkpoint is damaged or hostile; run `ckpt verify` on it",
        ) from None


@dataclass(frozen=True)
class Entry:
    """One child of a directory, as one listing call sees it."""

    name: str
    is_dir: bool
    size: int
    mtime: float
    is_symlink: bool = False


class Location:
    """A file or directory in some store, addressed by path; cheap to create, lazy to touch."""

    #: Whether a finished step must carry ``commit_success.txt`` (object stores have no rename).
    #: Writers then write a step in place and put the marker last.
    requires_commit_marker = False
    #: How many independent small reads are worth running at once (1: serial is fastest).
    parallel_reads = 1

    @property
    def options(self) -> StorageOptions:
        """The storage options this location was opened with (units of work carry them)."""
        raise NotImplementedError

    @property
    def name(self) -> str:
        raise NotImplementedError

    @property
    def parent(self) -> Location:
        raise NotImplementedError

    def child(self, *parts: str) -> Location:
        raise NotImplementedError

    def exists(self) -> bool:
        raise NotImplementedError

    def is_dir(self) -> bool:
        raise NotImplementedError

    def is_file(self) -> bool:
        raise NotImplementedError

    def list(self) -> list[Entry]:
        """The immediate children, sorted by name."""
        raise NotImplementedError

    def read_bytes(self, limit: int = MAX_METADATA_BYTES) -> bytes:
        raise NotImplementedError

    def read_tail(self, size: int) -> bytes:
        """The last ``size`` bytes of this file (all of it when shorter)."""
        raise NotImplementedError

    def read_ranges(self, ranges: Sequence[tuple[Location, int, int]]) -> builtins.list[bytes]:
        """The bytes ``[start, end)`` of each (file, start, end), in order, read together where
        the store overlaps requests (object stores only, so far: ``parallel_reads > 1``)."""
        raise NotImplementedError

    def cached(self, ranges: Sequence[tuple[Location, int, int]]) -> builtins.list[bytes] | None:
        """``read_ranges`` where this process holds every range already (``prefetch``), without
        a request; None where one is not held (on disk: always, nothing is held)."""
        return None

    def mtime(self) -> float:
        raise NotImplementedError

    def walk(self) -> Iterator[tuple[str, Entry]]:
        """Every file below this directory as (relative path, entry), symlinks not followed."""
        raise NotImplementedError

    def is_symlink(self) -> bool:
        raise NotImplementedError

    def resolve(self) -> Location:
        """This location with every symlink on its path resolved."""
        raise NotImplementedError

    def link_target(self) -> Location:
        """Where this symlink points, read from the link alone (its directory resolved, the
        link's text joined to it): nothing it points to is looked at."""
        raise NotImplementedError

    # Writes, used only by commands that change a root (prune) or write a new step.

    def rename(self, new_name: str) -> Location:
        """Rename this entry inside its parent directory, atomically; returns the new location."""
        raise NotImplementedError

    def delete_tree(self, *, first: Collection[str] = (), last: Collection[str] = ()) -> None:
        """Remove this directory and everything below it; refuses a symlink (never follows one).

        Where the store deletes entry by entry (object stores), files with a basename in
        ``first`` go before the others and those in ``last`` after them, so that a delete cut
        short leaves what the caller wants seen (no commit marker, a tombstone).
        """
        raise NotImplementedError

    def delete_file(self) -> None:
        """Remove this one file."""
        raise NotImplementedError

    # Many at once: object stores overlap the requests (``--max-requests`` in flight, batched
    # deletes); elsewhere these are plain loops. Every location passed lies in this one's store.

    def prefetch(self, files: Sequence[Location], tail: int | None = None) -> None:
        """Fetch these small files (their last ``tail`` bytes) together, so that the next
        ``read_bytes`` (``read_tail(tail)``) of each costs no request. Files that do not exist
        are skipped; a failed fetch is left to the later read to report."""

    def prefetch_each(self, files: Sequence[Location], tail: int | None = None) -> Iterator[int]:
        """``prefetch``, the index in ``files`` of each file once it is settled (its bytes held,
        or its fetch failed or skipped: the later read says), every index once, as the answers
        arrive: what the caller does with one overlaps the fetches still in flight. Here all
        at once, in order."""
        self.prefetch(files, tail)
        yield from range(len(files))

    def write_many(self, files: Sequence[tuple[Location, bytes]]) -> None:
        """``write_bytes`` of each, in no particular order; the first failure raises, after
        every write has finished or failed."""
        for loc, data in files:
            loc.write_bytes(data)

    def delete_files(self, files: Sequence[Location]) -> dict[str, str]:
        """Delete these files; what failed, by path (a file already gone is deleted)."""
        failed: dict[str, str] = {}
        for loc in files:
            try:
                loc.delete_file()
            except NotFoundError:
                continue
            except CkptError as e:
                failed[str(loc)] = e.message
        return failed

    def delete_trees(
        self, dirs: Sequence[Location], *, first: Collection[str] = (), last: Collection[str] = ()
    ) -> dict[str, str]:
        """``delete_tree`` of each directory (``first``/``last`` as there, across all of them:
        every ``first`` file goes before any other); what failed, by path."""
        failed: dict[str, str] = {}
        for loc in dirs:
            try:
                loc.delete_tree(first=first, last=last)
            except CkptError as e:
                failed[str(loc)] = e.message
        return failed

    def refresh(self) -> None:
        """Forget cached listings (after writes made by TensorStore, before a re-check)."""

    def notes(self) -> tuple[str, ...]:
        """How the storage got its answers so far, a line each (``ls -v``): none on disk."""
        return ()

    def try_lock(self, owner: str, *, record_required: bool = True) -> Lock | None:
        """Take an exclusive lock on this file (created if absent) and write ``owner`` into it.

        None when another process holds it. ``record_required=False``: where the lock itself
        holds without the record (a local ``flock``), a record the disk has no room for is left
        empty instead of failing (a prune that frees a full disk).
        """
        raise NotImplementedError

    def kvstore_spec(self) -> dict[str, Any]:
        """A TensorStore kvstore spec for this directory (always ending in ``/``)."""
        raise NotImplementedError

    # Writing (writers only ever write inside a tmp step directory they created).

    def write_bytes(self, data: bytes, *, create_parents: bool = True) -> None:
        """Write a whole file atomically: a temporary name in the same directory, then rename.
        ``create_parents`` False: the directory must exist (``NotFoundError`` otherwise), for
        writers that must never bring back a directory someone removed."""
        raise NotImplementedError

    def write_stream(self, pieces: Iterable[bytes], size: int) -> None:
        """Write a file of ``size`` bytes from ``pieces``, streamed (never held whole): it
        appears whole or not at all (a temporary name renamed; a multipart or resumable upload
        completed). Fewer or more bytes than ``size`` fail without leaving the file."""
        raise NotImplementedError

    def make_dirs(self) -> None:
        raise NotImplementedError

    def sync_tree(self) -> None:
        """Make every file and directory under this one durable before a writer commits it
        (writers' TensorStore writes skip a sync each: ``write.item``). Object stores: nothing
        to do; a write is durable when it is acknowledged."""

    def make_dirs_undoable(self) -> Callable[[], None]:
        """``make_dirs``, returning the undo of a write that then failed: it removes the
        directories this call created, deepest first, while they are still empty (a write
        that failed leaves nothing that was not there; object stores have no directories)."""
        self.make_dirs()
        return lambda: None

    def copy_tree(self, target: Location) -> None:
        """Copy every file below this directory into ``target`` (created): in windows of up to
        ``COPY_WINDOW_BYTES``, each read together (``prefetch``) and written together
        (``write_many``), which on object stores is a round of requests per window."""
        window: list[tuple[list[str], int]] = []
        held = 0
        for rel, entry in [*self.walk(), ("", None)]:
            if window and (entry is None or held + entry.size > COPY_WINDOW_BYTES):
                srcs = [self.child(*parts) for parts, _ in window]
                self.prefetch(srcs)
                target.write_many(
                    [
                        (target.child(*parts), src.read_bytes())
                        for (parts, _), src in zip(window, srcs, strict=True)
                    ]
                )
                window, held = [], 0
            if entry is not None:
                window.append((rel.split("/"), entry.size))
                held += entry.size

    def content_tag(self) -> str | None:
        """What the store's listing says of this file's bytes (``etags.py``; buckets only),
        or None."""
        return None

    def size(self) -> int:
        """Bytes of this file, symlinks followed."""
        raise NotImplementedError

    def iter_bytes(self, block_size: int = 4 << 20) -> Iterator[bytes]:
        """This file's content in pieces of at most ``block_size`` bytes (streamed, not loaded)."""
        raise NotImplementedError

    def scan(
        self, start: int = 0, end: int | None = None, piece: int = 4 << 20
    ) -> Iterator[memoryview]:
        """This file's bytes ``[start, end)`` (to its end when ``end`` is None) in pieces of at
        most ``piece`` bytes, each valid only until the next is asked for: a store may read
        every piece into one buffer it reuses (a local disk does), so a caller that keeps a
        piece copies it. A file shorter than ``end`` raises ``StorageError``."""
        if end is None:
            if start:
                raise ValueError("scan: an open end needs start 0")
            for block in self.iter_bytes(piece):
                yield memoryview(block)
            return
        for a in range(start, end, piece):
            (block,) = self.read_ranges([(self, a, min(end, a + piece))])
            yield memoryview(block)

    def is_within(self, other: Location) -> bool:
        """Whether this location is ``other`` or lies below it (paths compared as given)."""
        raise NotImplementedError

    def describe_error(self, e: BaseException) -> str:
        """One line for a TensorStore error met here (object stores: endpoint and cause)."""
        return first_line(e)

    def __str__(self) -> str:
        raise NotImplementedError

    # Shared helpers built on the primitives above.

    def read_json(self) -> Any:
        """Parse this file as JSON; damage becomes one ``InvalidMetadataError`` naming the file."""
        return loads_json(self.read_bytes(), self)

    def read_json_if_exists(self) -> Any | None:
        if not self.is_file():
            return None
        return self.read_json()

    def du(self) -> int:
        """Bytes used by all files below this directory (symlinks counted as links)."""
        return sum(entry.size for _, entry in self.walk())


class Lock:
    """A held lock; ``release`` (or leaving the ``with`` block) gives it up."""

    def release(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Lock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class NotACheckpointDirError(NotFoundError):
    """A file where a directory was expected."""
