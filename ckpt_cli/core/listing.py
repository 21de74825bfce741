"""``ls``: every step of a root with its state, time, size, items, metrics and storage format."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, ClassVar, Literal, TypedDict

from ckpt_cli.core.format.discovery import (
    Detected,
    Status,
    StepRef,
    detect,
    item_location,
    latest_committed,
    legacy_msgpack_error,
    list_saves,
    step_items,
    step_ref,
)
from ckpt_cli.core.format.emergency import LocalTier, is_local_root_entry
from ckpt_cli.core.format.metadata import (
    FLAGS_TAIL_BYTES,
    StepMetadata,
    peek_storage_flags,
    read_metrics,
    read_root_metadata,
    read_step_metadata,
)
from ckpt_cli.core.format.names import (
    COMMIT_MARKER,
    METRICS_ITEM,
    STEP_METADATA,
    TOMBSTONE,
    TREE_METADATA,
    looks_like_item,
    parse_step_name,
)
from ckpt_cli.core.format.pins import PIN_FILE, Pin, PinJSON, read_pin
from ckpt_cli.core.format.tiers import listed_local_tier
from ckpt_cli.core.schema import JSONValue
from ckpt_cli.core.schema.finite import NonFinite, split_nonfinite
from ckpt_cli.core.storage import Location
from ckpt_cli.core.storage.base import Entry
from ckpt_cli.errors import CkptError, NotACheckpointError, NotFoundError

#: Where a step's commit time comes from: ``_CHECKPOINT_METADATA``, the object-store commit
#: marker, or the newest file time.
TimeSource = Literal["commit_metadata", "commit_marker", "mtime"]
#: What wrote an entry: a CheckpointManager's numbered step (``step``), a Checkpointer's save
#: without a step number (``save``: the NNX guide's ``ckpt_dir/state``), or a numbered step
#: that is itself its one item (``flax``: ``flax.training.checkpoints.save_checkpoint``).
EntryKind = Literal["step", "save", "flax"]


class StepJSON(TypedDict):
    #: None: a checkpoint saved without a CheckpointManager (a Checkpointer's directory).
    step: int | None
    name: str
    path: str
    status: Literal["committed", "incomplete", "uncommitted", "partial"]
    #: schema 4: why the step is not committed (the writer's evidence), null when it is.
    reason: str | None
    #: schema 4: items a deletion record names (being deleted; the step restores without them)
    deleting: list[str]
    latest: bool
    committed_at: str
    time_source: TimeSource
    size_bytes: int
    items: list[str]
    metrics: JSONValue  # NaN/Inf as null (JSON has neither): ``metrics_nonfinite`` says which
    #: schema 5: each NaN/Inf metric -> ``"nan"``, ``"inf"`` or ``"-inf"`` (``{}``: none)
    metrics_nonfinite: dict[str, NonFinite]
    formats: dict[str, str]
    problem: str | None
    pinned: PinJSON | None
    kind: EntryKind
    #: schema 6: the step is one host's local tier of Orbax's emergency checkpointing (only
    #: that host's shards are stored in it); null for any other step.
    local_tier: StepTierJSON | None


class StepTierJSON(TypedDict):
    """A local tier: what marks it (``process-metadata``: Orbax's marker item;
    ``single-writer``: the chunks of the p2p manager's, which writes none), whose shards."""

    marker: Literal["process-metadata", "single-writer"]
    process: int | None
    devices: list[int] | None
    note: str


class LsJSON(TypedDict):
    """``ckpt ls --json``: the steps of a root."""

    schema_version: int
    ok: bool
    root: str
    root_metadata: JSONValue
    latest_step: int | None
    total_bytes: int
    steps: list[StepJSON]
    ignored: list[str]


@dataclass(frozen=True)
class StepInfo:
    step: int
    name: str
    path: str
    status: Status
    committed_at: datetime
    time_source: TimeSource
    size_bytes: int
    items: tuple[str, ...]
    metrics: dict[str, Any] | None
    formats: dict[str, str]
    latest: bool = False
    problem: str | None = None
    #: False for a checkpoint saved without a CheckpointManager: no step number (JSON null).
    numbered: bool = True
    pinned: Pin | None = None  # ``ckpt pin``: prune always keeps the step
    kind: EntryKind = "step"
    reason: str | None = None  # why it is not committed (``evidence.judge``)
    deleting: tuple[str, ...] = ()  # items being deleted (a deletion record)
    #: One host's local tier of Orbax's emergency checkpointing (``format/tiers``).
    local_tier: LocalTier | None = None

    def to_json(self) -> StepJSON:
        metrics, nonfinite = split_nonfinite(self.metrics)
        return {
            "step": self.step if self.numbered else None,
            "name": self.name,
            "path": self.path,
            "status": self.status,
            "reason": self.reason,
            "deleting": list(self.deleting),
            "latest": self.latest,
            "committed_at": self.committed_at.isoformat(),
            "time_source": self.time_source,
            "size_bytes": self.size_bytes,
            "items": list(self.items),
            "metrics": metrics,
            "metrics_nonfinite": nonfinite,
            "formats": self.formats,
            "problem": self.problem,
            "pinned": self.pinned.to_json() if self.pinned else None,
            "kind": self.kind,
            "local_tier": _tier_json(self.local_tier),
        }


def _tier_json(tier: LocalTier | None) -> StepTierJSON | None:
    if tier is None:
        return None
    looks = "looks like the " if tier.marker == "single-writer" else ""
    return {
        "marker": tier.marker,
        "process": tier.process,
        "devices": list(tier.devices) if tier.devices is not None else None,
        "note": looks + tier.describe(),
    }


@dataclass(frozen=True)
class RootListing:
    #: 2: a step saved without a CheckpointManager has ``"step": null`` (1 said integer, and
    #: printed null all the same). 3: each entry's ``kind`` (step, save, flax). 4: status
    #: ``partial`` (a v1 partial save), each entry's ``reason`` and ``deleting``. 5: a NaN/Inf
    #: metric is null, ``metrics_nonfinite`` says which (Orbax writes ``{"loss": NaN}``). 6:
    #: each entry's ``local_tier`` (one host's shards of Orbax's emergency checkpointing).
    SCHEMA_VERSION: ClassVar[int] = 6

    root: str
    steps: tuple[StepInfo, ...]
    root_metadata: dict[str, Any] | None
    ignored: tuple[str, ...]  # directories under the root that are not steps

    @property
    def latest(self) -> StepInfo | None:
        return next((s for s in self.steps if s.latest), None)

    @property
    def total_bytes(self) -> int:
        return sum(s.size_bytes for s in self.steps)

    def to_json(self) -> LsJSON:
        """The document ``ckpt ls --json`` prints."""
        return {
            "schema_version": self.SCHEMA_VERSION,
            "ok": True,
            "root": self.root,
            "root_metadata": self.root_metadata,
            "latest_step": self.latest.step if self.latest and self.latest.numbered else None,
            "total_bytes": self.total_bytes,
            "steps": [s.to_json() for s in self.steps],
            "ignored": list(self.ignored),
        }


def _format_of(item: Location) -> str | None:
    flags = peek_storage_flags(item)
    if flags is None:
        return _format_from_listing(item, with_zarr=True)
    ocdbt, zarr3 = flags
    if ocdbt is None:  # not recorded before Orbax 0.12: the database on disk tells
        ocdbt = _holds_ocdbt(item)
    return ("ocdbt" if ocdbt else "plain") + ("+zarr3" if zarr3 else "+zarr2")


def _holds_ocdbt(item: Location) -> bool:
    names = {e.name for e in item.list()}
    return "manifest.ocdbt" in names or any(n.startswith("ocdbt.process_") for n in names)


def _format_from_listing(item: Location, with_zarr: bool = False) -> str | None:
    """The storage format as far as an object listing tells it (no request: listings are cached).

    OCDBT hides the zarr version inside its database, so an OCDBT item reads ``ocdbt``
    (``ocdbt+zarr2`` with ``with_zarr``: an item without ``_METADATA``, an ArraySave of Orbax
    0.4, whose releases wrote zarr2 only).
    """
    if _holds_ocdbt(item):
        return "ocdbt+zarr2" if with_zarr else "ocdbt"
    for _, entry in item.walk():
        if entry.name in ("zarr.json", ".zarray"):
            return "plain+zarr3" if entry.name == "zarr.json" else "plain+zarr2"
    return None


def _step_info_from_listing(ref: StepRef) -> StepInfo:
    """A committed step on an object store, from the prefix listing plus its metadata.

    Reading three small objects per step made ``ls`` of 1,000 steps take 12 s against a local
    S3 server (bench/bench_remote.py); the listing already holds the items (the step's
    subdirectories) and the storage formats. ``_CHECKPOINT_METADATA`` is read for the commit
    time, the one Orbax records and prune keeps by (the marker object's own time is when it was
    uploaded, which for a copied bucket is not when the step was saved), and for the metrics;
    ``metrics/metrics`` only when the metadata has none.
    """
    loc = ref.location
    marker = next(e for e in ref.children if e.name == COMMIT_MARKER)
    items = [i for i in step_items(loc, ref.children, None) if i not in ref.deleting]
    formats: dict[str, str] = {}
    metrics = None
    problem = None
    meta = None
    try:
        meta = read_step_metadata(loc)
    except CkptError as e:
        problem = e.message
    source: TimeSource = "commit_marker"
    committed_at = datetime.fromtimestamp(marker.mtime, tz=timezone.utc)
    if meta is not None and meta.committed_at is not None:
        committed_at, source = meta.committed_at, "commit_metadata"
    try:
        for name in items:
            if name != METRICS_ITEM and (
                fmt := _format_from_listing(item_location(loc, name, items))
            ):
                formats[name] = fmt
        metrics = read_metrics(loc, meta or StepMetadata())
    except CkptError as e:
        problem = problem or e.message
    return StepInfo(
        step=ref.step,
        name=ref.name,
        path=str(loc),
        status=ref.status,
        committed_at=committed_at,
        time_source=source,
        size_bytes=loc.du(),
        items=tuple(i for i in items if i != METRICS_ITEM),
        metrics=metrics,
        formats=formats,
        problem=problem,
        pinned=read_pin(loc, ref.children),
        kind=_kind(ref),
        deleting=ref.deleting,
        local_tier=_local_tier(ref, meta),
    )


def _kind(ref: StepRef) -> EntryKind:
    """A numbered step whose directory is itself an item: flax.training.checkpoints writes one
    Checkpointer save per step (``checkpoint_<N>/``), a manager an item directory in each."""
    return "flax" if looks_like_item(ref.child_names) else "step"


def step_info(ref: StepRef, from_listing: bool = False) -> StepInfo:
    """Everything ``ls`` shows about one step; damage becomes a ``problem``, not an abort.

    ``from_listing``: on an object store, take a committed step's time and items from the
    listing (see ``_step_info_from_listing``); prune keeps the exact commit timestamps.
    """
    loc = ref.location
    if ref.status == "partial":
        return _partial_info(ref)
    # A directory taken for a step without a marker of its own (several Checkpointer saves
    # side by side) has no marker time to take from the listing: read it like a local step.
    if (
        from_listing
        and loc.requires_commit_marker
        and ref.status == "committed"
        and COMMIT_MARKER in ref.child_names
    ):
        return _step_info_from_listing(ref)
    problem = None
    try:
        meta = read_step_metadata(loc)
    except CkptError as e:
        meta, problem = None, e.message
    committed_at = meta.committed_at if meta else None
    source: TimeSource = "commit_metadata"
    if committed_at is None:
        committed_at = datetime.fromtimestamp(loc.mtime(), tz=timezone.utc)
        source = "mtime"
    items = step_items(loc, ref.children, meta.item_handlers if meta else None)
    items = [i for i in items if i not in ref.deleting]
    if not ref.committed:  # an unfinished save or a deletion's leftover: what is there only
        items = [i for i in items if i in ref.child_names]
    formats: dict[str, str] = {}
    metrics = None
    try:
        for name in items:
            if name != METRICS_ITEM and (fmt := _format_of(item_location(loc, name, items))):
                formats[name] = fmt
        metrics = read_metrics(loc, meta) if meta else None
    except CkptError as e:
        problem = problem or e.message
    return StepInfo(
        step=ref.step,
        name=ref.name,
        path=str(loc),
        status=ref.status,
        committed_at=committed_at,
        time_source=source,
        size_bytes=loc.du(),
        items=tuple(i for i in items if i != METRICS_ITEM),
        metrics=metrics,
        formats=formats,
        problem=problem,
        pinned=read_pin(loc, ref.children),
        kind=_kind(ref),
        reason=ref.reason,
        deleting=ref.deleting,
        local_tier=_local_tier(ref, meta),
    )


def _local_tier(ref: StepRef, meta: StepMetadata | None) -> LocalTier | None:
    """The local tier a committed step is (only its host's shards stored): still committed."""
    if not ref.committed:
        return None
    handlers = meta.item_handlers if meta else None
    confirm = not ref.location.requires_commit_marker  # local tiers live on local disks
    try:
        return listed_local_tier(ref.location, ref.children, handlers, confirm)
    except CkptError:
        return None


def _partial_info(ref: StepRef) -> StepInfo:
    """A v1 partial save in progress: its age (the newest file in it), its size, its reason;
    no items or metrics (they live in its pending saves until ``finalize`` merges them)."""
    loc = ref.location
    newest = loc.mtime()
    with contextlib.suppress(CkptError):
        newest = max([newest, *(e.mtime for _, e in loc.walk())])
    return StepInfo(
        step=ref.step,
        name=ref.name,
        path=str(loc),
        status=ref.status,
        committed_at=datetime.fromtimestamp(newest, tz=timezone.utc),
        time_source="mtime",
        size_bytes=loc.du(),
        items=(),
        metrics=None,
        formats={},
        reason=ref.reason,
    )


def list_root(
    location: Location, *, from_listing: bool = False, detected: Detected | None = None
) -> RootListing:
    """List a CheckpointManager root; a step directory lists as a root of one step.

    ``detected``: what ``detect(location)`` already found (a caller that detected the root
    need not list it again).
    """
    found = detected if detected is not None else detect(location)
    kind, entries = found.kind, found.entries
    if kind == "item":
        raise NotACheckpointError(
            f"{location} is an item directory, not a root of steps",
            hint=f"run `ckpt inspect {location}` to see its tree",
        )
    if kind == "legacy":
        raise legacy_msgpack_error(location)
    saves = list_saves(location, entries) if kind == "step" else None
    if saves:
        # Checkpointer saves side by side (``ckpt_dir/state``, ``ckpt_dir/other``): each its
        # own entry, none of them a step of the others.
        refs, root, root_meta = saves, location, None
    elif kind == "step":
        refs, root, root_meta = [step_ref(location, entries)], location.parent, None
    else:
        refs, root, root_meta = found.steps or [], location, read_root_metadata(location)
    ignored = _ignored(location, entries, {r.name for r in refs}) if kind == "root" else ()
    # Serial: on local disks the per-step work is cheap system calls, and threads only fight
    # over the GIL (measured 3x slower with 8 workers on 2 cores, bench/). On object stores every
    # small file the steps need is fetched first, all in flight together: then the same serial
    # loop reads from memory.
    if location.parallel_reads > 1 and len(refs) > 1:
        _prefetch(location, refs, from_listing)
    found_infos = [_info_if_present(r, from_listing) for r in refs]
    infos = [i for i in found_infos if i is not None]
    present = {i.name for i in infos}
    # Saves side by side have no order to them: none is the latest.
    latest = None if saves else latest_committed([r for r in refs if r.name in present])
    if latest is not None:
        infos = [_mark_latest(i) if i.name == latest.name else i for i in infos]
    if saves or (kind == "step" and parse_step_name(location.name) is None):
        from dataclasses import replace

        # Checkpoints saved without a CheckpointManager (a Checkpointer's directory): they
        # have no step number, and none is made up.
        infos = [replace(i, numbered=False, kind="save") for i in infos]
    return RootListing(str(root if kind == "root" else location), tuple(infos), root_meta, ignored)


def _ignored(location: Location, entries: Sequence[Entry], steps: set[str]) -> tuple[str, ...]:
    """Directories under a root that are no step: not hidden, not Orbax's ``metadata``, not a
    step being deleted (a bucket's tombstone), and still there."""
    return tuple(
        e.name
        for e in entries
        if e.is_dir
        and e.name not in steps
        and e.name != "metadata"
        and not e.name.startswith(".")
        and not is_local_root_entry(e.name)  # the emergency managers' files beside the steps
        and not (location.requires_commit_marker and location.child(e.name, TOMBSTONE).is_file())
        and (location.requires_commit_marker or location.child(e.name).exists())  # not vanished
    )


def _prefetch(root: Location, refs: list[StepRef], from_listing: bool) -> None:
    """The files ``step_info`` reads, for every step at once: metrics, the pin, the step's
    ``_CHECKPOINT_METADATA``, and unless the listing answers for the step, the tail of each
    item's ``_METADATA``."""
    whole: list[Location] = []
    tails: list[Location] = []
    for ref in refs:
        loc = ref.location
        # _CHECKPOINT_METADATA always: a committed step's commit time is the one it records.
        whole += [loc.child(METRICS_ITEM, METRICS_ITEM), loc.child(PIN_FILE)]
        whole.append(loc.child(STEP_METADATA))
        if from_listing and ref.status == "committed":
            continue
        tails.append(loc.child(TREE_METADATA))  # a single-item Checkpointer's step
        tails += [loc.child(e.name, TREE_METADATA) for e in ref.children if e.is_dir]
    root.prefetch(whole)
    root.prefetch(tails, tail=FLAGS_TAIL_BYTES)


def _info_if_present(ref: StepRef, from_listing: bool) -> StepInfo | None:
    """``step_info``, or None when the step vanished since the root was listed (a trainer's
    rename or retention): expected beside a live trainer, not an error."""
    try:
        return step_info(ref, from_listing)
    except NotFoundError:
        if ref.location.exists():
            raise
        return None


def _mark_latest(info: StepInfo) -> StepInfo:
    from dataclasses import replace

    return replace(info, latest=True)
