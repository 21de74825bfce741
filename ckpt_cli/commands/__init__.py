"""The one registry of subcommands: the app, the schema generator, ``ckpt_cli.execute`` (the
writers' plan types and executors), the reference pages, the site's nav, the command lists of
README.md, docs/index.md and json.md (docs/gen_reference.py) and the tests' matrices iterate
``COMMANDS``, so a command is registered in one place or not at all (CONTRIBUTING.md: "Add a
command"; tests/commands/test_registry.py proves it with a toy command).

Each ``commands/<x>.py`` is a vertical slice: its Typer signature with its own options, its
``Command`` record, and beside it ``commands/<x>_text.py``, its text rendering (over the shared
primitives of ``_text.py``; ``_write_text.py`` holds what every writer prints). Command modules
import the core inside their functions: importing this package (``ckpt --help``) loads none of
it.
"""

from __future__ import annotations

from ckpt_cli.commands import (
    average,
    cp,
    diff,
    digest,
    doctor,
    du,
    export,
    import_,
    inspect,
    ls,
    migrate,
    pin,
    prune,
    reshard,
    trend,
    verify,
)
from ckpt_cli.commands._command import Command

#: Every subcommand, in the order ``ckpt --help`` lists them.
COMMANDS: tuple[Command, ...] = (
    ls.COMMAND,
    du.COMMAND,
    inspect.COMMAND,
    verify.COMMAND,
    digest.COMMAND,
    diff.COMMAND,
    doctor.COMMAND,
    trend.COMMAND,
    prune.COMMAND,
    reshard.COMMAND,
    migrate.COMMAND,
    average.COMMAND,
    export.COMMAND,
    import_.COMMAND,
    cp.COMMAND,
    pin.PIN,
    pin.UNPIN,
)


def command(name: str) -> Command:
    """The command called ``name`` on the command line (KeyError if there is none)."""
    for c in COMMANDS:
        if c.name == name:
            return c
    raise KeyError(name)
