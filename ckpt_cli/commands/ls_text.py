"""Text of ``ckpt ls``: a table of the steps, a summary line, and the warnings on stderr."""

from __future__ import annotations

import json

from ckpt_cli.commands._text import (
    emit,
    human_age,
    human_bytes,
    painter,
    plural,
    said,
    table_lines,
    use_color,
)
from ckpt_cli.core.format.names import DELETION_RECORD, TMP_MARKER
from ckpt_cli.core.listing import RootListing, StepInfo

_STATUS = {"committed": "green", "incomplete": "yellow", "uncommitted": "red", "partial": "yellow"}


def print_listing(listing: RootListing, extra: list[str] | None = None) -> None:
    """The table, then the summary lines, then ``extra`` lines (``ls -v``)."""
    color = use_color()
    paint = painter(color)
    rows = []
    for s in listing.steps:
        when = s.committed_at.astimezone().strftime("%Y-%m-%d %H:%M")
        if s.time_source == "mtime":
            when += " (mtime)"
        rows.append(
            [
                (_label(s, listing.root), ""),
                (s.status + (", pinned" if s.pinned else ""), _STATUS[s.status]),
                (when, ""),
                (human_age(s.committed_at), ""),
                (human_bytes(s.size_bytes), ""),
                (",".join([*s.items, *(f"{d} (deleting)" for d in s.deleting)]), ""),
                (",".join(sorted(set(s.formats.values()))), ""),
                _metrics_cell(s),
            ]
        )
    # Metrics last: the column that grows, wrapped at spaces (or each step a block) when the
    # terminal is narrow, never dropped.
    headers = ["step", "status", "committed", "age", "size", "items", "format", "metrics"]
    # Built whole, then written at once: a Ctrl-C or SIGTERM while it is built leaves nothing on
    # stdout, not the root's name alone or half a table.
    right = _kind_column(headers, rows, listing.steps)
    out = [paint(listing.root, "bold")]
    out += table_lines(headers, rows, paint, right=right, wrap_last=True)
    latest = listing.latest
    unnumbered = bool(listing.steps) and not listing.steps[0].numbered
    if unnumbered:
        count = (
            f"{plural(len(listing.steps), 'checkpoint')} without a step number "
            "(saved by a Checkpointer, not a manager)"
        )
    else:
        count = plural(len(listing.steps), "step")
    committed = latest or (unnumbered and any(s.status == "committed" for s in listing.steps))
    texts = [
        f"{count}, {human_bytes(listing.total_bytes)}"
        + (
            f"; latest committed: {latest.step} (*)"
            if latest and latest.numbered
            else ("" if committed else "; no committed step")
        )
    ]
    for s in listing.steps:
        if s.pinned is not None:
            note = f": {s.pinned.note}" if s.pinned.note else ""
            texts.append(f"pinned {s.step}{note} (prune keeps it; `ckpt unpin` releases it)")
    texts += _tier_lines(listing.steps)
    if listing.root_metadata and listing.root_metadata.get("custom_metadata"):
        texts.append(f"root metadata: {json.dumps(listing.root_metadata['custom_metadata'])}")
    texts += extra or []
    for text in texts:
        out += said(text, color)
    emit(out, color)


def _tier_lines(steps: tuple[StepInfo, ...]) -> list[str]:
    """One line per local tier among the steps (committed, whole for their host only)."""
    by_note: dict[str, list[StepInfo]] = {}
    for s in steps:
        if s.local_tier is not None:
            looks = "looks like the " if s.local_tier.marker == "single-writer" else ""
            by_note.setdefault(looks + s.local_tier.describe(), []).append(s)
    out = []
    for note, group in by_note.items():
        if all(s.numbered for s in group):
            what = ("steps " if len(group) > 1 else "step ") + ", ".join(str(s.step) for s in group)
        else:
            what = ", ".join(_what(s) for s in group)
        out.append(f"{what}: {note}")
    return out


def _kind_column(
    headers: list[str], rows: list[list[tuple[str, str]]], steps: tuple[StepInfo, ...]
) -> frozenset[int]:
    """A ``kind`` column after the step's, only when the root mixes kinds (a
    flax.training.checkpoints step beside a manager's); the right-aligned columns."""
    if len({s.kind for s in steps}) < 2:
        return frozenset({0, 3, 4})
    headers.insert(1, "kind")
    for row, s in zip(rows, steps, strict=True):
        row.insert(1, (s.kind, ""))
    return frozenset({0, 4, 5})


def _label(s: StepInfo, root: str) -> str:
    """The step column: the step number; ``-`` for the one checkpoint a Checkpointer's directory
    is; a save's name when the listed directory holds several saves side by side."""
    if s.numbered:
        return f"{s.step}{' *' if s.latest else ''}"
    return "-" if s.path == root else s.name


def warnings(listing: RootListing) -> list[str]:
    """What ``ls`` says on stderr: damaged steps, ignored directories, uncommitted steps."""
    out = [f"step {s.step}: {s.problem}" for s in listing.steps if s.problem]
    if listing.ignored:
        out.append(f"not steps, ignored: {', '.join(listing.ignored)}")
    for s in listing.steps:
        if s.status == "uncommitted" and s.path.startswith(("s3://", "gs://")):
            out.append(_uncommitted_hint(s, listing.root))
        elif s.status != "committed" and s.reason and TMP_MARKER not in s.name:
            out.append(f"{_what(s)} is {s.status}: {s.reason}")
        if s.deleting:
            out.append(
                f"{_what(s)}: item {', '.join(s.deleting)} is being deleted "
                f"({DELETION_RECORD}): Orbax restores the step without it"
            )
    return out


def _what(s: StepInfo) -> str:
    return f"step {s.step}" if s.numbered else f"save {s.name}"


def _uncommitted_hint(s: StepInfo, root: str) -> str:
    """An object-store step without commit_success.txt: a save in progress or interrupted, or a
    complete step copied without its marker (Orbax issue #394): say how to tell and fix."""
    if not s.numbered:
        return _uncommitted_save_hint(s)
    target = f"{root} --step {s.step}" if s.path != root else s.path
    why = (
        "its _CHECKPOINT_METADATA records a commit, so it may be a complete step copied "
        "without its marker (Orbax issue #394)"
        if s.time_source == "commit_metadata"
        else "a save in progress or interrupted, or a copy without its marker (Orbax issue #394)"
    )
    return (
        f"step {s.step} has no commit_success.txt: Orbax and ckpt do not treat it as a "
        f"checkpoint; {why}; if no save is writing it, check it and mark it with "
        f"`ckpt verify {target} --mark-committed`"
    )


def _uncommitted_save_hint(s: StepInfo) -> str:
    """A Checkpointer's save on an object store without its commit_success.txt: Orbax writes it
    into the save directory itself when the save is done, so marking means marking the save."""
    return (
        f"save {s.name} has no commit_success.txt: Orbax writes it into the save when the save "
        "is done, so it is a save in progress or interrupted, or a copy without its marker; "
        f"if no save is writing it, check it and mark it with "
        f"`ckpt verify {s.path} --mark-committed`"
    )


_NONFINITE = {"nan": "NaN", "inf": "Inf", "-inf": "-Inf"}


def _metrics_cell(s: StepInfo) -> tuple[str, str]:
    """``loss=0.31, acc=0.9``; red when a metric is NaN or Inf (a diverged run), spelt as
    diff's notes spell them."""
    shown = [(k, _metric(v)) for k, v in (s.metrics or {}).items()]
    diverged = any(v in _NONFINITE.values() for _, v in shown)
    return ", ".join(f"{k}={v}" for k, v in shown), "red" if diverged else ""


def _metric(value: object) -> str:
    if isinstance(value, float):
        text = f"{value:.4g}"
        return _NONFINITE.get(text, text)
    return str(value)
