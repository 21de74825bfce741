"""Text of ``ckpt prune``: the plan (kept steps with their reasons, deletions with sizes), the
outcome, and the warnings."""

from __future__ import annotations

from datetime import datetime

from ckpt_cli.commands._text import emit, human_bytes, painter, plural, say, table_lines, use_color
from ckpt_cli.core.prune.execute import PruneOutcome
from ckpt_cli.core.prune.finite import Judgement
from ckpt_cli.core.prune.plan import SYMLINK_KEPT, PrunePlan
from ckpt_cli.core.prune.policy import MetricRank

_CLEAN_WHY = {"tmp": "unfinished save", "trash": "trash of an interrupted prune"}


def _when(t: datetime | None) -> str:
    return t.astimezone().strftime("%Y-%m-%d %H:%M") if t else ""


def _rank(m: MetricRank | None) -> str:
    """A --keep-best value and its rank: ``0.4633 #1``; ``nan``/``inf`` as they are (ranked
    below every finite value, so no rank); ``-`` when the step lacks the metric."""
    if m is None or m.value is None:
        return "-"
    return m.nonfinite or f"{m.value:.4g} #{m.rank}"


def _judged(j: Judgement) -> tuple[str, str]:
    """A step's metrics as --keep-last-finite judges them: ``finite``, ``loss=nan``, ``-``."""
    if j is None:
        return "-", "dim"
    if not j:
        return "finite", ""
    return ", ".join(f"{name}={kind}" for name, kind in j), "yellow"


def _columns(plan: PrunePlan) -> tuple[str | None, bool]:
    """The --keep-best metric's column (its name), and whether to show each step's non-finite
    metrics: with --keep-last-finite, or once a step has one (and --keep-best's column does
    not already show it)."""
    metric = plan.policy.metric if plan.policy.keep_best else None
    judged = [k.nonfinite for k in plan.keep] + [r.nonfinite for r in plan.delete]
    nonfinite = any(name != metric for j in judged for name, _ in j or ())
    return metric, bool(plan.policy.keep_last_finite) or nonfinite


def render_plan(plan: PrunePlan, *, dry_run: bool) -> None:
    color = use_color()
    paint = painter(color)
    emit([paint(plan.root, "bold") + ("  (dry run)" if dry_run else "")], color)
    metric, judged = _columns(plan)
    rows: list[tuple[int, str, list[tuple[str, str]]]] = []
    for k in plan.keep:
        cells = [(k.name, ""), ("keep", "green"), (_when(k.committed_at), ""), ("", "")]
        # The values --keep-best ranked by, so a person sees why a step goes.
        cells += [(_rank(k.metric), "")] if metric else []
        cells += [_judged(k.nonfinite)] if judged else []
        rows.append((k.step, k.name, [*cells, (", ".join(k.reasons), "")]))
    for r in plan.delete:
        cells = [(r.name, ""), ("delete", "red"), (_when(r.committed_at), "")]
        cells += [(human_bytes(r.size_bytes), "")]
        cells += [(_rank(r.metric), "")] if metric else []
        cells += [_judged(r.nonfinite)] if judged else []
        rows.append((r.step or 0, r.name, [*cells, ("", "")]))
    ordered = [row for _, _, row in sorted(rows, key=lambda x: (x[0], x[1]))]
    headers = ["step", "action", "committed", "size", *([metric] if metric else [])]
    headers += ["metrics"] if judged else []
    right = frozenset({0, 3, 4}) if metric else frozenset({0, 3})
    emit(table_lines([*headers, "why"], ordered, paint, right=right, wrap_last=True), color)
    if plan.clean or plan.untouched:
        others = [
            [
                (r.name, ""),
                ("remove", "red"),
                (human_bytes(r.size_bytes), ""),
                (_CLEAN_WHY[r.kind], ""),
            ]
            for r in plan.clean
        ]
        others += [[(u.name, ""), ("leave", "dim"), ("", ""), (u.why, "")] for u in plan.untouched]
        headers = ["other directory", "action", "size", "why"]
        emit(table_lines(headers, others, paint, right=frozenset({2}), wrap_last=True), color)
    would = "would free" if dry_run else "frees"
    parts = [f"keep {plural(len(plan.keep), 'step')}", f"delete {plural(len(plan.delete), 'step')}"]
    if plan.clean:
        parts.append(
            f"remove {plural(len(plan.clean), 'tmp/trash directory', 'tmp/trash directories')}"
        )
    say("; ".join(parts) + f": {would} {human_bytes(plan.freed_bytes)}", color)


def render_outcome(plan: PrunePlan, outcome: PruneOutcome) -> None:
    steps = sum(1 for r in outcome.deleted if r.kind == "step")
    others = len(outcome.deleted) - steps
    line = f"deleted {plural(steps, 'step')}"
    if others:
        line += f" and {plural(others, 'tmp/trash directory', 'tmp/trash directories')}"
    if plan.is_noop:
        line = "nothing to delete"
    say(f"{line}; freed {human_bytes(outcome.freed_bytes)}", use_color())


def plan_warnings(plan: PrunePlan) -> list[str]:
    out = [*plan.warnings]
    out += [
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
    what = plural(len(plan.delete), "step")
    if plan.clean:
        what += f" and {plural(len(plan.clean), 'other directory', 'other directories')}"
    return f"Delete {what}?"
