"""Reshard rules: leaf-name patterns mapped to partition specs (``--rules`` files, ``--rule``).

First match wins; a leaf no rule matches is replicated. A pattern names whole leaves (globs
cross dots: ``params.*kernel``); a spec is ``[null, model]``, ``[[data, model], null]``, ``[]``
or ``null`` (replicated).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ckpt_cli.core.format.names import compile_leaf_pattern
from ckpt_cli.core.format.sharding import MeshSpec, Spec
from ckpt_cli.core.regex import Regex
from ckpt_cli.core.textfiles import load_yaml, read_limited
from ckpt_cli.core.units import short_repr
from ckpt_cli.errors import InvalidMetadataError, NotFoundError, UsageError


@dataclass(frozen=True)
class Rule:
    pattern: str
    spec: Spec
    regex: Regex


def parse_spec(value: Any, where: str, mesh: MeshSpec) -> Spec:
    """``[null, model]``, ``[[data, model], null]``, ``[]`` (replicated) or ``null`` (replicated)."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise UsageError(
            f"{where}: a partition spec is a list such as [null, model], got {value!r}"
        )
    out: list[Any] = []
    used: list[str] = []
    for dim in value:
        axes = [dim] if isinstance(dim, str) else dim if isinstance(dim, list) else None
        if dim is None:
            out.append(None)
            continue
        if axes is None or not all(isinstance(a, str) for a in axes):
            raise UsageError(f"{where}: {dim!r} is neither null, an axis name nor a list of them")
        for a in axes:
            if a not in mesh.axis_names:
                raise UsageError(
                    f"{where}: unknown mesh axis {a!r} (mesh axes: {', '.join(mesh.axis_names)})"
                )
            if a in used:
                raise UsageError(f"{where}: mesh axis {a!r} is used twice")
            used.append(a)
        out.append(dim if isinstance(dim, str) else tuple(axes))
    return tuple(out)


def parse_rules(doc: Any, mesh: MeshSpec, source: str) -> list[Rule]:
    """Rules from a mapping ``{pattern: spec}`` (YAML/JSON), in file order; first match wins."""
    if doc is None:
        return []
    if not isinstance(doc, dict):
        raise UsageError(f"{source}: expected a mapping of leaf patterns to partition specs")
    rules = []
    for pattern, value in doc.items():
        regex = compile_leaf_pattern(str(pattern), f"{source}: rule")
        # A rule names whole leaves: anchor it so `kernel` does not match `kernel_scale`.
        anchored = Regex(f"(?:{regex.pattern})\\z")
        rules.append(
            Rule(str(pattern), parse_spec(value, f"{source}: rule {pattern!r}", mesh), anchored)
        )
    return rules


def load_rules(path: str) -> Any:
    """A ``--rules`` file: YAML (or JSON) mapping leaf patterns to partition specs."""
    import yaml

    try:
        return load_yaml(read_limited(path, "--rules").decode("utf-8"), f"--rules {path}")
    except NotFoundError:
        raise InvalidMetadataError(f"--rules {path} does not exist") from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise InvalidMetadataError(
            f"--rules {path} is not valid YAML/JSON: {str(e).splitlines()[0]}"
        ) from None


def inline_rule(text: str) -> dict[str, Any]:
    """A ``--rule PATTERN=SPEC`` as a one-rule mapping."""
    import yaml

    pattern, sep, spec = text.partition("=")
    if not sep or not pattern:
        raise UsageError(
            f"--rule {text!r}: expected PATTERN=SPEC, e.g. 'params.*kernel=[null, model]'"
        )
    try:
        return {pattern.strip(): yaml.safe_load(spec)}
    except (yaml.YAMLError, RecursionError, ValueError):  # 5,000-deep, 5,000 digits
        raise UsageError(
            f"--rule {short_repr(text, 80)}: the spec is not a YAML list such as [null, model]"
        ) from None
