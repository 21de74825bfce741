"""The one context every command builds (``run_context``): the storage options of the app's
global flags, the output mode and its progress bar, how the work scales; and ``write_plan``, the one
way a writer shows its plan, executes it and reports.

Apart from ``_options`` so that shell completion (``_complete``), which ``_options`` imports,
reaches the same storage options without an import cycle.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import typer

if TYPE_CHECKING:
    from ckpt_cli.commands._output import Document
    from ckpt_cli.core.progress import ProgressFn
    from ckpt_cli.core.scale import ScaleOptions
    from ckpt_cli.core.storage import StorageOptions

P = TypeVar("P", bound="Document")
R = TypeVar("R", bound="Document")


def storage_options(ctx: typer.Context) -> StorageOptions:
    """The storage options of this run (set from ``--s3-endpoint`` and the environment by the
    app's callback; while the shell completes a line that callback does not run: from the
    flags parsed so far)."""
    from ckpt_cli.core.storage import StorageOptions

    root = ctx.find_root()
    if isinstance(root.obj, StorageOptions):
        return root.obj
    params = root.params or {}
    endpoint, limit = params.get("s3_endpoint"), params.get("max_requests")
    return StorageOptions.from_environment(
        s3_endpoint=endpoint if isinstance(endpoint, str) else None,
        max_requests=limit if isinstance(limit, int) else None,
    )


@dataclass(frozen=True)
class Run:
    """One run of a command: where it reads and writes (storage), whether it prints one JSON
    document (no colour, no progress bar, no prompt), and how its array work scales (``scale``:
    executor, unit size, threads; None: the command takes none of those flags)."""

    storage: StorageOptions
    json_out: bool = False
    scale: ScaleOptions | None = None

    def progress(self, min_bytes: int = 0) -> AbstractContextManager[ProgressFn | None]:
        """The one progress bar (stderr, a terminal, not --json); see ``progress_bar``."""
        from ckpt_cli.commands._output import progress_bar

        return progress_bar(not self.json_out, min_bytes)


def run_context(
    ctx: typer.Context,
    json_out: bool = False,
    scale: ScaleOptions | None = None,
    *,
    start: bool = False,
) -> Run:
    """The context of this run. ``scale``: the command's scale flags (``ScaleOptions``; its
    ``threads``, ``--threads``, are set once for this process, ``core/threads.py``). ``start``:
    the run will use the executor, so its workers are started now, before the command lists and
    plans (and released when the command ends if it never used them)."""
    from ckpt_cli.core.threads import tune_allocator, use_threads

    tune_allocator()
    if scale is not None and scale.threads is not None:
        use_threads(scale.threads)
    if scale is not None and start:
        from ckpt_cli.core.executor import release_early, start_early

        spec = scale.executor
        start_early(spec)
        ctx.call_on_close(lambda: release_early(spec))
    return Run(storage_options(ctx), json_out, scale)


def write_plan(
    run: Run,
    plan: P,
    execute: Callable[[P, ProgressFn | None], R],
    *,
    dry_run: bool,
    print_plan: Callable[[P], Any],
    print_result: Callable[[R], Any],
    warnings: Iterable[str] = (),
    plan_first: bool = True,
) -> R | None:
    """A writer's tail: a refused plan raises its refusal (with --json the plan in the error
    document, with --dry-run the plan printed first); its warnings; with --dry-run the plan (text
    or the one document) and the dry-run line on stderr, nothing else; otherwise the plan before the first byte is written (unless ``plan_first`` is
    False: export and import show it with the result), the work under the progress bar, then
    the result (text or the one document)."""
    from ckpt_cli.commands._output import dry_run_note, emit_json, warn

    refusal = getattr(plan, "refusal", None)  # reshard and migrate refuse in their plan
    if refusal is not None:
        shown = None  # where the refused plan is shown, if it is
        if run.json_out:
            refusal.result = plan.to_json()  # the refused plan, in the one error document
            shown = "the plan in the JSON document"
        elif dry_run:
            print_plan(plan)
            shown = "the plan above"
        if shown and refusal.hint:  # no "--dry-run lists ..." when the list is there already
            refusal.hint = refusal.hint.replace("--dry-run lists", f"{shown} lists")
        raise refusal
    for message in warnings:
        warn(message)
    if dry_run:
        emit_json(plan) if run.json_out else print_plan(plan)
        dry_run_note()
        return None
    if not run.json_out and plan_first:
        print_plan(plan)  # before the first byte is written: what will happen
    with run.progress() as on_progress:
        result = execute(plan, on_progress)
    emit_json(result) if run.json_out else print_result(result)
    return result
