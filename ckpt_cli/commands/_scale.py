"""Options of the commands that scale out (verify, reshard, migrate): where units run."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from ckpt_cli.commands._common import parse_size

if TYPE_CHECKING:
    from ckpt_cli.core.executor import ExecutorSpec
    from ckpt_cli.core.write.distributed import ScaleStats

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
    str,
    typer.Option(
        "--unit-bytes",
        help="Array bytes per unit of work when scaled out (whole chunks; small leaves share one).",
    ),
]


def executor_spec(executor: str, workers: int, scheduler: str | None) -> ExecutorSpec:
    from ckpt_cli.core.executor import EXECUTORS, ExecutorSpec
    from ckpt_cli.errors import UsageError

    if executor not in EXECUTORS:
        raise UsageError(f"--executor {executor!r}: use local or dask")
    if scheduler and executor != "dask":
        raise UsageError("--scheduler applies to --executor dask")
    return ExecutorSpec(executor, workers, scheduler)


def unit_bytes(text: str) -> int:
    return parse_size(text, "--unit-bytes")


def stats_json(stats: ScaleStats | None) -> dict[str, Any] | None:
    if stats is None:
        return None
    return {
        "executor": stats.executor,
        "workers": stats.workers,
        "units": stats.units,
        "databases": stats.databases,
        "worker_seconds": round(stats.worker_seconds, 3),
        "merge_seconds": round(stats.merge_seconds, 3),
    }


def stats_line(stats: ScaleStats) -> str:
    return (
        f"{stats.units} units on {stats.workers} {stats.executor} workers "
        f"({stats.databases} worker databases merged in {stats.merge_seconds:.2f} s)"
    )
