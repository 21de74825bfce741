"""The keys below the prefixes listed so far in one bucket, shared by related locations.

A prefix is listed once, whole (``bulk.list_parallel``: in parallel key ranges when large), with
sizes and times; questions about anything below it are answered from memory. Small files that a
caller announced (``RemoteLocation.prefetch``) wait here, until written or deleted.
"""

from __future__ import annotations

import bisect
import threading
from typing import Any

from ckpt_cli.core.storage.bulk import list_parallel
from ckpt_cli.core.storage.objstore import ObjectStore

#: Bytes of prefetched small files one listing keeps at most.
CACHE_BYTES = 256 << 20


class Listing:
    """The keys (sizes, times) of the prefixes listed so far, shared by related locations."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store
        self.keys: list[str] = []
        self.info: dict[str, tuple[int, float]] = {}
        #: Content tags from the listing (``etags.py``), for the keys that have one.
        self.tags: dict[str, str] = {}
        self.listed: list[str] = []  # string prefixes listed completely
        #: How the listings larger than a page were made (``bulk.list_parallel``), for ``-v``.
        self.notes: list[str] = []
        self.lock = threading.RLock()
        self._kv: Any = None
        #: Prefetched contents: (key, tail size or None for the whole object) -> bytes, kept
        #: until the key is written or deleted (or the listing refreshed); the oldest go first
        #: beyond ``CACHE_BYTES``.
        self.cache: dict[tuple[str, int | None], bytes] = {}
        self.cached_bytes = 0

    def kv(self) -> Any:
        import tensorstore as ts

        with self.lock:
            if self._kv is None:
                self._kv = ts.KvStore.open(self.store.kvstore_spec("")).result()
            return self._kv

    def covered(self, prefix: str) -> bool:
        return any(prefix.startswith(p) for p in self.listed)

    def ensure(self, prefix: str) -> None:
        with self.lock:
            if self.covered(prefix):
                return
            try:
                found = list_parallel(self.store, prefix, self.notes.append)
            except Exception as e:
                raise self.store.error(f"cannot list {self.store.url(prefix)}", e) from None
            self.listed = [p for p in self.listed if not p.startswith(prefix)] + [prefix]
            for key in self._span(prefix):  # gone since an earlier listing of a wider prefix
                self.info.pop(key, None)
                self.tags.pop(key, None)
            for obj in found:
                self.info[obj.key] = (obj.size, obj.mtime)
                if obj.tag is not None:
                    self.tags[obj.key] = obj.tag
                else:
                    self.tags.pop(obj.key, None)
            self.keys = sorted(self.info)

    def below(self, prefix: str) -> list[str]:
        """Listed keys that start with ``prefix`` (which must be covered)."""
        with self.lock:
            return self._span(prefix)

    def below_info(self, prefix: str) -> list[tuple[str, int, float]]:
        """``below`` with each key's size and time, taken together: listing ``prefix`` again
        (another thread's ``forget``) cannot come between the keys and their sizes."""
        with self.lock:
            self.ensure(prefix)
            info = self.info
            return [(k, *info[k]) for k in self._span(prefix)]

    def _span(self, prefix: str) -> list[str]:
        lo = bisect.bisect_left(self.keys, prefix)
        hi = bisect.bisect_left(self.keys, prefix + "\U0010ffff")
        return self.keys[lo:hi]

    def added(self, key: str, size: int, mtime: float, tag: str | None = None) -> None:
        with self.lock:
            if key not in self.info:
                bisect.insort(self.keys, key)
            self.info[key] = (size, mtime)
            if tag is not None:
                self.tags[key] = tag
            else:
                self.tags.pop(key, None)  # written by this run: its tag is not known here
            self._forget(key)

    def removed(self, key: str) -> None:
        with self.lock:
            if self.info.pop(key, None) is not None:
                del self.keys[bisect.bisect_left(self.keys, key)]
            self.tags.pop(key, None)
            self._forget(key)

    def _forget(self, key: str) -> None:
        for entry in [e for e in self.cache if e[0] == key] if self.cache else ():
            self.cached_bytes -= len(self.cache.pop(entry))

    def take(self, key: str, tail: int | None) -> bytes | None:
        with self.lock:
            return self.cache.get((key, tail)) if self.cache else None

    def keep(self, found: dict[tuple[str, int | None], bytes]) -> None:
        with self.lock:
            for entry, data in found.items():
                if entry in self.cache:
                    self.cached_bytes -= len(self.cache.pop(entry))
                self.cache[entry] = data
                self.cached_bytes += len(data)
            while self.cached_bytes > CACHE_BYTES and self.cache:
                oldest = next(iter(self.cache))
                self.cached_bytes -= len(self.cache.pop(oldest))

    def forget(self, key: str) -> None:
        """Forget what was listed at ``key`` and below it (the next question lists it again),
        and nothing else: locations sharing this listing keep what they know of their own
        prefixes (two steps of one ``cp`` check their files at once, each after forgetting
        its own). A wider prefix listed earlier is no longer taken as covering ``key``."""
        below = f"{key}/" if key else ""
        with self.lock:
            self.listed = [p for p in self.listed if not (key.startswith(p) or p.startswith(below))]
            lo = bisect.bisect_left(self.keys, below)
            hi = bisect.bisect_left(self.keys, below + "\U0010ffff")
            gone = self.keys[lo:hi]
            del self.keys[lo:hi]
            if key and key in self.info:  # the file ``key`` itself
                gone.append(key)
                del self.keys[bisect.bisect_left(self.keys, key)]
            for k in gone:
                del self.info[k]
                self.tags.pop(k, None)
            if self.cache:
                dropped = set(gone)
                for entry in [e for e in self.cache if e[0] in dropped]:
                    self.cached_bytes -= len(self.cache.pop(entry))
