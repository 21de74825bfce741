"""Leaves while a migration is planned, and how optimizer state follows parameters.

A parameter is a leaf below a parameter root (``params``, ``model``... the names ``inspect`` uses
to find the training state's parts); its *relative path* is what follows the root
(``params.Dense_0.kernel`` -> ``Dense_0.kernel``). An optimizer leaf (below ``opt_state``,
``optimizer``...) *mirrors* a parameter when its path ends with that relative path and it has the
parameter's shape: optax's Adam ``mu``/``nu``, SGD's ``trace``, an EMA of the parameters all do;
scalar counts and factored second moments do not. When several relative paths end an optimizer
leaf's path, the longest one decides which parameter it mirrors. Its *moment prefix* is the rest
(``opt_state.0.mu``).

Other subtrees can mirror a parameter tree leaf for leaf, outside the optimizer state: a float32
``master_params``, ``ema_params`` (``state.mirror_roots``). They follow the rules written for the
parameters as moments do (``follow_mirrors``), with the parameters' own new values where those
grow; a rule written for a mirror changes that mirror only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol, TypedDict

from ckpt_cli.core.format.names import leaf_name_problem, tree_conflict
from ckpt_cli.core.format.sizes import shape_problem
from ckpt_cli.core.inspect import Leaf
from ckpt_cli.core.spec import ops
from ckpt_cli.core.state import (
    item_keypath,
    mirror_roots,
    mirrored,
    parameter_index,
    parameter_root,
    telling_name,
)
from ckpt_cli.errors import RefusedError

if TYPE_CHECKING:
    from ckpt_cli.core.spec.language import Rule


class OperationJSON(TypedDict):
    rule: int
    op: str
    detail: str
    follows: str | None


@dataclass(frozen=True)
class Step:
    """One operation on a destination leaf, for the plan's display."""

    rule: int
    op: str
    detail: str
    via: str | None = None  # the parameter an optimizer leaf followed

    def to_json(self) -> OperationJSON:
        return {"rule": self.rule, "op": self.op, "detail": self.detail, "follows": self.via}

    def text(self) -> str:
        via = f" (follows {self.via})" if self.via else ""
        return f"{self.op} {self.detail}{via} [rule {self.rule}]".replace("  ", " ")


@dataclass
class Work:
    """One leaf of the tree being planned (mutable only while rules apply)."""

    keypath: tuple[str, ...]
    key_types: tuple[int | None, ...]  # None: a new container, decided when the plan is frozen
    value_type: str
    expr: ops.Node | None
    sources: tuple[str, ...]
    leaf: Leaf | None  # the source leaf whose storage facts (sharding, key impl) it keeps
    origin: str  # for messages: the source leaf, or the rule that made it
    steps: tuple[Step, ...] = ()
    claims: dict[str, int] = field(default_factory=dict)
    #: The item of the step it belongs to when a migration plans several items at once.
    item: str | None = None

    @property
    def name(self) -> str:
        return ".".join(self.keypath)

    @property
    def mirror_path(self) -> tuple[str, ...]:
        """The path optimizer mirrors are matched by, across items too (``item_keypath``)."""
        return item_keypath(self.item, self.keypath)

    @classmethod
    def from_leaf(cls, leaf: Leaf, item: str | None = None) -> Work:
        expr = None
        if leaf.array is not None and leaf.dtype is not None and leaf.shape is not None:
            expr = ops.Source(
                shape=leaf.shape,
                dtype=leaf.dtype,
                name=leaf.name,
                info=leaf.array,
                database=leaf.database,
            )
        return cls(
            leaf.keypath,
            leaf.key_types,
            leaf.value_type,
            expr,
            (leaf.name,),
            leaf,
            leaf.name,
            item=item,
        )

    @classmethod
    def new(cls, name: str, expr: ops.Node, value_type: str, step: Step) -> Work:
        keypath = tuple(name.split("."))
        return cls(
            keypath,
            (None,) * len(keypath),
            value_type,
            expr,
            (),
            None,
            f"rule {step.rule}",
            (step,),
        )

    def _moved_types(self, keypath: tuple[str, ...]) -> tuple[int | None, ...]:
        # The type at position i is the kind of the container keypath[:i]: known when unchanged.
        return tuple(
            self.key_types[i] if i < len(self.keypath) and keypath[:i] == self.keypath[:i] else None
            for i in range(len(keypath))
        )

    def renamed(self, name: str, step: Step) -> Work:
        keypath = tuple(name.split("."))
        return replace(
            self,
            keypath=keypath,
            key_types=self._moved_types(keypath),
            steps=(*self.steps, step),
            claims=dict(self.claims),
        )

    def with_expr(self, expr: ops.Node, step: Step, name: str | None = None) -> Work:
        out = replace(self, expr=expr, steps=(*self.steps, step), claims=dict(self.claims))
        if name is not None and name != self.name:
            keypath = tuple(name.split("."))
            out = replace(out, keypath=keypath, key_types=self._moved_types(keypath))
        return out

    def merged(self, name: str, expr: ops.Node, step: Step, inputs: list[Work]) -> Work:
        sources = tuple(dict.fromkeys(s for w in inputs for s in w.sources))
        out = self.with_expr(expr, step, name)
        return replace(out, sources=sources, steps=(*(s for w in inputs for s in w.steps), step))

    def claim(self, rule: Rule, kind: str) -> None:
        """A leaf takes one cast and one set: a second would silently undo the first."""
        if kind in self.claims:
            raise RefusedError(
                f"{rule.label}: leaf {self.name!r} is already given a {kind} by rule {self.claims[kind]}",
                hint="two rules write one leaf; narrow one of them with `exclude`",
            )
        self.claims[kind] = rule.index


def _params_by_path(work: list[Work]) -> dict[tuple[str, ...], list[Work]]:
    return parameter_index((w for w in work if w.expr is not None), lambda w: w.mirror_path)


def _mirrored(o: Work, index: dict[tuple[str, ...], list[Work]]) -> tuple[list[Work], int] | None:
    """The parameters an optimizer leaf mirrors (longest relative path first) and where it starts."""
    if o.expr is None:
        return None
    found = mirrored(o.mirror_path, o.expr.shape, index, lambda p: p.expr.shape if p.expr else None)
    shift = len(o.mirror_path) - len(o.keypath)  # the item name, when it leads the path
    return None if found is None else (found[0], found[1] - shift)


def mirrors_by_root(work: list[Work]) -> dict[tuple[str, ...], tuple[str, ...]]:
    """The subtrees that mirror a parameter tree leaf for leaf (``master_params``,
    ``ema_params``), each with the root of the parameters it mirrors (``state.mirror_roots``)."""
    arrays = [w for w in work if w.expr is not None]
    return mirror_roots(arrays, lambda w: w.keypath, lambda w: w.expr.shape if w.expr else None)


def _carries(w: Work, mirrors: dict[tuple[str, ...], tuple[str, ...]]) -> bool:
    """Whether leaves follow ``w``: a parameter, not one of a mirror's (``ema_params``: a rule
    written for the EMA changes the EMA only)."""
    root = parameter_root(w.keypath)
    return root is None or root not in mirrors


def followers(rule: Rule, direct: list[Work], work: list[Work]) -> dict[int, list[Work]]:
    """For each parameter a rule matches (by id), the leaves that follow it and that the rule
    does not match itself: with ``follow_optimizer`` the optimizer leaves that mirror it, with
    ``follow_mirrors`` its copy in each subtree that mirrors its tree (``master_params``...)."""
    mirrors = mirrors_by_root(work)
    matched = {id(w) for w in direct}
    chosen = {id(w) for w in direct if _carries(w, mirrors)}
    out: dict[int, list[Work]] = {}
    if rule.follow_optimizer:
        index = _params_by_path(work)
        for o in work:
            found = None if id(o) in matched else _mirrored(o, index)
            params = [p for p in found[0] if id(p) in chosen] if found else []
            if len(params) > 1:
                raise RefusedError(
                    f"{rule.label}: optimizer leaf {o.name!r} mirrors both {params[0].name!r} and "
                    f"{params[1].name!r}; set follow_optimizer: false and match the optimizer leaves"
                )
            if params:
                out.setdefault(id(params[0]), []).append(o)
    if rule.follow_mirrors and mirrors:
        by_path = {w.keypath: w for w in work if w.expr is not None}
        for w in direct:
            root = parameter_root(w.keypath)
            if root is None or id(w) not in chosen:
                continue
            for prefix in (p for p, r in mirrors.items() if r == root):
                m = by_path.get(prefix + w.keypath[len(root) :])
                if m is not None and id(m) not in matched:
                    out.setdefault(id(w), []).append(m)
    return out


def follower_prefixes(
    rule: Rule, first: Work, work: list[Work]
) -> list[tuple[tuple[str, ...], str]]:
    """The prefixes of the leaves that follow a parameter ``first`` of ``work`` under ``rule``
    (optimizer moments, then the subtrees that mirror its tree), each with its leaves' dtype."""
    mirrors = mirrors_by_root(work)
    if not _carries(first, mirrors):
        return []
    out = moment_prefixes(work) if rule.follow_optimizer else []
    root = parameter_root(first.keypath)
    if rule.follow_mirrors and root is not None:
        for prefix in (p for p, r in mirrors.items() if r == root):
            out.append((prefix, _dtype_under(prefix, work)))
    return out


def _dtype_under(prefix: tuple[str, ...], work: list[Work]) -> str:
    """The dtype of a mirror's first leaf: what a leaf added to it is written as."""
    return next(
        w.expr.dtype for w in work if w.expr is not None and w.keypath[: len(prefix)] == prefix
    )


def is_moment(w: Work | tuple[str, ...]) -> bool:
    """Whether a leaf (or a path) is optimizer state: a moment follows a parameter with zeros
    where it grows; a mirror is a copy."""
    telling = telling_name(w if isinstance(w, tuple) else w.keypath)
    return telling is not None and telling[0] == "opt_state"


def moment_prefixes(work: list[Work]) -> list[tuple[tuple[str, ...], str]]:
    """The moment prefixes of the tree (``opt_state.0.mu``...), each with its leaves' dtype."""
    index = _params_by_path(work)
    out: dict[tuple[str, ...], str] = {}
    for o in work:
        found = _mirrored(o, index)
        if found is not None and o.expr is not None:
            out.setdefault(o.keypath[: found[1]], o.expr.dtype)
    return list(out.items())


def fill_key_types(work: list[Work]) -> dict[tuple[str, ...], int]:
    """Container kinds (1 sequence, 2 mapping) of every path prefix the known types tell."""
    kinds: dict[tuple[str, ...], int] = {}
    for w in work:
        for i, t in enumerate(w.key_types):
            if t is not None:
                kinds.setdefault(w.keypath[:i], t)
    return kinds


def key_types(w: Work, kinds: dict[tuple[str, ...], Any]) -> tuple[int, ...]:
    return tuple(
        t if t is not None else kinds.get(w.keypath[:i], 2) for i, t in enumerate(w.key_types)
    )


class Planned(Protocol):
    """A leaf a writer plans (``Work``, as migrate and import check them)."""

    @property
    def keypath(self) -> tuple[str, ...]: ...

    @property
    def name(self) -> str: ...

    @property
    def expr(self) -> ops.Node | None: ...


def check_written_leaves(leaves: Sequence[Planned], *, ocdbt: bool) -> None:
    """What every writer of planned leaves (migrate, import) refuses before anything is written:
    a name that is both a leaf and a subtree, a name the output cannot hold (without OCDBT an
    array's name is its directory), a shape TensorStore cannot open."""
    if clash := tree_conflict([leaf.keypath for leaf in leaves]):
        raise RefusedError(
            f"leaf {clash[0]!r} would also hold {clash[1]!r}: Orbax restores only the subtree "
            "and loses the leaf; nothing written",
            hint="rename one of them (`op: rename`)",
        )
    for leaf in leaves:
        plain = not ocdbt and leaf.expr is not None
        if why := leaf_name_problem(leaf.name, ocdbt=not plain):
            raise RefusedError(
                f"leaf {leaf.name!r} cannot be written{' without OCDBT' if plain else ''} "
                f"({why}); nothing written",
                hint="rename it (`op: rename`)" + (", or drop --no-ocdbt" if plain else ""),
            )
        if leaf.expr is not None and (problem := shape_problem(leaf.expr.shape)):
            raise RefusedError(
                f"leaf {leaf.name!r}: shape: {problem}; nothing written",
                hint="change the rule or the file that gives it this shape",
            )


class Followed(Protocol):
    """A planned leaf with the operations that made it (``plan.DestLeaf``)."""

    @property
    def keypath(self) -> tuple[str, ...]: ...

    @property
    def expr(self) -> ops.Node | None: ...

    @property
    def steps(self) -> tuple[Step, ...]: ...


def followed_families(leaves: Sequence[Followed]) -> dict[int, dict[str, int]]:
    """Per rule, the families of leaves that followed the parameters it changed and how many
    leaves of each: a mirror by its root (``master_params``), a moment by its prefix
    (``opt_state.0.mu``), in the planned tree."""

    def shape_of(x: Followed) -> tuple[int, ...] | None:
        return x.expr.shape if x.expr is not None else None

    arrays = [x for x in leaves if x.expr is not None]
    mirrors = mirror_roots(arrays, lambda x: x.keypath, shape_of)
    index = parameter_index(arrays, lambda x: x.keypath)
    out: dict[int, dict[str, int]] = {}
    for x in arrays:
        rules = {s.rule for s in x.steps if s.via is not None}
        if not rules:
            continue
        family = next((p for p in mirrors if x.keypath[: len(p)] == p), None)
        if family is None:
            found = mirrored(x.keypath, shape_of(x), index, shape_of)
            family = x.keypath[: found[1]] if found else x.keypath[:1]
        for rule in rules:
            counts = out.setdefault(rule, {})
            counts[".".join(family)] = counts.get(".".join(family), 0) + 1
    return out
