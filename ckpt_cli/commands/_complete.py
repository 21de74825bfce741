"""Shell completion of the values only a checkpoint knows: step numbers and item names.

Typer's completion (``ckpt --install-completion`` / ``--show-completion`` for bash, zsh and fish)
calls these with the command line parsed so far: once a root is on the line (the command's
PATH, SRC or ROOT argument, ROOT@STEP included), ``--step`` completes its committed steps and
``--item`` the items of the chosen step (``--step``, ROOT@STEP, else the latest); ``ROOT@``
completes to ``ROOT@STEP``. They list directories only (no array data, no JAX), and
stay silent on any error: a completion never prints a traceback into the shell.
"""

from __future__ import annotations

from typing import Any

import typer

_PATH_PARAMS = ("path", "src", "root", "a")
#: The app's flags that take a value (``ckpt --s3-endpoint URL ls ...``): not the root.
_GLOBAL_VALUED = ("--s3-endpoint", "--max-requests")


def _root_on_line(ctx: Any) -> str | None:
    params = getattr(ctx, "params", None) or {}
    for name in _PATH_PARAMS:
        value = params.get(name)
        if isinstance(value, str) and value:
            from ckpt_cli.core.step_ranges import split_at

            return split_at(value)[0]
    # An option still waiting for its value (``--step <TAB>``) stops Click's parsing before the
    # arguments are set: read the line the shell handed over instead.
    import os
    import shlex

    line = os.environ.get("COMP_WORDS") or os.environ.get("_TYPER_COMPLETE_ARGS") or ""
    try:
        words = shlex.split(line)
    except ValueError:
        words = line.split()
    rest = words[1:]
    while rest and rest[0].startswith("-"):  # the app's own flags, before the command
        rest = rest[2:] if rest[0] in _GLOBAL_VALUED else rest[1:]
    for word in rest[1:]:
        candidate = word.rpartition("@")[0] if "@" in word and not os.path.exists(word) else word
        if not word.startswith("-") and ("://" in candidate or os.path.isdir(candidate)):
            return candidate
    return None


def _committed_steps(ctx: typer.Context, path: str) -> list[int]:
    from ckpt_cli.commands._context import storage_options
    from ckpt_cli.core.listing import list_root
    from ckpt_cli.core.storage import open_location

    listing = list_root(open_location(path, storage_options(ctx)), from_listing=True)
    return [s.step for s in listing.steps if s.status == "committed"]


def complete_step(ctx: typer.Context, incomplete: str) -> list[str]:
    """Committed step numbers of the root given earlier on the line."""
    path = _root_on_line(ctx)
    if path is None:
        return []
    try:
        steps = _committed_steps(ctx, path)
    except Exception:  # not a root (yet), unreachable: offer nothing
        return []
    return [str(s) for s in steps if str(s).startswith(incomplete)]


def complete_item(ctx: typer.Context, incomplete: str) -> list[str]:
    """Item names of the step chosen so far (``--step``, else the latest committed)."""
    path = _root_on_line(ctx)
    if path is None:
        return []
    try:
        from ckpt_cli.commands._context import storage_options
        from ckpt_cli.core.format.discovery import detect, latest_committed, step_items
        from ckpt_cli.core.storage import open_location

        location = open_location(path, storage_options(ctx))
        found = detect(location)
        steps = found.steps or []
        step = (getattr(ctx, "params", None) or {}).get("step") or _step_on_line(ctx)
        ref = next((s for s in steps if s.step == step and s.committed), None)
        ref = ref or latest_committed(steps)
        if ref is None:
            return []
        items = step_items(ref.location, ref.children, None)
    except Exception:
        return []
    return [i for i in items if i.startswith(incomplete) and i != "metrics"]


def _step_on_line(ctx: Any) -> int | None:
    """The step a ROOT@STEP argument names, if one does."""
    from ckpt_cli.core.step_ranges import split_at

    params = getattr(ctx, "params", None) or {}
    for name in _PATH_PARAMS:
        value = params.get(name)
        steps = split_at(value)[1] if isinstance(value, str) else None
        if steps is not None and steps.strip().isdigit():
            return int(steps)
    return None


def complete_root_at_step(ctx: typer.Context, incomplete: str) -> list[str]:
    """``ROOT@`` completes to ``ROOT@STEP`` for each committed step (the path of every command
    that takes a step)."""
    root, at, partial = incomplete.rpartition("@")
    if not at:
        return []
    try:
        steps = _committed_steps(ctx, root)
    except Exception:
        return []
    return [f"{root}@{s}" for s in steps if str(s).startswith(partial)]
