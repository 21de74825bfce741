"""What each rule does to the leaves it matches, and to the leaves that follow them: optimizer
moments and the subtrees that mirror the parameters (``master_params``, ``ema_params``).

Every refusal names the rule, the field and the leaf; nothing here reads array data.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

from ckpt_cli.core.format.names import tree_conflict
from ckpt_cli.core.regex import Match
from ckpt_cli.core.spec import ops
from ckpt_cli.core.spec.initializers import FAN_KINDS, Initializer, numpy_dtype
from ckpt_cli.core.spec.language import Rule
from ckpt_cli.core.spec.tree import Step, Work, follower_prefixes, is_moment
from ckpt_cli.core.state import parameter_root, relative_path
from ckpt_cli.errors import RefusedError


def change(rule: Rule, w: Work, via: Work | None) -> list[Work]:
    """The leaves ``w`` becomes under ``rule`` (``via``: the parameter a moment follows)."""
    op = rule.op
    if op == "drop":
        return []
    if op == "rename":
        m = rule.selects(w.name)
        assert m is not None
        new = _expand(rule, m, rule.to or "", w)
        return [w.renamed(new, Step(rule.index, op, f"{w.name} -> {new}", _name(via)))]
    assert w.expr is not None
    expr, where = w.expr, f"{rule.label}: leaf {w.name!r}"
    if op == "cast":
        return [_cast(rule, w, via)]
    if op == "set":
        w.claim(rule, "set")
        value = _fits(rule, expr.dtype, rule.value, where)
        node: ops.Node = ops.Const(shape=expr.shape, dtype=expr.dtype, value=value)
        return [w.with_expr(node, Step(rule.index, op, f"= {rule.value}", _name(via)))]
    if op == "resize":
        return [_resize(rule, w, via)]
    if op == "reshape":
        shape = _reshape_shape(rule, expr.shape, where)
        node = ops.Reshape(shape=shape, dtype=expr.dtype, inner=expr)
        return [
            w.with_expr(
                node, Step(rule.index, op, f"{_dims(expr.shape)} -> {_dims(shape)}", _name(via))
            )
        ]
    if op == "transpose":
        axes = rule.axes or ()
        if len(axes) != len(expr.shape):
            raise RefusedError(
                f"{where} has rank {len(expr.shape)}: field 'axes' {list(axes)} has {len(axes)} entries"
            )
        node = ops.Transpose(
            shape=tuple(expr.shape[a] for a in axes), dtype=expr.dtype, inner=expr, axes=axes
        )
        return [w.with_expr(node, Step(rule.index, op, f"axes {list(axes)}", _name(via)))]
    if op == "split":
        return _split(rule, w, via)
    if op == "python":
        shape = (
            tuple(d for d in rule.shape if d is not None) if rule.shape is not None else expr.shape
        )
        node = ops.Python(
            shape=shape,
            dtype=rule.dtype or expr.dtype,
            inner=expr,
            function=rule.function or "",
            label=rule.label,
            leaf=w.name,
        )
        return [w.with_expr(node, Step(rule.index, op, rule.function or "", _name(via)))]
    raise AssertionError(op)


def follow_change(rule: Rule, param: Work, moment: Work, param_out: list[Work]) -> list[Work]:
    """A moment or a mirror follows its parameter: renamed and split to mirror the parameter's
    new names; resized with zeros (a moment) or the parameter's own new values (a mirror: the
    same initializer keyed by the parameter's name) where the parameter got new values."""
    if rule.op in ("rename", "split"):
        prefix = moment.keypath[: len(moment.keypath) - len(relative_path(param.keypath))]
        names = [".".join(prefix + relative_path(p.keypath)) for p in param_out]
        if rule.op == "split":
            return _split(rule, moment, param, names)
        step = Step(rule.index, "rename", f"{moment.name} -> {names[0]}", param.name)
        return [moment.renamed(names[0], step)]
    if rule.op == "drop":
        return []
    if rule.op == "resize":
        return [_resize(rule, moment, param, zeros=is_moment(moment))]
    return change(rule, moment, param)


def _cast(rule: Rule, w: Work, via: Work | None) -> Work:
    assert w.expr is not None and rule.dtype is not None
    w.claim(rule, "cast")
    src, dst = w.expr.dtype, rule.dtype
    where = f"{rule.label}: leaf {w.name!r}"
    if not (ops.is_float(src) or ops.is_integer(src) or src == "bool"):
        raise RefusedError(f"{where} is {src}: only bool, integer and float leaves are cast")
    if ops.is_integer(dst) and ops.is_float(src) and rule.rounding is None:
        raise RefusedError(
            f"{where} is {src} and {dst} is an integer: field 'rounding' is required (nearest, floor, ceil or trunc)"
        )
    if src == dst:
        return w
    node = ops.Cast(
        shape=w.expr.shape,
        dtype=dst,
        inner=w.expr,
        rounding=rule.rounding,
        label=rule.label,
        leaf=w.name,
    )
    return w.with_expr(node, Step(rule.index, "cast", f"{src} -> {dst}", _name(via)))


def _resize(rule: Rule, w: Work, via: Work | None, zeros: bool = False) -> Work:
    assert w.expr is not None and rule.shape is not None
    old, where = w.expr.shape, f"{rule.label}: leaf {w.name!r}"
    if len(rule.shape) != len(old):
        raise RefusedError(
            f"{where} has shape {_dims(old)}: field 'shape' {_dims(rule.shape)} has {len(rule.shape)} entries"
        )
    new = tuple(o if d is None else d for o, d in zip(old, rule.shape, strict=True))
    init = Initializer("zeros") if zeros else rule.init
    if any(n > o for n, o in zip(new, old, strict=True)):
        if init is None:
            raise RefusedError(
                f"{where} grows {_dims(old)} -> {_dims(new)}: field 'init' is required (zeros, normal(0.02), lecun_normal, ...)"
            )
        if init.kind in FAN_KINDS and len(new) < 2:
            raise RefusedError(
                f"{where}: field 'init': {init.kind} needs fans, leaf has rank {len(new)}"
            )
    if new == old:
        return w
    # A mirror draws the values its parameter draws: the key is the parameter's name.
    key = (via or w).name
    node = ops.Resize(shape=new, dtype=w.expr.dtype, inner=w.expr, init=init, key_name=key)
    fill = (
        f" pad {init.describe()}"
        if init and any(n > o for n, o in zip(new, old, strict=True))
        else ""
    )
    return w.with_expr(
        node, Step(rule.index, "resize", f"{_dims(old)} -> {_dims(new)}{fill}", _name(via))
    )


def _reshape_shape(rule: Rule, old: tuple[int, ...], where: str) -> tuple[int, ...]:
    shape = [int(d or 0) for d in rule.shape or ()]
    total = 1
    for d in old:
        total *= d
    if -1 in shape:
        known = 1
        for d in shape:
            known *= d if d != -1 else 1
        if known == 0 or total % known:
            raise RefusedError(
                f"{where}: impossible reshape: {total} elements into {_dims(tuple(shape))}"
            )
        shape[shape.index(-1)] = total // known
    count = 1
    for d in shape:
        count *= d
    if count != total:
        raise RefusedError(
            f"{where}: impossible reshape of {_dims(old)} ({total} elements) into field 'shape' {_dims(tuple(shape))} ({count})"
        )
    return tuple(shape)


def _split(rule: Rule, w: Work, via: Work | None, names: list[str] | None = None) -> list[Work]:
    assert w.expr is not None and rule.axis is not None
    expr, where = w.expr, f"{rule.label}: leaf {w.name!r}"
    axis = _axis(rule.axis, len(expr.shape), where)
    n = expr.shape[axis]
    if rule.sizes is not None:
        sizes = list(rule.sizes)
        if sum(sizes) != n:
            raise RefusedError(
                f"{where}: field 'sizes' {sizes} sums to {sum(sizes)}, axis {axis} has {n}"
            )
    else:
        if n % len(rule.into):
            raise RefusedError(
                f"{where}: axis {axis} of size {n} does not split into {len(rule.into)} equal parts: give field 'sizes'"
            )
        sizes = [n // len(rule.into)] * len(rule.into)
    if names is None:
        m = rule.selects(w.name)
        assert m is not None
        names = [_expand(rule, m, template, w) for template in rule.into]
    out, start = [], 0
    for name, size in zip(names, sizes, strict=True):
        shape = tuple(size if i == axis else d for i, d in enumerate(expr.shape))
        node = ops.Slice(shape=shape, dtype=expr.dtype, inner=expr, axis=axis, start=start)
        detail = f"{w.name}[{start}:{start + size}] on axis {axis}"
        out.append(w.with_expr(node, Step(rule.index, "split", detail, _name(via)), name))
        start += size
    return out


def concat(rule: Rule, work: list[Work]) -> tuple[list[Work], bool]:
    assert rule.axis is not None
    first, others = rule.match[0], rule.match[1:]
    by_groups: list[dict[tuple[Any, ...], Work]] = [{} for _ in others]
    for w in work:
        for i, pattern in enumerate(others):
            m = pattern.fullmatch(w.name) if w.expr is not None else None
            if m:
                by_groups[i][m.groups()] = w
    groups: list[tuple[Work, list[Work], Match]] = []
    used: dict[int, str] = {}
    for w in work:
        m = first.fullmatch(w.name) if w.expr is not None else None
        if not m:
            continue
        partners = []
        for i, pattern in enumerate(others):
            p = by_groups[i].get(m.groups())
            if p is None:
                raise RefusedError(
                    f"{rule.label}: field 'from': {w.name!r} has no partner matching {pattern.pattern!r}"
                )
            partners.append(p)
        for p in [w, *partners]:
            if id(p) in used:
                raise RefusedError(
                    f"{rule.label}: leaf {p.name!r} is an input of two concatenations ({used[id(p)]!r} and {w.name!r})"
                )
            used[id(p)] = w.name
        groups.append((w, partners, m))
    merged = [(_expand(rule, m, rule.to or "", w), [w, *partners]) for w, partners, m in groups]
    return merge_following(rule, work, merged, _concat_one), bool(groups)


def merge_following(
    rule: Rule,
    work: list[Work],
    groups: Iterable[tuple[str, list[Work]]],
    merge: Callable[[Rule, list[Work], str, Work | None], Work],
) -> list[Work]:
    """``work`` with the inputs of each group merged by ``merge`` into one leaf of the group's
    name (concat, stack) in the place of the first; each family of leaves that follows them
    (optimizer moments with ``follow_optimizer``, mirrors with ``follow_mirrors``) is merged
    the same way beside them."""
    by_path: dict[tuple[str, ...], Work] = {}  # each mirror found in one lookup, not a scan
    for w in work:
        if w.expr is not None:
            by_path.setdefault(w.keypath, w)
    families: dict[tuple[str, ...] | None, list[tuple[str, ...]]] = {}
    replaced: dict[int, list[Work]] = {}

    def replace(inputs: list[Work], result: Work) -> None:
        replaced[id(inputs[0])] = [result]
        for x in inputs[1:]:
            replaced[id(x)] = []

    for name, inputs in groups:
        result = merge(rule, inputs, name, None)
        replace(inputs, result)
        root = parameter_root(inputs[0].keypath)
        if root not in families:
            families[root] = [p for p, _ in follower_prefixes(rule, inputs[0], work)]
        for prefix in families[root]:
            moments = [by_path.get(prefix + relative_path(x.keypath)) for x in inputs]
            present = [x for x in moments if x is not None]
            if not present:
                continue
            if len(present) != len(moments):
                raise RefusedError(
                    f"{rule.label}: {'.'.join(prefix)} follows some inputs of {name!r} but not all: set follow_optimizer: false (follow_mirrors: false for a mirror)"
                )
            moment_name = ".".join(prefix + relative_path(result.keypath))
            replace(present, merge(rule, present, moment_name, inputs[0]))
    out: list[Work] = []
    for w in work:
        out += replaced.get(id(w), [w])
    check_unique(rule, out)
    return out


def _concat_one(rule: Rule, inputs: list[Work], name: str, via: Work | None) -> Work:
    exprs = [x.expr for x in inputs]
    assert all(e is not None for e in exprs) and rule.axis is not None
    nodes = [e for e in exprs if e is not None]
    where = f"{rule.label}: {name!r}"
    axis = _axis(rule.axis, len(nodes[0].shape), where)
    for x, e in zip(inputs, nodes, strict=True):
        if e.dtype != nodes[0].dtype:
            raise RefusedError(
                f"{where}: {x.name!r} is {e.dtype}, {inputs[0].name!r} is {nodes[0].dtype}: cast them to one dtype first"
            )
        if len(e.shape) != len(nodes[0].shape) or any(
            a != b
            for i, (a, b) in enumerate(zip(e.shape, nodes[0].shape, strict=True))
            if i != axis
        ):
            raise RefusedError(
                f"{where}: {x.name!r} {_dims(e.shape)} and {inputs[0].name!r} {_dims(nodes[0].shape)} differ off axis {axis}"
            )
    shape = tuple(
        sum(e.shape[axis] for e in nodes) if i == axis else d for i, d in enumerate(nodes[0].shape)
    )
    node = ops.Concat(shape=shape, dtype=nodes[0].dtype, parts=tuple(nodes), axis=axis)
    step = Step(
        rule.index, "concat", f"{' + '.join(x.name for x in inputs)} on axis {axis}", _name(via)
    )
    return inputs[0].merged(name, node, step, inputs)


def add(rule: Rule, work: list[Work]) -> list[Work]:
    assert rule.name is not None and rule.shape is not None and rule.dtype is not None
    shape = tuple(int(d or 0) for d in rule.shape)
    init = rule.init or Initializer("zeros")
    node = ops.Init(shape=shape, dtype=rule.dtype, init=init, key_name=rule.name)
    added = Work.new(rule.name, node, rule.value_type, Step(rule.index, "add", init.describe()))
    out = [*work, added]
    if relative_path(added.keypath) != added.keypath:
        for prefix, dtype in follower_prefixes(rule, added, work):
            name = ".".join(prefix + relative_path(added.keypath))
            # A moment starts at zero; a mirror holds the parameter's own values (same key).
            fill = Initializer("zeros") if is_moment(prefix) else init
            node = ops.Init(shape=shape, dtype=dtype, init=fill, key_name=rule.name)
            step = Step(rule.index, "add", fill.describe(), rule.name)
            out.append(Work.new(name, node, rule.value_type, step))
    check_unique(rule, out)
    return out


def _expand(rule: Rule, m: Match, template: str, w: Work) -> str:
    try:
        name = m.expand(template)
    except (re.error, IndexError) as e:
        raise RefusedError(
            f"{rule.label}: cannot build a name from {template!r} for {w.name!r}: {e}"
        ) from None
    if not name or any(not p for p in name.split(".")):
        raise RefusedError(
            f"{rule.label}: {w.name!r} would become {name!r}, not a dotted leaf name"
        )
    return name


def _followers_last(work: list[Work]) -> list[Work]:
    """Report a conflict between the leaves a rule names before one among their followers."""
    return sorted(work, key=lambda w: bool(w.steps and w.steps[-1].via))


def check_unique(rule: Rule, out: list[Work]) -> None:
    seen: dict[tuple[str | None, str], Work] = {}
    for w in _followers_last(out):
        other = seen.get((w.item, w.name))
        if other is not None:
            a, b = sorted([other.origin, w.origin])
            raise RefusedError(
                f"{rule.label}: two leaves would be named {w.name!r} ({a} and {b})",
                hint="two rules or two leaves write one leaf; rename one of them",
            )
        seen[w.item, w.name] = w


def check_tree(rule: Rule, work: list[Work]) -> None:
    """A name may not be both a leaf and a subtree (``a.b`` and ``a.b.c``)."""
    for item in dict.fromkeys(w.item for w in work):
        paths = [w.keypath for w in _followers_last(work) if w.item == item]
        if clash := tree_conflict(paths):
            raise RefusedError(
                f"{rule.label}: {clash[0]!r} would be a leaf and also hold {clash[1]!r}"
            )


def _fits(rule: Rule, dtype: str, value: Any, where: str) -> Any:
    import numpy as np

    if dtype == "bool":
        if not isinstance(value, bool):
            raise RefusedError(
                f"{where} is bool: field 'value' must be true or false, got {value!r}"
            )
        return value
    if ops.is_integer(dtype):
        if isinstance(value, float) and not value.is_integer():
            raise RefusedError(f"{where} is {dtype}: field 'value' {value!r} is not an integer")
        info = np.iinfo(numpy_dtype(dtype))
        if not info.min <= int(value) <= info.max:
            raise RefusedError(f"{where} is {dtype}: field 'value' {value!r} does not fit")
        return int(value)
    return float(value)


def _axis(axis: int, rank: int, where: str) -> int:
    if not -rank <= axis < rank:
        raise RefusedError(f"{where}: field 'axis' {axis} is out of range for rank {rank}")
    return axis % rank


def _dims(shape: Iterable[Any]) -> str:
    return "[" + ",".join("*" if d is None else str(d) for d in shape) + "]"


def _name(w: Work | None) -> str | None:
    return None if w is None else w.name
