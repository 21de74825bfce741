"""The spec's rules applied in order to leaves being planned (``apply_rules``): from an Orbax
item (``migrate``, ``export``, ``doctor``) or the tensors of an ``import``. Each rule's direct
matches change, the optimizer leaves that mirror them follow (``tree.followers``), and the tree is
checked after every rule; PRNG state that a value rule matched only by a pattern is left alone and
reported (``Skip``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

from ckpt_cli.core.spec import rules, stack
from ckpt_cli.core.spec.language import MigrationSpec, Rule
from ckpt_cli.core.spec.tree import Work, followers
from ckpt_cli.core.state import RngStateKind, rng_state_kind


class SkipJSON(TypedDict):
    """PRNG state a rule matched by pattern and left as it is (v2)."""

    leaf: str
    rule: str
    reason: RngStateKind


#: Rules that change values or shapes; they leave PRNG state alone unless they name it exactly.
_VALUE_OPS = frozenset({"cast", "set", "resize", "reshape", "transpose", "split", "python"})


@dataclass(frozen=True)
class Skip:
    """A leaf a rule matched but did not change: PRNG state named by a pattern, not exactly."""

    leaf: str
    rule: str
    reason: RngStateKind

    def to_json(self) -> SkipJSON:
        return {"leaf": self.leaf, "rule": self.rule, "reason": self.reason}

    def text(self) -> str:
        return (
            f"{self.leaf}: {self.reason}, left as is by {self.rule} (name it exactly to change it)"
        )


def apply_rules(
    work: list[Work], spec: MigrationSpec, skipped: list[Skip] | None = None
) -> tuple[list[Work], tuple[str, ...]]:
    """The spec's rules applied in order to leaves being planned (from an Orbax item, or the
    tensors of an import): the leaves, and the labels of the rules that matched nothing."""
    unused = []
    left: list[Skip] = [] if skipped is None else skipped
    for rule in spec.rules:
        work, matched = _apply(rule, work, left)
        if not matched:
            unused.append(rule.label)
        rules.check_tree(rule, work)
    return work, tuple(unused)


def _apply(rule: Rule, work: list[Work], skipped: list[Skip]) -> tuple[list[Work], bool]:
    if rule.op == "add":
        return rules.add(rule, work), True
    if rule.op == "concat":
        return rules.concat(rule, work)
    if rule.op == "stack":
        return stack.stack(rule, work)
    change, follow_change = rules.change, rules.follow_change
    if rule.op == "unstack":
        change, follow_change = stack.unstack, stack.follow_unstack
    arrays_only = rule.op not in ("rename", "drop", "keep_only")
    direct = [w for w in work if (w.expr is not None or not arrays_only) and rule.selects(w.name)]
    if rule.op in _VALUE_OPS and direct:
        # PRNG key data cast to bfloat16 or padded is no key any more: a pattern that merely
        # covers it (`model\..*`) leaves it alone, and the plan says so.
        kept = []
        for w in direct:
            why = rng_state_kind(w.leaf) if w.leaf is not None else None
            if why and not rule.names_exactly(w.name):
                skipped.append(Skip(w.name, rule.label, why))
            else:
                kept.append(w)
        if not kept:
            return work, True  # matched, every match skipped: not an unused rule
        direct = kept
    if rule.op == "keep_only":
        keep = {id(w) for w in direct}
        return [w for w in work if id(w) in keep], bool(direct)
    follow = followers(rule, direct, work)
    changes: dict[int, list[Work]] = {}
    for w in direct:
        changes[id(w)] = change(rule, w, None)
        for f in follow.get(id(w), []):
            changes[id(f)] = follow_change(rule, w, f, changes[id(w)])
    out: list[Work] = []
    for w in work:
        out += changes.get(id(w), [w])
    rules.check_unique(rule, out)
    return out, bool(direct)
