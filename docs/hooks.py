"""MkDocs hooks: the repository's CHANGELOG.md as the site's page changelog.md, and the command
reference pages in the nav, from the command registry.

MkDocs reads only docs/, and the changelog belongs at the repository root, where contributors
edit it and the sdist ships it; the site gets the same text at build time. Its links are written
from the root (``docs/reference/x.md``): here they are made relative to docs/.

The nav's Reference section lists ``Commands: reference/index.md``; after it this hook puts one
entry per command of ``ckpt_cli.commands.COMMANDS`` (``gen_lists.nav_entries``), in the
registry's order, so mkdocs.yml names no command and a new command needs no edit there.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from mkdocs.structure.files import File, Files

DOCS = Path(__file__).resolve().parent
#: The nav entry the command pages follow.
INDEX = "reference/index.md"


def _lists() -> ModuleType:
    """docs/gen_lists.py (not a package: loaded by path), with the repository importable."""
    if str(DOCS.parent) not in sys.path:
        sys.path.insert(0, str(DOCS.parent))
    spec = importlib.util.spec_from_file_location("gen_lists", DOCS / "gen_lists.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def with_commands(nav: list[Any], entries: list[dict[str, str]]) -> list[Any]:
    """``nav`` with ``entries`` right after the entry of the reference index (wherever it is
    nested); refuses a nav without that entry, and one that lists a command page by hand."""
    pages = {page for entry in entries for page in entry.values()}
    found = False

    def walk(items: list[Any]) -> list[Any]:
        nonlocal found
        out: list[Any] = []
        for item in items:
            value = next(iter(item.values())) if isinstance(item, dict) else item
            if isinstance(value, list):
                out.append({next(iter(item)): walk(value)})
                continue
            if value in pages:
                raise ValueError(f"mkdocs.yml lists {value} by hand: the registry's hook adds it")
            out.append(item)
            if value == INDEX:
                found = True
                out.extend(entries)
        return out

    result = walk(nav)
    if not found:
        raise ValueError(f"mkdocs.yml's nav has no {INDEX} entry to put the commands after")
    return result


def on_config(config: Any) -> Any:
    config["nav"] = with_commands(config["nav"], _lists().nav_entries())
    return config


def on_files(files: Files, config: Any) -> Files:
    text = (Path(config["docs_dir"]).parent / "CHANGELOG.md").read_text()
    files.append(File.generated(config, "changelog.md", content=re.sub(r"\]\(docs/", "](", text)))
    return files
