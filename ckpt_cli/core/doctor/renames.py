"""Renames: stored and expected leaves of the same shape paired by how alike their names are and
by how many other pairs are renamed the same way (a module renamed renames all its leaves).

A pair's *change* is what differs once the names' common segments are set aside: a middle part
replaced (``params.Dense_0.kernel`` -> ``params.encoder.kernel``: ``Dense_0`` -> ``encoder``) or
affixes changed around a common core (linen ``params.Dense_0.kernel`` -> nnx
``Dense_0.kernel.value``). Pairs that share a change become one migrate rule when its pattern
matches exactly those leaves; otherwise one literal rule each. A stored leaf with two equally good
partners is left unpaired and said to be ambiguous: ckpt never guesses silently.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from difflib import SequenceMatcher

from ckpt_cli.core.doctor.types import Finding, Leaves

#: Above this many candidate pairs in one shape, only pairs ending in the same segment count.
_MAX_PAIRS = 250_000
_MIN_SCORE = 0.35

Change = tuple[str, str, str, str, str]


@dataclass(frozen=True)
class Pair:
    stored: str
    expected: str
    score: float
    change: Change


def pair_renames(
    only_stored: Leaves, only_expected: Leaves, every_stored: Leaves, *, resized: bool = False
) -> tuple[list[Pair], list[Finding]]:
    """The renames (one finding per shared change) and the ambiguous leaves, found among
    leaves on one side only; paired leaves are left in the dicts (the caller compares them).
    A shared rule must rename none of ``every_stored``'s other leaves. With ``resized``, the
    partners are arrays of the same rank whose shapes differ on one axis (a layer renamed and
    widened): the caller then names the resize."""
    candidates = _candidates(only_stored, only_expected, resized)
    support = Counter(p.change for p in candidates)
    ranked = sorted(candidates, key=lambda p: (support[p.change], p.score), reverse=True)
    pairs: list[Pair] = []
    ambiguous: list[Finding] = []
    taken_s: set[str] = set()
    taken_e: set[str] = set()
    for i, p in enumerate(ranked):
        if p.stored in taken_s or p.expected in taken_e:
            continue
        rivals = [
            q
            for q in ranked[i + 1 :]
            if _tie(p, q, support) and q.expected not in taken_e and q.stored not in taken_s
        ]
        if rivals:
            ambiguous.append(_ambiguous(p, rivals))
            taken_s.update({p.stored, *(q.stored for q in rivals)})
            taken_e.update({p.expected, *(q.expected for q in rivals)})
            continue
        pairs.append(p)
        taken_s.add(p.stored)
        taken_e.add(p.expected)
    return pairs, _grouped(pairs, every_stored, resized) + ambiguous


def _tie(p: Pair, q: Pair, support: Counter[Change]) -> bool:
    same = q.stored == p.stored or q.expected == p.expected
    return same and support[q.change] == support[p.change] and q.score == p.score


def _ambiguous(p: Pair, rivals: list[Pair]) -> Finding:
    stored = sorted({p.stored, *(q.stored for q in rivals)})
    expected = sorted({p.expected, *(q.expected for q in rivals)})
    text = f"{', '.join(stored)}: as likely renamed to {' or '.join(expected)}; name the rename in a spec"
    return Finding("ambiguous", tuple(stored), tuple(expected), text, score=p.score)


def _candidates(only_stored: Leaves, only_expected: Leaves, resized: bool) -> list[Pair]:
    by_shape: dict[object, list[str]] = {}
    for name, spec in only_expected.items():
        by_shape.setdefault(_shape_key(spec, resized), []).append(name)
    out = []
    for name, spec in only_stored.items():
        partners = by_shape.get(_shape_key(spec, resized), []) if spec[0] or not resized else []
        crowded = len(partners) * len(only_stored) > _MAX_PAIRS
        for other in partners:
            if crowded and name.rsplit(".", 1)[-1] != other.rsplit(".", 1)[-1]:
                continue
            if resized and not _one_axis(spec[0], only_expected[other][0]):
                continue
            score = SequenceMatcher(None, name, other).ratio()
            if score >= _MIN_SCORE:
                out.append(Pair(name, other, score, change_of(name, other)))
    return out


def _shape_key(spec: tuple[tuple[int, ...] | None, str], resized: bool) -> object:
    shape, dtype = spec
    if resized:
        return (None if shape is None else len(shape), dtype == "string")
    return (shape, dtype == "string")


def _one_axis(a: tuple[int, ...] | None, b: tuple[int, ...] | None) -> bool:
    """Shapes of one rank that differ on exactly one axis."""
    if a is None or b is None or len(a) != len(b):
        return False
    return sum(x != y for x, y in zip(a, b, strict=True)) == 1


def change_of(old: str, new: str) -> Change:
    """What differs between two names once their common segments are set aside."""
    a, b = old.split("."), new.split(".")
    pre = 0
    while pre < min(len(a), len(b)) - 1 and a[pre] == b[pre]:
        pre += 1
    suf = 0
    while suf < min(len(a), len(b)) - pre - 1 and a[-1 - suf] == b[-1 - suf]:
        suf += 1
    mid_a, mid_b = a[pre : len(a) - suf], b[pre : len(b) - suf]
    core = _common_run(mid_a, mid_b)
    if core is None or pre or suf:
        return ("mid", ".".join(mid_a), ".".join(mid_b), "pre" if pre else "", "suf" if suf else "")
    (i, j, n) = core
    return (
        "affix",
        ".".join(mid_a[:i]),
        ".".join(mid_b[:j]),
        ".".join(mid_a[i + n :]),
        ".".join(mid_b[j + n :]),
    )


def _common_run(a: list[str], b: list[str]) -> tuple[int, int, int] | None:
    m = SequenceMatcher(None, a, b, autojunk=False).find_longest_match(0, len(a), 0, len(b))
    return (m.a, m.b, m.size) if m.size else None


def _grouped(pairs: list[Pair], stored: Leaves, resized: bool = False) -> list[Finding]:
    """One finding (one rule) per change shared by pairs whose pattern matches exactly them."""
    by_change: dict[Change, list[Pair]] = {}
    for p in pairs:
        by_change.setdefault(p.change, []).append(p)
    out = []
    for change, members in by_change.items():
        rule = _rule(change) if len(members) > 1 else None
        if rule is not None and _exact(rule, members, stored):
            out.append(_finding(members, (rule,), resized))
            continue
        out += [_finding([p], (_literal(p),), resized) for p in members]
    return out


def _rule(change: Change) -> dict[str, object] | None:
    kind, old, new, x, y = change
    if kind == "mid":
        before = r"(.*\.)" if x else ""
        after = r"(\..*)" if y else ""
        if not old:
            return None
        to = (r"\g<1>" if x else "") + new + ((r"\g<2>" if x else r"\g<1>") if y else "")
        return {
            "op": "rename",
            "from": before + re.escape(old) + after,
            "to": to,
            "follow_optimizer": False,
        }
    pattern = (re.escape(old + ".") if old else "") + "(.*)" + (re.escape("." + x) if x else "")
    to = (new + "." if new else "") + r"\g<1>" + ("." + y if y else "")
    return {"op": "rename", "from": pattern, "to": to, "follow_optimizer": False}


def _exact(rule: dict[str, object], members: list[Pair], stored: Leaves) -> bool:
    """The rule's pattern renames exactly ``members``, each to its partner."""
    pattern = re.compile(str(rule["from"]))
    hits = {n: pattern.fullmatch(n) for n in stored}
    matched = {n: m.expand(str(rule["to"])) for n, m in hits.items() if m}
    return matched == {p.stored: p.expected for p in members}


def _literal(p: Pair) -> dict[str, object]:
    return {
        "op": "rename",
        "from": re.escape(p.stored),
        "to": p.expected,
        "follow_optimizer": False,
    }


def _finding(members: list[Pair], rules: tuple[dict[str, object], ...], resized: bool) -> Finding:
    score = min(p.score for p in members)
    shapes = "shapes differing on one axis" if resized else "same shape"
    if len(members) == 1:
        p = members[0]
        text = f"{p.stored}: likely renamed to {p.expected} ({shapes}; names {score:.0%} alike)"
    else:
        first = members[0]
        text = (
            f"{len(members)} leaves likely renamed the same way, e.g. {first.stored} -> "
            f"{first.expected} ({shapes}; names at least {score:.0%} alike)"
        )
    return Finding(
        "rename",
        tuple(p.stored for p in members),
        tuple(p.expected for p in members),
        text,
        score=score,
        rules=rules,
    )
