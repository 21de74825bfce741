"""What the commands that write a new step share (reshard, migrate): options, limits, progress,
and the write itself with its report."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from ckpt_cli.commands._common import emit_json, human_bytes, parse_size, stdout_console

if TYPE_CHECKING:
    from ckpt_cli.core.executor import ExecutorSpec
    from ckpt_cli.core.format.layout import ItemRef
    from ckpt_cli.core.storage import Location
    from ckpt_cli.core.write.rewrite import StepOutput
    from ckpt_cli.core.write.types import LeafOut

# Options of the commands that write a new step (reshard, migrate).
MaxChunkBytesOpt = Annotated[
    str,
    typer.Option(
        "--max-chunk-bytes", help="Split a device's shard into equal chunks no larger than this."
    ),
]
MemoryLimitOpt = Annotated[
    str,
    typer.Option(
        "--memory-limit",
        help="Bytes of array data held at once (blocks in flight plus TensorStore's cache).",
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


T = TypeVar("T")


def with_progress(
    label: str, total: int, allowed: bool, run: Callable[[Callable[[int], None] | None], T]
) -> T:
    """Run ``run(on_bytes)`` under a transient byte progress bar on stderr (a terminal only)."""
    if not (allowed and sys.stderr.isatty()):
        return run(None)
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    with Progress(
        TextColumn(label), BarColumn(), DownloadColumn(), TransferSpeedColumn(), transient=True
    ) as progress:
        task = progress.add_task(label, total=total)
        return run(lambda n: progress.advance(task, n))


def write_limits(max_chunk_bytes: str, memory_limit: str) -> tuple[int, int]:
    """``--max-chunk-bytes`` and ``--memory-limit`` in bytes; a chunk fits a quarter of the limit."""
    chunk_limit = parse_size(max_chunk_bytes, "--max-chunk-bytes")
    mem_limit = parse_size(memory_limit, "--memory-limit")
    if chunk_limit * 4 > mem_limit:
        from ckpt_cli.errors import UsageError

        raise UsageError(
            f"--max-chunk-bytes ({human_bytes(chunk_limit)}) must be at most a quarter "
            f"of --memory-limit ({human_bytes(mem_limit)})"
        )
    return chunk_limit, mem_limit


def write_and_report(
    label: str,
    ref: ItemRef,
    destination: Location,
    leaves: list[LeafOut],
    *,
    total: int,
    json_doc: dict[str, Any] | None,
    print_plan: Callable[[], None],
    after: Callable[[StepOutput], dict[str, Any]] | None = None,
    scale: ExecutorSpec | None = None,
    **write_args: Any,
) -> None:
    """``write_step`` under a progress bar, then the result: added to ``json_doc`` and printed
    as JSON, or the plan and one line with the rate. ``after`` runs on the written step; what it
    returns joins the JSON document (or is printed as ``key: value`` lines). With a ``scale``
    that splits the work, units run on its executor (the progress bar sums their bytes)."""
    from ckpt_cli.commands._scale import stats_json, stats_line
    from ckpt_cli.core.executor import open_executor
    from ckpt_cli.core.write.rewrite import write_step

    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        if scale is not None and scale.scaled:
            write_args["executor"] = stack.enter_context(open_executor(scale))
        result = with_progress(
            label,
            total,
            json_doc is None,
            lambda on_bytes: write_step(ref, destination, leaves, on_bytes=on_bytes, **write_args),
        )
    seconds = time.monotonic() - started
    extra = after(result) if after is not None else {}
    if json_doc is not None:
        json_doc.update(
            {
                "output": result.path,
                "step": result.step,
                "item": result.item,
                "bytes_written": result.bytes_written,
                "seconds": round(seconds, 3),
                "scale": stats_json(result.scale),
                **extra,
            }
        )
        emit_json(json_doc)
        return
    print_plan()
    rate = result.bytes_written / seconds if seconds > 0 else 0
    stdout_console().print(
        f"wrote step {result.step} to {result.path}: "
        f"{human_bytes(result.bytes_written)} in {seconds:.1f} s ({human_bytes(int(rate))}/s)"
    )
    if result.scale is not None:
        stdout_console().print(stats_line(result.scale))
    for key, value in extra.items():
        stdout_console().print(f"{key}: {value}")
