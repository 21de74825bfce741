"""Check a migration plan against the abstract state of the new model, and import user code.

``--target MODULE:FUNCTION`` names a function (no arguments) returning the new model's state as a
pytree of arrays or ``jax.ShapeDtypeStruct`` (``jax.eval_shape`` of its init, for example). Its
leaves are named the way Orbax names them (dict keys, attribute names, sequence indices joined
with ``.``) and compared with the plan's destination leaves: names, shapes, dtypes. This is the
one place jax is imported, and only when a target is given.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypedDict

from ckpt_cli.errors import (
    ORBAX_EXTRA_HINT,
    RefusedError,
    UsageError,
    missing_extra_module,
    require_orbax_extra,
)

Abstract = dict[str, tuple[tuple[int, ...] | None, str]]


class DifferenceJSON(TypedDict):
    name: str
    kind: str
    expected: str | None
    planned: str | None


@dataclass(frozen=True)
class Difference:
    name: str
    kind: str  # missing (the target has it, the plan not) | extra | shape | dtype
    expected: str | None
    planned: str | None

    def text(self) -> str:
        if self.kind == "missing":
            return f"{self.name}: missing (the target expects {self.expected})"
        if self.kind == "extra":
            return f"{self.name}: not in the target ({self.planned})"
        return f"{self.name}: {self.kind} {self.planned}, the target expects {self.expected}"

    def to_json(self) -> DifferenceJSON:
        return {
            "name": self.name,
            "kind": self.kind,
            "expected": self.expected,
            "planned": self.planned,
        }


def import_function(ref: str, what: str) -> Callable[..., Any]:
    """``pkg.module:function``, imported with the current directory on ``sys.path``."""
    module, _, name = ref.partition(":")
    if not module or not name:
        raise UsageError(f"{what} {ref!r}: expected MODULE:FUNCTION, e.g. mymodel:abstract_state")
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        mod = importlib.import_module(module)
    except Exception as e:
        # The user's module needs JAX (or Flax, Orbax) and ckpt was installed without them.
        hint = ORBAX_EXTRA_HINT if isinstance(e, ImportError) and missing_extra_module(e) else None
        raise RefusedError(
            f"{what} {ref}: cannot import {module}: {_first(e)}", hint=hint
        ) from None
    fn = getattr(mod, name, None)
    if not callable(fn):
        raise RefusedError(f"{what} {ref}: {module} has no function {name!r}")
    return fn  # type: ignore[no-any-return]


def abstract_state(ref: str) -> Abstract:
    """Call the target function and name its leaves as Orbax does: name -> (shape, dtype)."""
    return abstract_leaves(ref, call_target(ref))


def call_target(ref: str) -> Any:
    """Import and call the ``--target`` function: the abstract tree it returns."""
    require_orbax_extra("--target")  # before the user's module, which imports jax itself
    fn = import_function(ref, "--target")
    try:
        return fn()
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # SystemExit too: `builtins:exit` must not end ckpt silently
        raise RefusedError(
            f"--target {ref} failed ({_first(e)}); it must return the abstract tree of the new "
            "model"
        ) from None


def abstract_leaves(ref: str, tree: Any) -> Abstract:
    """The leaves of the tree target ``ref`` returned, named as Orbax does; refused when it is
    not an abstract tree."""
    leaves = flatten_abstract(tree)
    if not leaves or all(name == "" for name in leaves):
        raise RefusedError(
            f"--target {ref} returned {type(tree).__name__}, not an abstract tree of the new "
            "model (a pytree of jax.ShapeDtypeStruct or arrays, e.g. jax.eval_shape of its init)"
        )
    return leaves


def flatten_abstract(
    tree: Any, *, typed_keys: bool = False, empty: set[str] | None = None
) -> Abstract:
    """The leaves of an abstract tree, named as Orbax names them: name -> (shape, dtype).

    A typed PRNG key is its raw data (``uint32[..., 2]``, as Orbax stores it), or with
    ``typed_keys`` itself (``key<fry>`` of its shape, as ``inspect`` names a stored one).
    ``empty``, when given, receives the names of the empty nodes (``None``, optax's
    ``EmptyState``, ``()``, ``{}``, ``[]``), which are then not leaves."""
    require_orbax_extra("--target")
    import jax
    import numpy as np

    out: Abstract = {}
    is_leaf = _is_empty if empty is not None else None
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_leaf)[0]:
        name = ".".join(key_name(k) for k in path)
        if empty is not None and _is_empty(leaf):
            empty.add(name)
        elif isinstance(leaf, str):
            out[name] = (None, "string")
        elif hasattr(leaf, "shape") and hasattr(leaf, "dtype"):
            if jax.numpy.issubdtype(leaf.dtype, jax.dtypes.prng_key):
                if typed_keys:  # key<fry>, as inspect names a stored typed key
                    out[name] = (tuple(int(d) for d in leaf.shape), str(leaf.dtype))
                    continue
                # Orbax stores a typed key as its raw data (uint32) plus the impl name.
                leaf = jax.eval_shape(jax.random.key_data, leaf)
            out[name] = (tuple(int(d) for d in leaf.shape), str(np.dtype(leaf.dtype).name))
        else:
            value = np.asarray(leaf)
            out[name] = (tuple(value.shape), str(value.dtype.name))
    return out


def _is_empty(x: Any) -> bool:
    """An empty node: ``None``, ``()`` and field-less NamedTuples (``optax.EmptyState``), ``{}``,
    ``[]``."""
    if x is None:
        return True
    if isinstance(x, tuple) and not x:
        return True
    return isinstance(x, (dict, list)) and not x


def key_name(k: Any) -> str:
    for attr in ("key", "name", "idx"):  # DictKey / FlattenedIndexKey, GetAttrKey, SequenceKey
        if hasattr(k, attr):
            return str(getattr(k, attr))
    return str(k)


def compare_target(planned: Abstract, expected: Abstract) -> tuple[Difference, ...]:
    """Differences between a plan's destination leaves and the target's (name -> shape, dtype)."""
    diffs = []
    for name, (shape, dtype) in expected.items():
        have = planned.get(name)
        if have is None:
            diffs.append(Difference(name, "missing", _text(shape, dtype), None))
        elif have[0] != shape:
            diffs.append(Difference(name, "shape", _dims(shape), _dims(have[0])))
        elif have[1] != dtype:
            diffs.append(Difference(name, "dtype", dtype, have[1]))
    for name, (shape, dtype) in planned.items():
        if name not in expected:
            diffs.append(Difference(name, "extra", None, _text(shape, dtype)))
    return tuple(diffs)


def _dims(shape: tuple[int, ...] | None) -> str:
    return "" if shape is None else "[" + ",".join(str(d) for d in shape) + "]"


def _text(shape: tuple[int, ...] | None, dtype: str) -> str:
    return f"{dtype}{_dims(shape)}"


def _first(e: BaseException) -> str:
    text = str(e).splitlines()[0] if str(e) else ""
    return f"{type(e).__name__}: {text}" if text else type(e).__name__
