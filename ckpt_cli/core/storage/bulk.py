"""Many object-store requests at once: a prefix listed in parallel key ranges, keys deleted in
batches sent together.

A listing hands out 1,000 keys a request and each page needs the previous one's token, so a
root of 13,000 keys costs 13 round trips in a row. Here, when the first page is not the whole
listing, a delimiter listing names the prefix's children, which are split into up to
``max_requests`` key ranges listed at once, each paging on its own (S3 ``StartAfter``; GCS
``startOffset`` and ``endOffset``): three round trips for any size. A store that ignores the offsets (gcp-storage-emulator) is noticed from the
keys it returns, and each child of the range is then listed by its own prefix.

Deletes: ``ObjectStore.delete_keys`` removes a batch in one request (S3 DeleteObjects: 1,000
keys; the GCS JSON batch endpoint: 100 calls); the batches go out ``max_requests`` at a time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from ckpt_cli.core.storage.objstore import ObjectInfo, ObjectStore
from ckpt_cli.errors import UnreachableError

T = TypeVar("T")
PAGE = 1000  # keys of a full listing page (S3, GCS)


def list_parallel(store: ObjectStore, prefix: str) -> list[ObjectInfo]:
    """Every object below ``prefix``, in key order: what ``store.list_objects(prefix)`` lists,
    with up to ``store.options.max_requests`` listing requests in flight."""
    first = store.list_page(prefix)
    if first.token is None:
        return list(first.objects)  # one page: one request, as a plain listing
    direct, children = _children(store, prefix)
    found = {o.key: o for o in (*first.objects, *direct)}
    # Children whose keys all came with the first page (sibling prefixes "…/7/" and "…/70/"
    # hold disjoint, ordered key ranges) need no second look.
    last = first.objects[-1].key if first.objects else ""
    pending = [
        c for i, c in enumerate(children) if not (i + 1 < len(children) and children[i + 1] <= last)
    ]
    if len(pending) < 2:
        found.update((o.key, o) for o in _pages(store, prefix, first.token))
    else:
        # As many ranges as the keys left need pages (estimated from what the first page held
        # per child), so the requests stay those of a plain listing, made at once; each asks
        # for about what it holds (a range that asks for 1,000 keys but holds 100 makes the
        # server list 900 keys of the next ranges).
        per_child = len(first.objects) / max(1, len(children) - len(pending))
        pages = -(-int(per_child * len(pending)) // PAGE)
        ranges = _ranges(pending, min(store.options.max_requests, max(2, pages)))
        lock = threading.Lock()

        def one(r: tuple[list[str], str | None]) -> None:
            limit = min(1000, int(len(r[0]) * per_child * 1.25) + 16)
            got = _list_range(store, prefix, r[0], r[1], limit)
            with lock:
                found.update((o.key, o) for o in got)

        concurrently(one, ranges, store.options.max_requests)
    return [found[k] for k in sorted(found)]


def _children(store: ObjectStore, prefix: str) -> tuple[list[ObjectInfo], list[str]]:
    """Objects directly below ``prefix`` and its child prefixes (sorted), every page of them."""
    direct: list[ObjectInfo] = []
    children: list[str] = []
    token: str | None = None
    while True:
        page = store.list_page(prefix, token, delimiter="/")
        direct += page.objects
        children += page.prefixes
        token = page.token
        if token is None:
            return direct, sorted(children)


def _pages(store: ObjectStore, prefix: str, token: str | None) -> list[ObjectInfo]:
    out: list[ObjectInfo] = []
    while token is not None:
        page = store.list_page(prefix, token)
        out += page.objects
        token = page.token
    return out


def _ranges(children: Sequence[str], n: int) -> list[tuple[list[str], str | None]]:
    """Sorted child prefixes in up to ``n`` contiguous groups: (the group's children, the first
    child of the next group, None for the last)."""
    n = max(1, min(n, len(children)))
    size = -(-len(children) // n)
    groups = [list(children[i : i + size]) for i in range(0, len(children), size)]
    return [(g, groups[i + 1][0] if i + 1 < len(groups) else None) for i, g in enumerate(groups)]


def _list_range(
    store: ObjectStore, prefix: str, children: list[str], end: str | None, limit: int
) -> list[ObjectInfo]:
    """The keys in [children[0], end), paging until past ``end``."""
    start = children[0]
    out: list[ObjectInfo] = []
    token: str | None = None
    while True:
        page = store.list_page(prefix, token, start=start, end=end, limit=limit)
        keys = page.objects
        if token is None and keys and keys[0].key < start[:-1]:
            # The store ignored the range (an emulator): list each child by its prefix.
            return [o for child in children for o in store.list_objects(child)]
        out += [o for o in keys if o.key >= start and (end is None or o.key < end)]
        token = page.token
        if token is None or (end is not None and keys and keys[-1].key >= end):
            return out


def delete_all(store: ObjectStore, keys: Sequence[str]) -> dict[str, str]:
    """Delete ``keys`` in batches of ``store.delete_batch``, ``max_requests`` batches at once;
    what failed, by key (a batch whose request failed fails all its keys). An endpoint that is
    gone raises ``UnreachableError`` once every batch has finished."""
    size = store.delete_batch
    batches = [list(keys[i : i + size]) for i in range(0, len(keys), size)]
    failed: dict[str, str] = {}
    gone: list[UnreachableError] = []
    lock = threading.Lock()

    def one(batch: list[str]) -> None:
        try:
            bad = store.delete_keys(batch)
        except Exception as e:
            err = store.error(f"cannot delete {store.url(batch[0])}", e)
            if isinstance(err, UnreachableError):
                gone.append(err)
            bad = dict.fromkeys(batch, err.message)
        with lock:
            failed.update(bad)

    concurrently(one, batches, store.options.max_requests)
    if gone:
        raise gone[0]
    return failed


def concurrently(fn: Callable[[T], None], items: Sequence[T], limit: int) -> None:
    """``fn`` over ``items``, up to ``limit`` at a time (inline for a single item)."""
    if len(items) <= 1:
        for item in items:
            fn(item)
        return
    with ThreadPoolExecutor(max(1, min(limit, len(items)))) as pool:
        for f in [pool.submit(fn, item) for item in items]:
            f.result()
