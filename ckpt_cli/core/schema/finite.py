"""NaN and Inf in the JSON documents ckpt prints: strict JSON, with the meaning kept beside.

JSON (RFC 8259) has no NaN, Infinity or -Infinity; Python's ``json`` writes them as bare tokens
that JavaScript's ``JSON.parse``, Go's ``encoding/json`` and ``jq`` refuse. A diverging run puts
them in metrics (Orbax writes ``{"loss": NaN}``) and in every figure computed over its values.

The convention, once for every document (docs/reference/json.md, "NaN and Inf"): such a float is
written ``null``, and beside its key ``<key>`` the key ``<key>_nonfinite`` says which it was:
``"nan"``, ``"inf"`` or ``"-inf"`` (null when the value is a number or absent). A mapping of
values named by the user (metrics) keeps its names: each non-finite value is null and
``<key>_nonfinite`` maps its name (nested names joined by ``.``) to its kind.

``split_nonfinite`` is also the last guard of every printed document
(``commands._output``): a NaN or Inf that reached it without its result saying so is written
null all the same, never as a bare token.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypedDict

#: What a non-finite float was.
NonFinite = Literal["nan", "inf", "-inf"]


def nonfinite_kind(value: object) -> NonFinite | None:
    """``"nan"``, ``"inf"`` or ``"-inf"`` for such a float, None for anything else."""
    if not isinstance(value, float) or math.isfinite(value):
        return None
    if math.isnan(value):
        return "nan"
    return "inf" if value > 0 else "-inf"


def finite_or_none(value: float | None) -> float | None:
    """``value`` where it is a number, None where it is NaN or Inf (or absent)."""
    return None if value is None or not math.isfinite(value) else value


def split_nonfinite(value: Any) -> tuple[Any, dict[str, NonFinite]]:
    """``value`` (any JSON value: a mapping of metrics, a whole document) with each NaN and Inf
    float as None, and where each was: its keys and list indexes joined by ``.`` -> its kind.
    Nothing non-finite: ``value`` itself, unchanged, and ``{}``."""
    found: dict[str, NonFinite] = {}

    def walk(v: Any, path: tuple[str, ...]) -> Any:
        kind = nonfinite_kind(v)
        if kind is not None:
            found[".".join(path)] = kind
            return None
        if isinstance(v, dict):
            return {k: walk(x, (*path, str(k))) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [walk(x, (*path, str(i))) for i, x in enumerate(v)]
        return v

    cleaned = walk(value, ())
    return (cleaned, found) if found else (value, {})


class DivergenceJSON(TypedDict):
    """Where a run's values stopped being finite (``trend``, ``verify``)."""

    first_nonfinite_step: int
    last_finite_step: int | None
    leaves: list[str]
    nonfinite_steps: list[int]


@dataclass(frozen=True)
class Divergence:
    """The first listed step where a leaf holds NaN/Inf, the last listed step before it whose
    leaves are all finite (what to resume from; None when none is), the leaves already
    non-finite at the first, and every step with any."""

    first_step: int
    last_finite_step: int | None
    leaves: tuple[str, ...]
    steps: tuple[int, ...]

    def to_json(self) -> DivergenceJSON:
        return {
            "first_nonfinite_step": self.first_step,
            "last_finite_step": self.last_finite_step,
            "leaves": list(self.leaves),
            "nonfinite_steps": list(self.steps),
        }


def find_divergence(steps: Sequence[int], bad: Mapping[int, Sequence[str]]) -> Divergence | None:
    """The verdict over the listed ``steps`` from ``bad`` (step -> the leaves holding NaN/Inf
    there); None when no step has any."""
    at = sorted(s for s, leaves in bad.items() if leaves)
    if not at:
        return None
    before = [s for s in steps if s < at[0]]
    return Divergence(at[0], before[-1] if before else None, tuple(bad[at[0]]), tuple(at))
