"""Many requests at once for ``RemoteLocation``: prefetched small files, concurrent writes,
batched deletes of files and of whole directories (``Location``'s bulk interface)."""

from __future__ import annotations

import builtins
from collections.abc import Collection, Iterator, Sequence
from typing import TYPE_CHECKING

from ckpt_cli.core.storage.base import Location
from ckpt_cli.core.storage.bulk import delete_all
from ckpt_cli.errors import NotFoundError, StorageError

if TYPE_CHECKING:
    from ckpt_cli.core.storage.objstore import ObjectStore
    from ckpt_cli.core.storage.prefixes import Listing

#: Larger files are not prefetched (they are data, read when and as needed).
PREFETCH_MAX_BYTES = 64 << 20


class RemoteBulk:
    """Mixed into ``RemoteLocation``: every location passed lies in the same bucket."""

    _listing: Listing
    key: str

    @property
    def store(self) -> ObjectStore:
        return self._listing.store

    def refresh(self) -> None:
        raise NotImplementedError

    def _children_keys(self) -> builtins.list[str]:
        raise NotImplementedError

    def prefetch(self, files: Sequence[Location], tail: int | None = None) -> None:
        """One GET per listed file (``ObjectStore.read_objects``), ``max_requests`` of them in
        flight, none for a file the cache already holds; the contents wait in the listing's
        cache."""
        for _ in self.prefetch_each(files, tail):
            pass

    def prefetch_each(self, files: Sequence[Location], tail: int | None = None) -> Iterator[int]:
        """``prefetch``, each file's index as its answer arrives (``ObjectStore.read_each``),
        those it skips first. A failed read is left out of the cache: the read that needs the
        file fails again, with its own message."""
        info = self._listing.info
        wanted: dict[tuple[str, int | None], builtins.list[int]] = {}
        sizes: builtins.list[int] = []
        for n, f in enumerate(files):
            if isinstance(f, RemoteBulk) and f._listing is self._listing and f.key in info:
                size = info[f.key][0]
                cut = None if tail is None or size <= tail else tail
                if size <= PREFETCH_MAX_BYTES and self._listing.take(f.key, cut) is None:
                    if (f.key, cut) not in wanted:
                        sizes.append(size)
                    wanted.setdefault((f.key, cut), []).append(n)
                    continue
            yield n
        asked = builtins.list(wanted)
        reads = [
            (k, None if t is None else size - t, size)
            for (k, t), size in zip(asked, sizes, strict=True)
        ]
        for i, data in self.store.read_each(reads):
            if isinstance(data, bytes):
                self._listing.keep({asked[i]: data})
            yield from wanted[asked[i]]

    def cached(self, ranges: Sequence[tuple[Location, int, int]]) -> builtins.list[bytes] | None:
        out = []
        for loc, start, end in ranges:
            held = _held(loc, start, end)
            if held is None:
                return None
            out.append(held)
        return out

    def read_ranges(self, ranges: Sequence[tuple[Location, int, int]]) -> builtins.list[bytes]:
        """One ranged GET per entry (``ObjectStore.read_objects``: ``max_requests`` or more in
        flight), none for a range of a file prefetched whole (``prefetch``); the first failure
        in the order asked raises (as a ``StorageError`` naming the file), after every read
        has finished."""
        if any(not isinstance(loc, RemoteBulk) for loc, _, _ in ranges):
            raise StorageError(f"read_ranges on {self} got locations of another store")
        store = self.store
        locs = [loc for loc, _, _ in ranges if isinstance(loc, RemoteBulk)]
        keys = [loc.key for loc in locs]
        out: builtins.list[bytes] = [b""] * len(ranges)
        wanted = []
        for i, (loc, start, end) in enumerate(ranges):
            held = _held(loc, start, end)
            if held is None:
                wanted.append(i)
            else:
                out[i] = held
        asked = [(keys[i], ranges[i][1], ranges[i][2]) for i in wanted]
        answers = store.read_objects(asked) if asked else []
        for i, data in zip(wanted, answers, strict=True):
            _, start, end = ranges[i]
            url = store.url(keys[i])
            if isinstance(data, Exception):
                raise store.error(f"cannot read {url}", data) from None
            if data is None:
                raise NotFoundError(f"{url} does not exist")
            if len(data) != end - start:
                raise StorageError(
                    f"cannot read {url}: {len(data)} bytes at {start}, not {end - start}"
                )
            out[i] = data
        return out

    def write_many(self, files: Sequence[tuple[Location, bytes]]) -> None:
        import time

        kv = self._listing.kv()
        remote = [(f, d) for f, d in files if isinstance(f, RemoteBulk)]
        if len(remote) != len(files):
            raise StorageError(f"write_many on {self} got locations of another store")
        futures = [(f, d, kv.write(f.key, d)) for f, d in remote]
        failed: tuple[RemoteBulk, Exception] | None = None
        for f, d, fut in futures:
            try:
                fut.result()
                self._listing.added(f.key, len(d), time.time())
            except Exception as e:
                failed = failed or (f, e)
        if failed:
            raise self.store.error(f"cannot write {failed[0]}", failed[1])

    def delete_files(self, files: Sequence[Location]) -> dict[str, str]:
        keys = [f.key for f in files if isinstance(f, RemoteBulk)]
        failed = delete_all(self.store, keys)
        for k in keys:
            if k not in failed:
                self._listing.removed(k)
        return {self.store.url(k): why for k, why in failed.items()}

    def delete_trees(
        self, dirs: Sequence[Location], *, first: Collection[str] = (), last: Collection[str] = ()
    ) -> dict[str, str]:
        """One fresh listing (the directories' common parent, in parallel ranges), then three
        waves of batched deletes over all directories at once: the ``first`` files, the rest,
        and the ``last`` files of each directory whose other objects are all gone."""
        remote = [d for d in dirs if isinstance(d, RemoteBulk) and d.key]
        if not remote:
            return {}
        self.refresh()
        for d in remote:
            if self.key and not d.key.startswith(f"{self.key}/"):  # else forgotten just now
                self._listing.forget(d.key)
        parents = {d.key.rsplit("/", 1)[0] if "/" in d.key else "" for d in remote}
        if len(parents) == 1 and len(remote) > 1:
            parent = parents.pop()
            self._listing.ensure(parent + "/" if parent else "")
        keys = {d.key: d._children_keys() for d in remote}
        failed: dict[str, str] = {str(d): f"{d} does not exist" for d in remote if not keys[d.key]}
        early = {d: [k for k in ks if k.rsplit("/", 1)[-1] in first] for d, ks in keys.items()}
        late = {
            d: [k for k in ks if k[len(d) + 1 :] in last and k not in early[d]]
            for d, ks in keys.items()
        }
        rest = {
            d: [k for k in ks if k not in set(early[d]) | set(late[d])] for d, ks in keys.items()
        }
        for wave in (early, rest):
            self._delete_wave(wave, failed)
        self._delete_wave(
            {d: ks for d, ks in late.items() if self.store.url(d) not in failed}, failed
        )
        return failed

    def _delete_wave(self, wave: dict[str, builtins.list[str]], failed: dict[str, str]) -> None:
        flat = [k for d, ks in wave.items() if self.store.url(d) not in failed for k in ks]
        bad = delete_all(self.store, flat)
        for d, ks in wave.items():
            for k in ks:
                if k in bad:
                    failed.setdefault(
                        self.store.url(d), f"cannot delete {self.store.url(k)}: {bad[k]}"
                    )
                else:
                    self._listing.removed(k)


def _held(loc: Location, start: int, end: int) -> bytes | None:
    """Bytes ``[start, end)`` of a file this process holds whole (``prefetch``), without a
    request (an empty range: nothing to hold); None where it is not held."""
    if end <= start:
        return b""
    whole = loc._listing.take(loc.key, None) if isinstance(loc, RemoteBulk) else None
    return whole[start:end] if whole is not None and end <= len(whole) else None
