"""Many object-store requests at once: a prefix listed in parallel key ranges, keys deleted in
batches sent together.

A listing hands out 1,000 keys a request and each page needs the previous one's token, so a
root of 13,000 keys costs 13 round trips in a row. Here, when the first page is not the whole
listing, a delimiter listing names the prefix's children, which are split into up to
``max_requests`` contiguous groups listed at once, each paging on its own: three round trips
for any size.

Stores do not agree on the order of a listing. S3 and GCS list in byte order; SeaweedFS lists
in the order of its directory tree (``r/6/…`` before ``r/6.orbax-checkpoint-tmp-1/…``, and its
delimiter listing names the children in that same order) and reads ``StartAfter="r/231"`` as
"after the directory 231", skipping every key below ``r/231/``. So no range boundary is a byte
comparison: the children stay in the order the store named them; a range starts just after the
previous child (``StartAfter``/``startOffset`` = that child's prefix + U+10FFFF, which no key
below it passes, on either kind of store) and ends where it meets a key of a child outside its
group, which must be the first child of the next group; keys are kept by the name of their
child. Each range's answers are then checked (``_Unproven``): the children come one run each,
in the named order, and every child the delimiter listing named has a key somewhere (a child
without one is asked for a single key by its own prefix: SeaweedFS keeps a directory whose keys
were all deleted). A store that ignores the offsets (gcp-storage-emulator) fails that check on
its first answer. Whatever cannot be proven complete is listed again as one plain listing that
continues from the first page, which is complete by construction: a listing never returns with
keys missing, and ``on_note`` says which way it went (``ckpt ls -v``).

Deletes: ``ObjectStore.delete_keys`` removes a batch in one request (S3 DeleteObjects: 1,000
keys; the GCS JSON batch endpoint: 100 calls); the batches go out ``max_requests`` at a time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ckpt_cli.core.storage.objstore import ObjectInfo, ObjectStore, Page, concurrently
from ckpt_cli.errors import UnreachableError

PAGE = 1000  # keys of a full listing page (S3, GCS)
#: The last code point: ``child + AFTER`` sorts after every key below ``child`` and before the
#: next child's keys, in byte order and in SeaweedFS's tree order alike.
AFTER = "\U0010ffff"


class _Unproven(Exception):
    """The ranges' answers do not prove the listing complete (the message says why)."""


@dataclass(frozen=True)
class _Range:
    """One group of children listed by one request chain: after ``after`` (or on from
    ``token``, the first page's), up to ``end`` where the store can stop, until a key of ``nxt``
    (None: the last group, which runs to the end)."""

    children: tuple[str, ...]
    after: str | None
    token: str | None
    end: str | None
    nxt: str | None
    limit: int


def list_parallel(
    store: ObjectStore, prefix: str, on_note: Callable[[str], None] | None = None
) -> list[ObjectInfo]:
    """Every object below ``prefix``, in key order: what ``store.list_objects(prefix)`` lists,
    with up to ``store.options.max_requests`` listing requests in flight. ``on_note`` hears how
    a listing of more than one page was made."""
    first = store.list_page(prefix)
    if first.token is None:
        return list(first.objects)  # one page: one request, as a plain listing
    before = store.requests - 1
    direct, children = _children(store, prefix)
    if not children:
        got, how = _pages(store, prefix, first), "one plain listing (no child prefixes)"
    else:
        try:
            got, ranges = _list_ranges(store, prefix, first, children)
            how = f"{len(children):,} children in {ranges} parallel key range"
            how += f"{'s' if ranges > 1 else ''}, every child accounted for"
        except _Unproven as e:
            got = _pages(store, prefix, first)
            how = (
                f"one plain listing, since the parallel key ranges were not provably complete ({e})"
            )
    found = {o.key: o for o in (*got, *direct)}
    if on_note is not None:
        requests = store.requests - before
        on_note(f"listed {store.url(prefix)}: {len(found):,} keys, {how}; {requests} requests")
    return [found[k] for k in sorted(found)]


def _children(store: ObjectStore, prefix: str) -> tuple[list[ObjectInfo], list[str]]:
    """Objects directly below ``prefix`` and its child prefixes in the store's order, every
    page of them."""
    direct: list[ObjectInfo] = []
    children: list[str] = []
    token: str | None = None
    while True:
        page = store.list_page(prefix, token, delimiter="/")
        direct += page.objects
        children += page.prefixes
        token = page.token
        if token is None:
            return direct, children


def _pages(store: ObjectStore, prefix: str, first: Page) -> list[ObjectInfo]:
    """The plain listing that ``first`` began, page after page: complete by construction."""
    out = list(first.objects)
    token = first.token
    while token is not None:
        page = store.list_page(prefix, token)
        out += page.objects
        token = page.token
    return out


def _child(prefix: str, key: str) -> str | None:
    """The child prefix of ``prefix`` that holds ``key`` (None: a key directly below)."""
    name, slash, _ = key[len(prefix) :].partition("/")
    return f"{prefix}{name}/" if slash else None


def _list_ranges(
    store: ObjectStore, prefix: str, first: Page, children: list[str]
) -> tuple[list[ObjectInfo], int]:
    """The keys of ``children`` listed in parallel ranges, and how many ranges; ``_Unproven``
    when the answers do not prove that every key was found."""
    order = {c: i for i, c in enumerate(children)}
    if len(order) != len(children):
        raise _Unproven("the store named a child twice")
    runs = _runs(prefix, first.objects, order, None)
    # The last child of the first page may go on; the ones before it are complete.
    done = order[runs[-1][0]] if runs else 0
    complete = runs[:-1]
    per_child = (
        sum(n for _, n in complete) / len(complete) if complete else max(1, len(first.objects))
    )
    pending = children[done:]
    # As many ranges as the keys left need pages (estimated from what the first page held per
    # child), so the requests stay those of a plain listing, made at once; each asks for about
    # what it holds (a range that asks for 1,000 keys but holds 100 makes the server list 900
    # keys of the next ranges).
    pages = -(-int(per_child * len(pending)) // PAGE)
    groups = _groups(pending, min(store.options.max_requests, max(2, pages)))
    ranges = []
    for i, group in enumerate(groups):
        nxt = groups[i + 1][0] if i + 1 < len(groups) else None
        limit = min(PAGE, int(len(group) * per_child * 1.25) + 16)
        if i == 0:  # on from the first page, whose last child it holds
            ranges.append(_Range(group, None, first.token, None, nxt, limit))
        else:
            after = children[order[group[0]] - 1] + AFTER
            ranges.append(_Range(group, after, None, nxt, nxt, limit))
    found: list[ObjectInfo] = list(first.objects)
    lock = threading.Lock()

    def one(r: _Range) -> None:
        got = _list_range(store, prefix, r, order)
        with lock:
            found.extend(got)

    concurrently(one, ranges, store.options.max_requests)
    _check_every_child(store, children, {_child(prefix, o.key) for o in found})
    return found, len(ranges)


def _groups(children: Sequence[str], n: int) -> list[tuple[str, ...]]:
    """``children`` in up to ``n`` contiguous groups of about equal size."""
    n = max(1, min(n, len(children)))
    size = -(-len(children) // n)
    return [tuple(children[i : i + size]) for i in range(0, len(children), size)]


def _list_range(
    store: ObjectStore, prefix: str, r: _Range, order: dict[str, int]
) -> list[ObjectInfo]:
    """The keys of ``r.children``, paging until a key of ``r.nxt`` or the end of the listing."""
    members = set(r.children)
    keys: list[ObjectInfo] = []
    token = r.token
    while True:
        page = store.list_page(prefix, token, start=r.after, end=r.end, limit=r.limit)
        stop = _outside(prefix, page.objects, members)
        keys += page.objects[:stop]
        if stop is not None:
            met = _child(prefix, page.objects[stop].key)
            if met != r.nxt:
                where = f"after {r.after[: -len(AFTER)]}" if r.after else "on from the first page"
                should = f"{r.nxt} should follow" if r.nxt else "the listing should end"
                raise _Unproven(f"the range {where} met {met} where {should}")
            break
        token = page.token
        if token is None:
            break
    _runs(prefix, keys, order, r.children[0])
    return [k for k in keys if _child(prefix, k.key) is not None]


def _outside(prefix: str, objects: Sequence[ObjectInfo], members: set[str]) -> int | None:
    """Where the first key of a child outside ``members`` is (None: nowhere)."""
    for n, o in enumerate(objects):
        child = _child(prefix, o.key)
        if child is not None and child not in members:
            return n
    return None


def _runs(
    prefix: str, objects: Sequence[ObjectInfo], order: dict[str, int], start: str | None
) -> list[tuple[str, int]]:
    """The children of ``objects`` as (child, keys) runs; ``_Unproven`` unless each child comes
    in one run, in the store's order of children, none before ``start``."""
    runs: list[tuple[str, int]] = []
    for o in objects:
        child = _child(prefix, o.key)
        if child is None:
            continue  # a key directly below: the delimiter listing has it
        if runs and runs[-1][0] == child:
            runs[-1] = (child, runs[-1][1] + 1)
            continue
        if child not in order:
            raise _Unproven(f"{child} holds keys but the store did not name it")
        low = order[runs[-1][0]] + 1 if runs else order[start] if start else 0
        if order[child] < low:
            raise _Unproven(f"the keys of {child} came out of the store's order of children")
        runs.append((child, 1))
    return runs


def _check_every_child(store: ObjectStore, children: list[str], seen: set[str | None]) -> None:
    """Every child the store named holds a key: the ranges found one, or a listing of the
    child's own prefix finds none (SeaweedFS keeps the directory of deleted keys)."""
    empty = [c for c in children if c not in seen]
    if len(empty) > store.options.max_requests:
        raise _Unproven(f"{len(empty):,} children without a key in the ranges")
    missed: list[str] = []

    def probe(child: str) -> None:
        if store.list_page(child, limit=1).objects:
            missed.append(child)

    concurrently(probe, empty, store.options.max_requests)
    if missed:
        raise _Unproven(f"the ranges missed the keys of {sorted(missed)[0]}")


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
