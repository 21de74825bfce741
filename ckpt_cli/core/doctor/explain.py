"""Pair a checkpoint's leaves with the target's and name each difference as what it is.

Order of the search: leaves of one name on both sides (dtype, transposed, padded or truncated on
one axis, reshaped); then numbered leaves on one side that are one stacked leaf on the other
(``nn.scan``); then renames (same shape, a similar name, scored), then renames of leaves whose
shapes differ on one axis (a layer renamed and widened); what is left is missing (never added
when it is an optax hyperparameter or most of the model) or unexpected. Every finding carries the migrate rules that close it (``follow_optimizer: false``:
the doctor sees the optimizer's leaves too and writes their rules itself).
"""

from __future__ import annotations

import math
import re

from ckpt_cli.core.doctor.renames import pair_renames
from ckpt_cli.core.doctor.types import Finding, Kind, Leaves, Spec

_NUMBER = re.compile(r"\d+")


def explain(stored: Leaves, expected: Leaves) -> list[Finding]:
    """Every difference between ``stored`` (the checkpoint) and ``expected`` (the target)."""
    findings = [
        f
        for name in stored.keys() & expected.keys()
        for f in compare(name, name, stored[name], expected[name])
    ]
    only_stored = {n: s for n, s in stored.items() if n not in expected}
    only_expected = {n: s for n, s in expected.items() if n not in stored}
    findings += _stacks(only_stored, only_expected)
    findings += _unstacks(only_stored, only_expected)
    findings += _renamed(only_stored, only_expected, stored, resized=False)
    findings += _renamed(only_stored, only_expected, stored, resized=True)
    findings += missing_leaves(only_expected, expected)
    findings += [_unexpected(n, s) for n, s in sorted(only_stored.items())]
    return sorted(findings, key=lambda f: (f.expected or f.stored)[0])


def _renamed(
    only_stored: Leaves, only_expected: Leaves, stored: Leaves, *, resized: bool
) -> list[Finding]:
    """Renames (then, with ``resized``, renames of leaves resized on one axis) and how each
    renamed leaf still differs; paired and ambiguous leaves leave ``only_*``."""
    pairs, findings = pair_renames(only_stored, only_expected, stored, resized=resized)
    for p in pairs:
        findings += compare(
            p.stored, p.expected, only_stored.pop(p.stored), only_expected.pop(p.expected)
        )
    for f in findings:  # ambiguous leaves: neither missing nor unexpected, but undecided
        for n in f.stored if f.kind == "ambiguous" else ():
            only_stored.pop(n, None)
        for n in f.expected if f.kind == "ambiguous" else ():
            only_expected.pop(n, None)
    return findings


def compare(stored_name: str, name: str, have: Spec, want: Spec) -> list[Finding]:
    """How one stored leaf differs from the target leaf ``name`` it restores into."""
    out = []
    (shape, dtype), (target_shape, target_dtype) = have, want
    if dtype.startswith("key<") or target_dtype.startswith("key<"):
        if have != want:
            return [_key(stored_name, name, have, want)]
        return []
    if (dtype == "string") != (target_dtype == "string"):
        what = f"{_text(have)} is stored where the target has {_text(want)}"
        return [Finding("shape", (stored_name,), (name,), f"{name}: {what}")]
    if shape != target_shape and shape is not None and target_shape is not None:
        out.append(_shape(stored_name, name, shape, target_shape, target_dtype))
    if dtype != target_dtype and target_dtype != "string":
        rule = {
            "op": "cast",
            "match": re.escape(name),
            "dtype": target_dtype,
            "follow_optimizer": False,
        }
        message = (
            f"{name}: stored as {dtype}, the target has {target_dtype}; Orbax casts on restore"
        )
        out.append(Finding("dtype", (stored_name,), (name,), message, blocks=False, rules=(rule,)))
    return out


def _shape(
    stored_name: str, name: str, shape: tuple[int, ...], target: tuple[int, ...], dtype: str
) -> Finding:
    """A shape difference named as what it is, with the rule that maps one to the other."""
    match = re.escape(name)
    have, want = _dims(shape), _dims(target)
    if len(shape) == len(target) and sorted(shape) == sorted(target):
        axes = _permutation(shape, target)
        rule = {"op": "transpose", "match": match, "axes": list(axes), "follow_optimizer": False}
        text = f"{name}: transposed, stored {have}, the target has {want} (axes {list(axes)})"
        return Finding("transposed", (stored_name,), (name,), text, rules=(rule,))
    differ = [i for i, (a, b) in enumerate(zip(shape, target, strict=False)) if a != b]
    if len(shape) == len(target) and len(differ) == 1:
        axis = differ[0]
        kind: Kind = "padded" if target[axis] > shape[axis] else "truncated"
        init = padding_init(name, axis, len(target))
        rule = {
            "op": "resize",
            "match": match,
            "shape": list(target),
            "init": init,
            "follow_optimizer": False,
        }
        how = f"the target is {target[axis] - shape[axis]:+d} on axis {axis}"
        words = f"new entries {init}" if kind == "padded" else "the extra entries are dropped"
        return Finding(
            kind, (stored_name,), (name,), f"{name}: stored {have}, {how}; {words}", rules=(rule,)
        )
    if math.prod(shape) == math.prod(target):
        rule = {"op": "reshape", "match": match, "shape": list(target), "follow_optimizer": False}
        text = f"{name}: stored {have}, the target has {want}: the same values in another shape (split or fused heads?)"
        return Finding("reshaped", (stored_name,), (name,), text, rules=(rule,))
    text = f"{name}: stored {have}, the target has {want}: they differ on {len(differ) or 'every'} axes and no rule maps one to the other without guessing"
    return Finding("shape", (stored_name,), (name,), text)


#: Where an optimizer's state lives (its new entries start at zero, as a fresh optimizer's do).
_OPTIMIZER = re.compile(r"(^|\.)(opt_state|optimizer|opt|tx_state|mu|nu)(\.|$)")


def padding_init(name: str, axis: int, ndim: int) -> str:
    """The values of new entries, as Flax initialises a fresh layer where it can be told: zero
    moments; a kernel's new outputs (its last axis) ``lecun_normal`` (``nn.Dense``'s default),
    its new inputs zero (so the wider model computes what the narrow one did); zero biases; unit
    scales. ckpt cannot see the target's own initialisers: the spec says so in its comment.
    An nnx state names a variable's array ``<variable>.value``: the variable is the leaf."""
    parts = name.split(".")
    leaf = parts[-2] if parts[-1] == "value" and len(parts) > 1 else parts[-1]
    if _OPTIMIZER.search(name) or leaf in ("bias", "mean", "count"):
        return "zeros"
    if leaf in ("scale", "var"):
        return "constant(1.0)"
    if leaf in ("kernel", "embedding", "weight") and ndim >= 2 and axis == ndim - 1:
        return "lecun_normal"
    return "zeros"


def _key(stored_name: str, name: str, have: Spec, want: Spec) -> Finding:
    """A typed PRNG key on one side, raw key data (or another key) on the other: Orbax restores
    what is stored, whatever the target says, and no migrate rule converts one to the other."""
    if want[1].startswith("key<") and not have[1].startswith("key<"):
        how = "restore it as raw data and call jax.random.wrap_key_data on it"
    elif have[1].startswith("key<") and not want[1].startswith("key<"):
        how = "restore it as a key and call jax.random.key_data on it"
    else:
        how = "restore it and convert it in your code"
    text = f"{name}: stored as {_text(have)}, the target has {_text(want)}; Orbax returns the stored kind: {how}"
    return Finding("key", (stored_name,), (name,), text)


def _permutation(shape: tuple[int, ...], target: tuple[int, ...]) -> tuple[int, ...]:
    """Axes of ``shape`` in the target's order; the reversal when several fit (a 2-D transpose)."""
    reverse = tuple(range(len(shape)))[::-1]
    if tuple(shape[a] for a in reverse) == target:
        return reverse
    free = list(range(len(shape)))
    axes = []
    for d in target:
        axis = next(a for a in free if shape[a] == d)
        free.remove(axis)
        axes.append(axis)
    return tuple(axes)


def _stacks(only_stored: Leaves, only_expected: Leaves) -> list[Finding]:
    """Numbered stored leaves (``layers_0 .. layers_{N-1}``) that the target holds as one leaf
    of ``[N, ...]`` (scanned layers)."""
    out = []
    groups = _numbered(only_stored)
    for name, (shape, dtype) in sorted(only_expected.items()):
        if not shape:
            continue
        fits = [
            (t, m)
            for t, m in groups.items()
            if len(m) == shape[0] and all(only_stored[n] == (shape[1:], dtype) for n in m.values())
        ]
        best = _closest(name, [t for t, _ in fits])
        if best is None:
            continue
        members = dict(fits)[best]
        pattern = re.escape(best).replace(re.escape("{i}"), r"(?P<i>\d+)")
        rule = {"op": "stack", "from": pattern, "to": name, "axis": 0, "follow_optimizer": False}
        text = f"{name}: the target stacks {len(members)} layers ({best.replace('{i}', 'N')}) into one {_dims(shape)} leaf"
        out.append(Finding("stacked", tuple(members.values()), (name,), text, rules=(rule,)))
        for n in members.values():
            del only_stored[n]
        del only_expected[name]
        del groups[best]
    return out


def _unstacks(only_stored: Leaves, only_expected: Leaves) -> list[Finding]:
    """A stored ``[N, ...]`` leaf that the target holds as N numbered leaves."""
    out = []
    groups = _numbered(only_expected)
    for name, (shape, dtype) in sorted(only_stored.items()):
        if not shape:
            continue
        fits = [
            t
            for t, m in groups.items()
            if len(m) == shape[0]
            and all(only_expected[n] == (shape[1:], dtype) for n in m.values())
        ]
        best = _closest(name, fits)
        if best is None:
            continue
        members = groups.pop(best)
        rule = {
            "op": "unstack",
            "match": re.escape(name),
            "to": best,
            "axis": 0,
            "follow_optimizer": False,
        }
        text = f"{name}: stored as one {_dims(shape)} leaf, the target has {len(members)} layers ({best.replace('{i}', 'N')})"
        out.append(Finding("unstacked", (name,), tuple(members.values()), text, rules=(rule,)))
        for n in members.values():
            del only_expected[n]
        del only_stored[name]
    return out


def _numbered(leaves: Leaves) -> dict[str, dict[int, str]]:
    """Names that differ by one number, as ``template -> {index: name}``, where the indices are
    exactly 0..N-1 (N >= 2)."""
    groups: dict[str, dict[int, str]] = {}
    for name in leaves:
        for m in _NUMBER.finditer(name):
            template = name[: m.start()] + "{i}" + name[m.end() :]
            groups.setdefault(template, {})[int(m.group())] = name
    return {
        t: dict(sorted(m.items()))
        for t, m in groups.items()
        if len(m) >= 2 and sorted(m) == list(range(len(m)))
    }


def _closest(name: str, templates: list[str]) -> str | None:
    """The template most like ``name`` (its index removed), or None when two tie."""
    from difflib import SequenceMatcher

    scored = sorted(
        ((SequenceMatcher(None, t.replace("{i}", ""), name).ratio(), t) for t in templates),
        reverse=True,
    )
    if not scored or (len(scored) > 1 and scored[0][0] == scored[1][0]):
        return None
    return scored[0][1]


#: Where ``optax.inject_hyperparams`` keeps the optimizer's settings (a learning rate...).
_HYPERPARAMS = re.compile(r"(^|\.)hyperparams\.")


def missing_leaves(missing: Leaves, expected: Leaves) -> list[Finding]:
    """The target's leaves that no stored leaf becomes: added (zeros) when they are a small part
    of the model; never when they are optax hyperparameters (their values are the user's
    settings: a learning rate of zero trains nothing) or when most of the model's values would
    be made up (another model altogether)."""
    model = {n: s[0] for n, s in expected.items() if s[0] is not None and not _OPTIMIZER.search(n)}
    new = sum(math.prod(shape) for n, shape in model.items() if n in missing)
    total = sum(math.prod(shape) for shape in model.values())
    out = []
    for name, spec in sorted(missing.items()):
        if _HYPERPARAMS.search(name):
            text = (
                f"{name}: a hyperparameter optax.inject_hyperparams keeps in the optimizer state; "
                "the checkpoint does not hold it and its value is your setting, not zero: restore "
                "this checkpoint with the optimizer it was saved with, or start the new "
                "optimizer's state with tx.init(params)"
            )
            out.append(Finding("missing", (), (name,), text))
        elif name in model and new * 2 > total:
            text = (
                f"{name}: the target has {_text(spec)}, the checkpoint has no such leaf; not added: "
                f"{new} of the target's {total} model values are not in the checkpoint, it looks "
                "like another model"
            )
            out.append(Finding("missing", (), (name,), text))
        else:
            out.append(_missing(name, spec))
    return out


def _missing(name: str, spec: Spec) -> Finding:
    shape, dtype = spec
    if shape is None:
        return Finding(
            "missing",
            (),
            (name,),
            f"{name}: the target has {_text(spec)}, the checkpoint has no such leaf",
        )
    rule = {
        "op": "add",
        "name": name,
        "shape": list(shape),
        "dtype": dtype,
        "init": "zeros",
        "follow_optimizer": False,
    }
    text = f"{name}: the target has {_text(spec)}, the checkpoint has no such leaf; added as zeros (the target's initialiser is not known to ckpt)"
    return Finding("missing", (), (name,), text, rules=(rule,))


def _unexpected(name: str, spec: Spec) -> Finding:
    rule = {"op": "drop", "match": re.escape(name), "follow_optimizer": False}
    text = f"{name}: {_text(spec)} is in the checkpoint, not in the target; dropped"
    return Finding("unexpected", (name,), (), text, rules=(rule,))


def _dims(shape: tuple[int, ...] | None) -> str:
    return "" if shape is None else "[" + ",".join(str(d) for d in shape) + "]"


def _text(spec: Spec) -> str:
    return f"{spec[1]}{_dims(spec[0])}"
