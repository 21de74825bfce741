"""Every option of the commands, with its default and its parser; the one size parser.

Sizes (``--memory-limit``, ``--max-chunk-bytes``, ``--unit-bytes``, the amount form of
``--sample``) all mean the same: ``K``/``M``/``G``/``T`` and ``KiB``/``MiB``/``GiB``/``TiB`` are
binary (1024), ``KB``/``MB``/``GB``/``TB`` decimal (1000), a plain number is bytes; case does not
matter and a fraction is allowed (``1.5G``). Size options are parsed while the command line is
read (Typer ``parser=``), so a command receives bytes.

Nothing here imports the core at module level: ``ckpt --help`` stays light.
"""

from __future__ import annotations

import re
from enum import Enum
from typing import TYPE_CHECKING, Annotated, Any, cast

import typer

from ckpt_cli.commands._complete import complete_item, complete_root_at_step, complete_step
from ckpt_cli.commands._context import storage_options as storage_options
from ckpt_cli.errors import OptionValueError, UsageError

if TYPE_CHECKING:
    from ckpt_cli.core.verify.types import SampleSpec
    from ckpt_cli.core.write.types import WriteOptions

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    **{p: 1024**i for i, p in enumerate("kmgt", 1)},
    **{f"{p}ib": 1024**i for i, p in enumerate("kmgt", 1)},
    **{f"{p}b": 1000**i for i, p in enumerate("kmgt", 1)},
}
_SIZE_RE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*")


def parse_size(text: str, option: str) -> int:
    """``1GiB``, ``512M``, ``64MB``, ``1000000`` -> bytes (K, M, G, T binary; KB, MB... decimal)."""
    m = _SIZE_RE.fullmatch(text)
    if not m or m.group(2).lower() not in _SIZE_UNITS:
        raise UsageError(f"{option} {text!r} is not a size: use e.g. 512MiB, 1GiB or bytes")
    value = float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()]
    if not value < 1 << 62:  # 5,000 digits make inf; no machine holds 4 EiB
        raise UsageError(f"{option} {text[:40]!r}: too large a size (the most is 4 EiB)")
    return int(value)


def parse_sample(text: str) -> SampleSpec:
    """``5%`` (of the array bytes) or an amount of bytes, as any size: ``2G``, ``500MiB``."""
    from ckpt_cli.core.verify.budget import parse_subset
    from ckpt_cli.core.verify.types import SampleSpec

    t = text.strip()
    subset = parse_subset(t)  # n/t: the n-th of t disjoint subsets (restic's n/t)
    if subset is not None:
        return SampleSpec(subset=subset)
    try:
        if t.endswith("%"):
            pct = float(t[:-1])
            if not 0 < pct <= 100:
                raise ValueError
            return SampleSpec(percent=pct)
        amount = parse_size(t, "--sample")
        if amount <= 0:
            raise ValueError
        return SampleSpec(bytes=amount)
    except ValueError:  # UsageError is one
        raise UsageError(
            f"--sample {text!r} is neither a percentage, an amount of bytes nor N/T",
            hint="for example --sample 5%, --sample 2GiB or --sample 2/7",
        ) from None


class SizeParser:
    """The Typer parser of one size option (``--memory-limit``...): bytes, or the command-line
    error at ckpt's boundary. ``sample`` marks ``--sample``, which also takes a percentage."""

    def __init__(self, option: str, sample: bool = False) -> None:
        self.option = option
        self.sample = sample
        self.__name__ = option  # Click names the parameter type after it

    def __call__(self, value: Any) -> Any:
        if not isinstance(value, str):
            return value  # the default, already parsed
        try:
            return parse_sample(value) if self.sample else parse_size(value, self.option)
        except UsageError as e:
            raise OptionValueError(e.message, hint=e.hint) from None


def _size_option(flag: str, help_: str) -> Any:
    return typer.Option(flag, parser=SizeParser(flag), metavar="SIZE", help=help_)


def size_default(text: str) -> int:
    """A size option's default as ``--help`` shows it (``1GiB``); the option's parser turns it
    into bytes before the command runs, so the command sees an int."""
    return cast(int, text)


#: Size defaults as ``--help`` shows them (see ``size_default``).
MAX_CHUNK_BYTES = size_default("64MiB")
MEMORY_LIMIT = size_default("1GiB")
UNIT_BYTES = size_default("256MiB")


def write_options(
    max_chunk_bytes: int,
    memory_limit: int,
    zarr3: bool | None,
    compression: str,
    ocdbt: bool,
    executor: str,
    workers: int,
    scheduler: str | None,
    unit_bytes: int,
) -> WriteOptions:
    """The options of a writer (reshard, migrate) from its command line."""
    from ckpt_cli.core.executor import ExecutorSpec
    from ckpt_cli.core.write.types import Compression, WriteOptions

    return WriteOptions(
        max_chunk_bytes=max_chunk_bytes,
        memory_limit=memory_limit,
        zarr3=zarr3,
        compression=Compression.parse(compression),
        ocdbt=ocdbt,
        executor=ExecutorSpec(executor, workers, scheduler),
        unit_bytes=unit_bytes,
    )


# --- read commands -----------------------------------------------------------------------------

PathArg = Annotated[
    str,
    typer.Argument(
        help="A CheckpointManager root, a step directory or an item directory.", show_default=False
    ),
]
StepOpt = Annotated[
    int | None,
    typer.Option(
        "--step",
        "-s",
        help="Step to read from a root (default: latest committed).",
        show_default=False,
        metavar="N",
        autocompletion=complete_step,
    ),
]
ItemOpt = Annotated[
    str | None,
    typer.Option(
        "--item",
        "-i",
        help="Item to read (default: the step's one state item).",
        show_default=False,
        metavar="NAME",
        autocompletion=complete_item,
    ),
]
ItemAOpt = Annotated[
    str | None,
    typer.Option(
        "--item-a", help="Item of A (also A@STEP:ITEM).", show_default=False, metavar="NAME"
    ),
]
ItemBOpt = Annotated[
    str | None,
    typer.Option(
        "--item-b", help="Item of B (also B@STEP:ITEM).", show_default=False, metavar="NAME"
    ),
]
FilterOpt = Annotated[
    str | None,
    typer.Option(
        "--filter",
        "-f",
        help="Only leaves whose dotted name matches: a glob ('params.*kernel'), a regex "
        "('^opt_state\\.'), or re:REGEX.",
        show_default=False,
    ),
]
JsonOpt = Annotated[
    bool,
    typer.Option("--json", help="Print one JSON document on stdout (no colour, no progress)."),
]
FlatOpt = Annotated[bool, typer.Option("--flat", help="One line per leaf instead of a tree.")]
StatsOpt = Annotated[
    bool,
    typer.Option(
        "--stats",
        help="Add min, max, mean, std, NaN and Inf counts per leaf (reads the data, "
        "chunk by chunk).",
    ),
]
LayoutOpt = Annotated[
    str | None,
    typer.Option(
        "--layout", help="Draw which device holds which block of this leaf.", show_default=False
    ),
]

# --- verify --------------------------------------------------------------------------------------

VerifyStepOpt = Annotated[
    int | None,
    typer.Option(
        "--step",
        "-s",
        help="Check only this step of a root.",
        show_default=False,
        metavar="N",
        autocompletion=complete_step,
    ),
]
LatestOpt = Annotated[
    bool, typer.Option("--latest", help="Check only the latest committed step of a root.")
]
DeepOpt = Annotated[
    bool,
    typer.Option(
        "--deep",
        help="Decode every chunk (streamed, in parallel): NaN/Inf per leaf, recorded "
        "digests and file checksums.",
    ),
]
RecordOpt = Annotated[
    bool,
    typer.Option(
        "--record",
        help="After a clean deep pass, store digests in each item (_CKPT_DIGESTS.json) "
        "that every later verify checks. Implies --deep.",
    ),
]
SampleOpt = Annotated[
    Any,
    typer.Option(
        "--sample",
        parser=SizeParser("--sample", sample=True),
        metavar="SIZE|N%",
        help="Decode a random subset of chunks: a percentage of the bytes ('5%') or an "
        "amount ('2GiB'). Checks the files holding them against recorded digests.",
        show_default=False,
    ),
]
SeedOpt = Annotated[
    int | None,
    typer.Option("--seed", help="Seed choosing the --sample subset.", show_default=False),
]
StrictOpt = Annotated[
    bool, typer.Option("--strict", help="Treat warnings as errors (exit 1 on any).")
]
FailOnNonfiniteOpt = Annotated[
    bool, typer.Option("--fail-on-nonfinite", help="Treat NaN/Inf in a leaf as an error.")
]
MarkCommittedOpt = Annotated[
    bool,
    typer.Option(
        "--mark-committed",
        help="After a clean deep check of the one step (a root with --step N, or a step), "
        "put its commit_success.txt: for steps copied to a bucket without it (Orbax #394). "
        "Refused (nothing written, exit 1) when the check finds errors.",
    ),
]
MaxDurationOpt = Annotated[
    str | None,
    typer.Option(
        "--max-duration",
        help="With --deep: read for at most this long (90s, 10m, 2h), counted from the start; "
        "reports the coverage. Exit code on what was seen.",
        metavar="DURATION",
        show_default=False,
    ),
]
RotateOpt = Annotated[
    bool,
    typer.Option(
        "--rotate",
        help="With --max-duration: continue where the last run stopped (state in each item's "
        "_CKPT_VERIFY_STATE.json), so N runs cover every chunk.",
    ),
]
JunitOpt = Annotated[
    str | None,
    typer.Option(
        "--junit", help="Also write a JUnit XML report to FILE.", metavar="FILE", show_default=False
    ),
]

# --- diff ----------------------------------------------------------------------------------------

SideArg = Annotated[
    str,
    typer.Argument(
        help="Root, step or item; ROOT@STEP picks a step, ROOT@STEP:ITEM an item.",
        autocompletion=complete_root_at_step,
    ),
]
BothStepsOpt = Annotated[
    int | None,
    typer.Option("--step", "-s", help="Step to take from both roots.", show_default=False),
]
StepAOpt = Annotated[
    int | None, typer.Option("--step-a", help="Step of A's root.", show_default=False)
]
StepBOpt = Annotated[
    int | None, typer.Option("--step-b", help="Step of B's root.", show_default=False)
]
AtolOpt = Annotated[
    float, typer.Option("--atol", help="Absolute tolerance: |a-b| <= atol + rtol*|b|.")
]
RtolOpt = Annotated[float, typer.Option("--rtol", help="Relative tolerance.")]
CompareCastOpt = Annotated[
    bool,
    typer.Option(
        "--compare-cast",
        help="Compare leaves whose dtype changed as float64 instead of counting them as different.",
    ),
]
AllOpt = Annotated[
    bool, typer.Option("--all", help="List equal leaves too, not only the differences.")
]
StructureOpt = Annotated[
    bool,
    typer.Option(
        "--structure",
        help="Compare names, dtypes, shapes and shardings only: no array data is read.",
    ),
]

# --- the writers (reshard, migrate) and scale-out -----------------------------------------------

SourceArg = Annotated[
    str, typer.Argument(help="Source: a root, step or item directory.", show_default=False)
]
MaxChunkBytesOpt = Annotated[
    int,
    _size_option(
        "--max-chunk-bytes",
        "Split a device's shard into equal chunks no larger than this.",
    ),
]
MemoryLimitOpt = Annotated[
    int,
    _size_option(
        "--memory-limit",
        "Bytes of array data held at once (blocks in flight plus TensorStore's cache).",
    ),
]
Zarr3Opt = Annotated[
    bool | None,
    typer.Option(
        "--zarr3/--zarr2", help="Output zarr version (default: the source's).", show_default=False
    ),
]
CompressionOpt = Annotated[str, typer.Option("--compression", help="zstd, zstd:LEVEL or none.")]
OcdbtOpt = Annotated[
    bool,
    typer.Option(
        "--ocdbt/--no-ocdbt", help="One merged OCDBT database, or a zarr directory per array."
    ),
]
PlanOnlyOpt = Annotated[
    bool, typer.Option("--dry-run", help="Print the plan per leaf; write nothing.")
]
ExecutorOpt = Annotated[
    str,
    typer.Option(
        "--executor",
        help="Where the work runs: local (this machine, --workers processes) or dask "
        "(an existing Dask cluster, --scheduler).",
    ),
]
WorkersOpt = Annotated[
    int,
    typer.Option(
        "--workers",
        help="Local worker processes; above 1 the work is split into units of chunks.",
        min=1,
    ),
]
SchedulerOpt = Annotated[
    str | None,
    typer.Option(
        "--scheduler",
        help="Dask scheduler address, e.g. tcp://10.0.0.5:8786 (default: DASK_SCHEDULER_ADDRESS).",
        show_default=False,
    ),
]
UnitBytesOpt = Annotated[
    int,
    _size_option(
        "--unit-bytes",
        "Array bytes per unit of work when scaled out (whole chunks; small leaves share one).",
    ),
]

# --- reshard -------------------------------------------------------------------------------------

ReshardDestArg = Annotated[
    str,
    typer.Argument(
        help="Destination root (created if missing; the step keeps its number).",
        show_default=False,
    ),
]
MeshOpt = Annotated[
    str | None,
    typer.Option("--mesh", help="Target mesh, e.g. data=8,model=4.", show_default=False),
]
RulesOpt = Annotated[
    str | None,
    typer.Option(
        "--rules",
        help="YAML/JSON file: leaf pattern -> partition "
        "spec, e.g. 'params.*kernel: [null, model]'. First match "
        "wins; unmatched leaves are replicated.",
        show_default=False,
    ),
]
RuleOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--rule",
        help="PATTERN=SPEC, e.g. 'params.*kernel=[null, model]' (repeatable; after --rules).",
        show_default=False,
    ),
]
LikeOpt = Annotated[
    str | None,
    typer.Option(
        "--like",
        help="Copy the chunking and sharding of this "
        "checkpoint (its latest step) instead of --mesh/--rules.",
        show_default=False,
    ),
]

# --- migrate -------------------------------------------------------------------------------------

MigrateDestArg = Annotated[
    str,
    typer.Argument(
        help="Destination root (created if missing), or ROOT/N to name the step.",
        show_default=False,
    ),
]
SpecOpt = Annotated[
    str,
    typer.Option("--spec", help="YAML (or .toml) file of ordered rules.", show_default=False),
]
TargetOpt = Annotated[
    str | None,
    typer.Option(
        "--target",
        help="MODULE:FUNCTION returning the new model's abstract state; the result is "
        "checked against it (names, shapes, dtypes). Imports jax.",
        show_default=False,
    ),
]
AllowMismatchOpt = Annotated[
    bool,
    typer.Option("--allow-mismatch", help="Write even if the result differs from --target."),
]
AllowUnusedOpt = Annotated[
    bool, typer.Option("--allow-unused", help="Warn, not fail, when a rule matches no leaf.")
]
AllowPythonOpt = Annotated[
    bool,
    typer.Option("--allow-python", help="Let `op: python` rules import and run their function."),
]
StepOutOpt = Annotated[
    int | None,
    typer.Option(
        "--step-out", help="Step number to write (default: the source's).", show_default=False
    ),
]
RecordDigestsOpt = Annotated[
    bool | None,
    typer.Option(
        "--record-digests/--no-record-digests",
        help="Read the new step back and record its digests, as `ckpt verify --record` "
        "(default: when the source has a record).",
        show_default=False,
    ),
]

# --- prune ---------------------------------------------------------------------------------------


class Mode(str, Enum):
    min = "min"
    max = "max"


def _count(flag: str, help_: str) -> Any:
    return typer.Option(flag, min=1, help=help_, show_default=False, metavar="N")


RootArg = Annotated[
    str, typer.Argument(help="A CheckpointManager root (the directory holding the steps).")
]
KeepLastOpt = Annotated[int | None, _count("--keep-last", "Keep the N newest steps.")]
KeepEveryOpt = Annotated[
    int | None, _count("--keep-every", "Keep steps divisible by N (Orbax keep_period).")
]
KeepStepOpt = Annotated[
    list[int] | None,
    typer.Option(
        "--keep-step", help="Keep this step (repeatable).", show_default=False, metavar="STEP"
    ),
]
KeepWithinOpt = Annotated[
    str | None,
    typer.Option(
        "--keep-within",
        help="Keep steps committed within this long before now: 90m, 36h, 7d, 2w.",
        show_default=False,
        metavar="DURATION",
    ),
]
KeepHourlyOpt = Annotated[
    int | None, _count("--keep-hourly", "Newest step of each of the last N hours with one.")
]
KeepDailyOpt = Annotated[
    int | None, _count("--keep-daily", "Newest step of each of the last N days (UTC).")
]
KeepWeeklyOpt = Annotated[
    int | None, _count("--keep-weekly", "Newest step of each of the last N ISO weeks.")
]
KeepMonthlyOpt = Annotated[
    int | None, _count("--keep-monthly", "Newest step of each of the last N months.")
]
KeepBestOpt = Annotated[int | None, _count("--keep-best", "Keep the N best steps by --metric.")]
MetricOpt = Annotated[
    str | None,
    typer.Option(help="Metric of metrics/metrics to rank by (--keep-best).", show_default=False),
]
ModeOpt = Annotated[
    Mode | None,
    typer.Option(
        help="With --keep-best, required: best is the lowest (min, a loss) or the highest (max, "
        "an accuracy; Orbax's best_mode default).",
        show_default=False,
    ),
]
KeepMissingMetricOpt = Annotated[
    bool,
    typer.Option(
        "--keep-missing-metric/--drop-missing-metric",
        help="With --keep-best: keep steps that lack the metric (Orbax's default), or let "
        "the other rules decide.",
    ),
]
CleanTmpOpt = Annotated[
    bool,
    typer.Option("--clean-tmp", help="Also remove unfinished saves (*.orbax-checkpoint-tmp*)."),
]
TmpMinAgeOpt = Annotated[
    str,
    typer.Option(
        help="Only remove unfinished saves unmodified for this long (a save in progress "
        "writes all the time).",
        metavar="DURATION",
    ),
]
PruneDryRunOpt = Annotated[
    bool, typer.Option("--dry-run", "-n", help="Print the plan; change nothing.")
]
YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="Delete without asking.")]

# --- export / import -----------------------------------------------------------------------------

#: Defaults of export/import: values stream from or into a file at disk speed, so more blocks in
#: flight buy nothing (bench/bench_export.py: 256MiB and 16MiB chunks ran faster than 1GiB/64MiB).
EXCHANGE_MEMORY_LIMIT = size_default("256MiB")
IMPORT_CHUNK_BYTES = size_default("16MiB")
#: transformers' default for save_pretrained(max_shard_size=...): 5 GB, decimal.
MAX_SHARD_SIZE = size_default("5GB")
MaxShardSizeOpt = Annotated[
    int,
    _size_option(
        "--max-shard-size",
        "Shard above this size (5GB = 5e9 bytes, as transformers; GiB units too).",
    ),
]
OptionalSpecOpt = Annotated[
    str | None,
    typer.Option(
        "--spec",
        help="A migrate spec (YAML or .toml): rules applied first (rename, transpose, "
        "unstack, ...).",
        show_default=False,
    ),
]
