"""Step selections: ``--steps 100-300,500,700-`` as the commands that choose among a root's
steps take it (``cp``, ``trend``), and ``ROOT@STEPS[:ITEM]``, the suffix every command that
takes a step reads (``split_at``). A utility below every read and write operation."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from ckpt_cli.errors import UsageError

_PART_RE = re.compile(r"^\s*(\d*)\s*-\s*(\d*)\s*$|^\s*(\d+)\s*$")
#: What follows the last ``@`` of ``ROOT@STEPS[:ITEM]``: step numbers, ranges and commas, and
#: after a colon an item's plain name.
_AT_RE = re.compile(r"(?P<steps>[\d,\-\s]+)(?::(?P<item>[^/\\:@]+))?")


def split_at(path: str) -> tuple[str, str | None, str | None]:
    """``ROOT@STEPS`` -> (ROOT, STEPS, None) and ``ROOT@STEPS:ITEM`` -> (ROOT, STEPS, ITEM),
    where STEPS is step numbers (``6``, ``100-300,500``; ``parse_steps`` reads them); anything
    else, or a path of that very name that exists (a directory may hold an ``@``), is the
    path itself: (path, None, None). The rule of ``diff``, ``cp`` and every command that takes
    a step (``commands/_options.at_step``)."""
    head, at, tail = path.rpartition("@")
    m = _AT_RE.fullmatch(tail)
    if not at or not head or m is None or os.path.exists(path):
        return path, None, None
    return head, m.group("steps"), m.group("item")


@dataclass(frozen=True)
class StepSelection:
    """Inclusive ranges of step numbers (``None`` ends are open); ``singles`` are the steps
    asked for by number, which must exist and be committed (a range may match none of its
    numbers)."""

    ranges: tuple[tuple[int | None, int | None], ...] = ()
    singles: tuple[int, ...] = ()
    latest: bool = False

    @property
    def everything(self) -> bool:
        return not self.ranges and not self.singles and not self.latest

    def matches(self, step: int) -> bool:
        if step in self.singles:
            return True
        return any(
            (lo is None or step >= lo) and (hi is None or step <= hi) for lo, hi in self.ranges
        )

    def describe(self) -> str:
        parts = [str(s) for s in self.singles]
        parts += [
            f"{'' if lo is None else lo}-{'' if hi is None else hi}" for lo, hi in self.ranges
        ]
        return ",".join(parts) or ("latest" if self.latest else "all")


def parse_steps(text: str, option: str = "--steps") -> StepSelection:
    """``100-300``, ``100-``, ``-300``, ``500`` and comma lists of them."""
    ranges: list[tuple[int | None, int | None]] = []
    singles: list[int] = []
    for part in text.split(","):
        m = _PART_RE.match(part)
        if not m or (m.group(3) is None and not (m.group(1) or m.group(2))):
            raise UsageError(
                f"{option} {text!r} is not a list of steps",
                hint="use e.g. 100-300, 500, 100- (from 100 on) or 100-300,500",
            )
        if m.group(3) is not None:
            singles.append(int(m.group(3)))
            continue
        lo = int(m.group(1)) if m.group(1) else None
        hi = int(m.group(2)) if m.group(2) else None
        if lo is not None and hi is not None and lo > hi:
            raise UsageError(f"{option} {text!r}: the range {lo}-{hi} is empty (start > end)")
        ranges.append((lo, hi))
    return StepSelection(tuple(ranges), tuple(singles))
