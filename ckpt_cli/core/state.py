"""The four parts of a training state: parameters, optimizer state, step and RNG state.

A checkpoint that lacks one of them still restores, but resuming from it silently loses something;
this module finds each part by leaf names and dtypes and says what resuming would lose.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

Part = Literal["params", "opt_state", "step", "rng"]
PARTS: tuple[Part, ...] = ("params", "opt_state", "step", "rng")

_OPT_NAMES = {"opt_state", "optimizer", "optimizer_state", "opt", "optim", "tx_state", "optstate"}
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
}
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
}
LOSS_IF_MISSING: dict[Part, str] = {
    "params": "no model parameters: nothing here restores a model",
    "opt_state": "no optimizer state: resuming restarts the optimizer from zero (Adam moments and "
    "its count reset), expect a loss spike",
    "step": "no step counter in the state: learning-rate schedules restart at 0 unless the step "
    "is taken from the directory name",
    "rng": "no RNG key: a resumed run cannot reproduce the dropout masks and data order of an "
    "uninterrupted one",
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


@dataclass(frozen=True)
class StatePart:
    part: Part
    present: bool
    subtrees: tuple[str, ...]
    leaves: tuple[str, ...]
    note: str

    @property
    def description(self) -> str:
        return DESCRIPTIONS[self.part]

    def to_json(self) -> dict[str, object]:
        return {
            "part": self.part,
            "present": self.present,
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
    """The part a leaf belongs to, by the first telling name on its path, then by its dtype."""
    telling = telling_name(leaf.keypath)
    if telling is not None:
        return telling[0]
    lowered = [k.lower() for k in leaf.keypath]
    last = lowered[-1] if lowered else ""
    if (last in _RNG_NAMES or "rng" in last) and _is_key(leaf):
        return "rng"
    if leaf.random_key_impl:
        return "rng"
    if last in _STEP_NAMES and _is_int_scalar(leaf):
        return "step"
    return None


def analyse_state(leaves: Sequence[LeafLike]) -> tuple[StatePart, ...]:
    groups: dict[Part, list[LeafLike]] = {p: [] for p in PARTS}
    for leaf in leaves:
        if leaf.part is not None:
            groups[leaf.part].append(leaf)  # type: ignore[index]
    out = []
    for part in PARTS:
        found = groups[part]
        subtrees = tuple(dict.fromkeys(_subtree(part, lf.keypath) for lf in found))
        names = tuple(".".join(lf.keypath) for lf in found)
        if not found:
            note = LOSS_IF_MISSING[part]
        elif part == "rng":
            lf = found[0]
            impl = f" ({lf.random_key_impl})" if lf.random_key_impl else ""
            note = f"{lf.dtype}{list(lf.shape or ())} key{impl}" + (
                f", {len(found)} keys" if len(found) > 1 else ""
            )
        elif part == "step":
            note = f"{names[0]} ({found[0].dtype} scalar)"
        else:
            note = f"{len(found)} leaves"
        out.append(StatePart(part, bool(found), subtrees, names, note))
    return tuple(out)


def _subtree(part: Part, keypath: tuple[str, ...]) -> str:
    """The shortest prefix of a leaf's path that names its part (``params``, ``opt_state``)."""
    names = _OPT_NAMES if part == "opt_state" else _PARAM_NAMES if part == "params" else None
    if names is not None:
        for i, k in enumerate(keypath):
            if k.lower() in names:
                return ".".join(keypath[: i + 1])
    return ".".join(keypath)
