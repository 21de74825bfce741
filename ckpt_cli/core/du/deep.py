"""What ``du`` finds beyond the files it lists: duplicates found by reading values (``--deep``),
and the uploads a bucket holds open under the path.

``--deep``: a leaf is compared across steps by its ``ld1`` digest (``core/digest``), recorded by
``verify --record`` or, here, computed from its values (``digest_items``: one item after
another, chunk-aligned reads under ``memory_limit``, the hashing on ``--threads``). Only leaves
that could be duplicates are read: those found in several steps (same item, name, dtype and
shape) that no record covers. Without ``--deep`` they are counted as not compared.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace
from functools import partial

from ckpt_cli.core.du.types import Duplicate, Garbage, StepUsage
from ckpt_cli.core.progress import ProgressFn
from ckpt_cli.core.storage import Location
from ckpt_cli.errors import CkptError, UnreachableError

#: (step index, item index, leaf name)
Slot = tuple[int, int, str]


def uncompared(steps: list[StepUsage]) -> list[Slot]:
    """Leaves in several steps (same item, name, dtype, shape) with no digest to compare."""
    seen: dict[tuple[str, str, str | None, tuple[int, ...] | None], list[Slot]] = defaultdict(list)
    for si, s in enumerate(steps):
        for ii, item in enumerate(s.items):
            for leaf in item.leaves:
                if leaf.logical_bytes is not None and not leaf.partial:
                    seen[(item.name, leaf.name, leaf.dtype, leaf.shape)].append((si, ii, leaf.name))
    out = []
    for slots in seen.values():
        if len({si for si, _, _ in slots}) > 1:
            out += [
                (si, ii, name) for si, ii, name in slots if name not in steps[si].items[ii].recorded
            ]
    return out


def duplicates(steps: list[StepUsage]) -> list[Duplicate]:
    """Leaves stored with the same values in several steps, from the items' digest records."""
    seen: dict[tuple[str, str, str], list[tuple[int | None, int]]] = defaultdict(list)
    for s in steps:
        for i in s.items:
            sizes = {leaf.name: leaf.bytes for leaf in i.leaves}
            for leaf, digest in i.recorded.items():
                if leaf in sizes:
                    seen[(i.name, leaf, digest)].append((s.step, sizes[leaf]))
    out = []
    for (item, leaf, digest), copies in seen.items():
        if len(copies) > 1:
            stored = [b for _, b in copies]
            out.append(
                Duplicate(
                    item,
                    leaf,
                    digest.split(" ")[0],
                    tuple(st for st, _ in copies),
                    sum(stored),
                    sum(stored) - max(stored),
                )
            )
    out.sort(key=lambda d: (-d.saved_bytes, d.item, d.leaf))
    return out


def add_digests(
    steps: list[StepUsage], memory_limit: int, on_progress: ProgressFn | None = None
) -> list[StepUsage]:
    """``steps`` with the digests of their uncompared leaves computed from the values."""
    from ckpt_cli.core.digest.items import digest_items
    from ckpt_cli.core.format.discovery import ItemRef
    from ckpt_cli.core.verify.gate import item_locator

    wanted: dict[tuple[int, int], set[str]] = defaultdict(set)
    for si, ii, name in uncompared(steps):
        wanted[(si, ii)].add(name)
    if not wanted:
        return steps
    order = sorted(wanted)
    refs = []
    for si, ii in order:
        item = steps[si].items[ii]
        refs.append((ItemRef(item.location, item.name, steps[si].step, None, None), wanted[si, ii]))
    found = digest_items(refs, memory_limit, on_progress, item_locator)
    out = list(steps)
    for (si, ii), digests in zip(order, found, strict=True):
        item = out[si].items[ii]
        recorded = dict(item.recorded)
        for d in digests.leaves:
            if d.digest is not None and d.dtype != "string":
                recorded[d.name] = f"{d.digest} {d.dtype}{list(d.shape)}"
        items = list(out[si].items)
        items[ii] = replace(item, recorded=recorded)
        out[si] = replace(out[si], items=tuple(items))
    return out


def upload_garbage(location: Location, root: str | None) -> tuple[list[Garbage], str | None]:
    """The multipart uploads begun under ``location`` and never completed nor aborted (a
    bucket only): each with the bytes of its parts (``ListParts``; not counted past
    ``MAX_COUNTED`` uploads) and how to abort it. When the store refuses to list them (a
    credential without ``s3:ListBucketMultipartUploads``): none, and a note saying so."""
    from ckpt_cli.core.storage.remote import RemoteLocation
    from ckpt_cli.core.storage.uploads import MAX_COUNTED, open_uploads

    try:
        uploads = open_uploads(location)
    except UnreachableError:
        raise
    except CkptError as e:
        return [], f"open multipart uploads not listed: {e.message}"
    if not uploads or not isinstance(location, RemoteLocation):
        return [], None
    store = location.store
    count = len(uploads) <= MAX_COUNTED
    out = []
    for u in uploads:
        try:
            size = store.upload_bytes(u) if count else 0
        except Exception as e:
            raise store.error(f"cannot list the parts of an upload under {location}", e) from None
        hint = (
            f"`aws s3api abort-multipart-upload --bucket {store.bucket} --key {u.key} "
            f"--upload-id {u.upload_id}` aborts it"
        )
        if root:
            hint = (
                f"`ckpt prune {root} --clean-tmp` aborts it once older than --tmp-min-age "
                f"(never a live ckpt writer's); or {hint}"
            )
        if not count:
            hint = f"parts not counted (over {MAX_COUNTED} open uploads); " + hint
        out.append(Garbage("open-upload", store.url(u.key), size, hint))
    return out, None


def uploads_meanwhile(
    location: Location, root: str | None
) -> Callable[[], tuple[list[Garbage], str | None]]:
    """``upload_garbage``, on a bucket begun now in a thread of its own: its requests (and
    building botocore's client, 0.2 s of CPU) overlap the listing's and the walk's round
    trips instead of following them. Its answer, or its error, when called."""
    if location.parallel_reads <= 1:
        return partial(upload_garbage, location, root)
    import threading
    from concurrent.futures import Future

    future: Future[tuple[list[Garbage], str | None]] = Future()

    def run() -> None:
        try:
            future.set_result(upload_garbage(location, root))
        except BaseException as e:  # raised where the answer is asked for
            future.set_exception(e)

    threading.Thread(target=run, name="ckpt-du-uploads", daemon=True).start()
    return future.result
