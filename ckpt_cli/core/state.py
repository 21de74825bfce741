"""The parts of a training state: parameters, optimizer state and step (required), RNG state and
data order (optional).

A checkpoint that lacks one of them still restores, but resuming from it silently loses something;
this module finds each part by leaf names and dtypes (``classify_leaf``, ``analyse_state``: one
item) and follows mirrors of the parameters (optimizer moments, EMA, master copies);
``core.step_state`` judges the step, whose items together are the training state.
A missing required part makes the state incomplete; a missing optional part is a note naming what
a resumed run cannot reproduce.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, TypedDict, TypeVar

Part = Literal["params", "opt_state", "step", "rng", "data_order"]
PARTS: tuple[Part, ...] = ("params", "opt_state", "step", "rng", "data_order")
#: The parts found among an item's leaves; data order is a whole item (a data iterator's state).
LEAF_PARTS: tuple[Part, ...] = ("params", "opt_state", "step", "rng")
#: Without these a resumed run is not the run that stopped: ``complete`` needs them all. A CNN
#: without dropout has no RNG state to lose, so a missing RNG key is only a note.
REQUIRED: frozenset[Part] = frozenset({"params", "opt_state", "step"})
#: Where a part was found: leaves of an item's tree, a whole item, or the step directory's name.
Source = Literal["tree", "item", "directory"]

#: Keras 3's ``model.get_state_tree()`` (what its ``OrbaxCheckpoint`` saves as the ``pytree``
#: item) names its parts ``trainable_variables``, ``non_trainable_variables`` (BatchNorm
#: statistics, seed-generator states) and ``optimizer_variables``.
_OPT_NAMES = {
    "opt_state",
    "optimizer",
    "optimizer_state",
    "opt",
    "optim",
    "tx_state",
    "optstate",
    "optimizer_variables",
}
_PARAM_NAMES = {
    "params",
    "param",
    "parameters",
    "model",
    "weights",
    "variables",
    "ema_params",
    "model_state",
    "batch_stats",
    "state_dict",
    "trainable_variables",
    "non_trainable_variables",
}
#: Variables of flax layers (Dense/Linear, Embed, LayerNorm/BatchNorm): parameters, or batch
#: statistics, which inspect counts with them as ``batch_stats`` is.
_LAYER_NAMES = {"kernel", "bias", "embedding", "scale", "mean", "var", "weight"}
#: jax's short names of PRNG implementations, as in the dtype ``key<fry>``.
KEY_DTYPES = {"threefry2x32": "fry", "rbg": "rbg", "unsafe_rbg": "urbg"}
_STEP_NAMES = {"step", "global_step", "steps", "iteration", "iter", "train_step"}
_RNG_NAMES = {
    "rng",
    "rngs",
    "key",
    "keys",
    "prng",
    "prng_key",
    "rng_key",
    "dropout_rng",
    "rng_state",
    "seed",
    "random_key",
    "dropout_key",
    "params_rng",
}

DESCRIPTIONS: dict[Part, str] = {
    "params": "parameters",
    "opt_state": "optimizer state",
    "step": "step",
    "rng": "RNG state",
    "data_order": "data order",
}
LOSS_IF_MISSING: dict[Part, str] = {
    "params": "no model parameters: nothing here restores a model",
    "opt_state": "no optimizer state: resuming restarts the optimizer from zero (Adam moments and "
    "its count reset), expect a loss spike",
    "step": "no step counter in the state: learning-rate schedules restart at 0 unless the step "
    "is taken from the directory name",
    "rng": "no RNG key: a resumed run cannot reproduce the dropout masks and random sampling of "
    "an uninterrupted one",
    "data_order": "no data-iterator item: a resumed input pipeline does not continue where it "
    "stopped unless it derives its position from the step",
}


class LeafLike(Protocol):
    @property
    def keypath(self) -> tuple[str, ...]: ...
    @property
    def dtype(self) -> str | None: ...
    @property
    def shape(self) -> tuple[int, ...] | None: ...
    @property
    def random_key_impl(self) -> str | None: ...
    @property
    def part(self) -> str | None: ...


class PartJSON(TypedDict):
    part: str
    present: bool
    required: bool  # schema 4: a missing required part makes the state incomplete
    items: list[str]  # schema 4: the items of the step that hold the part
    source: Source | None  # schema 4: tree leaves, a whole item, the directory name
    subtrees: list[str]
    leaves: int
    note: str | None


@dataclass(frozen=True)
class StatePart:
    part: Part
    present: bool
    subtrees: tuple[str, ...]
    leaves: tuple[str, ...]
    note: str
    items: tuple[str, ...] = ()
    source: Source | None = None

    @property
    def description(self) -> str:
        return DESCRIPTIONS[self.part]

    @property
    def required(self) -> bool:
        return self.part in REQUIRED

    def to_json(self) -> PartJSON:
        return {
            "part": self.part,
            "present": self.present,
            "required": self.required,
            "items": list(self.items),
            "source": self.source,
            "subtrees": list(self.subtrees),
            "leaves": len(self.leaves),
            "note": self.note,
        }


def _is_int_scalar(leaf: LeafLike) -> bool:
    return leaf.shape == () and leaf.dtype is not None and "int" in leaf.dtype


def _is_key(leaf: LeafLike) -> bool:
    if leaf.random_key_impl:
        return True
    # Raw key data: uint32[..., 2] (threefry) or uint32[..., 4] (rbg).
    return (
        leaf.dtype == "uint32"
        and bool(leaf.shape)
        and leaf.shape is not None
        and leaf.shape[-1] in (2, 4)
    )


_KEYISH = re.compile(r"(^|_)(rngs?|keys?|prng|seed)(_|$)|rng")


#: What a leaf is of a PRNG state (``rng_state_kind``).
RngStateKind = Literal["typed PRNG key", "raw PRNG key data", "nnx RNG stream counter"]


def rng_state_kind(leaf: LeafLike) -> RngStateKind | None:
    """What a leaf is of a PRNG state, or None: a typed key (``random_key_impl``), raw key data
    (uint32 ``[..., 2]`` threefry / ``[..., 4]`` rbg under a key-ish name such as ``rng``,
    ``rngs``, ``dropout_key``, ``key_batch``), or the counter of a flax.nnx RNG stream
    (``rngs.<stream>.count``). Writers never change such values unless a rule names them."""
    if leaf.random_key_impl:
        return "typed PRNG key"
    lowered = [k.lower() for k in leaf.keypath]
    keyish = any(_KEYISH.search(k) for k in lowered)
    if keyish and _is_key(leaf):
        return "raw PRNG key data"
    names = _names(leaf.keypath)
    if "rngs" in names[:-1] and names[-1:] == ["count"] and _is_int_scalar(leaf):
        return "nnx RNG stream counter"
    return None


def telling_name(keypath: Sequence[str]) -> tuple[Part, int] | None:
    """The first path component that names parameters or optimizer state, and its position."""
    for i, k in enumerate(keypath):
        lowered = k.lower()
        if lowered in _OPT_NAMES:
            return "opt_state", i
        if lowered in _PARAM_NAMES:
            return "params", i
    return None


def classify_leaf(leaf: LeafLike) -> Part | None:
    """The part a leaf belongs to: PRNG state and a step counter wherever they sit (flax.nnx
    keeps its RNG streams inside the model, its Optimizer the step: ``optimizer.step.value``),
    then the first telling name on the path, then, in a bare model state (``nnx.split``,
    ``nnx.state``, ``nnx.to_pure_dict``: no ``params`` above), the flax layer variables."""
    if rng_state_kind(leaf):
        return "rng"
    names = _names(leaf.keypath)
    last = names[-1] if names else ""
    if last in _STEP_NAMES and _is_int_scalar(leaf):
        return "step"
    telling = telling_name(leaf.keypath)
    if telling is not None:
        return telling[0]
    if last in _LAYER_NAMES and leaf.dtype is not None and _is_float(leaf.dtype):
        return "params"
    return None


def _names(keypath: Sequence[str]) -> list[str]:
    """A path's names without nnx's Variable wrappers (``kernel.value``, ``kernel.raw_value``
    in flax 0.8)."""
    return [k.lower() for k in keypath if k.lower() not in ("value", "raw_value")]


def _is_float(dtype: str) -> bool:
    return dtype.startswith(("float", "bfloat"))


def analyse_state(leaves: Sequence[LeafLike]) -> tuple[StatePart, ...]:
    groups: dict[Part, list[LeafLike]] = {p: [] for p in LEAF_PARTS}
    for leaf in leaves:
        if leaf.part is not None:
            groups[leaf.part].append(leaf)  # type: ignore[index]
    out = []
    for part in LEAF_PARTS:
        found = groups[part]
        subtrees = tuple(dict.fromkeys(_subtree(part, lf.keypath) for lf in found))
        names = tuple(".".join(lf.keypath) for lf in found)
        if not found:
            note = LOSS_IF_MISSING[part]
        elif part == "rng":
            note = _rng_note(found)
        elif part == "step":
            note = f"{names[0]} ({found[0].dtype} scalar)"
        else:
            note = f"{len(found)} leaves"
        source: Source | None = "tree" if found else None
        out.append(StatePart(part, bool(found), subtrees, names, note, source=source))
    return tuple(out)


def _rng_note(found: list[LeafLike]) -> str:
    keys = [lf for lf in found if rng_state_kind(lf) != "nnx RNG stream counter"] or found
    lf = keys[0]
    if lf.random_key_impl:
        short = KEY_DTYPES.get(lf.random_key_impl, lf.random_key_impl)
        first = f"key<{short}>{list((lf.shape or ())[:-1])} typed key ({lf.random_key_impl})"
    else:
        first = f"{lf.dtype}{list(lf.shape or ())} key"
    more = f", {len(keys)} keys" if len(keys) > 1 else ""
    counters = len(found) - len(keys)
    plural = "s" if counters > 1 else ""
    return first + more + (f", {counters} stream counter{plural}" if counters else "")


def _subtree(part: Part, keypath: tuple[str, ...]) -> str:
    """The shortest prefix of a leaf's path that names its part (``params``, ``opt_state``);
    the top module for the parameters of a bare model state."""
    names = _OPT_NAMES if part == "opt_state" else _PARAM_NAMES if part == "params" else None
    if names is not None:
        for i, k in enumerate(keypath):
            if k.lower() in names:
                return ".".join(keypath[: i + 1])
        if part == "params" and len(keypath) > 1:
            return keypath[0]
    return ".".join(keypath)


_T = TypeVar("_T")


def relative_path(keypath: tuple[str, ...]) -> tuple[str, ...]:
    """The path below the parameter root, or the whole path for a leaf that is no parameter."""
    telling = telling_name(keypath)
    if telling is not None and telling[0] == "params" and len(keypath) > telling[1] + 1:
        return keypath[telling[1] + 1 :]
    return keypath


def parameter_index(
    leaves: Iterable[_T], keypath_of: Callable[[_T], tuple[str, ...]]
) -> dict[tuple[str, ...], list[_T]]:
    """The parameters among ``leaves`` (below a parameter root) by their relative path."""
    index: dict[tuple[str, ...], list[_T]] = {}
    for x in leaves:
        keypath = keypath_of(x)
        telling = telling_name(keypath)
        if telling is not None and telling[0] == "params":
            rel = relative_path(keypath)
            if rel != keypath:
                index.setdefault(rel, []).append(x)
    return index


def mirrored(
    keypath: tuple[str, ...],
    shape: tuple[int, ...] | None,
    index: dict[tuple[str, ...], list[_T]],
    shape_of: Callable[[_T], tuple[int, ...] | None],
) -> tuple[list[_T], int] | None:
    """The parameters an optimizer leaf mirrors and where its relative path starts: a leaf below
    an optimizer root whose path ends with a parameter's relative path and that has its shape
    (optax's Adam ``mu``/``nu``, SGD's ``trace``); the longest relative path decides."""
    telling = telling_name(keypath)
    if telling is None or telling[0] != "opt_state":
        return None
    for k in range(telling[1] + 1, len(keypath)):
        found = [p for p in index.get(keypath[k:], []) if shape_of(p) == shape]
        if found:
            return found, k
    return None


#: Parameter roots named for the parameters themselves, not for a copy of them (``ema_params``):
#: among trees that mirror each other, one named so (the shallowest) is the one rules target.
_PRIMARY_NAMES = _PARAM_NAMES - {"ema_params"}


def parameter_root(keypath: tuple[str, ...]) -> tuple[str, ...] | None:
    """The prefix of a parameter's path that ends at its parameter root (``params``,
    ``ema.params``), or None for a leaf that is no parameter."""
    telling = telling_name(keypath)
    if telling is None or telling[0] != "params" or len(keypath) <= telling[1] + 1:
        return None
    return keypath[: telling[1] + 1]


def mirror_roots(
    leaves: Iterable[_T],
    keypath_of: Callable[[_T], tuple[str, ...]],
    shape_of: Callable[[_T], tuple[int, ...] | None],
) -> dict[tuple[str, ...], tuple[str, ...]]:
    """The subtrees that mirror a parameter tree leaf for leaf, each with the root of the tree
    it mirrors: outside the optimizer state, the same relative paths with the same shapes
    (``master_params``, ``ema_params``, ``ema.params`` beside ``params``). Of trees that mirror
    each other, the parameters are the tree under a root named for them (``params``, ``model``...
    not ``ema_params``), the shallowest, the first; the others are its mirrors."""
    arrays = [(keypath_of(x), shape_of(x)) for x in leaves]
    trees: dict[tuple[str, ...], dict[tuple[str, ...], tuple[int, ...]]] = {}
    for keypath, shape in arrays:
        root = parameter_root(keypath)
        if root is not None and shape is not None:
            trees.setdefault(root, {})[keypath[len(root) :]] = shape
    roots = list(trees)
    relative = {rel for tree in trees.values() for rel in tree}
    candidates: set[tuple[str, ...]] = set()
    for keypath, shape in arrays:
        telling = telling_name(keypath)
        if telling is None and shape is not None:
            k = next((k for k in range(1, len(keypath)) if keypath[k:] in relative), None)
            candidates.update(() if k is None else (keypath[:k],))
    for keypath, shape in arrays:
        for i in range(1, len(keypath)):
            if keypath[:i] in candidates and shape is not None:
                trees.setdefault(keypath[:i], {})[keypath[i:]] = shape
    out: dict[tuple[str, ...], tuple[str, ...]] = {}
    for root in sorted(roots, key=lambda r: (r[-1].lower() not in _PRIMARY_NAMES, len(r))):
        if root in out:
            continue
        for prefix, tree in trees.items():
            apart = prefix[: len(root)] != root and root[: len(prefix)] != prefix
            if apart and prefix not in out and tree == trees[root]:
                out[prefix] = root
    return out


def item_keypath(item: str | None, keypath: tuple[str, ...]) -> tuple[str, ...]:
    """A leaf's path as optimizer mirrors are matched across the items of a step: its own
    when a name on it tells its part, else under its item's name (the nnx ``model`` item of a
    ``model`` + ``optimizer`` Composite save holds bare ``linear.kernel.value`` paths)."""
    if item is None or telling_name(keypath) is not None:
        return keypath
    return (item, *keypath)


# The training state of a step: its items together -------------------------------------------

#: Words of an item's name that say it holds a data iterator's state (``data_iter``,
#: ``train_iterator``, ``dataloader``, ``input_pipeline``, ``ds_state``).
