"""What ``trend`` works with and returns: options, the plan, the per-step figures, findings.

A ``TrendReport`` is what ``ckpt trend --json`` prints (``to_json``) and what
``ckpt_cli.trend`` returns.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, ClassVar, Literal, TypedDict, cast

from ckpt_cli.core.scale import ReadScaleJSON, Scale
from ckpt_cli.core.schema import JSONValue
from ckpt_cli.core.schema.finite import Divergence, DivergenceJSON, find_divergence

if TYPE_CHECKING:
    from ckpt_cli.core.format.arrays import ArrayInfo
    from ckpt_cli.core.format.discovery import ItemRef

Severity = Literal["error", "warning"]
FindingKind = Literal["nonfinite", "frozen", "zero", "dead", "exploding", "vanishing", "norm-jump"]

#: Defaults of the thresholds (``--explode``, ``--vanish``, ``--norm-jump``, ``--dead-units``).
EXPLODE = 10.0
VANISH = 10.0
NORM_JUMP = 4.0
DEAD_UNITS = 1
#: Bytes of one leaf's block at all its steps together (each step's block is a share of it).
TREND_BLOCK_BYTES = 4 << 20


@dataclass(frozen=True)
class TrendOptions:
    """What to read and when a figure is a finding.

    ``explode``: an update ratio above this many times the leaf's median ratio is
    ``exploding``; ``vanish``: below the median divided by this, ``vanishing`` (both need three
    or more ratios of the leaf). ``norm_jump``: a norm growing or shrinking by more than this
    factor from one listed step to the next. ``dead_units``: a leaf of two or more dimensions
    with at least this many units (along its last axis) all 0 at a step that were not at the
    step before is ``dead``. ``read_all``: read every step even where the recorded digests
    (``verify --record``, save-time digests) say a leaf holds the previous step's values.
    """

    steps: str | None = None
    item: str | None = None
    match: str | None = None
    explode: float = EXPLODE
    vanish: float = VANISH
    norm_jump: float = NORM_JUMP
    block_bytes: int = TREND_BLOCK_BYTES
    dead_units: int = DEAD_UNITS
    read_all: bool = False


@dataclass(frozen=True)
class StepRead:
    """One listed step: where its item is, its metrics, and its recorded digests (leaf -> what
    identifies its values, ``records.values_key``)."""

    step: int
    ref: ItemRef
    metrics: dict[str, JSONValue] | None
    zarr3: bool = False
    digests: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class LeafPlan:
    """One leaf and the steps holding it: (step, its array, its OCDBT database)."""

    name: str
    part: str | None
    dtype: str
    shape: tuple[int, ...]
    at: tuple[tuple[int, ArrayInfo, str], ...]

    @property
    def nbytes(self) -> int:
        return sum(info.nbytes for _, info, _ in self.at)


@dataclass(frozen=True)
class TrendPlan:
    """What ``trend`` reads: the root, the item, the steps in order and the leaves."""

    root: str
    item: str
    steps: tuple[StepRead, ...]
    leaves: tuple[LeafPlan, ...]
    options: TrendOptions

    @property
    def nbytes(self) -> int:
        return sum(leaf.nbytes for leaf in self.leaves)


class StepStatsJSON(TypedDict):
    step: int
    #: schema 4: null when the leaf holds NaN/Inf at the step (``nonfinite`` counts them)
    norm: float | None
    rms: float | None
    max_abs: float | None
    mean: float | None
    zeros: float
    nonfinite: int
    update_norm: float | None
    update_ratio: float | None
    dead_units: int | None
    new_dead_units: int | None


class LeafTrendJSON(TypedDict):
    name: str
    part: str | None
    dtype: str
    shape: list[int]
    steps: list[StepStatsJSON]


class StepMetricsJSON(TypedDict):
    step: int
    metrics: dict[str, JSONValue]  # NaN/Inf as null (schema 4: ``metrics_nonfinite`` says which)
    #: schema 4: each metric that is NaN/Inf at the step: ``"nan"``, ``"inf"`` or ``"-inf"``
    metrics_nonfinite: dict[str, str]


class TrendFindingJSON(TypedDict):
    kind: FindingKind
    severity: Severity
    leaf: str
    step: int
    message: str


class ThresholdsJSON(TypedDict):
    explode: float
    vanish: float
    norm_jump: float
    dead_units: int


class TrendJSON(TypedDict):
    schema_version: int
    root: str
    item: str
    steps: list[int]
    leaves: list[LeafTrendJSON]
    metrics: list[StepMetricsJSON]
    findings: list[TrendFindingJSON]
    #: schema 4: where the run's values stopped being finite (null: they never did)
    divergence: DivergenceJSON | None
    thresholds: ThresholdsJSON
    skipped_reads: int
    scale: ReadScaleJSON | None
    ok: bool


@dataclass(frozen=True)
class StepStats:
    """One leaf at one step; ``update_*`` against the previous listed step holding the leaf
    with the same shape (None at the first). ``dead_units``: units (along the last axis) all 0,
    ``new_dead_units``: those of them not all 0 at that previous step (None for a leaf of fewer
    than two dimensions, and ``new_dead_units`` at the first step). A leaf holding NaN/Inf
    (``nonfinite``) has no norm, rms, max_abs or mean (None), and no update against or from
    it."""

    step: int
    norm: float | None
    rms: float | None
    max_abs: float | None
    mean: float | None
    zeros: float
    nonfinite: int
    update_norm: float | None
    update_ratio: float | None
    dead_units: int | None = None
    new_dead_units: int | None = None

    def to_json(self) -> StepStatsJSON:
        return cast("StepStatsJSON", asdict(self))  # the fields are the document's


@dataclass(frozen=True)
class LeafTrend:
    name: str
    part: str | None
    dtype: str
    shape: tuple[int, ...]
    steps: tuple[StepStats, ...]

    @property
    def is_float(self) -> bool:
        return self.dtype.startswith(("float", "bfloat"))

    def to_json(self) -> LeafTrendJSON:
        return {
            "name": self.name,
            "part": self.part,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "steps": [s.to_json() for s in self.steps],
        }


@dataclass(frozen=True)
class Finding:
    kind: FindingKind
    severity: Severity
    leaf: str
    step: int
    message: str

    def to_json(self) -> TrendFindingJSON:
        return cast("TrendFindingJSON", asdict(self))  # the fields are the document's


@dataclass(frozen=True)
class TrendReport:
    #: 1: the first version. 2: ``dead_units``, ``new_dead_units`` per step, the ``dead``
    #: finding and its threshold, ``skipped_reads``. 3: ``scale`` (how a run asked to scale
    #: out read). 4: statistics of a leaf holding NaN/Inf are null (``nonfinite`` beside
    #: them), ``divergence``, metrics' ``metrics_nonfinite``.
    SCHEMA_VERSION: ClassVar[int] = 4

    root: str
    item: str
    steps: tuple[int, ...]
    leaves: tuple[LeafTrend, ...]
    metrics: tuple[tuple[int, dict[str, JSONValue]], ...]
    findings: tuple[Finding, ...]
    options: TrendOptions
    #: Leaf-steps not read: their recorded digest equals the previous listed step's.
    skipped_reads: int = 0
    #: How the reads scaled out (None: not asked to).
    scale: Scale | None = None

    @property
    def ok(self) -> bool:
        """No error-level finding (what ``--check`` exits 1 on)."""
        return not any(f.severity == "error" for f in self.findings)

    def leaf(self, name: str) -> LeafTrend:
        return next(lf for lf in self.leaves if lf.name == name)

    @property
    def divergence(self) -> Divergence | None:
        """Where the run's values stopped being finite (None: they never did)."""
        bad: dict[int, list[str]] = {}
        for lf in self.leaves:
            for s in lf.steps:
                if s.nonfinite:
                    bad.setdefault(s.step, []).append(lf.name)
        return find_divergence(self.steps, bad)

    def to_json(self) -> TrendJSON:
        o = self.options
        return {
            "schema_version": self.SCHEMA_VERSION,
            "root": self.root,
            "item": self.item,
            "steps": list(self.steps),
            "leaves": [lf.to_json() for lf in self.leaves],
            "metrics": [
                {"step": s, "metrics": _finite(m), "metrics_nonfinite": nonfinite_of(m)}
                for s, m in self.metrics
            ],
            "findings": [f.to_json() for f in self.findings],
            "divergence": None if self.divergence is None else self.divergence.to_json(),
            "thresholds": {
                "explode": o.explode,
                "vanish": o.vanish,
                "norm_jump": o.norm_jump,
                "dead_units": o.dead_units,
            },
            "skipped_reads": self.skipped_reads,
            "scale": None if self.scale is None else self.scale.to_json(),
            "ok": self.ok,
        }


def nonfinite_of(metrics: dict[str, JSONValue]) -> dict[str, str]:
    """Each NaN/Inf metric and which it is (``nan``, ``inf``, ``-inf``)."""
    import math

    return {
        k: "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
        for k, v in metrics.items()
        if isinstance(v, float) and not math.isfinite(v)
    }


def _finite(metrics: dict[str, JSONValue]) -> dict[str, JSONValue]:
    """The metrics with NaN/Inf as null (Orbax writes them as ``NaN``, which JSON is not)."""
    import math

    return {
        k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in metrics.items()
    }
