"""``ckpt doctor``: why a checkpoint will not restore into a model, and the spec that fixes it.

``diagnose`` compares an item's leaves with the state it is to be restored into (``--target``
function, ``--like`` checkpoint or safetensors), names every difference (``explain``), gathers
the migrate rules that close them, and checks those rules by planning the migration against the
checkpoint (no data read) and comparing the planned leaves with the target's.
"""

from __future__ import annotations

import json
from dataclasses import replace

from ckpt_cli.core.doctor.expected import like_leaves, stored_leaves, target_leaves
from ckpt_cli.core.doctor.explain import explain
from ckpt_cli.core.doctor.types import (
    Diagnosis,
    DiagnosisJSON,
    Finding,
    FindingJSON,
    Leaves,
    Memory,
    order,
)
from ckpt_cli.core.format.dtypes import dtype_itemsize
from ckpt_cli.core.format.resolve import resolve_item
from ckpt_cli.core.inspect import ItemReport, inspect_item
from ckpt_cli.core.storage import StorageOptions, open_location
from ckpt_cli.errors import CkptError, UsageError

__all__ = ["Diagnosis", "DiagnosisJSON", "Finding", "FindingJSON", "diagnose", "spec_text"]


def diagnose(
    checkpoint: str,
    *,
    target: str | None = None,
    like: str | None = None,
    step: int | None = None,
    item: str | None = None,
    storage: StorageOptions | None = None,
) -> Diagnosis:
    """The verdict on restoring ``checkpoint`` (a root, step or item; ``step``/``item`` pick
    one) into ``target`` (``MODULE:FUNCTION``, imports jax) or ``like`` (a checkpoint, whose item
    of the same name is taken, or safetensors). Reads metadata only."""
    if (target is None) == (like is None):
        raise UsageError("give the state to restore into: --target MODULE:FUNCTION or --like PATH")
    ref = resolve_item(open_location(checkpoint, storage), step, item)
    report = inspect_item(ref)
    stored = stored_leaves(report)
    if target is not None:
        expected = target_leaves(target)
    else:
        assert like is not None
        expected = like_leaves(like, None, ref.name if _named(like) else None, storage)
    findings = tuple(explain(dict(stored), dict(expected)))
    diagnosis = Diagnosis(
        str(ref.location), ref.step, ref.name, target or str(like), findings, _memory(report)
    )
    if not any(f.blocks and f.rules for f in findings):
        return diagnosis
    return replace(diagnosis, spec_checked=True, unresolved=check_spec(report, diagnosis, expected))


def _named(like: str) -> bool:
    """--like a checkpoint: its item named as the source's, when it has one of that name."""
    return not like.endswith((".safetensors", ".json"))


def check_spec(report: ItemReport, diagnosis: Diagnosis, expected: Leaves) -> tuple[str, ...]:
    """Plan the spec's rules against the item (metadata only) and say what still differs from
    the target; a rule the planner refuses is itself what is left."""
    from ckpt_cli.core.migrate.plan import apply_spec
    from ckpt_cli.core.migrate.spec import parse_spec
    from ckpt_cli.core.migrate.target import compare_target

    text = spec_text(diagnosis)
    try:
        spec = parse_spec(text.encode(), "doctor.yaml")
        leaves, _, _ = apply_spec(report, spec, 64 << 20)
    except CkptError as e:
        return (e.message,)
    planned: Leaves = {}
    for leaf in leaves:  # as MigrationPlan.abstract names them
        if leaf.expr is not None:
            planned[leaf.name] = (leaf.expr.shape, leaf.expr.dtype)
        elif leaf.value_type == "string":
            planned[leaf.name] = (None, "string")
    return tuple(d.text() for d in compare_target(planned, expected))


def spec_text(diagnosis: Diagnosis) -> str:
    """The migrate spec (YAML) that closes every finding it can, each rule under a comment that
    says why; what it cannot close is listed in comments at the end."""
    lines = [
        f"# written by ckpt doctor: {diagnosis.checkpoint} -> {diagnosis.target}",
        f"# verdict: {diagnosis.verdict}",
        "version: 1",
        "rules:",
    ]
    for f, rule in _ordered(diagnosis):
        lines.append(f"  # {f.message}")
        lines.append("  - " + json.dumps(rule, ensure_ascii=False))
    if len(lines) == 4:
        lines[-1] = "rules: []  # nothing to change"
    open_items = [f for f in diagnosis.findings if f.blocks and not f.rules]
    if open_items or diagnosis.unresolved:
        lines.append("# not closed by this spec (restore will still fail):")
        lines += [f"#   {f.message}" for f in open_items]
        lines += [f"#   {u}" for u in diagnosis.unresolved]
    return "\n".join(lines) + "\n"


def _ordered(diagnosis: Diagnosis) -> list[tuple[Finding, dict[str, object]]]:
    return [(f, dict(r)) for f in sorted(diagnosis.findings, key=order) for r in f.rules]


def _memory(report: ItemReport) -> Memory:
    arrays = [leaf for leaf in report.leaves if leaf.is_array and leaf.shape is not None]
    if not arrays:
        return Memory(0, 0, None, 0)
    sizes = {leaf.name: leaf.elements * dtype_itemsize(leaf.dtype or "uint8") for leaf in arrays}
    largest = max(sizes, key=lambda name: sizes[name])
    return Memory(sum(sizes.values()), len(arrays), largest, sizes[largest])
