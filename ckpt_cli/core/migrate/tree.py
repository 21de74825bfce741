"""Leaves while a migration is planned, and how optimizer state follows parameters.

A parameter is a leaf below a parameter root (``params``, ``model``... the names ``inspect`` uses
to find the training state's parts); its *relative path* is what follows the root
(``params.Dense_0.kernel`` -> ``Dense_0.kernel``). An optimizer leaf (below ``opt_state``,
``optimizer``...) *mirrors* a parameter when its path ends with that relative path and it has the
parameter's shape: optax's Adam ``mu``/``nu``, SGD's ``trace``, an EMA of the parameters all do;
scalar counts and factored second moments do not. When several relative paths end an optimizer
leaf's path, the longest one decides which parameter it mirrors. Its *moment prefix* is the rest
(``opt_state.0.mu``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol, TypedDict

from ckpt_cli.core.format.names import leaf_name_problem, tree_conflict
from ckpt_cli.core.format.sizes import shape_problem
from ckpt_cli.core.inspect import Leaf
from ckpt_cli.core.migrate import ops
from ckpt_cli.core.state import item_keypath, mirrored, parameter_index
from ckpt_cli.errors import RefusedError

if TYPE_CHECKING:
    from ckpt_cli.core.migrate.spec import Rule


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


def followers(rule: Rule, direct: list[Work], work: list[Work]) -> dict[int, list[Work]]:
    """For each parameter a rule matches (by id), the optimizer leaves that mirror it and that
    the rule does not match itself."""
    index = _params_by_path(work)
    chosen = {id(w) for w in direct}
    out: dict[int, list[Work]] = {}
    for o in work:
        if id(o) in chosen:
            continue
        found = _mirrored(o, index)
        if found is None:
            continue
        params = [p for p in found[0] if id(p) in chosen]
        if len(params) > 1:
            raise RefusedError(
                f"{rule.label}: optimizer leaf {o.name!r} mirrors both {params[0].name!r} and "
                f"{params[1].name!r}; set follow_optimizer: false and match the optimizer leaves"
            )
        if params:
            out.setdefault(id(params[0]), []).append(o)
    return out


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
