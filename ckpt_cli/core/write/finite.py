"""The refusal every writer makes of NaN/Inf in the values it is to write: a run that diverged
is not averaged, exported, migrated, resharded or imported without a word. One check a block,
on the values the writer already holds (``dtypes.all_finite``: two reductions, bfloat16 by its
bits), before the block is written; ``--allow-nonfinite`` writes them as they are."""

from __future__ import annotations

from typing import Any

from ckpt_cli.errors import NonFiniteError


def floating(dtype: Any) -> bool:
    """Whether a numpy, ml_dtypes or TensorStore dtype holds floating-point or complex values."""
    name = getattr(dtype, "name", str(dtype))
    return "float" in name or "complex" in name


def check_finite(name: str, label: str | None, values: Any) -> None:
    """Raise ``NonFiniteError`` naming leaf ``name`` of ``label`` (``step 5 of /runs/exp7``)
    when ``values`` (a block of it) hold NaN/Inf; nothing when ``label`` is None (allowed)."""
    if label is None or not floating(values.dtype):
        return
    from ckpt_cli.core.format.dtypes import all_finite

    if all_finite(values):
        return
    raise NonFiniteError(
        f"leaf {name!r} of {label} holds NaN/Inf values: the run had diverged when it was "
        "saved; refusing to write them (nothing was written)",
        hint="pick a step before the divergence (`ckpt trend` or `ckpt verify --deep` names "
        "the last finite one), or pass --allow-nonfinite to write them as they are",
    )
