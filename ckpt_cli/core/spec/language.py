"""Parse and validate a ``ckpt migrate`` spec: an ordered list of rules, as data.

A spec is YAML (or TOML when the file ends in ``.toml``)::

    version: 1            # optional
    seed: 0               # default seed of the random initialisers
    rules:
      - {op: rename, from: 'params\\.Dense_(\\d+)\\.(.*)', to: 'params.layer_\\1.\\2'}
      - {op: cast, match: 'params\\..*', dtype: bfloat16}

Every problem is a ``RefusedError`` whose one line names the file, the rule (1-based index and
op) and the field; a pattern RE2 cannot take is a ``UsageError`` (exit 2, as for ``--filter``)
with the same line. ``match``, ``from`` and ``exclude`` are leaf patterns, as everywhere
(``format.names.leaf_pattern_source``: a glob or an RE2 regular expression), matched against
the whole name. The spec is never executed: ``op: python`` names a function that the command
imports only under ``--allow-python``.
"""

from __future__ import annotations

import difflib
import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

from ckpt_cli.core.format.dtypes import EXTRA_DTYPES
from ckpt_cli.core.format.names import compile_leaf_pattern, literal_name
from ckpt_cli.core.regex import Match, Regex
from ckpt_cli.core.spec.initializers import FAN_KINDS, Initializer, parse_init
from ckpt_cli.core.textfiles import load_yaml, read_limited
from ckpt_cli.core.units import short_repr
from ckpt_cli.errors import RefusedError

DTYPES = (
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "float32",
    "float64",
    *EXTRA_DTYPES,
)
ROUNDINGS = ("nearest", "floor", "ceil", "trunc")
VALUE_TYPES = ("jax.Array", "np.ndarray")
_COMMON = ("op", "comment")
FIELDS: dict[str, tuple[str, ...]] = {
    "rename": ("from", "to", "exclude", "follow_optimizer", "follow_mirrors"),
    "drop": ("match", "exclude", "follow_optimizer", "follow_mirrors"),
    "keep_only": ("match", "exclude"),
    "cast": ("match", "exclude", "dtype", "rounding", "follow_optimizer", "follow_mirrors"),
    "resize": ("match", "exclude", "shape", "init", "follow_optimizer", "follow_mirrors"),
    "reshape": ("match", "exclude", "shape", "follow_optimizer", "follow_mirrors"),
    "transpose": ("match", "exclude", "axes", "follow_optimizer", "follow_mirrors"),
    "split": ("match", "exclude", "into", "axis", "sizes", "follow_optimizer", "follow_mirrors"),
    "concat": ("from", "to", "axis", "follow_optimizer", "follow_mirrors"),
    "stack": ("from", "to", "axis", "follow_optimizer", "follow_mirrors"),
    "unstack": ("match", "exclude", "to", "axis", "follow_optimizer", "follow_mirrors"),
    "add": ("name", "shape", "dtype", "init", "value_type", "follow_optimizer", "follow_mirrors"),
    "set": ("match", "exclude", "value", "follow_optimizer", "follow_mirrors"),
    "python": (
        "match",
        "exclude",
        "function",
        "shape",
        "dtype",
        "follow_optimizer",
        "follow_mirrors",
    ),
}
REQUIRED: dict[str, tuple[str, ...]] = {
    "rename": ("from", "to"),
    "drop": ("match",),
    "keep_only": ("match",),
    "cast": ("match", "dtype"),
    "resize": ("match", "shape"),
    "reshape": ("match", "shape"),
    "transpose": ("match", "axes"),
    "split": ("match", "into", "axis"),
    "concat": ("from", "to", "axis"),
    "stack": ("from", "to"),
    "unstack": ("match", "to"),
    "add": ("name", "shape"),
    "set": ("match", "value"),
    "python": ("match", "function"),
}
#: Whether an op's changes reach the optimizer state of the parameters it changes, by default.
#: A cast does not: Adam moments usually stay float32 when parameters go to bfloat16.
#: The same defaults hold for the subtrees that mirror the parameters (``follow_mirrors``): a
#: float32 master copy stays float32 when the parameters are cast to bfloat16.
FOLLOW_DEFAULT = {op: op not in ("cast", "set", "python") for op in FIELDS}
_REF = re.compile(r"\\(\d+)|\\g<(\w+)>")


@dataclass(frozen=True)
class Rule:
    """One validated rule. Only the fields of its op are set."""

    index: int  # 1-based position in the spec
    op: str
    match: tuple[Regex, ...] = ()  # rename: `from`; concat: `from`, one per input
    exclude: tuple[Regex, ...] = ()
    to: str | None = None
    into: tuple[str, ...] = ()
    name: str | None = None
    dtype: str | None = None
    rounding: str | None = None
    shape: tuple[int | None, ...] | None = None
    axes: tuple[int, ...] | None = None
    axis: int | None = None
    sizes: tuple[int, ...] | None = None
    init: Initializer | None = None
    value: float | int | bool | None = None
    value_type: str = "jax.Array"
    function: str | None = None
    follow_optimizer: bool = True
    follow_mirrors: bool = True

    @property
    def label(self) -> str:
        return f"rule {self.index} ({self.op})"

    def names_exactly(self, name: str) -> bool:
        """Whether a ``match`` pattern spells out ``name`` itself (dots escaped or not), not a
        family of leaves: what a rule must do to change PRNG key data."""
        return any(literal_name(p.pattern) == name for p in self.match)

    def selects(self, name: str) -> Match | None:
        """The match of the first ``match`` pattern that takes the whole name, unless excluded."""
        if any(e.fullmatch(name) for e in self.exclude):
            return None
        for pattern in self.match:
            m = pattern.fullmatch(name)
            if m:
                return m
        return None


@dataclass(frozen=True)
class MigrationSpec:
    path: str
    sha256: str
    rules: tuple[Rule, ...]
    seed: int = 0
    document: Any = field(default=None, compare=False)  # the parsed file, recorded in the step

    @property
    def python_rules(self) -> list[Rule]:
        return [r for r in self.rules if r.op == "python"]


def unused_rules_hint(source: object) -> str:
    """The hint of a refusal for rules that matched no leaf of ``source`` (an item): the
    command that lists the names the rules are matched against (a dry run would refuse too)."""
    import shlex

    return (
        f"`ckpt inspect {shlex.quote(str(source))} --flat` lists the leaf names; "
        "--allow-unused goes on without them"
    )


def load_spec(path: str) -> MigrationSpec:
    """Read, parse and validate a spec file."""
    return parse_spec(read_limited(path, "spec"), path)


def parse_spec(raw: bytes, path: str) -> MigrationSpec:
    where = f"spec {path}"
    try:
        text = raw.decode("utf-8")
        if path.endswith(".toml"):
            import tomllib

            doc: Any = tomllib.loads(text)
        else:
            doc = load_yaml(text, where)
    except RefusedError:
        raise
    except Exception as e:  # yaml.YAMLError, tomllib.TOMLDecodeError, UnicodeDecodeError
        first = " ".join(str(e).split())[:200]
        raise RefusedError(f"{where} is not valid {_syntax(path)}: {first}") from None
    if isinstance(doc, list):
        doc = {"rules": doc}
    if not isinstance(doc, dict):
        raise RefusedError(f"{where}: expected a mapping with a `rules` list (or a list of rules)")
    unknown = sorted(str(k) for k in set(doc) - {"version", "seed", "rules", "comment"})
    if unknown:  # YAML keys may be numbers too: compared as text
        raise RefusedError(
            f"{where}: unknown top-level field {short_repr(unknown[0])}{_hint(unknown[0], ('version', 'seed', 'rules'))}"
        )
    if doc.get("version", 1) != 1:
        raise RefusedError(
            f"{where}: field 'version': only version 1 exists, got {doc['version']!r}"
        )
    seed = doc.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise RefusedError(f"{where}: field 'seed': expected a non-negative integer, got {seed!r}")
    items = doc.get("rules")
    if not isinstance(items, list) or not items:
        raise RefusedError(f"{where}: field 'rules': expected a non-empty list of rules")
    rules = tuple(_rule(i + 1, item, seed, where) for i, item in enumerate(items))
    return MigrationSpec(path, hashlib.sha256(raw).hexdigest(), rules, seed, doc)


def _syntax(path: str) -> str:
    return "TOML" if path.endswith(".toml") else "YAML"


def _hint(word: str, choices: tuple[str, ...] | list[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


class _Fields:
    """Typed access to one rule's fields; every error names the rule and the field."""

    def __init__(self, index: int, op: str, doc: dict[str, Any], where: str) -> None:
        self.op = op
        self.doc = doc
        self.prefix = f"{where}: rule {index} ({op})"

    def fail(self, name: str, message: str) -> RefusedError:
        return RefusedError(f"{self.prefix}: field {name!r}: {message}")

    def get(self, name: str) -> Any:
        return self.doc.get(name)

    def has(self, name: str) -> bool:
        return name in self.doc

    def regex(self, name: str, value: Any) -> Regex:
        """A leaf pattern (a glob or an RE2 regular expression, ``names.leaf_pattern_source``);
        one RE2 cannot take is a usage error naming the rule and the field."""
        if not isinstance(value, str) or not value:
            raise self.fail(name, f"expected a leaf pattern (a string), got {value!r}")
        return compile_leaf_pattern(value, f"{self.prefix}: field {name!r}")

    def regexes(self, name: str, at_least: int = 1) -> tuple[Regex, ...]:
        value = self.get(name)
        values = value if isinstance(value, list) else [value]
        if len(values) < at_least:
            raise self.fail(name, f"expected a list of at least {at_least} regular expressions")
        return tuple(self.regex(name, v) for v in values)

    def name(self, name: str) -> str:
        value = self.get(name)
        if not isinstance(value, str) or not value or any(not p for p in value.split(".")):
            raise self.fail(name, f"expected a dotted leaf name such as params.w, got {value!r}")
        return value

    def template(self, name: str, value: Any, groups: int, named: set[str]) -> str:
        if not isinstance(value, str) or not value:
            raise self.fail(
                name, f"expected a name template such as 'params.layer_\\1', got {value!r}"
            )
        for m in _REF.finditer(value):
            number, label = m.group(1), m.group(2)
            if number is not None and int(number) > groups:
                raise self.fail(
                    name, f"\\{number} refers to group {number}, the pattern has {groups} group(s)"
                )
            if label is not None and not label.isdigit() and label not in named:
                raise self.fail(name, f"\\g<{label}> names no group of the pattern")
        return value

    def integer(self, name: str, value: Any, minimum: int | None = None) -> int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise self.fail(name, f"expected an integer, got {value!r}")
        if minimum is not None and value < minimum:
            raise self.fail(name, f"expected an integer >= {minimum}, got {value}")
        return value

    def ints(self, name: str, allow_null: bool = False, minimum: int = 0) -> tuple[Any, ...]:
        value = self.get(name)
        if not isinstance(value, list):
            raise self.fail(name, f"expected a list of integers, got {value!r}")
        out: list[int | None] = []
        for v in value:
            if v is None and allow_null:
                out.append(None)
                continue
            out.append(self.integer(name, v, minimum))
        return tuple(out)

    def dtype(self, name: str) -> str:
        value = self.get(name)
        if not isinstance(value, str) or value not in DTYPES:
            raise self.fail(name, f"unknown dtype {value!r}{_hint(str(value), DTYPES)}")
        return value

    def choice(self, name: str, choices: tuple[str, ...]) -> str:
        value = self.get(name)
        if value not in choices:
            raise self.fail(
                name,
                f"expected one of {', '.join(choices)}, got {value!r}{_hint(str(value), choices)}",
            )
        return str(value)

    def boolean(self, name: str) -> bool:
        value = self.get(name)
        if not isinstance(value, bool):
            raise self.fail(name, f"expected true or false, got {value!r}")
        return value


def _rule(index: int, item: Any, seed: int, where: str) -> Rule:
    f = _fields(index, item, where)
    op = f.op
    kw: dict[str, Any] = {"index": index, "op": op}
    for follow in ("follow_optimizer", "follow_mirrors"):
        kw[follow] = f.boolean(follow) if f.has(follow) else FOLLOW_DEFAULT[op]
    if f.has("exclude"):
        kw["exclude"] = f.regexes("exclude")
    # Checked in this order: the first field at fault is the one reported.
    _pattern_fields(f, op, kw)
    _split_fields(f, op, kw)
    _array_fields(f, op, kw)
    _new_value_fields(f, op, kw, seed)
    return Rule(**kw)


def _fields(index: int, item: Any, where: str) -> _Fields:
    """The rule's mapping, refused unless its op is known, every field is one of that op's and
    every required field is there."""
    if not isinstance(item, dict):
        raise RefusedError(
            f"{where}: rule {index}: expected a mapping with an `op`, got {short_repr(item)}"
        )
    op = item.get("op")
    if not isinstance(op, str) or op not in FIELDS:
        raise RefusedError(
            f"{where}: rule {index}: field 'op': unknown op {short_repr(op)}"
            f"{_hint(str(op), tuple(FIELDS)) if isinstance(op, str) else ''} "
            f"(ops: {', '.join(FIELDS)})"
        )
    f = _Fields(index, op, item, where)
    allowed = FIELDS[op] + _COMMON
    for key in item:
        if key not in allowed:
            raise f.fail(
                key,
                f"not a field of {op}{_hint(str(key), allowed)} (fields: {', '.join(FIELDS[op])})",
            )
    for key in REQUIRED[op]:
        if key not in item:
            raise f.fail(key, "missing")
    return f


def _pattern_fields(f: _Fields, op: str, kw: dict[str, Any]) -> None:
    """What the rule selects (``from``/``match``) and the names it gives (``to``)."""
    if op in ("rename", "concat", "stack"):
        kw["match"] = f.regexes("from", at_least=2 if op == "concat" else 1)
        if op == "stack" and (len(kw["match"]) != 1 or "i" not in kw["match"][0].groupindex):
            raise f.fail(
                "from",
                "stack takes one pattern with a group named i, e.g. (?P<i>\\d+), that numbers the leaves",
            )
        if op == "concat" and len({p.groups for p in kw["match"]}) != 1:
            raise f.fail(
                "from", "every pattern must have the same number of groups (they pair inputs)"
            )
        first = kw["match"][0]
        kw["to"] = f.template("to", f.get("to"), first.groups, set(first.groupindex))
    elif op != "add":
        kw["match"] = f.regexes("match")
    if op == "unstack":
        pattern = kw["match"][0]
        to = f.template("to", f.get("to"), pattern.groups, set(pattern.groupindex))
        if "{i}" not in to:
            raise f.fail(
                "to",
                f"needs {{i}} where the index goes, e.g. 'params.layers_{{i}}.\\1', got {to!r}",
            )
        kw["to"] = to
    if op in ("stack", "unstack"):
        kw["axis"] = f.integer("axis", f.get("axis")) if f.has("axis") else 0


def _split_fields(f: _Fields, op: str, kw: dict[str, Any]) -> None:
    """split's outputs (``into``, ``sizes``), and the axis of split and concat."""
    if op == "split":
        if len(kw["match"]) != 1:
            raise f.fail("match", "split takes one pattern (its groups name the outputs)")
        into = f.get("into")
        if not isinstance(into, list) or len(into) < 2:
            raise f.fail("into", f"expected a list of at least 2 name templates, got {into!r}")
        pattern = kw["match"][0]
        kw["into"] = tuple(
            f.template("into", t, pattern.groups, set(pattern.groupindex)) for t in into
        )
        if f.has("sizes"):
            kw["sizes"] = f.ints("sizes", minimum=1)
            if len(kw["sizes"]) != len(into):
                raise f.fail("sizes", f"{len(kw['sizes'])} sizes for {len(into)} outputs")
    if op in ("split", "concat"):
        kw["axis"] = f.integer("axis", f.get("axis"))


def _array_fields(f: _Fields, op: str, kw: dict[str, Any]) -> None:
    """The dtype, shape or axes an op gives an array."""
    if op == "cast":
        kw["dtype"] = f.dtype("dtype")
        if kw["dtype"] == "bool":
            raise f.fail("dtype", "casting to bool is refused (which values are true?); use python")
        if f.has("rounding"):
            kw["rounding"] = f.choice("rounding", ROUNDINGS)
    if op in ("resize", "reshape", "add") or (op == "python" and f.has("shape")):
        allow_null = op == "resize"
        shape = f.ints("shape", allow_null=allow_null, minimum=-1 if op == "reshape" else 0)
        if op == "reshape" and sum(1 for d in shape if d == -1) > 1:
            raise f.fail("shape", "at most one dimension may be -1")
        kw["shape"] = shape
    if op == "transpose":
        axes = f.ints("axes")
        if sorted(axes) != list(range(len(axes))):
            raise f.fail("axes", f"{list(axes)} is not a permutation of 0..{len(axes) - 1}")
        kw["axes"] = axes


def _new_value_fields(f: _Fields, op: str, kw: dict[str, Any], seed: int) -> None:
    """Where new values come from: add's leaf, an initializer, set's value, a python function."""
    if op in ("add", "python") and f.has("dtype"):
        kw["dtype"] = f.dtype("dtype")
    if op == "add":
        kw["name"] = f.name("name")
        kw["dtype"] = kw.get("dtype", "float32")
        if f.has("value_type"):
            kw["value_type"] = f.choice("value_type", VALUE_TYPES)
    if op in ("resize", "add") and f.has("init"):
        try:
            kw["init"] = parse_init(f.get("init"), seed)
        except ValueError as e:
            raise f.fail("init", str(e)) from None
    if op == "add":
        kw["init"] = kw.get("init") or Initializer("zeros")
        if kw["init"].kind in FAN_KINDS and len(kw["shape"]) < 2:
            raise f.fail("init", f"{kw['init'].kind} needs fans: a shape of rank >= 2")
    if op == "set":
        value = f.get("value")
        if not isinstance(value, (int, float, bool)):
            raise f.fail("value", f"expected a number or true/false, got {value!r}")
        kw["value"] = value
    if op == "python":
        kw["function"] = _function(f)


def _function(f: _Fields) -> str:
    value = f.get("function")
    if not isinstance(value, str) or not re.fullmatch(r"[\w.]+:[A-Za-z_]\w*", value):
        raise f.fail("function", f"expected MODULE:FUNCTION such as mypkg.fix:scale, got {value!r}")
    return value
