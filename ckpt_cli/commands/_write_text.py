"""Text of a written step (reshard, migrate): what was written and how fast (the plan is
printed before the writing starts)."""

from __future__ import annotations

from ckpt_cli.commands._output import stdout_console
from ckpt_cli.commands.render.units import human_bytes
from ckpt_cli.core.write.rewrite import WriteResult


def print_result(result: WriteResult) -> None:
    out = result.output
    console = stdout_console()
    console.print(
        f"wrote step {out.step} to {out.path}"
        + (f" (items {', '.join(out.items)})" if len(out.items) > 1 else "")
        + ": "
        f"{human_bytes(out.bytes_written)} in {result.seconds:.1f} s "
        f"({human_bytes(int(result.rate))}/s)"
    )
    if out.scale is not None and not out.scale.split:
        console.print(f"not split: {out.scale.reason}")
    elif out.scale is not None:
        s = out.scale
        console.print(
            f"{s.units} units on {s.workers} {s.executor} workers "
            f"({s.databases} worker databases merged in {s.merge_seconds:.2f} s)"
        )
    if out.unchecked:
        several = len(out.items) > 1
        names = [f"{item}/{leaf}" if several else leaf for item, leaf in out.unchecked]
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        console.print(
            f"{len(names)} version-1 (SHA-256) digests carried unchecked (not written as one "
            f"C-order stream): {shown}; `ckpt verify --deep {out.path}` checks them"
        )
    if result.digests is not None:
        console.print(f"digests: {result.digests}")
