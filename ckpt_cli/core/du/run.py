"""``ckpt du``: one listing of every file under the path, then each OCDBT item's b-tree.

Metadata only: file sizes from the store's listing (one recursive listing), zarr headers
(inline in the b-tree's leaf nodes, or one small file each), the b-tree nodes of each
database's latest version (a level at a time, batched) and TensorStore's walk of every version
for the data files they reference. No JAX, no array data.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Sequence
from functools import partial

from ckpt_cli.core.digest.records import DIGEST_FILE, recorded_values
from ckpt_cli.core.du.deep import add_digests, duplicates, uncompared, uploads_meanwhile
from ckpt_cli.core.du.ocdbt import (
    ItemDatabases,
    ItemWalks,
    Range,
    is_ocdbt,
    walk_cached,
    walk_item,
)
from ckpt_cli.core.du.tier import local_tier_leaves
from ckpt_cli.core.du.types import (
    DuReport,
    Garbage,
    ItemFormat,
    ItemUsage,
    LeafUsage,
    StepUsage,
)
from ckpt_cli.core.du.wave import HEADERS, fetch_decoding, wave_files
from ckpt_cli.core.format.arrays import parse_zarr_header
from ckpt_cli.core.format.discovery import detect, legacy_msgpack_error, step_status
from ckpt_cli.core.format.names import (
    COMMIT_MARKER,
    TMP_MARKER,
    TOMBSTONE,
    WRITING_MARKER,
    StepName,
    looks_like_item,
    parse_step_name,
    split_key,
)
from ckpt_cli.core.format.ocdbt import Value
from ckpt_cli.core.progress import ProgressFn
from ckpt_cli.core.storage import Entry, Location
from ckpt_cli.errors import CkptError

TRASH_PREFIX = ".ckpt-trash-"  # prune's trash directories (core/prune/plan.py)

Files = dict[str, int]
#: An OCDBT item's path -> its databases' walk (``walk_items``, done for many steps at once).
Walked = dict[str, ItemDatabases]
#: A step to report: its name, location, directory, files (step-relative) and status.
Todo = tuple[StepName, Location, str, Files, str]
#: A step's report: its usage and the garbage found in it.
Found = tuple[StepUsage, list[Garbage]]
#: Steps whose items are walked together on an object store (each level of their b-trees one
#: batched read, as deep as ``metadata_requests``), until their latest versions hold
#: ``WALK_KEYS`` keys: what the walks hold at once (keys and inline values, a few hundred
#: bytes each) stays bounded whatever the checkpoint's size.
WALK_STEPS = 4096
WALK_KEYS = 1 << 18


def _split(files: Files) -> tuple[dict[str, Files], Files]:
    """Files grouped by their top directory, and the files at the top."""
    dirs: dict[str, Files] = defaultdict(dict)
    top: Files = {}
    for rel, size in files.items():
        head, sep, rest = rel.partition("/")
        if sep:
            dirs[head][rest] = size
        else:
            top[rel] = size
    return dict(dirs), top


def _reclaim_tree(where: str) -> str:
    return (
        f"rewrite the step without them (`ckpt reshard {where} OUT --like {where}` keeps its "
        "sharding), check the copy, then replace the step"
    )


def _split_values(
    values: dict[bytes, Value | Range], files: Files
) -> tuple[dict[str, int], dict[str, Value | Range]]:
    """An OCDBT item's values: the bytes each leaf stores (a chunk whose data file is missing
    or cut short counts only what is there), and each leaf's zarr header, inline or where."""
    zarr3 = any(k.endswith(b"zarr.json") for k in values)
    stored: dict[str, int] = defaultdict(int)
    headers: dict[str, Value | Range] = {}
    for key, v in values.items():
        name, part = split_key(key, zarr3)
        if part in HEADERS:
            headers[name] = v
        else:
            stored[name] += (
                len(v) if isinstance(v, bytes) else max(0, min(v[2], files.get(v[0], 0) - v[1]))
            )
    return stored, headers


def _leaves_ocdbt(
    item: Location, values: dict[bytes, Value | Range], files: Files
) -> tuple[LeafUsage, ...]:
    """Leaves of an OCDBT item (a damaged one: ``verify`` says what)."""
    stored, headers = _split_values(values, files)
    out_of_line = [(n, v) for n, v in headers.items() if not isinstance(v, bytes)]
    fetched = item.read_ranges([(item.child(v[0]), v[1], v[1] + v[2]) for _, v in out_of_line])
    raw = {n: v for n, v in headers.items() if isinstance(v, bytes)}
    raw.update((n, data) for (n, _), data in zip(out_of_line, fetched, strict=True))
    return _leaves(stored, raw, str(item))


def _leaves(stored: dict[str, int], raw: dict[str, bytes], where: str) -> tuple[LeafUsage, ...]:
    out = []
    for name in sorted(set(stored) | set(raw)):
        try:
            info = parse_zarr_header(name, raw[name], where) if name in raw else None
        except CkptError:
            info = None
        out.append(
            LeafUsage(
                name,
                stored.get(name, 0),
                info.nbytes if info else None,
                info.dtype if info else None,
                info.shape if info else None,
            )
        )
    return tuple(out)


def _leaves_zarr(item: Location, files: Files) -> tuple[LeafUsage, ...]:
    """Plain zarr: a leaf is the directory of a header, its bytes every file in it."""
    dirs = sorted(
        {rel.rpartition("/")[0] for rel in files if rel.rpartition("/")[2] in HEADERS},
        key=len,
        reverse=True,
    )
    stored: dict[str, int] = defaultdict(int)
    for rel, size in files.items():
        for d in dirs:  # the deepest leaf directory holding the file
            if rel.startswith(d + "/") or (not d and "/" not in rel and rel in HEADERS):
                stored[d] += size
                break
    headers = {
        d: item.child(f"{d}/{h}" if d else h)
        for d in dirs
        for h in HEADERS
        if (f"{d}/{h}" if d else h) in files
    }
    item.prefetch(list(headers.values()))
    raw = {d: loc.read_bytes() for d, loc in headers.items()}
    return _leaves(dict(stored), raw, str(item))


def item_usage(
    item: Location,
    name: str,
    files: Files,
    step: int | None,
    step_path: str,
    walked: Walked | None = None,
) -> tuple[ItemUsage, list[Garbage]]:
    """One item: its leaves, and the garbage inside its databases (walked here unless
    ``walked`` holds the walk)."""
    total = sum(files.values())
    fmt: ItemFormat = "other"
    garbage: list[Garbage] = []
    leaves: tuple[LeafUsage, ...] = ()
    exact, note = True, None
    if is_ocdbt(files):
        fmt = "ocdbt"
        dbs = (walked or {}).get(str(item)) or walk_item(item, files)
        leaves = _leaves_ocdbt(item, dbs.values, files)
        exact, (leaves, note) = dbs.exact, local_tier_leaves(item, dbs.values, leaves, dbs.note)
        for rel in dbs.unreferenced:
            garbage.append(
                Garbage(
                    "unreferenced-file",
                    str(item.child(rel)),
                    files[rel],
                    "no version of the OCDBT database references it: nothing reads it; "
                    + _reclaim_tree(step_path)
                    + ", or delete the file",
                    step=step,
                )
            )
        if dbs.unused:
            garbage.append(
                Garbage(
                    "unreferenced-ranges",
                    str(item),
                    sum(dbs.unused.values()),
                    "byte ranges of data files that only older versions read (a rewrite in "
                    "place): " + _reclaim_tree(step_path),
                    files=len(dbs.unused),
                    step=step,
                )
            )
    elif any(rel.rpartition("/")[2] in HEADERS for rel in files):
        fmt = "zarr"
        leaves = _leaves_zarr(item, files)
    usage = ItemUsage(
        name,
        str(item),
        fmt,
        total,
        leaves,
        sum(g.bytes for g in garbage),
        exact,
        note,
        recorded_values(item) if DIGEST_FILE in files else {},  # ``verify --record``'s
        item,
    )
    return usage, garbage


def _is_item_dir(d: str) -> bool:
    return TMP_MARKER not in d and not d.startswith(".")


def _items(loc: Location, files: Files) -> list[tuple[Location, Files]]:
    """The items of a step, as ``step_usage`` finds them."""
    dirs, top = _split(files)
    if looks_like_item(set(dirs) | set(top)):
        return [(loc, files)]
    return [(loc.child(d), sub) for d, sub in sorted(dirs.items()) if _is_item_dir(d)]


def _ocdbt_items(loc: Location, files: Files) -> list[tuple[Location, Files]]:
    """The OCDBT items of a step, as ``step_usage`` finds them."""
    return [(item, sub) for item, sub in _items(loc, files) if is_ocdbt(sub)]


def _walk(where: Location, steps: list[tuple[Location, Files]]) -> Walked:
    """The walks of every OCDBT item of these steps, side by side (``ItemWalks``)."""
    walks = ItemWalks(where)
    for loc, files in steps:
        for item, sub in _ocdbt_items(loc, files):
            walks.add(item, sub)
    return _walked(walks)


def _walked(walks: ItemWalks) -> Walked:
    return {str(item): dbs for (item, _), dbs in zip(walks.items, walks.run(), strict=True)}


def _chunks(location: Location, todo: list[Todo]) -> Iterator[tuple[list[Todo], Walked]]:
    """The steps ``WALK_STEPS`` at a time, fewer where their latest versions hold more than
    ``WALK_KEYS`` keys, each group with its items' walks."""
    walks, chunk, keys = ItemWalks(location), [], 0
    for t in todo:
        keys += sum(walks.add(item, sub) for item, sub in _ocdbt_items(t[1], t[3]))
        chunk.append(t)
        if len(chunk) >= WALK_STEPS or keys >= WALK_KEYS:
            yield chunk, _walked(walks)
            walks, chunk, keys = ItemWalks(location), [], 0
    if chunk:
        yield chunk, _walked(walks)


def step_usage(
    loc: Location,
    name: str,
    files: Files,
    step: int | None,
    status: str,
    walked: Walked | None = None,
) -> tuple[StepUsage, list[Garbage]]:
    """One step: its items, its own files, the item saves left unfinished inside it."""
    dirs, top = _split(files)
    garbage: list[Garbage] = []
    items: list[ItemUsage] = []
    own = 0
    if looks_like_item(set(dirs) | set(top)):  # a single-item Checkpointer's save
        single, found = item_usage(loc, "default", files, step, str(loc), walked)
        return StepUsage(step, name, str(loc), status, sum(files.values()), (single,), 0), found
    leftover = 0
    for d, sub in sorted(dirs.items()):
        size = sum(sub.values())
        if TMP_MARKER in d:
            leftover += size
            garbage.append(
                Garbage(
                    "tmp-item",
                    str(loc.child(d)),
                    size,
                    "an item save that never finished: no reader reads it; delete the "
                    "directory once no save is writing it",
                    files=len(sub),
                    step=step,
                )
            )
        elif not _is_item_dir(d):
            own += size
        else:
            usage, found = item_usage(loc.child(d), d, sub, step, str(loc), walked)
            items.append(usage)
            garbage += found
    own += sum(top.values())
    total = sum(files.values())
    return StepUsage(step, name, str(loc), status, total, tuple(items), own, leftover), garbage


def _classify(location: Location, files: Files) -> tuple[list[Todo], list[Garbage], int]:
    """The steps of a root to report, in order; its garbage directories; its other bytes."""
    dirs, top = _split(files)
    todo: list[Todo] = []
    garbage: list[Garbage] = []
    other = sum(top.values())
    root = str(location)
    for d, sub in sorted(dirs.items()):
        size, count, loc = sum(sub.values()), len(sub), location.child(d)
        parsed = parse_step_name(d)
        kind = None
        if d.startswith(TRASH_PREFIX) or (parsed and TOMBSTONE in sub):
            kind, hint = "trash", f"left by an interrupted prune: `ckpt prune {root}` removes it"
        elif parsed and parsed.tmp:
            kind, hint = (
                "tmp-save",
                (f"an unfinished save: `ckpt prune {root} --clean-tmp` removes it once idle"),
            )
        elif (
            parsed
            and location.requires_commit_marker
            and WRITING_MARKER in sub
            and COMMIT_MARKER not in sub
        ):
            kind, hint = (
                "unfinished-write",
                (f"a ckpt write that never committed: `ckpt prune {root} --clean-tmp` removes it"),
            )
        if kind is not None:
            step = parsed.step if parsed else None
            garbage.append(Garbage(kind, str(loc), size, hint, count, step))  # type: ignore[arg-type]
            continue
        if parsed is None:
            other += size  # metadata/ and directories that are not steps
            continue
        status = step_status(loc, parsed, frozenset(n.partition("/")[0] for n in sub))
        todo.append((parsed, loc, d, sub, status))
    todo.sort(key=lambda t: (t[0].step, t[2]))
    return todo, garbage, other


def _step_of(walked: Walked, t: Todo) -> tuple[StepUsage, list[Garbage]]:
    return step_usage(t[1], t[2], t[3], t[0].step, t[4], walked)


def _each_step(location: Location, todo: list[Todo], early: dict[int, Found]) -> Iterator[Found]:
    """Each step's usage, in order: those ``early`` holds (decoded in the first wave), the
    others here. On an object store ``WALK_STEPS`` steps at a time (fewer past ``WALK_KEYS``
    keys): their OCDBT items walked side by side (a level of every item's b-trees in one
    batched read: a step's walk costs round trips, latency, not CPU), then the rest of each
    step, several steps at once (as ``verify`` checks items). Locally one step after another."""
    if location.parallel_reads <= 1:
        for t in todo:
            yield _step_of(_walk(location, [(t[1], t[3])]), t)
        return
    rest = _each_walked(location, [t for i, t in enumerate(todo) if i not in early])
    for i in range(len(todo)):
        yield early[i] if i in early else next(rest)


def _each_walked(location: Location, todo: list[Todo]) -> Iterator[Found]:
    from concurrent.futures import ThreadPoolExecutor

    for chunk, walked in _chunks(location, todo):
        workers = max(1, min(len(chunk), location.parallel_reads // 4))
        with ThreadPoolExecutor(workers) as pool:
            yield from pool.map(partial(_step_of, walked), chunk)


def _early(t: Todo) -> Found | None:
    """A step decoded in the first wave from what the wave holds (``walk_cached``); None where
    it would need a request (a walk going deeper, headers out of line, a record or a header
    the wave did not read) or fails: the usual walk after the wave then reads, decodes and
    reports it (the errors in their order), its reads batched with the other steps'."""
    walked: Walked = {}
    for item, sub in _ocdbt_items(t[1], t[3]):
        dbs = walk_cached(item, sub)
        if dbs is None:
            return None
        walked[str(item)] = dbs
    if not _held(t[1], t[3], walked):
        return None
    try:
        return _step_of(walked, t)
    except CkptError:
        return None


def _held(loc: Location, files: Files, walked: Walked) -> bool:
    """Whether ``step_usage`` of this step (its items walked: ``walked``) reads only what this
    process holds: the zarr headers out of line, the plain zarr headers, the digest records."""
    for item, sub in _items(loc, files):
        dbs = walked.get(str(item))
        if dbs is not None:
            headers = _split_values(dbs.values, sub)[1].values()
            reads = [(item.child(v[0]), v[1], v[1] + v[2]) for v in headers if isinstance(v, tuple)]
        else:
            names = [r for r in sub if r.rpartition("/")[2] in HEADERS]
            reads = [(item.child(r), 0, sub[r]) for r in names]
        if DIGEST_FILE in sub:
            reads.append((item.child(DIGEST_FILE), 0, sub[DIGEST_FILE]))
        if reads and item.cached(reads) is None:
            return False
    return True


def _root(location: Location, files: Files) -> tuple[list[StepUsage], list[Garbage], int]:
    """Every step of a root, and its garbage: the first wave's reads (``wave_files``) go
    out step after step, each step decoded as its files arrive (``wave.fetch_decoding``; on
    a bucket), then the steps left walked the usual way."""
    todo, garbage, other = _classify(location, files)
    by_dir: dict[str, list[str]] = defaultdict(list)
    for rel in wave_files(files):
        by_dir[rel.partition("/")[0]].append(rel)
    groups = [by_dir.pop(t[2], []) for t in todo]
    rest = [rel for rels in by_dir.values() for rel in rels]
    decode = (lambda g: _early(todo[g])) if location.parallel_reads > 1 else None
    early = fetch_decoding(location, groups, rest, decode)
    steps = []
    for usage, found in _each_step(location, todo, early):
        steps.append(usage)
        garbage += found
    return steps, garbage, other


def _below_root(
    location: Location, kind: str, entries: Sequence[Entry], files: Files
) -> tuple[list[StepUsage], list[Garbage], int]:
    """A step (``entries``: its children) or an item: its usage, its garbage, no other bytes."""
    if kind == "step":
        parsed = parse_step_name(location.name)
        names = frozenset(e.name for e in entries)
        status = (
            "uncommitted"
            if location.requires_commit_marker and COMMIT_MARKER not in names
            else "committed"
        )
        walked = _walk(location, [(location, files)])
        usage, garbage = step_usage(
            location, location.name, files, parsed.step if parsed else None, status, walked
        )
        return [usage], garbage, 0
    item, garbage = item_usage(location, location.name, files, None, str(location.parent))
    return [StepUsage(None, "", str(location), "-", sum(files.values()), (item,), 0)], garbage, 0


def disk_usage(
    location: Location,
    *,
    deep: bool = False,
    memory_limit: int = 1 << 30,
    on_progress: ProgressFn | None = None,
) -> DuReport:
    """Where the bytes under ``location`` (a root, a step or an item) are, and which are
    garbage. ``deep``: compute the digests no record holds of the leaves found in several
    steps (reads their values, under ``memory_limit``), so that duplicates are found."""
    found = detect(location)
    if found.kind == "legacy":
        raise legacy_msgpack_error(location)
    uploads = uploads_meanwhile(location, str(location) if found.kind == "root" else None)
    files = {rel: e.size for rel, e in location.walk()}
    total = sum(files.values())
    # Every OCDBT manifest under the path at once, each merged root's b-tree nodes and the
    # digest records (``wave_files``; ``metadata_requests`` in flight on a bucket): each
    # item's walk then starts from its manifests and nodes without a round trip of its own.
    if found.kind == "root":
        steps, garbage, other = _root(location, files)
    else:
        location.prefetch([location.child(rel) for rel in wave_files(files)])
        steps, garbage, other = _below_root(location, found.kind, found.entries, files)
    found_uploads, note = uploads()
    garbage += found_uploads
    if deep:
        steps = add_digests(steps, memory_limit, on_progress)
    return DuReport(
        str(location),
        found.kind,
        total,
        tuple(steps),
        other,
        tuple(garbage),
        tuple(duplicates(steps)),
        deep,
        len(uncompared(steps)),
        (note,) if note else (),
    )
