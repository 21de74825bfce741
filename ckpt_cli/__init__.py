"""ckpt: list, inspect, verify, prune, migrate and reshard Orbax checkpoints, without JAX.

The Python API (everything in ``__all__``)::

    import ckpt_cli
    ck = ckpt_cli.open("runs/exp7")          # root, step or item; local, file://, s3://, gs://
    ck.steps()                                # [StepInfo(step=600, status="committed", ...)]
    item = ck.item(step=600)                  # default: latest committed step, its only item
    item.leaves                               # [Leaf(name, dtype, shape, sharding, ...)]
    item.read("params.Dense_0.kernel")        # a numpy array (ml_dtypes for bfloat16)
    item.read("params.Dense_0.kernel", index=np.s_[0:16, :])  # only that region is read
    item.read_tree()                          # nested dicts of numpy arrays (small checkpoints)
    ckpt_cli.verify("runs/exp7", deep=True)   # VerifyReport, as `ckpt verify --json`
    ckpt_cli.du("runs/exp7").garbage          # DuReport, as `ckpt du --json`: bytes per leaf
    ckpt_cli.digest("runs/exp7").digests()    # {leaf: "ld1:..."}: item, step or safetensors
    ckpt_cli.digest_array(x)                  # the same digest of a numpy array
    plan = ckpt_cli.plan_trend("runs/exp7", ckpt_cli.TrendOptions(steps="500-"))
    ckpt_cli.trend(plan).findings             # TrendReport, as `ckpt trend --json`

Writers plan first and write on ``execute``; a plan is frozen, its ``to_json()`` is what
``--dry-run --json`` prints, and ``refusal`` says why it would not be written::

    plan = ckpt_cli.plan_reshard("runs/exp7", "runs/exp7-4x2", mesh="data=4,model=2",
                                 rules={"params.*kernel": [None, "model"]})
    result = ckpt_cli.execute(plan)           # WriteResult; also plan_migration, plan_prune

    plan = ckpt_cli.plan_average("runs/exp7", "runs/exp7-avg", [600, 900, 1000], ema=0.9)
    ckpt_cli.execute(plan)                    # WriteResult: the mean (EMA) of the steps' floats

    plan = ckpt_cli.plan_export("runs/exp7", "runs/exp7-hf", spec="examples/mlp_to_pytorch.yaml")
    ckpt_cli.execute(plan)                    # safetensors files; ckpt_cli.plan_import(...) back

    plan = ckpt_cli.plan_copy("runs/exp7", "s3://bucket/exp7", step_ranges="500-", verify=True)
    ckpt_cli.execute(plan)                    # CopyResult: data first, markers last, resumable

Importing ``ckpt_cli`` is cheap: names resolve on first use, and nothing here imports JAX.
``export`` and ``import_`` are the old names of ``plan_export`` and ``plan_import``: they still
work and warn (``DeprecationWarning``).
Errors are ``ckpt_cli.CkptError`` subclasses with a one-line message and a ``hint``.
"""

from __future__ import annotations

import importlib
import os
import warnings
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from ckpt_cli._version import __version__
from ckpt_cli.errors import CkptError

if TYPE_CHECKING:
    from ckpt_cli.core.average.plan import AveragePlan, plan_average
    from ckpt_cli.core.checkpoint import Checkpoint, Item
    from ckpt_cli.core.copy.execute import CopyResult
    from ckpt_cli.core.copy.plan import CopyPlan, plan_copy
    from ckpt_cli.core.digest import DigestReport
    from ckpt_cli.core.digest.ld1 import Partial as DigestPartial
    from ckpt_cli.core.digest.ld1 import digest_array
    from ckpt_cli.core.du import DuReport
    from ckpt_cli.core.executor import ExecutorSpec
    from ckpt_cli.core.inspect import Leaf
    from ckpt_cli.core.listing import StepInfo
    from ckpt_cli.core.migrate.plan import MigrationPlan, plan_migration
    from ckpt_cli.core.progress import Progress, ProgressFn
    from ckpt_cli.core.prune.execute import PruneResult
    from ckpt_cli.core.prune.plan import PrunePlan
    from ckpt_cli.core.prune.policy import Mode, Policy
    from ckpt_cli.core.reshard.plan import ReshardPlan, plan_reshard
    from ckpt_cli.core.safetensors.export import ExportPlan, plan_export
    from ckpt_cli.core.safetensors.export_run import ExportResult
    from ckpt_cli.core.safetensors.import_ import ImportPlan, plan_import
    from ckpt_cli.core.safetensors.import_run import ImportResult
    from ckpt_cli.core.storage import StorageOptions
    from ckpt_cli.core.trend.plan import plan_trend
    from ckpt_cli.core.trend.run import trend
    from ckpt_cli.core.trend.types import TrendOptions, TrendPlan, TrendReport
    from ckpt_cli.core.verify.types import SampleSpec, VerifyReport
    from ckpt_cli.core.write.rewrite import WriteResult
    from ckpt_cli.core.write.types import Compression, WriteOptions

    # The old names (deprecated): the same functions, under the names of the other plan_*.
    export = plan_export
    import_ = plan_import

__all__ = [
    "AveragePlan",
    "Checkpoint",
    "CkptError",
    "Compression",
    "CopyPlan",
    "CopyResult",
    "DigestPartial",
    "DigestReport",
    "DuReport",
    "ExecutorSpec",
    "ExportPlan",
    "ExportResult",
    "ImportPlan",
    "ImportResult",
    "Item",
    "Leaf",
    "MigrationPlan",
    "Policy",
    "Progress",
    "ProgressFn",
    "PrunePlan",
    "PruneResult",
    "ReshardPlan",
    "SampleSpec",
    "StepInfo",
    "StorageOptions",
    "TrendOptions",
    "TrendPlan",
    "TrendReport",
    "VerifyReport",
    "WriteOptions",
    "WriteResult",
    "__version__",
    "digest",
    "digest_array",
    "digest_partial",
    "du",
    "execute",
    "merge_digest",
    "open",
    "plan_average",
    "plan_copy",
    "plan_export",
    "plan_import",
    "plan_migration",
    "plan_prune",
    "plan_reshard",
    "plan_trend",
    "trend",
    "verify",
]

#: Public names defined in the core, imported on first use (``import ckpt_cli`` stays cheap).
_LAZY = {
    "AveragePlan": "ckpt_cli.core.average.plan",
    "plan_average": "ckpt_cli.core.average.plan",
    "TrendOptions": "ckpt_cli.core.trend.types",
    "TrendPlan": "ckpt_cli.core.trend.types",
    "TrendReport": "ckpt_cli.core.trend.types",
    "plan_trend": "ckpt_cli.core.trend.plan",
    "trend": "ckpt_cli.core.trend.run",
    "Checkpoint": "ckpt_cli.core.checkpoint",
    "Item": "ckpt_cli.core.checkpoint",
    "CopyPlan": "ckpt_cli.core.copy.plan",
    "plan_copy": "ckpt_cli.core.copy.plan",
    "CopyResult": "ckpt_cli.core.copy.execute",
    "DigestReport": "ckpt_cli.core.digest",
    "DuReport": "ckpt_cli.core.du",
    "digest_array": "ckpt_cli.core.digest.ld1",
    "ExecutorSpec": "ckpt_cli.core.executor",
    "Leaf": "ckpt_cli.core.inspect",
    "StepInfo": "ckpt_cli.core.listing",
    "MigrationPlan": "ckpt_cli.core.migrate.plan",
    "plan_migration": "ckpt_cli.core.migrate.plan",
    "Progress": "ckpt_cli.core.progress",
    "ProgressFn": "ckpt_cli.core.progress",
    "PruneResult": "ckpt_cli.core.prune.execute",
    "PrunePlan": "ckpt_cli.core.prune.plan",
    "Policy": "ckpt_cli.core.prune.policy",
    "ReshardPlan": "ckpt_cli.core.reshard.plan",
    "plan_reshard": "ckpt_cli.core.reshard.plan",
    "ExportPlan": "ckpt_cli.core.safetensors.export",
    "plan_export": "ckpt_cli.core.safetensors.export",
    "ExportResult": "ckpt_cli.core.safetensors.export_run",
    "ImportPlan": "ckpt_cli.core.safetensors.import_",
    "plan_import": "ckpt_cli.core.safetensors.import_",
    "ImportResult": "ckpt_cli.core.safetensors.import_run",
    "StorageOptions": "ckpt_cli.core.storage",
    "SampleSpec": "ckpt_cli.core.verify.types",
    "VerifyReport": "ckpt_cli.core.verify.types",
    "WriteResult": "ckpt_cli.core.write.rewrite",
    "Compression": "ckpt_cli.core.write.types",
    "WriteOptions": "ckpt_cli.core.write.types",
}


#: Old public names -> the current ones. Not cached: every use warns.
_DEPRECATED = {"export": "plan_export", "import_": "plan_import"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    if name == "DigestPartial":
        from ckpt_cli.core.digest.ld1 import Partial

        globals()[name] = Partial
        return Partial
    if name in _DEPRECATED:
        new = _DEPRECATED[name]
        warnings.warn(
            f"ckpt_cli.{name} is deprecated: use ckpt_cli.{new}", DeprecationWarning, stacklevel=2
        )
        return __getattr__(new) if new not in globals() else globals()[new]
    raise AttributeError(f"module 'ckpt_cli' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The public API (``__all__``), not the module's imports and helpers."""
    return sorted(__all__)


def open(path: str | os.PathLike[str], *, storage: StorageOptions | None = None) -> Checkpoint:
    """Open a checkpoint: a CheckpointManager root, a step or an item directory, given as a
    local path or a ``file://``, ``s3://`` or ``gs://`` URL. ``storage`` says how to reach
    object stores (default: this process's environment, ``StorageOptions.from_environment``).

    Raises ``NotFoundError`` for a missing path, ``NotACheckpointError`` for one that holds no
    checkpoint. Example: ``ckpt_cli.open("s3://bucket/runs/exp7").item().leaves``.
    """
    from ckpt_cli.core.checkpoint import Checkpoint
    from ckpt_cli.core.storage import open_location

    return Checkpoint(open_location(os.fspath(path), storage))


def du(path: str | os.PathLike[str], *, storage: StorageOptions | None = None) -> DuReport:
    """Where the bytes under ``path`` (a root, a step or an item, local or in a bucket) go, as
    ``ckpt du`` reads them: ``total_bytes``, ``steps`` (each with its items and leaves: stored
    bytes, logical bytes), and ``garbage`` (each with its bytes, path and the command that
    reclaims it); ``to_json()`` is ``ckpt du --json``. Metadata only, no JAX.

    Example: ``[g.path for g in ckpt_cli.du("runs/exp7").garbage]``.
    """
    from ckpt_cli.core.du import disk_usage
    from ckpt_cli.core.storage import open_location

    return disk_usage(open_location(os.fspath(path), storage))


def verify(
    path: str | os.PathLike[str],
    *,
    deep: bool = False,
    record: bool = False,
    sample: SampleSpec | None = None,
    seed: int | None = None,
    step: int | None = None,
    latest: bool = False,
    item: str | None = None,
    strict: bool = False,
    fail_on_nonfinite: bool = False,
    mark_committed: bool = False,
    executor: ExecutorSpec | None = None,
    on_progress: ProgressFn | None = None,
    storage: StorageOptions | None = None,
) -> VerifyReport:
    """Check a root (all committed steps, or ``step``/``latest``), a step (``item``: only that
    item of each step), an item or safetensors (a file, index or Hugging Face folder), exactly
    as ``ckpt verify`` does, and return its report (``report.ok``, ``report.problems``, ``report.to_json()`` = ``ckpt verify
    --json``). Damage is reported, never raised.

    ``deep`` decodes every chunk; ``record`` stores digests after a clean deep pass;
    ``sample=SampleSpec(percent=5)`` (or ``bytes=...``) checks a random subset, ``seed`` fixes
    it; ``executor=ExecutorSpec("local", workers=4)`` runs the deep pass on worker processes
    when the split pays (``report.scale`` says; ``force_split=True`` splits anyway).
    Example: ``assert ckpt_cli.verify("runs/exp7", deep=True).ok``.
    """
    from ckpt_cli.core.safetensors.source import is_safetensors_source
    from ckpt_cli.core.storage import open_location
    from ckpt_cli.core.verify.run import verify_path
    from ckpt_cli.core.verify.types import VerifyOptions

    options = VerifyOptions(
        step=step,
        latest=latest,
        item=item,
        deep=deep,
        record=record,
        sample=sample,
        seed=seed,
        strict=strict,
        fail_on_nonfinite=fail_on_nonfinite,
        mark_committed=mark_committed,
    )
    if is_safetensors_source(os.fspath(path)):
        from ckpt_cli.core.safetensors.checks import verify_safetensors

        return verify_safetensors(os.fspath(path), options, on_progress)
    return verify_path(open_location(os.fspath(path), storage), options, on_progress, executor)


def digest(
    path: str | os.PathLike[str],
    *,
    step: int | None = None,
    memory_limit: int = 1 << 30,
    on_progress: ProgressFn | None = None,
    storage: StorageOptions | None = None,
) -> DigestReport:
    """The ``ld1`` digest of every leaf of an Orbax item, of every item of a step (``step``: of
    a root), or of every tensor of a safetensors file, index or directory, as ``ckpt digest``
    (``report.to_json()`` = ``--json``; ``report.digests()`` = {leaf: digest}). The digest
    depends on dtype, shape and values only: it is the same after a reshard, zarr2/zarr3,
    OCDBT or not, an export to safetensors (docs/reference/digest-spec.md). A leaf that cannot
    be read has ``digest`` None and a ``problem`` (``report.problems``): never raised.
    Example: ``ckpt_cli.digest("runs/exp7").digests() == ckpt_cli.digest("hf/").digests()``.
    """
    from ckpt_cli.core.digest.safetensors import digest_any

    return digest_any(os.fspath(path), step, storage, memory_limit, on_progress)


def digest_partial(
    origin: tuple[int, ...], block: Any, shape: tuple[int, ...], dtype: str | None = None
) -> DigestPartial:
    """The ``ld1`` partial of one box of a leaf of ``shape``: ``block`` (a numpy array) at
    ``origin`` (a shard, a slab). Partials of the boxes of one leaf, taken in any order by any
    number of processes (they pickle), give its digest with ``merge_digest``. ``dtype``: the
    leaf's dtype name when the array's is not it (default: ``block.dtype.name``)."""
    from ckpt_cli.core.digest.ld1 import partial

    return partial(tuple(origin), block, tuple(shape), dtype)


def merge_digest(partials: Iterable[DigestPartial]) -> str:
    """The ``ld1`` digest (``"ld1:"`` + 32 hex) of a leaf from the partials of boxes that cover
    it exactly once; raises ``ValueError`` for a box missing, counted twice or of another leaf."""
    from ckpt_cli.core.digest.ld1 import finish, merge

    return finish(merge(partials))


def plan_prune(
    root: str | os.PathLike[str],
    policy: Policy | None = None,
    *,
    keep_last: int | None = None,
    keep_last_finite: int | None = None,
    keep_every: int | None = None,
    keep_steps: Iterable[int] | None = None,
    keep_within: timedelta | None = None,
    keep_hourly: int | None = None,
    keep_daily: int | None = None,
    keep_weekly: int | None = None,
    keep_monthly: int | None = None,
    keep_best: int | None = None,
    metric: str | None = None,
    mode: Mode | None = None,
    keep_missing_metric: bool | None = None,
    clean_tmp: bool = False,
    tmp_min_age: timedelta = timedelta(hours=1),
    now: datetime | None = None,
    storage: StorageOptions | None = None,
) -> PrunePlan:
    """Plan a prune of the CheckpointManager ``root``: what ``policy`` keeps (with reasons) and
    what goes. Rules may be given as a ``Policy`` or as its fields: ``keep_last=2``,
    ``keep_every=1000``, ``keep_within=timedelta(days=7)``, ``keep_best=3, metric="loss",
    mode="min"``... (a rule left at None is off, as in ``Policy``). Nothing is deleted until
    ``execute(plan)``, which takes the root's lock and checks every entry again.
    Example: ``ckpt_cli.plan_prune("runs/exp7", keep_last=2).to_json()``.
    """
    from ckpt_cli.core.prune.plan import plan_prune_root
    from ckpt_cli.core.prune.policy import RULES, Policy
    from ckpt_cli.core.storage import open_location
    from ckpt_cli.errors import UsageError

    given = locals()
    rules: dict[str, Any] = {name: given[name] for name in RULES}  # the keywords above
    if policy is not None and any(v is not None for v in rules.values()):
        raise UsageError("give a Policy or its rules as keywords, not both")
    if policy is None:
        policy = Policy.from_rules(**rules)
    location = open_location(os.fspath(root), storage)
    return plan_prune_root(location, policy, clean_tmp=clean_tmp, tmp_min_age=tmp_min_age, now=now)


def _writers() -> dict[type, Callable[[Any, ProgressFn | None], Any]]:
    """plan type -> executor, from the command registry (its writers' ``Command.writer``)."""
    from ckpt_cli.commands import COMMANDS

    pairs = [c.writer() for c in COMMANDS if c.writer is not None]
    return {pair.plan: pair.execute for pair in pairs}


def execute(
    plan: ReshardPlan | MigrationPlan | PrunePlan | ExportPlan | ImportPlan | CopyPlan,
    *,
    on_progress: ProgressFn | None = None,
) -> WriteResult | PruneResult | ExportResult | ImportResult | CopyResult:
    """Carry out a plan of ``plan_reshard``, ``plan_migration``, ``plan_prune``, ``plan_export``,
    ``plan_import`` or ``plan_copy``.

    A refused plan (``plan.refusal``) raises that ``RefusedError`` and writes nothing. Writers
    stream the new step under the plan's memory limit into a tmp name and commit it last; a prune
    hides each entry, then deletes it. ``on_progress`` receives ``Progress`` events.
    Example: ``ckpt_cli.execute(ckpt_cli.plan_prune("runs/exp7", keep_last=2))``.
    """
    # The registry of commands is the registry of writers: each writer's ``Command`` names its
    # plan type and executor (``Command.writer``), so a new writer is dispatched here with no
    # edit. Looked up by the plan's exact type, then by its bases (a subclass of a plan).
    writers = _writers()
    for cls in type(plan).__mro__:
        found = writers.get(cls)
        if found is not None:
            return found(plan, on_progress)  # type: ignore[no-any-return]
    raise TypeError(f"not a plan ckpt executes: {type(plan).__name__}")
