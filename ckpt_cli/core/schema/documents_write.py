"""The document types of the commands that write (``reshard``, ``migrate``, ``export``, ``import``,
``pin``/``unpin``, ``cp``; ``documents.py`` has the others and the shared ones), and ``DOCUMENTS``: command -> type."""

from __future__ import annotations

from typing import Literal, TypedDict

from typing_extensions import NotRequired

from ckpt_cli.core.schema.documents import (
    DiffJSON,
    ErrorJSON,
    InspectJSON,
    LsJSON,
    PruneJSON,
    Shape,
    ShardingJSON,
    SideJSON,
    Spec,
    StepInspectJSON,
    VerifyJSON,
)

# --- reshard, migrate ---


class ScaleJSON(TypedDict):
    executor: str
    workers: int
    units: int
    databases: int
    worker_seconds: float
    merge_seconds: float


class ReshardLeafJSON(TypedDict):
    name: str
    dtype: str | None
    shape: Shape | None
    old_chunk_shape: Shape | None
    new_chunk_shape: Shape | None
    partition_spec: Spec | None
    rule: str | None
    follows: str | None  # the parameter an optimizer moment takes its sharding from (v2)
    size_bytes: int
    problem: str | None


class ReshardJSON(TypedDict):
    """``ckpt reshard --json``: the plan per leaf, and what was written (not with --dry-run)."""

    schema_version: int
    ok: bool
    mesh: dict[str, int] | None
    total_bytes: int
    unused_rules: list[str]
    leaves: list[ReshardLeafJSON]
    output: NotRequired[str]
    step: NotRequired[int]
    item: NotRequired[str]
    bytes_written: NotRequired[int]
    seconds: NotRequired[float]
    scale: NotRequired[ScaleJSON | None]
    digests: NotRequired[str]


class SpecJSON(TypedDict):
    path: str
    sha256: str
    rules: int


class OperationJSON(TypedDict):
    rule: int
    op: str
    detail: str
    follows: str | None


class MigrateLeafJSON(TypedDict):
    name: str
    value_type: str
    dtype: str | None
    shape: Shape | None
    sources: list[str]
    changed: bool
    operations: list[OperationJSON]
    streams: bool
    chunk_shape: Shape | None
    sharding: ShardingJSON | None
    size_bytes: int
    note: str | None


class DifferenceJSON(TypedDict):
    name: str
    kind: str
    expected: str | None
    planned: str | None


class TargetJSON(TypedDict):
    function: str
    differences: list[DifferenceJSON]


class SkipJSON(TypedDict):
    """PRNG state a rule matched by pattern and left as it is (v2)."""

    leaf: str
    rule: str
    reason: Literal["typed PRNG key", "raw PRNG key data", "nnx RNG stream counter"]


class MigrateJSON(TypedDict):
    """``ckpt migrate --json``: the plan per destination leaf, and what was written."""

    schema_version: int
    ok: bool
    spec: SpecJSON
    source: SideJSON
    total_bytes: int
    leaves: list[MigrateLeafJSON]
    dropped: list[str]
    skipped: list[SkipJSON]
    unused_rules: list[str]
    target: TargetJSON | None
    output: NotRequired[str]
    step: NotRequired[int]
    item: NotRequired[str]
    bytes_written: NotRequired[int]
    seconds: NotRequired[float]
    scale: NotRequired[ScaleJSON | None]
    digests: NotRequired[str]


# --- pin, unpin ---


class PinResultJSON(TypedDict):
    """``ckpt pin --json`` / ``ckpt unpin --json``: what changed."""

    schema_version: int
    ok: bool
    root: str
    step: int
    path: str
    pinned: bool
    changed: bool
    note: str | None
    pinned_at: str | None


# --- export, import (safetensors) ---


class ExportSourceJSON(TypedDict):
    path: str
    item: str
    step: int | None
    orbax_format: str


class ExportFileJSON(TypedDict):
    name: str
    bytes: int
    tensors: int


# "from" is a keyword: the functional form.
ExportTensorJSON = TypedDict(
    "ExportTensorJSON",
    {
        "name": str,
        "dtype": str,
        "shape": Shape,
        "bytes": int,
        "file": str,
        "from": list[str],
        "operations": list[OperationJSON],
    },
)


class SkippedJSON(TypedDict):
    name: str
    reason: str


class ExportWrittenJSON(TypedDict):
    path: str
    files: list[str]
    bytes: int
    seconds: float


class ExportJSON(TypedDict):
    """``ckpt export --json``: the tensors and files planned, and what was written."""

    schema_version: int
    ok: bool
    source: ExportSourceJSON
    out: str
    format: Literal["safetensors"]
    spec: str | None
    metadata: dict[str, str]
    total_bytes: int
    index: str | None
    files: list[ExportFileJSON]
    tensors: list[ExportTensorJSON]
    skipped: list[SkippedJSON]
    unused_rules: list[str]
    written: NotRequired[ExportWrittenJSON]


class ImportSourceJSON(TypedDict):
    path: str
    files: list[str]
    index: str | None
    metadata: dict[str, str]


class ImportOutputJSON(TypedDict):
    root: str
    step: int
    item: str


ImportLeafJSON = TypedDict(
    "ImportLeafJSON",
    {
        "name": str,
        "dtype": str,
        "shape": Shape,
        "bytes": int,
        "from": list[str],
        "operations": list[OperationJSON],
        "chunk_shape": Shape,
        "sharding": ShardingJSON,
        "mesh_rule": str | None,
    },
)


class ImportWrittenJSON(TypedDict):
    path: str
    bytes: int
    seconds: float


class ImportJSON(TypedDict):
    """``ckpt import --json``: the leaves planned from the safetensors files, and what was
    written."""

    schema_version: int
    ok: bool
    source: ImportSourceJSON
    output: ImportOutputJSON
    spec: str | None
    mesh: dict[str, int] | None
    total_bytes: int
    leaves: list[ImportLeafJSON]
    dropped: list[str]
    unused_rules: list[str]
    written: NotRequired[ImportWrittenJSON]


# --- cp ---


class CpStepJSON(TypedDict):
    """One step: where it goes, what the destination held (``new``, ``resume``: an unfinished
    ckpt write, ``present``: a committed step, checked), objects to copy and to check."""

    step: int
    name: str
    source: str
    destination: str
    state: Literal["new", "resume", "present"]
    objects: int
    bytes: int
    to_copy_objects: int
    to_copy_bytes: int
    to_check_objects: int
    adds_commit_marker: bool


class CpSkippedJSON(TypedDict):
    name: str
    reason: str


class CpStepOutcomeJSON(TypedDict):
    name: str
    status: Literal["copied", "already-there", "failed"]
    copied_objects: int
    copied_bytes: int
    skipped_objects: int
    skipped_bytes: int
    problem: str | None


class CpOutcomeJSON(TypedDict):
    """What the copy did: objects written, objects found whole at the destination and kept."""

    copied_objects: int
    copied_bytes: int
    skipped_objects: int
    skipped_bytes: int
    verified_objects: int
    unverified_items: list[str]
    seconds: float
    steps: list[CpStepOutcomeJSON]


class CpJSON(TypedDict):
    """``ckpt cp --json``: the plan (steps, objects, bytes) and, unless --dry-run, the outcome;
    a step that failed ``--verify`` or was refused carries ``ok: false`` and ``error`` here."""

    schema_version: int
    ok: bool
    source: str
    destination: str
    selection: str
    verify: bool
    total_objects: int
    total_bytes: int
    root_files: list[str]
    steps: list[CpStepJSON]
    skipped: list[CpSkippedJSON]
    warnings: list[str]
    outcome: NotRequired[CpOutcomeJSON]
    error: NotRequired[ErrorJSON]


DOCUMENTS: dict[str, object] = {
    "ls": LsJSON,
    "inspect": InspectJSON | StepInspectJSON,
    "verify": VerifyJSON,
    "diff": DiffJSON,
    "prune": PruneJSON,
    "reshard": ReshardJSON,
    "migrate": MigrateJSON,
    "export": ExportJSON,
    "import": ImportJSON,
    "pin": PinResultJSON,
    "unpin": PinResultJSON,
    "cp": CpJSON,
}
