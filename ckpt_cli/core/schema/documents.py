"""The types of the JSON documents the commands print: what ``docs/schemas/`` is generated from.

One ``TypedDict`` per JSON object, as each result's ``to_json()`` builds it. The tests validate
real outputs of every command against the schemas generated from these types, so a key added to
a ``to_json()`` without its type here fails there (every object is closed), and a change to a
type without a ``schema_version`` bump fails the registry test.
"""

from __future__ import annotations

from typing import Literal, TypedDict

from typing_extensions import NotRequired

from ckpt_cli.core.schema import JSONValue

Shape = list[int]
Spec = list[str | list[str] | None]  # per dimension: not split, an axis, several axes


class ErrorJSON(TypedDict):
    """What went wrong: a stable code (docs/json.md), the one-line message, the next step."""

    code: str
    message: str
    hint: str | None


class ErrorDocumentJSON(TypedDict):
    """A command that failed before it had a result (exit 2, 3, 70, 130 or 143)."""

    schema_version: int
    ok: Literal[False]
    error: ErrorJSON


class ShardingJSON(TypedDict):
    type: str
    mesh: NotRequired[dict[str, int]]
    partition_spec: NotRequired[Spec]
    device_ids: NotRequired[list[int]]
    device: NotRequired[str]


class PinJSON(TypedDict):
    note: str | None
    pinned_at: str | None
    by: str | None


# --- ls ---


class StepJSON(TypedDict):
    step: int
    name: str
    path: str
    status: Literal["committed", "incomplete", "uncommitted"]
    latest: bool
    committed_at: str
    time_source: Literal["commit_metadata", "commit_marker", "mtime"]
    size_bytes: int
    items: list[str]
    metrics: JSONValue
    formats: dict[str, str]
    problem: str | None
    pinned: PinJSON | None


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


# --- inspect ---


class StatsJSON(TypedDict):
    min: float | None
    max: float | None
    mean: float | None
    std: float | None
    nan: int
    inf: int
    finite: int


class KeyDataJSON(TypedDict):
    """What a typed PRNG key stores: its data (``uint32[..., 2]`` for threefry)."""

    dtype: str | None
    shape: Shape


class LeafJSON(TypedDict):
    name: str
    keypath: list[str]
    value_type: str
    dtype: str | None  # a typed key's own: key<fry> (schema 3)
    shape: Shape | None  # a typed key's own shape, its data's without the last dimension
    key_data: KeyDataJSON | None
    chunk_shape: Shape | None
    write_shape: Shape | None
    elements: int | None
    size_bytes: int
    sharding: ShardingJSON | None
    state_part: str | None
    value: JSONValue  # strings, and JSON-item values as JSON values (schema 2)
    problem: str | None
    stats: NotRequired[StatsJSON | None]


class SubtreeJSON(TypedDict):
    name: str
    leaves: int
    parameters: int
    size_bytes: int


class TotalsJSON(TypedDict):
    leaves: int
    arrays: int
    parameters: int
    size_bytes: int
    subtrees: list[SubtreeJSON]


class PartJSON(TypedDict):
    part: str
    present: bool
    subtrees: list[str]
    leaves: int
    note: str | None


class TrainingStateJSON(TypedDict):
    complete: bool
    parts: list[PartJSON]


class BlockJSON(TypedDict):
    index: list[int]
    bounds: list[list[int]]
    devices: list[int]


class LayoutJSON(TypedDict):
    leaf: str
    sharding: str
    grid: list[int]
    block_shape: list[int]
    replicas: int
    blocks: list[BlockJSON]


class InspectJSON(TypedDict):
    """``ckpt inspect --json``: the tree of one item."""

    schema_version: int
    ok: bool
    path: str
    root: str | None
    step: int | None
    item: str
    kind: Literal["pytree", "array", "json"]
    storage: str
    zarr_format: int
    totals: TotalsJSON
    training_state: TrainingStateJSON
    custom_metadata: JSONValue
    step_custom_metadata: JSONValue
    leaves: list[LeafJSON]
    layout: NotRequired[LayoutJSON]
    other_items: NotRequired[list[OtherItemJSON]]


class OtherItemJSON(TypedDict):
    """Another item of the inspected step, named beside the state item."""

    item: str
    kind: Literal["pytree", "array", "json"]
    path: str
    leaves: int
    size_bytes: int


class StepInspectJSON(TypedDict):
    """``ckpt inspect --json`` of a step of several items none of which is the state item (two
    PyTree items, no ``--item``): every item, each as the one-item document."""

    schema_version: int
    ok: bool
    path: str
    root: str | None
    step: int | None
    item: None
    items: list[InspectJSON]


# --- verify ---


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
    level: Literal["structure", "deep", "sample"]
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
    coverage: CoverageJSON | None
    rotation: RotationJSON | None
    sample: SampleJSON | None


class ProblemJSON(TypedDict):
    severity: Literal["error", "warning"]
    code: str
    leaf: str | None
    #: Every leaf the problem hurts (a data file holds chunks of many); ``leaf`` is the first.
    leaves: list[str]
    file: str | None
    message: str


class NonFiniteJSON(TypedDict):
    item: str
    leaf: str
    nan: int
    inf: int


class SummaryJSON(TypedDict):
    errors: int
    warnings: int


class VerifyJSON(TypedDict):
    """``ckpt verify --json``: what one run checked and found."""

    schema_version: int
    ok: bool
    path: str
    kind: Literal["root", "step", "item"]
    checked: CheckedJSON
    summary: SummaryJSON
    nonfinite: list[NonFiniteJSON]
    recorded: list[str]
    marked_committed: list[str]
    elapsed_s: float
    problems: list[ProblemJSON]


# --- diff ---


class SideJSON(TypedDict):
    path: str
    step: int | None
    item: str


class ToleranceJSON(TypedDict):
    atol: float
    rtol: float


class LeafDiffJSON(TypedDict):
    name: str
    status: str
    dtype: list[str | None]
    shape: list[Shape | None]
    elements: int
    mismatched: int
    max_abs_diff: float | None
    max_rel_diff: float | None
    message: str | None


class DiffJSON(TypedDict):
    """``ckpt diff --json``: leaf by leaf; ``ok`` is ``equal``."""

    schema_version: int
    ok: bool
    a: SideJSON
    b: SideJSON
    equal: bool
    tolerance: ToleranceJSON
    compare_cast: bool
    #: ``--structure``: names, kinds, dtypes, shapes, shardings compared; no array data read.
    structure_only: bool
    summary: dict[str, int]
    leaves: list[LeafDiffJSON]


# --- prune ---


class PolicyJSON(TypedDict):
    keep_last: int | None
    keep_every: int | None
    keep_hourly: int | None
    keep_daily: int | None
    keep_weekly: int | None
    keep_monthly: int | None
    keep_best: int | None
    keep_steps: list[int]
    keep_within: str | None
    metric: str | None
    mode: Literal["min", "max"] | None
    keep_missing_metric: bool | None
    clean_tmp: bool
    tmp_min_age: str | None


class MetricJSON(TypedDict):
    """The value ``--keep-best`` ranked a step by, and its rank (1 = best; null: no value)."""

    name: str
    value: float | None
    rank: int | None


class KeptJSON(TypedDict):
    step: int
    name: str
    path: str
    committed_at: str | None
    reasons: list[str]
    metric: MetricJSON | None


class RemovalJSON(TypedDict):
    step: int | None
    name: str
    path: str
    committed_at: NotRequired[str | None]
    metric: NotRequired[MetricJSON | None]
    kind: NotRequired[Literal["tmp", "trash"]]
    size_bytes: int


class UntouchedJSON(TypedDict):
    name: str
    path: str
    why: str


class OutcomeJSON(TypedDict):
    deleted: list[str]
    skipped: list[UntouchedJSON]
    failed: list[UntouchedJSON]
    freed_bytes: int


class PruneJSON(TypedDict):
    """``ckpt prune --json``: the plan and, unless a dry run or a refusal, its outcome; a refusal
    or a failed deletion carries ``ok: false`` and ``error`` in this same document."""

    schema_version: int
    ok: bool
    root: str
    policy: PolicyJSON
    keep: list[KeptJSON]
    delete: list[RemovalJSON]
    clean: list[RemovalJSON]
    untouched: list[UntouchedJSON]
    freed_bytes: int
    dry_run: bool
    outcome: OutcomeJSON | None
    error: NotRequired[ErrorJSON]
