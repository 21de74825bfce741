"""What ``verify`` works with and returns: its options, the working state of one item's check
(handed from the structure level to the data levels), and the frozen results.

A ``VerifyReport`` is what ``ckpt verify --json`` prints (``to_json``) and what
``ckpt_cli.verify`` returns.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, TypedDict

from ckpt_cli.core.digest.records import DigestRecord, FileSum, LeafDigest
from ckpt_cli.core.format.arrays import ArrayInfo, ItemStore
from ckpt_cli.core.format.emergency import LocalTier
from ckpt_cli.core.format.names import chunk_key
from ckpt_cli.core.format.scan import SCAN_BLOCK_BYTES
from ckpt_cli.core.scale import ReadScaleJSON, Scale
from ckpt_cli.core.schema.finite import Divergence, DivergenceJSON, find_divergence
from ckpt_cli.core.verify.inventory import Inventory
from ckpt_cli.core.verify.ocdbt import Ref
from ckpt_cli.core.verify.problems import Problem, ProblemJSON, problem

Level = Literal["structure", "deep", "sample"]
#: ``safetensors``: a safetensors file, index or Hugging Face folder (schema 6).
CheckedKind = Literal["root", "step", "item", "safetensors"]


class SampleJSON(TypedDict):
    seed: int | None
    chunks: int
    of_chunks: int
    bytes: int
    of_bytes: int
    subset: str | None


class CoverageJSON(TypedDict):
    bytes: int
    of_bytes: int
    leaves: int
    of_leaves: int
    complete: bool
    stopped: Literal["max-duration"] | None
    budget_s: float | None


class RotationJSON(TypedDict):
    state_files: list[str]
    covered_bytes: int
    of_bytes: int
    cycles_completed: int
    cycle_complete: bool
    #: A state file not used (damaged, or not the item's: a new cycle starts) or not written.
    warnings: list[str]


class CheckedJSON(TypedDict):
    level: Level
    steps: list[int]
    items: int
    leaves: int
    arrays: int
    chunks: int
    files: int
    chunks_decoded: int
    bytes_decoded: int
    digests: dict[str, str]
    unfinished_saves: list[str]
    #: schema 7: why each unfinished save is skipped (its state and its writer's evidence)
    unfinished_why: dict[str, str]
    #: schema 8: data files of per-process databases that nothing references (what ``du``
    #: counts as garbage; a clean save can leave them): named, never a problem
    unreferenced_files: list[str]
    coverage: CoverageJSON | None
    rotation: RotationJSON | None
    sample: SampleJSON | None


class NonFiniteJSON(TypedDict):
    item: str
    leaf: str
    nan: int
    inf: int
    step: int | None  # schema 8


class SummaryJSON(TypedDict):
    errors: int
    warnings: int


class VerifyScaleJSON(ReadScaleJSON):
    """How a ``--workers``/``--executor dask`` deep pass ran: split into units on the workers,
    or kept in one process (``split`` false, ``reason`` says why; no unit ran)."""


class VerifyJSON(TypedDict):
    """``ckpt verify --json``: what one run checked and found."""

    schema_version: int
    ok: bool
    path: str
    kind: CheckedKind
    checked: CheckedJSON
    summary: SummaryJSON
    nonfinite: list[NonFiniteJSON]
    divergence: DivergenceJSON | None
    recorded: list[str]
    marked_committed: list[str]
    elapsed_s: float
    #: None unless a deep pass (--deep, --record) was asked to scale out.
    scale: VerifyScaleJSON | None
    problems: list[ProblemJSON]
    #: schema 5: items named without their contents checked (empty, unknown handler).
    notes: list[NoteJSON]
    #: schema 8: the items of one host's local tier of Orbax's emergency checkpointing.
    local_tiers: list[LocalTierJSON]


@dataclass(frozen=True)
class SampleSpec:
    percent: float | None = None
    bytes: int | None = None
    subset: tuple[int, int] | None = None  # (n, t): the n-th of t disjoint subsets of chunks


@dataclass(frozen=True)
class VerifyOptions:
    step: int | None = None
    latest: bool = False
    #: --item: check only the item of this name in each step checked.
    item: str | None = None
    deep: bool = False
    record: bool = False
    #: --upgrade (with --record): a version-1 (SHA-256) record is checked, then replaced by
    #: ``ld1`` digests taken in the same read.
    upgrade: bool = False
    sample: SampleSpec | None = None
    seed: int | None = None
    strict: bool = False
    fail_on_nonfinite: bool = False
    budget: int = SCAN_BLOCK_BYTES
    #: After a clean deep check of the one step, put its ``commit_success.txt`` (a step copied
    #: to an object store without it, Orbax issue #394).
    mark_committed: bool = False
    #: --max-duration (seconds): the data level stops reading once the budget is spent.
    max_duration: float | None = None
    #: --rotate: resume where the last budgeted run stopped (state next to the digests).
    rotate: bool = False
    #: The clock the budget is measured on (tests drive it by bytes decoded).
    clock: Callable[[], float] = time.monotonic


@dataclass
class ItemFacts:
    """Working state of one item's check, handed from the structure level to the deeper ones."""

    shown_as: str
    kind: str = "pytree"  # pytree | array | json | empty | unknown (format/items.py)
    handler: str | None = None  # the one the step recorded
    leaves: list[str] = field(default_factory=list)
    arrays: dict[str, tuple[ArrayInfo, str]] = field(default_factory=dict)  # readable, no errors
    strings: dict[str, str] = field(default_factory=dict)
    store: ItemStore | None = None
    zarr3: bool = False
    keys: dict[bytes, Ref | None] = field(default_factory=dict)
    arrays_seen: set[str] = field(default_factory=set)  # arrays with a stored header
    record: DigestRecord | None = None
    inventory: Inventory | None = None
    chunks: int = 0
    problems: list[Problem] = field(default_factory=list)
    #: The local tier of Orbax's emergency checkpointing the item's step is (or may be), and
    #: the leaves that hold only this host's chunks there by design: leaf -> chunks stored.
    tier: LocalTier | None = None
    partial: dict[str, frozenset[tuple[int, ...]]] = field(default_factory=dict)
    #: Data files of its per-process databases that nothing references (dead weight a clean
    #: save can leave; ``du``'s garbage): named, never a problem.
    unreferenced: list[str] = field(default_factory=list)
    tier_devices: frozenset[int] | None = None  # the host's devices, where they could be told

    def array_bytes(self, name: str) -> int:
        """Bytes a full read of a readable array decodes: its stored chunks for a partial one."""
        info = self.arrays[name][0]
        present = self.partial.get(name)
        if present is None:
            return info.nbytes
        return sum(info.chunk_nbytes(index) for index in present)

    def add(
        self, code: str, message: str, leaf: str | None = None, file: str | None = None
    ) -> None:
        shown = (
            None
            if file is None
            else (file if self.shown_as in ("", ".") else f"{self.shown_as}/{file}")
        )
        self.problems.append(problem(code, message, leaf=leaf, file=shown))

    def chunk_file(self, name: str, index: tuple[int, ...]) -> str | None:
        """The item-relative file holding a chunk's bytes; None when inline in a tree node."""
        key = f"{name}/{chunk_key(index, self.zarr3)}"
        if self.store is not None and self.store.layout == "zarr":
            return key
        ref = self.keys.get(key.encode())
        return ref.file if ref is not None else None


@dataclass
class DataResult:
    """What the data level found in one item (its problems go straight into the facts)."""

    nonfinite: list[NonFinite]
    digests: dict[str, LeafDigest]
    files: dict[str, FileSum]
    bytes_decoded: int = 0
    chunks_decoded: int = 0
    #: A budgeted run (--max-duration): leaves read whole, and where the next run resumes
    #: (leaf index in name order, block index); None when the item was read to its end.
    leaves_complete: int = 0
    resume_at: tuple[int, int] | None = None
    #: A scaled-out pass: the units its workers ran and the seconds they spent in them.
    units: int = 0
    worker_seconds: float = 0.0


@dataclass(frozen=True)
class Coverage:
    """How much of the data a deep or sample run read (``--max-duration`` may stop it early)."""

    bytes: int
    of_bytes: int
    leaves: int
    of_leaves: int
    stopped: Literal["max-duration"] | None  # when the budget ran out
    budget_s: float | None
    elapsed_s: float

    @property
    def complete(self) -> bool:
        return self.stopped is None and self.bytes >= self.of_bytes

    def to_json(self) -> CoverageJSON:
        return {
            "bytes": self.bytes,
            "of_bytes": self.of_bytes,
            "leaves": self.leaves,
            "of_leaves": self.of_leaves,
            "complete": self.complete,
            "stopped": self.stopped,
            "budget_s": self.budget_s,
        }


@dataclass(frozen=True)
class Rotation:
    """``--rotate``: where the cycles over the checked items stand after this run."""

    state_files: tuple[str, ...]
    covered_bytes: int  # in the items' current cycles, this run included
    of_bytes: int
    cycles_completed: int  # the fewest completed cycles of any item
    cycle_complete: bool  # this run completed the cycle of every item it checked
    #: State files not used (damaged, or not this item's) or not written; one line each.
    warnings: tuple[str, ...] = ()

    def to_json(self) -> RotationJSON:
        return {
            "state_files": list(self.state_files),
            "covered_bytes": self.covered_bytes,
            "of_bytes": self.of_bytes,
            "cycles_completed": self.cycles_completed,
            "cycle_complete": self.cycle_complete,
            "warnings": list(self.warnings),
        }


@dataclass(frozen=True)
class NonFinite:
    leaf: str
    nan: int
    inf: int


@dataclass(frozen=True)
class ItemCheck:
    """The result for one item: what was looked at and what was found."""

    path: str  # relative to the checked path ("." when the item is the checked path)
    step: int | None
    name: str
    kind: str  # pytree | array | json | empty | unknown (format/items.py)
    leaves: tuple[str, ...]
    arrays: int
    chunks: int
    files: int
    digests: str  # absent | verified | recorded | structure-only | sampled
    problems: tuple[Problem, ...]
    nonfinite: tuple[NonFinite, ...] = ()
    bytes_decoded: int = 0
    chunks_decoded: int = 0
    handler: str | None = None  # the one the step recorded
    tier: TierCheck | None = None  # the item is one host's local tier (schema 8)
    #: Data files of its per-process databases nothing references (dead weight, no problem)
    unreferenced: tuple[str, ...] = ()

    @property
    def note(self) -> str | None:
        """What verify did with an item it does not read (``empty``, ``unknown``), else None."""
        if self.kind not in ("empty", "unknown"):
            return None
        from ckpt_cli.core.format.items import describe

        return describe(self.kind, self.handler)  # type: ignore[arg-type]

    def note_json(self) -> NoteJSON:
        return {"item": self.path, "kind": self.kind, "handler": self.handler, "note": self.note}


class LocalTierJSON(TypedDict):
    """An item of one host's local tier of Orbax's emergency checkpointing (schema 8): leaves
    that lack the chunks other hosts hold are partial by design, not damage."""

    item: str
    #: ``process-metadata``: Orbax's marker item says so (certain); ``single-writer``: only the
    #: chunks suggest it (the p2p manager writes no marker), reported with a warning.
    marker: Literal["process-metadata", "single-writer"]
    process: int | None
    devices: list[int] | None
    partial_leaves: list[str]
    #: Chunks the partial leaves store here, of all their chunks.
    chunks_stored: int
    of_chunks: int
    note: str


@dataclass(frozen=True)
class TierCheck:
    """What verify found of an item of a local tier (``verify/tier.py`` builds it)."""

    marker: Literal["process-metadata", "single-writer"]
    process: int | None
    devices: tuple[int, ...] | None
    partial_leaves: tuple[str, ...]
    chunks_stored: int
    of_chunks: int
    note: str

    def to_json(self, item: str) -> LocalTierJSON:
        return {
            "item": item,
            "marker": self.marker,
            "process": self.process,
            "devices": list(self.devices) if self.devices is not None else None,
            "partial_leaves": list(self.partial_leaves),
            "chunks_stored": self.chunks_stored,
            "of_chunks": self.of_chunks,
            "note": self.note,
        }


class NoteJSON(TypedDict):
    """An item verify names without checking its contents (schema 5): an empty item, or one of
    a handler ckpt does not know. Never a problem: the exit code does not change."""

    item: str
    kind: str
    handler: str | None
    note: str | None


@dataclass(frozen=True)
class SampleInfo:
    seed: int | None  # None for an n/t subset, which is not random
    chunks: int
    of_chunks: int
    bytes: int
    of_bytes: int
    subset: str | None = None  # "n/t"


@dataclass(frozen=True)
class VerifyReport:
    """Everything one ``verify`` run found, ready to render as a table, JSON or JUnit."""

    path: str
    #: 2: problems name every leaf they hurt (leaves); 3: rotation.warnings; 4: scale (the
    #: split decision of a scaled-out deep pass); 5: notes (items named, not read); 6: kind
    #: ``safetensors`` (a file, index or folder of shards: one item per file). 7:
    #: ``unfinished_why`` (each unfinished save's state and why), problem code ``uncommitted``.
    #: 8: ``local_tiers`` (items of one host's local tier of Orbax's emergency checkpointing),
    #: each problem's and non-finite leaf's ``step``, ``divergence``, ``unreferenced_files``.
    SCHEMA_VERSION: ClassVar[int] = 8
    kind: CheckedKind
    level: Level
    items: tuple[ItemCheck, ...]
    problems: tuple[Problem, ...]  # all of them: root, step and item problems
    steps: tuple[int, ...] = ()
    unfinished: tuple[str, ...] = ()
    unfinished_why: dict[str, str] = field(default_factory=dict)
    sample: SampleInfo | None = None
    coverage: Coverage | None = None
    rotation: Rotation | None = None
    recorded: tuple[str, ...] = ()
    marked_committed: tuple[str, ...] = ()  # steps given commit_success.txt (--mark-committed)
    elapsed_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)
    scale: Scale | None = None

    @property
    def divergence(self) -> Divergence | None:
        """Where the checked steps' values stopped being finite (None: all finite, or values
        not read)."""
        bad: dict[int, list[str]] = {}
        for i in self.items:
            if i.step is not None and i.nonfinite:
                bad.setdefault(i.step, []).extend(n.leaf for n in i.nonfinite)
        return find_divergence(self.steps, bad)

    @property
    def errors(self) -> int:
        return sum(1 for p in self.problems if p.severity == "error")

    @property
    def warnings(self) -> int:
        return sum(1 for p in self.problems if p.severity == "warning")

    @property
    def ok(self) -> bool:
        return self.errors == 0

    def checked_json(self) -> CheckedJSON:
        return {
            "level": self.level,
            "steps": list(self.steps),
            "items": len(self.items),
            "leaves": sum(len(i.leaves) for i in self.items),
            "arrays": sum(i.arrays for i in self.items),
            "chunks": sum(i.chunks for i in self.items),
            "files": sum(i.files for i in self.items),
            "chunks_decoded": sum(i.chunks_decoded for i in self.items),
            "bytes_decoded": sum(i.bytes_decoded for i in self.items),
            "digests": {i.path: i.digests for i in self.items},
            "unfinished_saves": list(self.unfinished),
            "unfinished_why": {
                n: self.unfinished_why[n] for n in self.unfinished if n in self.unfinished_why
            },
            "unreferenced_files": [
                rel if i.path in ("", ".") else f"{i.path}/{rel}"
                for i in self.items
                for rel in i.unreferenced
            ],
            "coverage": self.coverage.to_json() if self.coverage else None,
            "rotation": self.rotation.to_json() if self.rotation else None,
            "sample": None
            if self.sample is None
            else {
                "seed": self.sample.seed,
                "chunks": self.sample.chunks,
                "of_chunks": self.sample.of_chunks,
                "bytes": self.sample.bytes,
                "of_bytes": self.sample.of_bytes,
                "subset": self.sample.subset,
            },
        }

    def to_json(self) -> VerifyJSON:
        """The document ``ckpt verify --json`` prints."""
        return {
            "schema_version": self.SCHEMA_VERSION,
            "ok": self.ok,
            "path": self.path,
            "kind": self.kind,
            "checked": self.checked_json(),
            "summary": {"errors": self.errors, "warnings": self.warnings},
            "nonfinite": [
                {"item": i.path, "leaf": n.leaf, "nan": n.nan, "inf": n.inf, "step": i.step}
                for i in self.items
                for n in i.nonfinite
            ],
            "divergence": self.divergence.to_json() if self.divergence else None,
            "recorded": list(self.recorded),
            "marked_committed": list(self.marked_committed),
            "elapsed_s": round(self.elapsed_s, 3),
            "scale": self.scale.to_json() if self.scale else None,
            "problems": [p.to_json() for p in self.problems],
            "notes": [i.note_json() for i in self.items if i.note is not None],
            "local_tiers": [i.tier.to_json(i.path) for i in self.items if i.tier is not None],
        }
