"""Scanned <-> unscanned layers: ``unstack`` and ``stack``.

``unstack`` cuts a leaf along an axis into one leaf per index (``params.layers.kernel [L, d, d]``
-> ``params.layers_{i}.kernel [d, d]``); ``stack`` joins numbered leaves into one along a new
axis, ordered by the pattern's group ``i``. Both stream: a region of an unstacked leaf is the
same region of one slice of its source; a region of a stacked leaf reads the same region of each
layer it covers. Optimizer state follows as it does for ``split`` and ``concat``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ckpt_cli.core.spec import ops
from ckpt_cli.core.spec.language import Rule
from ckpt_cli.core.spec.rules import _axis, _dims, _expand, _name, merge_following
from ckpt_cli.core.spec.tree import Step, Work
from ckpt_cli.core.state import relative_path
from ckpt_cli.errors import RefusedError

INDEX = "{i}"


@dataclass(frozen=True, eq=False)
class Index(ops.Unary):
    """One index of ``inner`` along ``axis``, that axis removed."""

    axis: int
    index: int

    def fetch(self, region: ops.Region, ctx: ops.EvalContext) -> Any:
        import numpy as np

        sub = list(region)
        sub.insert(self.axis, slice(self.index, self.index + 1))
        shape = tuple(s.stop - s.start for s in region)
        return ops.then(self.inner.fetch(tuple(sub), ctx), lambda v: np.asarray(v).reshape(shape))


@dataclass(frozen=True, eq=False)
class Stack(ops.Node):
    """``parts`` (equal shapes and dtypes) stacked along a new ``axis``."""

    parts: tuple[ops.Node, ...]
    axis: int

    @property
    def inputs(self) -> tuple[ops.Node, ...]:
        return self.parts

    def fetch(self, region: ops.Region, ctx: ops.EvalContext) -> Any:
        import numpy as np

        s = region[self.axis]
        rest = region[: self.axis] + region[self.axis + 1 :]
        pieces = [self.parts[j].fetch(rest, ctx) for j in range(s.start, s.stop)]
        return ops.Pending(pieces, lambda vs: np.stack([np.asarray(v) for v in vs], self.axis))


def unstack(rule: Rule, w: Work, via: Work | None, names: list[str] | None = None) -> list[Work]:
    """The leaves ``w`` is cut into (``names``: the ones a following moment takes)."""
    assert w.expr is not None
    expr, where = w.expr, f"{rule.label}: leaf {w.name!r}"
    if not expr.shape:
        raise RefusedError(f"{where} is a scalar: there is no axis to unstack")
    axis = _axis(rule.axis or 0, len(expr.shape), where)
    n = expr.shape[axis]
    if n == 0:
        raise RefusedError(f"{where}: axis {axis} has size 0, nothing to unstack")
    if names is None:
        m = rule.selects(w.name)
        assert m is not None
        names = [_expand(rule, m, (rule.to or "").replace(INDEX, str(i)), w) for i in range(n)]
    shape = expr.shape[:axis] + expr.shape[axis + 1 :]
    out = []
    for i, name in enumerate(names):
        node = Index(shape=shape, dtype=expr.dtype, inner=expr, axis=axis, index=i)
        step = Step(rule.index, "unstack", f"{w.name}[{i}] on axis {axis}", _name(via))
        out.append(w.with_expr(node, step, name))
    return out


def follow_unstack(rule: Rule, param: Work, moment: Work, param_out: list[Work]) -> list[Work]:
    """A moment is cut like its parameter, into names that mirror the parameter's new ones."""
    prefix = moment.keypath[: len(moment.keypath) - len(relative_path(param.keypath))]
    names = [".".join(prefix + relative_path(p.keypath)) for p in param_out]
    return unstack(rule, moment, param, names)


def stack(rule: Rule, work: list[Work]) -> tuple[list[Work], bool]:
    """Join the leaves ``from`` matches, grouped by the name ``to`` gives them and ordered by
    their group ``i``, which must run 0..N-1."""
    groups: dict[str, list[tuple[int, Work]]] = {}
    for w in work:
        m = rule.selects(w.name) if w.expr is not None else None
        if m is None:
            continue
        text = m.group("i")
        if not text.isdigit():
            raise RefusedError(
                f"{rule.label}: leaf {w.name!r}: group i is {text!r}, not a layer number",
                hint="match the index with (?P<i>\\d+)",
            )
        groups.setdefault(_expand(rule, m, rule.to or "", w), []).append((int(text), w))
    return merge_following(rule, work, _numbered(rule, groups), _stack_one), bool(groups)


def _numbered(
    rule: Rule, groups: dict[str, list[tuple[int, Work]]]
) -> Iterator[tuple[str, list[Work]]]:
    """Each group's leaves in layer order, refused unless numbered 0, 1, ... without a gap."""
    for name, members in groups.items():
        members.sort(key=lambda t: t[0])
        indices = [i for i, _ in members]
        if indices != list(range(len(members))):
            missing = sorted(set(range(max(indices) + 1)) - set(indices))
            why = f"index {missing[0]} is missing" if missing else "an index appears twice"
            raise RefusedError(
                f"{rule.label}: the leaves stacked into {name!r} are numbered {_dims(indices)}: {why}"
            )
        yield name, [w for _, w in members]


def _stack_one(rule: Rule, inputs: list[Work], name: str, via: Work | None) -> Work:
    nodes = [x.expr for x in inputs if x.expr is not None]
    assert len(nodes) == len(inputs)
    first = nodes[0]
    where = f"{rule.label}: {name!r}"
    axis = _axis(rule.axis or 0, len(first.shape) + 1, where)
    for x, e in zip(inputs, nodes, strict=True):
        if e.dtype != first.dtype or e.shape != first.shape:
            raise RefusedError(
                f"{where}: {x.name!r} is {e.dtype}{_dims(e.shape)}, {inputs[0].name!r} is "
                f"{first.dtype}{_dims(first.shape)}: stacked leaves must be alike"
            )
    shape = (*first.shape[:axis], len(nodes), *first.shape[axis:])
    node = Stack(shape=shape, dtype=first.dtype, parts=tuple(nodes), axis=axis)
    detail = f"{len(inputs)} leaves ({inputs[0].name} ...) on axis {axis}"
    return inputs[0].merged(name, node, Step(rule.index, "stack", detail, _name(via)), inputs)
