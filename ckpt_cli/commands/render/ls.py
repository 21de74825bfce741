"""Text of ``ckpt ls``: a table of the steps, a summary line, and the warnings on stderr."""

from __future__ import annotations

import json

from rich.table import Table

from ckpt_cli.commands._output import stdout_console
from ckpt_cli.commands.render.units import human_age, human_bytes
from ckpt_cli.core.listing import RootListing, StepInfo

_STATUS = {
    "committed": "[green]committed[/]",
    "incomplete": "[yellow]incomplete[/]",
    "uncommitted": "[red]uncommitted[/]",
}


def print_listing(listing: RootListing) -> None:
    table = Table(title=listing.root, title_justify="left", box=None, pad_edge=False)
    for col, justify in (
        ("step", "right"),
        ("status", "left"),
        ("committed", "left"),
        ("age", "right"),
        ("size", "right"),
        ("items", "left"),
        ("metrics", "left"),
        ("format", "left"),
    ):
        table.add_column(col, justify=justify, no_wrap=col != "metrics")  # type: ignore[arg-type]
    for s in listing.steps:
        when = s.committed_at.astimezone().strftime("%Y-%m-%d %H:%M")
        if s.time_source == "mtime":
            when += " (mtime)"
        metrics = ", ".join(f"{k}={_metric(v)}" for k, v in (s.metrics or {}).items())
        formats = sorted(set(s.formats.values()))
        table.add_row(
            f"{s.step}{' *' if s.latest else ''}",
            _STATUS[s.status] + (", [cyan]pinned[/]" if s.pinned else ""),
            when,
            human_age(s.committed_at),
            human_bytes(s.size_bytes),
            ",".join(s.items),
            metrics,
            ",".join(formats),
        )
    console = stdout_console()
    console.print(table)
    latest = listing.latest
    console.print(
        f"{len(listing.steps)} steps, {human_bytes(listing.total_bytes)}"
        + (f"; latest committed: {latest.step} (*)" if latest else "; no committed step")
    )
    for s in listing.steps:
        if s.pinned is not None:
            note = f": {s.pinned.note}" if s.pinned.note else ""
            console.print(f"pinned {s.step}{note} (prune keeps it; `ckpt unpin` releases it)")
    if listing.root_metadata and listing.root_metadata.get("custom_metadata"):
        console.print(f"root metadata: {json.dumps(listing.root_metadata['custom_metadata'])}")


def warnings(listing: RootListing) -> list[str]:
    """What ``ls`` says on stderr: damaged steps, ignored directories, uncommitted steps."""
    out = [f"step {s.step}: {s.problem}" for s in listing.steps if s.problem]
    if listing.ignored:
        out.append(f"not steps, ignored: {', '.join(listing.ignored)}")
    out += [_uncommitted_hint(s, listing.root) for s in listing.steps if s.status == "uncommitted"]
    return out


def _uncommitted_hint(s: StepInfo, root: str) -> str:
    """An object-store step without commit_success.txt: a save in progress or interrupted, or a
    complete step copied without its marker (Orbax issue #394): say how to tell and fix."""
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


def _metric(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
