"""Text of ``ckpt cp``: the plan per step (state at the destination, objects, bytes), then what
was copied and what was found whole at the destination."""

from __future__ import annotations

from ckpt_cli.commands._text import emit, human_bytes, painter, say, table_lines, use_color
from ckpt_cli.core.copy.execute import CopyLeft, CopyResult
from ckpt_cli.core.copy.plan import CopyPlan

_STATE = {"new": ("new", "green"), "resume": ("resume", "yellow"), "present": ("present", "")}


def print_plan(plan: CopyPlan) -> None:
    color = use_color()
    paint = painter(color)
    rows = []
    for s in plan.steps:
        n, b = s.pending()
        label, style = _STATE[s.state]
        rows.append(
            [
                (s.name, ""),
                (label, style),
                (str(len(s.objects)), ""),
                (human_bytes(s.bytes), ""),
                (f"{n} ({human_bytes(b)})", ""),
                (str(len(s.objects) - n), ""),
            ]
        )
    # Checkpointer saves side by side (ckpt_dir/state) have names, no step numbers.
    saves = bool(plan.steps) and all(s.step is None for s in plan.steps)
    first = "save" if saves else "step"
    headers = [first, "destination", "objects", "bytes", "to copy", "to check"]
    emit(table_lines(headers, rows, paint, right=frozenset({2, 3, 5})), color)
    for name, reason in plan.skipped:
        say(f"not copied: {name} ({reason})", color, "yellow")
    root = [o.rel for o in plan.root_files if o.dest_size is None]
    extra = f" and {len(root)} root metadata files" if root else ""
    say(
        f"{len(plan.steps)} {'saves' if saves else 'steps'}{extra}: {plan.total_objects} objects, "
        f"{human_bytes(plan.total_bytes)}, from {plan.source} to {plan.destination}",
        color,
    )


def print_result(result: CopyResult) -> None:
    o = result.outcome
    color = use_color()
    rate = o["copied_bytes"] / o["seconds"] if o["seconds"] > 0 else 0.0
    there = sum(1 for s in o["steps"] if s["status"] == "already-there")
    say(
        f"copied {o['copied_objects']} objects ({human_bytes(o['copied_bytes'])}) in "
        f"{o['seconds']:.1f} s ({human_bytes(int(rate))}/s); {o['skipped_objects']} objects "
        f"({human_bytes(o['skipped_bytes'])}) already at the destination, checked"
        + (f"; {there} steps were there whole" if there else ""),
        color,
    )
    if o["verified_objects"]:
        say(f"{o['verified_objects']} files matched their recorded digests", color)
    for item in o["unverified_items"]:
        say(f"no recorded file checksums in {item}: its files were not checked", color, "yellow")


def interrupted_note(left: CopyLeft) -> str:
    """What an interrupted copy says on stderr: the steps copied, the unfinished ones kept (and
    where) for a rerun to resume."""
    text = f"interrupted: {len(left.committed)} of {left.planned} steps copied"
    if not left.unfinished:
        return text + "; no step is half-written; a rerun copies the rest"
    names = ", ".join(name for name, _ in left.unfinished)
    where = ", ".join(str(loc) for _, loc in left.unfinished)
    bucket = any(loc.requires_commit_marker for _, loc in left.unfinished)
    how = " (uncommitted: no commit_success.txt)" if bucket else ""
    if len(left.unfinished) == 1:
        return f"{text}; the partial step {names} is kept in {where}{how} so a rerun resumes it"
    return f"{text}; the partial steps {names} are kept in {where}{how} so a rerun resumes them"
