"""JSON documents: their versions, and the JSON Schemas generated from their types.

Versions. Every JSON document ckpt prints starts with its ``schema_version`` and ``ok``. Each
result type has its own version (``SCHEMA_VERSION`` where it has none of its own), and any
change to its generated schema, an added key included, takes a new one:
``tests/commands/test_schemas.py`` checks the hash of every published version
(``docs/schemas/versions.json``).

Schemas. JSON Schemas generated from the ``TypedDict``s that the results' ``to_json()`` return.

One description of each JSON document, checked twice: mypy checks every dict a ``to_json()``
builds against its ``TypedDict``, and the schema generated here from the same ``TypedDict`` is
what ``docs/schemas/`` publishes and the tests validate real outputs against.

Only the annotations the results use are supported; anything else raises ``TypeError`` so a
type the generator cannot express fails the build instead of yielding a vague schema:

* ``TypedDict``: a closed object (``additionalProperties: false``), ``NotRequired`` keys out of
  ``required``, emitted once under ``$defs`` (its docstring is the description);
* ``str`` ``int`` ``float`` ``bool`` ``None``; ``Literal[...]``; unions (``X | None``);
* ``list[X]``, ``tuple[X, ...]``, ``dict[str, X]``;
* ``Annotated[X, "text"]``: ``X`` with that description;
* ``JSONValue``: any JSON value (metrics, custom metadata, JSON item values), the one open spot.

The output is deterministic (no library version in it), so a hash of it changes only when a
type changes. No third-party import: stdlib ``typing`` introspection.
"""

from __future__ import annotations

import types
import typing
from typing import Annotated, Any, Literal, Union, get_args, get_origin, get_type_hints

DIALECT = "https://json-schema.org/draft/2020-12/schema"


class _Open:
    """Marks ``JSONValue``: any JSON value is allowed there."""

    def __repr__(self) -> str:
        return "JSONValue"


OPEN = _Open()

#: Any JSON value (null, bool, number, string, array, object). mypy sees ``Any``.
JSONValue = Annotated[Any, OPEN]


def _key_wrappers() -> frozenset[object]:
    """``Required``/``NotRequired`` from typing (3.11) and typing_extensions (3.10): requiredness
    is read from ``__required_keys__``; the wrappers themselves are peeled off."""
    found: set[object] = set()
    for module_name in ("typing", "typing_extensions"):
        try:
            module = __import__(module_name)
        except ImportError:  # pragma: no cover - a declared dependency of ckpt-orbax
            continue
        found.update(w for n in ("Required", "NotRequired") if (w := getattr(module, n, None)))
    return frozenset(found)


_KEY_WRAPPERS = _key_wrappers()

_SCALARS: dict[object, str] = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    type(None): "null",
}


def _typeddict_keys(tp: type) -> tuple[dict[str, Any], frozenset[str]]:
    """The keys' annotations and the required keys. Requiredness is read from the annotations
    themselves: under ``from __future__ import annotations`` Python 3.10/3.11 compute
    ``__required_keys__`` from unevaluated strings and count ``NotRequired`` keys as required."""
    hints = get_type_hints(tp, include_extras=True)
    total = bool(getattr(tp, "__total__", True))
    required = set()
    for key, hint in hints.items():
        wrapper = get_origin(hint)
        names = {getattr(w, "_name", None) for w in _KEY_WRAPPERS if w is wrapper}
        if "NotRequired" in names:
            continue
        if "Required" in names or total:
            required.add(key)
    return hints, frozenset(required)


class _Generator:
    def __init__(self) -> None:
        self.defs: dict[str, dict[str, Any]] = {}
        self._owners: dict[str, type] = {}

    def convert(self, tp: Any, where: str) -> dict[str, Any]:
        origin = get_origin(tp)
        if origin in _KEY_WRAPPERS:
            return self.convert(get_args(tp)[0], where)
        if origin is Annotated:
            base, *meta = get_args(tp)
            if any(m is OPEN for m in meta):
                out: dict[str, Any] = {}
            else:
                out = dict(self.convert(base, where))
            for m in meta:
                if isinstance(m, str):
                    out["description"] = m
            if any(m is OPEN for m in meta) and "description" not in out:
                out["description"] = "any JSON value"
            return out
        if tp is Any or tp is object:
            raise TypeError(f"{where}: use JSONValue (any JSON value), not {tp!r}")
        if typing.is_typeddict(tp):
            return self._typeddict(tp)
        if tp in _SCALARS:
            return {"type": _SCALARS[tp]}
        if origin is Literal:
            values = list(get_args(tp))
            for v in values:
                if not isinstance(v, (str, int, bool)) and v is not None:
                    raise TypeError(f"{where}: Literal value {v!r} is not a JSON scalar")
            return {"enum": values}
        if origin is Union or origin is types.UnionType:
            members = [self.convert(a, where) for a in get_args(tp)]
            if all(set(m) == {"type"} and isinstance(m["type"], str) for m in members):
                return {"type": [m["type"] for m in members]}
            return {"anyOf": members}
        if origin in (list, tuple):
            args = get_args(tp)
            if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
                raise TypeError(f"{where}: only tuple[X, ...] is supported, not {tp!r}")
            if not args:
                raise TypeError(f"{where}: {tp!r} needs an item type")
            return {"type": "array", "items": self.convert(args[0], f"{where}[]")}
        if origin is dict:
            key, value = get_args(tp) or (None, None)
            if key is not str:
                raise TypeError(f"{where}: JSON object keys are strings, not {key!r}")
            return {"type": "object", "additionalProperties": self.convert(value, f"{where}{{}}")}
        raise TypeError(f"{where}: cannot express {tp!r} as JSON Schema")

    def _typeddict(self, tp: type) -> dict[str, Any]:
        name = tp.__name__
        owner = self._owners.get(name)
        if owner is not None and owner is not tp:
            raise TypeError(f"two TypedDicts named {name}: {owner.__module__}, {tp.__module__}")
        ref = {"$ref": f"#/$defs/{name}"}
        if owner is not None:
            return ref
        self._owners[name] = tp
        self.defs[name] = {}  # placeholder: recursive types refer to it by name
        hints, required = _typeddict_keys(tp)
        properties = {key: self.convert(hint, f"{name}.{key}") for key, hint in hints.items()}
        schema: dict[str, Any] = {"type": "object"}
        doc = (tp.__doc__ or "").strip()
        if doc:
            schema["description"] = " ".join(doc.split())
        schema["properties"] = properties
        schema["required"] = [key for key in hints if key in required]
        schema["additionalProperties"] = False
        self.defs[name] = schema
        return ref


def json_schema(
    root: Any,
    *,
    schema_id: str | None = None,
    title: str | None = None,
    description: str | None = None,
) -> dict[str, Any]:
    """A standalone draft 2020-12 schema for documents of type ``root`` (usually a union of
    ``TypedDict``s: a result document and the error document)."""
    gen = _Generator()
    body = gen.convert(root, "document")
    out: dict[str, Any] = {"$schema": DIALECT}
    if schema_id:
        out["$id"] = schema_id
    if title:
        out["title"] = title
    if description:
        out["description"] = description
    out.update(body)
    if gen.defs:
        out["$defs"] = dict(sorted(gen.defs.items()))
    return out


SCHEMA_VERSION = 1
