"""``ckpt doctor``: why a checkpoint will not restore into a model, and the spec that fixes it.

``diagnose`` compares an item's leaves with the state it is to be restored into (``--target``
function, ``--like`` checkpoint or safetensors), names every difference (``explain``), gathers
the migrate rules that close them, and checks those rules by planning the migration against the
checkpoint (no data read) and comparing the planned leaves with the target's.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace

from ckpt_cli.core.doctor.expected import Tree, like_tree, stored_tree, target_tree
from ckpt_cli.core.doctor.explain import explain
from ckpt_cli.core.doctor.preflight import placements, preflight
from ckpt_cli.core.doctor.topology import reshard_rules, topology_finding
from ckpt_cli.core.doctor.types import (
    Diagnosis,
    DiagnosisJSON,
    Finding,
    FindingJSON,
    Leaves,
    order,
)
from ckpt_cli.core.format.resolve import resolve_item
from ckpt_cli.core.format.sharding import MeshSpec
from ckpt_cli.core.inspect import ItemReport
from ckpt_cli.core.inspect.item import inspect_item
from ckpt_cli.core.state import KEY_DTYPES
from ckpt_cli.core.storage import StorageOptions, open_location
from ckpt_cli.errors import CkptError, UsageError

__all__ = [
    "Diagnosis",
    "DiagnosisJSON",
    "Finding",
    "FindingJSON",
    "diagnose",
    "fix_text",
    "spec_text",
]


def diagnose(
    checkpoint: str,
    *,
    target: str | None = None,
    like: str | None = None,
    step: int | None = None,
    item: str | None = None,
    mesh: str | None = None,
    hosts: int = 1,
    storage: StorageOptions | None = None,
) -> Diagnosis:
    """The verdict on restoring ``checkpoint`` (a root, step or item; ``step``/``item`` pick
    one) into ``target`` (``MODULE:FUNCTION``, imports jax) or ``like`` (a checkpoint, whose item
    of the same name is taken, or safetensors). ``mesh`` (``data=4,model=2``) is the restore's
    topology; by default the target's shardings, else this process's jax devices (--target);
    ``hosts`` splits its devices over that many processes for the preflight (``memory``).
    Reads metadata only."""
    if (target is None) == (like is None):
        raise UsageError("give the state to restore into: --target MODULE:FUNCTION or --like PATH")
    ref = resolve_item(open_location(checkpoint, storage), step, item)
    report = inspect_item(ref)
    stored = stored_tree(report)
    if target is not None:
        expected = target_tree(target)
    else:
        assert like is not None
        expected = like_tree(like, ref.name, storage)
    findings = tuple(explain(dict(stored.leaves), dict(expected.leaves)))
    findings += tuple(empty_nodes(stored, expected))
    restore_mesh = MeshSpec.parse(mesh) if mesh is not None else None
    placed = topology_finding(report, restore_mesh, expected.devices, expected.sharded)
    findings += (placed,) if placed is not None else ()
    rules = reshard_rules(report, placed.reshard) if placed and placed.reshard else None
    diagnosis = Diagnosis(
        str(ref.location),
        ref.step,
        ref.name,
        target or str(like),
        findings,
        preflight(report, placements(report, target, expected.sharded, restore_mesh), hosts, mesh),
        reshard_rules=rules,
    )
    if not any(f.blocks and f.rules for f in findings):
        return diagnosis
    unresolved = check_spec(report, diagnosis, expected.leaves)
    return replace(diagnosis, spec_checked=True, unresolved=unresolved)


def empty_nodes(stored: Tree, expected: Tree) -> list[Finding]:
    """Empty nodes (``None``, optax's ``EmptyState``) where the other side has none: Orbax refuses
    a restore whose tree differs there, and no migrate rule adds or removes one."""
    out: list[Finding] = []
    if stored.empty is None or expected.empty is None:
        return out
    for name in sorted(expected.empty - stored.empty):
        if name in stored.leaves:
            continue  # a value where the target has an empty node: compare() does not see it
        text = f"{name}: the target has an empty node (None or an empty optax state) the checkpoint lacks; Orbax refuses the different tree"
        out.append(Finding("container", (), (name,), text))
    held = {n.split(".", 1)[0] for n in (*expected.leaves, *expected.empty)}
    for name in sorted(stored.empty - expected.empty):
        if name.split(".", 1)[0] not in held:  # under a subtree the target has none of
            text = f"{name}: an empty node (None or an empty optax state) under a subtree the target lacks; dropped"
            rule = {"op": "drop", "match": re.escape(name), "follow_optimizer": False}
            out.append(Finding("unexpected", (name,), (), text, rules=(rule,)))
            continue
        text = f"{name}: the checkpoint has an empty node (None or an empty optax state) the target lacks; Orbax refuses the different tree"
        out.append(Finding("container", (name,), (), text))
    return out


def check_spec(report: ItemReport, diagnosis: Diagnosis, expected: Leaves) -> tuple[str, ...]:
    """Plan the spec's rules against the item (metadata only) and say what still differs from
    the target; a rule the planner refuses is itself what is left."""
    from ckpt_cli.core.migrate.plan import apply_spec
    from ckpt_cli.core.spec.language import parse_spec
    from ckpt_cli.core.spec.target import compare_target

    text = spec_text(diagnosis)
    try:
        spec = parse_spec(text.encode(), "doctor.yaml")
        leaves, _, _ = apply_spec(report, spec, 64 << 20)
    except CkptError as e:
        return (e.message,)
    planned: Leaves = {}
    for leaf in leaves:  # as MigrationPlan.abstract names them, typed keys as stored_tree does
        if leaf.expr is not None and leaf.random_key_impl:
            impl = KEY_DTYPES.get(leaf.random_key_impl, leaf.random_key_impl)
            planned[leaf.name] = (leaf.expr.shape[:-1], f"key<{impl}>")
        elif leaf.expr is not None:
            planned[leaf.name] = (leaf.expr.shape, leaf.expr.dtype)
        elif leaf.value_type == "string":
            planned[leaf.name] = (None, "string")
    return tuple(d.text() for d in compare_target(planned, expected))


def fix_text(diagnosis: Diagnosis) -> str:
    """What ``--write-spec`` writes: the reshard rules when a reshard alone fixes the restore
    (or lays it out on the ``--mesh`` asked for), else the migrate spec."""
    reshard_only = diagnosis.verdict in ("restores-after-reshard", "restores")
    if reshard_only and diagnosis.reshard_rules is not None:
        return diagnosis.reshard_rules
    return spec_text(diagnosis)


def spec_text(diagnosis: Diagnosis) -> str:
    """The migrate spec (YAML) that closes every finding it can, each rule under a comment that
    says why; what it cannot close is listed in comments at the end."""
    lines = [
        f"# written by ckpt doctor: {diagnosis.checkpoint} -> {diagnosis.target}",
        f"# verdict: {diagnosis.verdict}",
    ]
    if diagnosis.reshard is not None:
        lines.append(f"# then reshard: ckpt reshard MIGRATED NEW_ROOT --mesh {diagnosis.reshard}")
    lines += ["version: 1", "rules:"]
    for f, rule in _ordered(diagnosis):
        lines.append(f"  # {f.message}")
        lines.append("  - " + json.dumps(rule, ensure_ascii=False))
    if lines[-1] == "rules:":
        lines[-1] = "rules: []  # nothing to change"
    open_items = [f for f in diagnosis.findings if f.blocks and not f.fixable]
    if open_items or diagnosis.unresolved:
        lines.append("# not closed by this spec (restore will still fail):")
        lines += [f"#   {f.message}" for f in open_items]
        lines += [f"#   {u}" for u in diagnosis.unresolved]
    return "\n".join(lines) + "\n"


def _ordered(diagnosis: Diagnosis) -> list[tuple[Finding, dict[str, object]]]:
    return [(f, dict(r)) for f in sorted(diagnosis.findings, key=order) for r in f.rules]
