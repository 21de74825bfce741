"""The options several commands share, with their defaults and parsers; the one size parser.

An option only one command takes is declared in that command's module.

Sizes (``--memory-limit``, ``--max-chunk-bytes``, ``--unit-bytes``, the amount form of
``--sample``) all mean the same: ``K``/``M``/``G``/``T`` and ``KiB``/``MiB``/``GiB``/``TiB`` are
binary (1024), ``KB``/``MB``/``GB``/``TB`` decimal (1000), a plain number is bytes; case does not
matter and a fraction is allowed (``1.5G``). Size options are parsed while the command line is
read (Typer ``parser=``), so a command receives bytes.

``ROOT@STEP`` is ``ROOT --step STEP`` wherever a command takes a step (``ROOT@STEP:ITEM`` adds
``--item ITEM`` where it takes an item; ``trend`` and ``average`` take ``ROOT@RANGES`` as
``--steps``): ``at_step`` and ``at_steps`` read it, by the one rule of ``diff`` and ``cp``
(``core/step_ranges.split_at``: a path of that very name that exists stays a path).

Nothing here imports the core at module level: ``ckpt --help`` stays light.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Annotated, Any, cast

import typer

from ckpt_cli.commands._complete import complete_item, complete_root_at_step, complete_step
from ckpt_cli.errors import OptionValueError, UsageError

if TYPE_CHECKING:
    from ckpt_cli.commands._context import Run
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


def size_option(flag: str, help_: str) -> Any:
    return typer.Option(flag, parser=SizeParser(flag), metavar="SIZE", help=help_)


def size_default(text: str) -> int:
    """A size option's default as ``--help`` shows it (``1GiB``); the option's parser turns it
    into bytes before the command runs, so the command sees an int."""
    return cast(int, text)


class ThreadsParser:
    """The Typer parser of ``--threads``: a whole number >= 1, or ``auto`` (the default):
    ``CKPT_THREADS``, else the CPUs this process may use (``core/threads.py``)."""

    __name__ = "--threads"

    def __call__(self, value: Any) -> Any:
        from ckpt_cli.core.threads import parse_threads, resolve_threads

        if not isinstance(value, str):
            return value
        try:
            if value.strip().lower() == "auto":
                return resolve_threads(None)
            return parse_threads(value, "--threads")
        except UsageError as e:
            raise OptionValueError(e.message, hint=e.hint) from None


#: ``--threads``'s default as ``--help`` shows it; the parser makes it a number.
THREADS = cast(int, "auto")
ThreadsOpt = Annotated[
    int,
    typer.Option(
        "--threads",
        parser=ThreadsParser(),
        metavar="N",
        help="Threads decoding, hashing and encoding (TensorStore's too). auto: CKPT_THREADS, "
        "else the CPUs this process may use (affinity and cgroup quota).",
    ),
]

#: Size defaults as ``--help`` shows them (see ``size_default``).
MAX_CHUNK_BYTES = size_default("64MiB")
MEMORY_LIMIT = size_default("1GiB")
UNIT_BYTES = size_default("256MiB")


AllowNonfiniteOpt = Annotated[
    bool,
    typer.Option(
        "--allow-nonfinite",
        help="Write NaN/Inf values as they are. Without it a writer refuses a leaf holding "
        "any (exit 3, nothing written): the source's run had diverged.",
    ),
]


def write_options(
    run: Run,
    max_chunk_bytes: int,
    memory_limit: int,
    zarr3: bool | None,
    compression: str,
    ocdbt: bool,
    allow_nonfinite: bool = False,
) -> WriteOptions:
    """The options of a writer (reshard, migrate, import) from its command line, and how its
    work scales from its run (``run.scale``; none: this process)."""
    from ckpt_cli.core.scale import ScaleOptions
    from ckpt_cli.core.write.types import Compression, WriteOptions

    scale = run.scale or ScaleOptions()
    return WriteOptions(
        max_chunk_bytes=max_chunk_bytes,
        memory_limit=memory_limit,
        zarr3=zarr3,
        compression=Compression.parse(compression),
        ocdbt=ocdbt,
        executor=scale.executor,
        unit_bytes=scale.unit_bytes,
        allow_nonfinite=allow_nonfinite,
    )


# --- paths, steps, items, output ------------------------------------------------------------------

PathArg = Annotated[
    str,
    typer.Argument(
        help="A CheckpointManager root, a step directory or an item directory.", show_default=False
    ),
]
#: The path of a command that takes ``--step`` (and ``--item``).
StepPathArg = Annotated[
    str,
    typer.Argument(
        help="A CheckpointManager root, a step directory or an item directory; ROOT@STEP "
        "names a step of a root (as --step), ROOT@STEP:ITEM an item of it (as --item).",
        show_default=False,
        autocompletion=complete_root_at_step,
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
#: The help of every option taking a leaf pattern (``--filter``).
LEAF_PATTERN_HELP = (
    "Only leaves whose dotted name matches: a name (`params`, `Dense_0.kernel`: whole "
    "components, so `params` is not `hyperparams`), a glob (`params.*kernel`, the whole name), "
    "a regular expression searched in the name (`^opt_state\\.`), or `re:REGEX`. "
    "Patterns: docs/reference/layouts.md#leaf-patterns."
)
FilterOpt = Annotated[
    str | None,
    typer.Option(
        "--filter",
        "-f",
        help=LEAF_PATTERN_HELP,
        show_default=False,
        metavar="PATTERN",
    ),
]
#: ``--filter``'s old name in ``trend`` and ``average``: hidden, kept for scripts, the same.
MatchAliasOpt = Annotated[
    str | None,
    typer.Option("--match", "-m", hidden=True, show_default=False, metavar="PATTERN"),
]
JsonOpt = Annotated[
    bool,
    typer.Option("--json", help="Print one JSON document on stdout (no colour, no progress)."),
]


def filter_or_match(filter_: str | None, match: str | None) -> str | None:
    """The one pattern of ``--filter`` and its old name ``--match`` (both given: the same)."""
    if filter_ is not None and match is not None and filter_ != match:
        raise UsageError(
            f"--filter {filter_!r} and --match {match!r} (its old name) differ: give --filter"
        )
    return filter_ if filter_ is not None else match


def at_step(
    path: str,
    step: int | None,
    item: str | None = None,
    *,
    items: bool = True,
    flag: str = "--step",
) -> tuple[str, int | None, str | None]:
    """``ROOT@N`` as (ROOT, N): the path, ``--step`` and ``--item`` a command reads, with
    ``ROOT@N:ITEM`` naming the item too (``items``: the command takes ``--item``). A step (or
    item) named both ways and differently is a usage error naming both (the step's ``flag``)."""
    from ckpt_cli.core.step_ranges import split_at

    root, steps, named = split_at(path)
    if steps is None:
        return path, step, item
    if not steps.strip().isdigit():
        raise UsageError(
            f"{path} names the steps {steps}: this command reads one step",
            hint=f"name one: ROOT@N or {flag} N",
        )
    number = int(steps)
    if step is not None and step != number:
        raise UsageError(f"{path} names step {number}, {flag} says {step}: give one of them")
    if named is not None and not items:
        raise UsageError(f"{path} names an item ({named}): this command takes a step, ROOT@N")
    return root, number, _one_item(path, named, item)


def at_steps(
    path: str, steps: str | None, item: str | None = None
) -> tuple[str, str | None, str | None]:
    """``ROOT@RANGES`` as (ROOT, RANGES): the path, ``--steps`` and ``--item`` of a command
    choosing several steps (``trend``, ``average``); named both ways and differently: a usage
    error naming both."""
    from ckpt_cli.core.step_ranges import split_at

    root, named, named_item = split_at(path)
    if named is None:
        return path, steps, item
    if steps is not None and steps.replace(" ", "") != named.replace(" ", ""):
        raise UsageError(f"{path} names the steps {named}, --steps says {steps}: give one of them")
    return root, named, _one_item(path, named_item, item)


def _one_item(path: str, named: str | None, item: str | None) -> str | None:
    if named is not None and item is not None and named != item:
        raise UsageError(f"{path} names the item {named!r}, --item says {item!r}: give one of them")
    return named if named is not None else item


# --- the writers (reshard, migrate) and scale-out -----------------------------------------------

SourceArg = Annotated[
    str,
    typer.Argument(
        help="Source: a root, step or item directory; ROOT@STEP names a step of a root (as "
        "--step), ROOT@STEP:ITEM an item of it.",
        show_default=False,
        autocompletion=complete_root_at_step,
    ),
]
MaxChunkBytesOpt = Annotated[
    int,
    size_option(
        "--max-chunk-bytes",
        "Split a device's shard into equal chunks no larger than this.",
    ),
]
MemoryLimitOpt = Annotated[
    int,
    size_option(
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
    size_option(
        "--unit-bytes",
        "Array bytes per unit of work when scaled out (whole chunks; small leaves share one).",
    ),
]
ForceSplitOpt = Annotated[
    bool,
    typer.Option(
        "--force-split",
        help="Split into units even when the transfer is too short for the workers' start-up "
        "to pay (otherwise such a run stays in one process and says why).",
    ),
]

# --- a layout for a mesh (reshard, import) --------------------------------------------------------

MeshOpt = Annotated[
    str | None,
    typer.Option("--mesh", help="Target mesh, e.g. data=8,model=4.", show_default=False),
]
RulesOpt = Annotated[
    str | None,
    typer.Option(
        "--rules",
        help="YAML/JSON file: leaf pattern -> partition "
        "spec, e.g. 'params.*kernel: [null, model]'. A pattern takes the whole name; first "
        "match wins; unmatched leaves are replicated. Patterns: "
        "docs/reference/layouts.md#leaf-patterns.",
        show_default=False,
    ),
]

# --- rules (migrate, export, import) --------------------------------------------------------------

TargetOpt = Annotated[
    str | None,
    typer.Option(
        "--target",
        help="MODULE:FUNCTION returning the new model's abstract state; the result is "
        "checked against it (names, shapes, dtypes). Imports jax.",
        show_default=False,
    ),
]
AllowUnusedOpt = Annotated[
    bool, typer.Option("--allow-unused", help="Warn, not fail, when a rule matches no leaf.")
]

# --- roots (prune, pin, unpin) --------------------------------------------------------------------

RootArg = Annotated[
    str, typer.Argument(help="A CheckpointManager root (the directory holding the steps).")
]

# --- export / import -----------------------------------------------------------------------------

#: Defaults of export/import: values stream from or into a file at disk speed, so more blocks in
#: flight buy nothing (bench/bench_export.py: 256MiB and 16MiB chunks ran faster than 1GiB/64MiB).
EXCHANGE_MEMORY_LIMIT = size_default("256MiB")
OptionalSpecOpt = Annotated[
    str | None,
    typer.Option(
        "--spec",
        help="A migrate spec (YAML or .toml): rules applied first (rename, transpose, "
        "unstack, ...); their match/from/exclude are leaf patterns: "
        "docs/reference/layouts.md#leaf-patterns.",
        show_default=False,
    ),
]
