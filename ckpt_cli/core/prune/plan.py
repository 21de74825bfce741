"""``prune``: scan a root and plan what a retention policy keeps and removes (no deletion here).

The plan is pure (``plan_prune``): it removes only entries it recognises, namely committed steps
the policy does not keep, unfinished saves (with ``--clean-tmp``, once idle for the minimum age)
and trash left by an interrupted prune; never the root, ``metadata/``, unknown entries or a
symlink (a symlinked step is kept and reported; its target is never reached). Deletion itself is
in ``execute.py``.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from typing import Annotated, ClassVar, Literal, TypedDict

from typing_extensions import NotRequired

from ckpt_cli.core.format.discovery import Detected, detect
from ckpt_cli.core.format.names import (
    COMMIT_MARKER,
    PRUNE_LOCK,
    TMP_MARKER,
    TOMBSTONE,
    WRITING_MARKER,
    parse_step_name,
)
from ckpt_cli.core.listing import StepInfo, list_root
from ckpt_cli.core.prune.finite import (
    Judgement,
    divergence_warnings,
    nonfinite_metrics,
    require_metrics,
)
from ckpt_cli.core.prune.policy import (
    MetricJSON,
    MetricRank,
    Policy,
    PolicyRulesJSON,
    format_duration,
    keep_reasons,
    metric_ranks,
    rough_duration,
    rule_keeps,
)
from ckpt_cli.core.schema.finite import NonFinite
from ckpt_cli.core.storage import Entry, Location
from ckpt_cli.errors import CkptError, NotACheckpointError, UsageError

TRASH_PREFIX = ".ckpt-trash-"
LOCK_NAME = PRUNE_LOCK
DEFAULT_TMP_MIN_AGE = timedelta(hours=1)
SYMLINK_KEPT = "symlink, never deleted"
NO_STEP_RULE = "no step rule"

Kind = Literal["step", "tmp", "trash"]


@dataclass(frozen=True)
class Leftover:
    """An unfinished save or a trash directory, with the newest mtime found inside it."""

    name: str
    path: str
    step: int | None
    size_bytes: int
    modified_at: datetime
    symlink: bool = False
    reason: str | None = None  # what the writer's evidence says it is (``evidence.judge``)


@dataclass(frozen=True)
class RootScan:
    """What a root holds, as ``plan_prune`` needs it."""

    root: str
    steps: tuple[StepInfo, ...]  # committed and uncommitted steps
    tmp: tuple[Leftover, ...] = ()  # unfinished saves (*.orbax-checkpoint-tmp*)
    trash: tuple[Leftover, ...] = ()  # left by an interrupted prune
    symlinks: frozenset[str] = frozenset()  # entry names that are symlinks
    unknown: tuple[str, ...] = ()  # directories that are neither steps nor tmp dirs


class PolicyJSON(PolicyRulesJSON):
    clean_tmp: bool
    tmp_min_age: str | None


NonfiniteMetricsJSON = Annotated[
    dict[str, NonFinite] | None,
    "the step's metrics that are NaN or infinite, by dotted name: {} when every number in its "
    "metrics is finite, null when it records no number",
]


class KeptJSON(TypedDict):
    step: int
    name: str
    path: str
    committed_at: str | None
    reasons: list[str]
    metric: MetricJSON | None
    metrics_nonfinite: NonfiniteMetricsJSON


class RemovalJSON(TypedDict):
    step: int | None
    name: str
    path: str
    committed_at: NotRequired[str | None]
    metric: NotRequired[MetricJSON | None]
    metrics_nonfinite: NotRequired[NonfiniteMetricsJSON]
    kind: NotRequired[Literal["tmp", "trash"]]
    size_bytes: int


class UntouchedJSON(TypedDict):
    name: str
    path: str
    why: str


class PrunePlanJSON(TypedDict):
    """A plan as ``ckpt prune --dry-run`` shows it; ``PruneJSON`` (beside ``PruneResult``) adds
    what was done."""

    schema_version: int
    ok: bool
    root: str
    policy: PolicyJSON
    keep: list[KeptJSON]
    delete: list[RemovalJSON]
    clean: list[RemovalJSON]
    untouched: list[UntouchedJSON]
    freed_bytes: int
    warnings: Annotated[
        list[str],
        "what the plan keeps that a person may not mean to: a rule that keeps only steps with "
        "NaN or infinite metrics while the newest finite step goes, a --keep-last-finite that "
        "finds fewer finite steps than it asks for",
    ]


@dataclass(frozen=True)
class KeptStep:
    step: int
    name: str
    path: str
    reasons: tuple[str, ...]
    committed_at: datetime | None = None
    metric: MetricRank | None = None  # with --keep-best: the value it was ranked by
    nonfinite: Judgement = None  # its NaN/infinite metrics; () all finite; None records none

    def to_json(self) -> KeptJSON:
        return {
            "step": self.step,
            "name": self.name,
            "path": self.path,
            "committed_at": _iso(self.committed_at),
            "reasons": [*self.reasons],
            "metric": self.metric.to_json() if self.metric else None,
            "metrics_nonfinite": _nonfinite_json(self.nonfinite),
        }


@dataclass(frozen=True)
class Removal:
    """One directory the plan removes: a step, an unfinished save or leftover trash."""

    kind: Kind
    name: str
    path: str
    size_bytes: int
    step: int | None = None
    committed_at: datetime | None = None  # steps only
    metric: MetricRank | None = None  # steps, with --keep-best: the value it was ranked by
    nonfinite: Judgement = None  # steps: as ``KeptStep.nonfinite``

    def to_json(self) -> RemovalJSON:
        # A step shows when it was committed and its metric, a leftover its kind: before
        # size_bytes, the order the documents have always had.
        if self.kind == "step":
            return {
                "step": self.step,
                "name": self.name,
                "path": self.path,
                "committed_at": _iso(self.committed_at),
                "metric": self.metric.to_json() if self.metric else None,
                "metrics_nonfinite": _nonfinite_json(self.nonfinite),
                "size_bytes": self.size_bytes,
            }
        return {
            "step": self.step,
            "name": self.name,
            "path": self.path,
            "kind": self.kind,
            "size_bytes": self.size_bytes,
        }


def _iso(t: datetime | None) -> str | None:
    return t.isoformat() if t else None


def _nonfinite_json(judged: Judgement) -> dict[str, NonFinite] | None:
    return None if judged is None else dict(judged)


@dataclass(frozen=True)
class Untouched:
    """Something prune saw and leaves alone, and why."""

    name: str
    path: str
    why: str

    def to_json(self) -> UntouchedJSON:
        return {"name": self.name, "path": self.path, "why": self.why}


@dataclass(frozen=True)
class PrunePlan:
    #: 2: ``warnings``; each step's ``metrics_nonfinite``; ``metric.value_nonfinite``;
    #: ``policy.keep_last_finite``.
    SCHEMA_VERSION: ClassVar[int] = 2

    root: str
    policy: Policy
    keep: tuple[KeptStep, ...]
    delete: tuple[Removal, ...]  # steps only
    clean: tuple[Removal, ...]  # unfinished saves and trash
    untouched: tuple[Untouched, ...]
    tmp_min_age: timedelta | None  # None: unfinished saves are not cleaned
    warnings: tuple[str, ...] = ()  # a rule keeping only non-finite steps (``finite.py``)
    #: The root itself, when the plan was made from it (``plan_prune_root``): where to execute.
    location: Location | None = field(default=None, compare=False, repr=False)

    @property
    def freed_bytes(self) -> int:
        return sum(r.size_bytes for r in (*self.delete, *self.clean))

    @property
    def is_noop(self) -> bool:
        return not self.delete and not self.clean

    def to_json(self) -> PrunePlanJSON:
        """The plan as ``ckpt prune --dry-run --json`` prints it."""
        return {
            "schema_version": self.SCHEMA_VERSION,
            "ok": True,
            "root": self.root,
            "policy": {
                **self.policy.to_json(),
                "clean_tmp": self.tmp_min_age is not None,
                "tmp_min_age": format_duration(self.tmp_min_age) if self.tmp_min_age else None,
            },
            "keep": [k.to_json() for k in self.keep],
            "delete": [r.to_json() for r in self.delete],
            "clean": [r.to_json() for r in self.clean],
            "untouched": [u.to_json() for u in self.untouched],
            "freed_bytes": self.freed_bytes,
            "warnings": [*self.warnings],
        }


def plan_prune(
    scan: RootScan,
    policy: Policy,
    now: datetime,
    *,
    clean_tmp: bool = False,
    tmp_min_age: timedelta = DEFAULT_TMP_MIN_AGE,
) -> PrunePlan:
    """Decide, without touching storage, what a prune of ``scan`` keeps and removes."""
    if policy.is_empty and not clean_tmp:
        raise UsageError(
            "no retention rule given: refusing to guess what to delete",
            hint="add --keep-last N, --keep-every N, --keep-within 7d, --keep-daily N, "
            "--keep-best N --metric NAME --mode min|max ...; see `ckpt prune --help`",
        )
    committed = [s for s in scan.steps if s.status == "committed"]
    if policy.keep_last_finite:
        require_metrics(committed, scan.root)
    keep, delete = _steps_fate(scan, policy, now)
    kept = frozenset(k.name for k in keep)
    rules = rule_keeps(committed, policy, now)
    warnings = divergence_warnings(committed, rules, kept, policy.keep_last_finite)
    untouched = [
        Untouched(s.name, s.path, _not_committed(s)) for s in scan.steps if s.status != "committed"
    ]
    clean = _leftovers(scan, now, clean_tmp, tmp_min_age, untouched)
    untouched += [
        Untouched(n, posixpath.join(scan.root, n), "not a step directory") for n in scan.unknown
    ]
    return PrunePlan(
        root=scan.root,
        policy=policy,
        keep=tuple(keep),
        delete=tuple(delete),
        clean=tuple(clean),
        untouched=tuple(untouched),
        tmp_min_age=tmp_min_age if clean_tmp else None,
        warnings=tuple(warnings),
    )


def _not_committed(s: StepInfo) -> str:
    """Why prune skips a step no rule may count: neither kept as a restorable step nor
    deleted (it may be a save in progress, or data a marker would make a step again)."""
    if s.reason:
        return f"{s.status}, skipped: {s.reason}"
    return f"{s.status}, skipped: a save may still be in progress"


def _steps_fate(
    scan: RootScan, policy: Policy, now: datetime
) -> tuple[list[KeptStep], list[Removal]]:
    """The committed steps kept, each with its reasons (a pin, a rule, a symlink), and the
    others, deleted."""
    committed = [s for s in scan.steps if s.status == "committed"]
    reasons: dict[str, tuple[str, ...]]
    if policy.is_empty:
        reasons = {s.name: (NO_STEP_RULE,) for s in committed}
    else:
        reasons = keep_reasons(committed, policy, now)
    ranks = metric_ranks(committed, policy)
    keep: list[KeptStep] = []
    delete: list[Removal] = []
    for s in committed:
        why = reasons.get(s.name, ())
        if s.pinned is not None:  # `ckpt pin`: kept whatever the rules say
            why = (s.pinned.reason, *why)
        if not why and s.name in scan.symlinks:
            why = (SYMLINK_KEPT,)
        rank, judged = ranks.get(s.name), nonfinite_metrics(s.metrics)
        if why:
            keep.append(KeptStep(s.step, s.name, s.path, why, s.committed_at, rank, judged))
        else:
            delete.append(
                Removal("step", s.name, s.path, s.size_bytes, s.step, s.committed_at, rank, judged)
            )
    return keep, delete


def _leftovers(
    scan: RootScan,
    now: datetime,
    clean_tmp: bool,
    tmp_min_age: timedelta,
    untouched: list[Untouched],
) -> list[Removal]:
    """The trash and unfinished saves removed; those left alone go to ``untouched``."""
    clean: list[Removal] = []
    for t in scan.trash:
        if t.symlink:
            untouched.append(Untouched(t.name, t.path, SYMLINK_KEPT))
        else:
            clean.append(Removal("trash", t.name, t.path, t.size_bytes, t.step))
    for t in scan.tmp:
        age = now - t.modified_at
        if not clean_tmp:
            what = t.reason if t.reason and TMP_MARKER not in t.name else "unfinished save"
            if "--clean-tmp" not in what:
                what += " (--clean-tmp removes it)"
            untouched.append(Untouched(t.name, t.path, what))
        elif t.symlink:
            untouched.append(Untouched(t.name, t.path, SYMLINK_KEPT))
        elif age < tmp_min_age:
            untouched.append(
                Untouched(
                    t.name,
                    t.path,
                    f"unfinished save modified {rough_duration(age)} ago, "
                    f"younger than --tmp-min-age {format_duration(tmp_min_age)}",
                )
            )
        else:
            clean.append(Removal("tmp", t.name, t.path, t.size_bytes, t.step))
    return clean


def plan_prune_root(
    root: Location,
    policy: Policy,
    *,
    clean_tmp: bool = False,
    tmp_min_age: timedelta = DEFAULT_TMP_MIN_AGE,
    now: datetime | None = None,
    detected: Detected | None = None,
) -> PrunePlan:
    """Scan ``root`` and plan what ``policy`` keeps and removes there (now, unless ``now``)."""
    scan = scan_root(root, detected)
    plan = plan_prune(
        scan,
        policy,
        now or datetime.now(timezone.utc),
        clean_tmp=clean_tmp,
        tmp_min_age=tmp_min_age,
    )
    return replace(plan, location=root)


def require_root(root: Location) -> Detected:
    """What ``root`` holds; raises unless it is a CheckpointManager root (not a step)."""
    found = detect(root)
    if found.kind != "root":
        raise NotACheckpointError(
            f"{root} is a {found.kind} directory, not a root of steps",
            hint="prune takes a CheckpointManager root: the directory that holds the steps",
        )
    return found


def scan_root(root: Location, detected: Detected | None = None) -> RootScan:
    """Read what ``plan_prune`` needs from a CheckpointManager root (metadata and sizes only).

    ``detected``: the root's detection, when the caller made it (``prune_lock``): a prune
    detects its root once.
    """
    found = detected if detected is not None else require_root(root)
    entries = found.entries
    listing = list_root(root, detected=found)
    symlinks = frozenset(e.name for e in entries if e.is_symlink)
    steps = tuple(s for s in listing.steps if s.status != "incomplete" and not _partial(root, s))
    tmp = tuple(
        Leftover(
            s.name,
            s.path,
            s.step,
            s.size_bytes,
            modified_at(root.child(s.name)),
            s.name in symlinks,
            s.reason,
        )
        for s in listing.steps
        if s.status == "incomplete" or _partial(root, s)
    )
    # Prune only ever makes trash directories: a file of that name is not ours, leave it unseen.
    trash = [_trash(root, e) for e in entries if e.name.startswith(TRASH_PREFIX) and e.is_dir]
    if root.requires_commit_marker:  # object stores: a step that got a tombstone is trash
        trash += [
            _trash(root, e)
            for e in entries
            if e.is_dir and parse_step_name(e.name) and is_tombstoned(root.child(e.name))
        ]
    return RootScan(str(root), steps, tmp, tuple(trash), symlinks, listing.ignored)


def _partial(root: Location, s: StepInfo) -> bool:
    """On object stores: a step a ckpt writer was writing in place and never committed (it
    carries ``.ckpt-writing``, no ``commit_success.txt``): an unfinished save, cleaned by
    ``--clean-tmp`` under the same age rule as local tmp dirs. A step without markers that ckpt
    did not write (a copy made without them, Orbax #394) is not one."""
    return is_partial_write(root.child(s.name)) if s.status == "uncommitted" else False


def is_partial_write(loc: Location) -> bool:
    return (
        loc.requires_commit_marker
        and loc.child(WRITING_MARKER).is_file()
        and not loc.child(COMMIT_MARKER).is_file()
    )


def is_tombstoned(loc: Location) -> bool:
    """Whether prune began to delete this step on an object store (see ``execute``)."""
    return loc.requires_commit_marker and loc.child(TOMBSTONE).is_file()


def _trash(root: Location, entry: Entry) -> Leftover:
    loc = root.child(entry.name)
    size = 0 if entry.is_symlink else loc.du()
    return Leftover(entry.name, str(loc), None, size, modified_at(loc), entry.is_symlink)


def modified_at(loc: Location) -> datetime:
    """The newest mtime of a directory and every file below it; a save writing deep inside a tmp
    dir does not touch the tmp dir's own mtime. Unreadable counts as modified now (kept)."""
    try:
        newest = loc.mtime()
        if not loc.is_symlink():
            newest = max([newest, *(e.mtime for _, e in loc.walk())])
    except CkptError:
        return datetime.now(timezone.utc)
    return datetime.fromtimestamp(newest, tz=timezone.utc)
