"""Text of ``ckpt prune``: the plan (kept steps with their reasons, deletions with sizes), the
outcome, and the warnings."""

from __future__ import annotations

from datetime import datetime

from rich.table import Table

from ckpt_cli.commands._output import stdout_console
from ckpt_cli.commands.render.units import human_bytes
from ckpt_cli.core.prune.execute import PruneOutcome
from ckpt_cli.core.prune.plan import SYMLINK_KEPT, PrunePlan
from ckpt_cli.core.prune.policy import MetricRank

_CLEAN_WHY = {"tmp": "unfinished save", "trash": "trash of an interrupted prune"}


def _when(t: datetime | None) -> str:
    return t.astimezone().strftime("%Y-%m-%d %H:%M") if t else ""


def _rank(m: MetricRank | None) -> str:
    if m is None or m.value is None:
        return "-"
    return f"{m.value:.4g} #{m.rank}"


def render_plan(plan: PrunePlan, *, dry_run: bool) -> None:
    title = plan.root + ("  (dry run)" if dry_run else "")
    table = Table(title=title, title_justify="left", box=None, pad_edge=False)
    table.add_column("step", justify="right", no_wrap=True)
    table.add_column("action", no_wrap=True)
    table.add_column("committed", no_wrap=True)
    table.add_column("size", justify="right", no_wrap=True)
    metric = plan.policy.metric if plan.policy.keep_best else None
    if metric:  # the values --keep-best ranked by, so a person sees why a step goes
        table.add_column(metric, justify="right", no_wrap=True)
    table.add_column("why")
    rows: list[tuple[int, str, tuple[str, ...]]] = []
    for k in plan.keep:
        cells = [k.name, "[green]keep[/]", _when(k.committed_at), ""]
        cells += [_rank(k.metric)] if metric else []
        rows.append((k.step, k.name, (*cells, ", ".join(k.reasons))))
    for r in plan.delete:
        cells = [r.name, "[red]delete[/]", _when(r.committed_at), human_bytes(r.size_bytes)]
        cells += [_rank(r.metric)] if metric else []
        rows.append((r.step or 0, r.name, (*cells, "")))
    for _, _, row in sorted(rows, key=lambda x: (x[0], x[1])):
        table.add_row(*row)
    console = stdout_console()
    console.print(table)
    if plan.clean or plan.untouched:
        others = Table(box=None, pad_edge=False)
        for col in ("other directory", "action", "size", "why"):
            others.add_column(
                col, justify="right" if col == "size" else "left", no_wrap=col != "why"
            )
        for r in plan.clean:
            others.add_row(r.name, "[red]remove[/]", human_bytes(r.size_bytes), _CLEAN_WHY[r.kind])
        for u in plan.untouched:
            others.add_row(u.name, "[dim]leave[/]", "", u.why)
        console.print(others)
    would = "would free" if dry_run else "frees"
    parts = [f"keep {_n(len(plan.keep), 'step')}", f"delete {_n(len(plan.delete), 'step')}"]
    if plan.clean:
        parts.append(
            f"remove {_n(len(plan.clean), 'tmp/trash directory', 'tmp/trash directories')}"
        )
    console.print("; ".join(parts) + f": {would} {human_bytes(plan.freed_bytes)}")


def _n(count: int, one: str, many: str | None = None) -> str:
    return f"{count} {one if count == 1 else many or one + 's'}"


def render_outcome(plan: PrunePlan, outcome: PruneOutcome) -> None:
    steps = sum(1 for r in outcome.deleted if r.kind == "step")
    others = len(outcome.deleted) - steps
    line = f"deleted {_n(steps, 'step')}"
    if others:
        line += f" and {_n(others, 'tmp/trash directory', 'tmp/trash directories')}"
    if plan.is_noop:
        line = "nothing to delete"
    stdout_console().print(f"{line}; freed {human_bytes(outcome.freed_bytes)}")


def plan_warnings(plan: PrunePlan) -> list[str]:
    out = [
        f"step {k.step} is a symlink: kept, prune never deletes through a link"
        for k in plan.keep
        if SYMLINK_KEPT in k.reasons
    ]
    kept = {k.step for k in plan.keep}
    out += [
        f"--keep-step {missing}: no committed step {missing} in {plan.root}"
        for missing in sorted(plan.policy.keep_steps - kept)
    ]
    return out


def outcome_warnings(outcome: PruneOutcome) -> list[str]:
    return [f"{s.name} not deleted: {s.why}" for s in (*outcome.skipped, *outcome.failed)]


def confirm_question(plan: PrunePlan) -> str:
    return f"Delete {len(plan.delete)} steps and {len(plan.clean)} other directories?"
