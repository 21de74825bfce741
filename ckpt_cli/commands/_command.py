"""``Command``: everything the app, the schema generator, the docs, the public API's ``execute``
and the tests need to know about one subcommand, declared once beside its function (``COMMAND``
in ``commands/<x>.py``) and registered by one line in ``commands/__init__.py``.

The record holds real objects, checked by mypy, but the heavy ones behind zero-argument
*loaders*: ``ckpt --help`` and the read commands must start without importing numpy or the core
(tests/commands/test_startup.py), and the JSON types, the renderers and the writers' plan and
executor live there. A loader is a small function in the command's module whose body imports
what it returns::

    def _json() -> JsonOutput:
        from ckpt_cli.core.listing import LsJSON, RootListing

        return JsonOutput((LsJSON,), RootListing.SCHEMA_VERSION)

so a misspelt name fails ``mypy`` (and ``ruff``), not only a test, while nothing is imported
until someone asks: the schema generator calls ``json_output()``, ``ckpt_cli.execute`` calls
``writer()``. A ``Writer`` ties a plan type to its executor, and its loader's return type names
both (``-> Writer[ReshardPlan, WriteResult]``): an executor that does not take that plan, or
returns something else, is a type error. (Moving every TypedDict into dependency-free modules would serve the JSON types, but not
the renderers, the plan classes or the executors: one mechanism for all of them.)
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    from ckpt_cli.core.progress import ProgressFn

P = TypeVar("P")
R = TypeVar("R")


@dataclass(frozen=True)
class JsonOutput:
    """What ``--json`` prints: the TypedDict(s) of the document (several when the command prints
    one of several documents: ``inspect``, one item or every item of a step) and the
    ``schema_version`` it carries."""

    documents: tuple[type[Any], ...]
    version: int

    def __post_init__(self) -> None:
        if not self.documents:
            raise ValueError("a JSON output names at least one document type")


@dataclass(frozen=True)
class Writer(Generic[P, R]):
    """A command that writes: the type of the plan its ``plan_*`` function returns and the
    executor ``ckpt_cli.execute(plan)`` dispatches that plan to (``execute(plan, on_progress)``
    -> its result)."""

    plan: type[P]
    execute: Callable[[P, ProgressFn | None], R]


@dataclass(frozen=True)
class Command:
    """One subcommand: its name on the command line, the Typer function (its docstring is the
    help), its one-line ``summary`` and ``guides`` (label, page under docs/) for the command
    tables of README.md and docs/index.md, the examples its help ends with, what its ``--json``
    prints, the module that renders its text output (None: the command prints its few lines
    itself), and for a writer its plan and executor."""

    name: str
    function: Callable[..., None]
    summary: str
    json_output: Callable[[], JsonOutput]
    examples: tuple[str, ...] = ()
    guides: tuple[tuple[str, str], ...] = ()
    renderer: Callable[[], ModuleType] | None = None
    writer: Callable[[], Writer[Any, Any]] | None = None

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

        return functools.reduce(operator.or_, self.json_output().documents)

    def schema_version(self) -> int:
        return self.json_output().version
