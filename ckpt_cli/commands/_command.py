"""``Command``: everything the app, the schema generator, the docs and the tests need to know
about one subcommand, declared once beside its function (``COMMAND`` in ``commands/<x>.py``).

The JSON document type and the schema version are named by dotted path (``module:Name``) and
resolved only when asked for: ``ckpt --help`` must not import the result types (numpy).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: Where the version of a document comes from when no result type carries its own.
DEFAULT_VERSION = "ckpt_cli.core.schema:SCHEMA_VERSION"


def resolve(dotted: str) -> Any:
    """``package.module:Name.attr`` -> the object."""
    module, _, attrs = dotted.partition(":")
    found: Any = importlib.import_module(module)
    for attr in attrs.split("."):
        found = getattr(found, attr)
    return found


@dataclass(frozen=True)
class Command:
    """One subcommand: its name on the command line, the Typer function (its docstring is the
    help), the TypedDict(s) its ``--json`` prints (``module:Name``; several when it prints one
    of several documents), where its ``schema_version`` comes from (``module:Class`` with a
    ``SCHEMA_VERSION``, or a constant), and the examples its help ends with."""

    name: str
    function: Callable[..., None]
    documents: tuple[str, ...]
    examples: tuple[str, ...]
    version: str = DEFAULT_VERSION

    def help(self) -> str:
        """The help Typer shows: the function's docstring, then ``Examples:`` (indented, so the
        Markdown help keeps each ``$ ckpt ...`` line whole)."""
        text = inspect.getdoc(self.function) or ""
        if not self.examples:
            return text
        lines = "\n".join(f"    $ ckpt {self.name} {example}" for example in self.examples)
        return f"{text}\n\nExamples:\n\n{lines}"

    def document_type(self) -> object:
        """The TypedDict of the ``--json`` document (a union when there are several)."""
        import functools
        import operator

        types = [resolve(d) for d in self.documents]
        return functools.reduce(operator.or_, types)

    def schema_version(self) -> int:
        found = resolve(self.version)
        return int(found if isinstance(found, int) else found.SCHEMA_VERSION)
