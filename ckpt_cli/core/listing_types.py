"""The JSON types of ``ckpt ls --json``: what ``listing.py``'s ``StepInfo.to_json`` and
``RootListing.to_json`` build.

They belong beside those results in ``listing.py``; they sit here only while that module is
being changed elsewhere. Moving them in (and annotating the two ``to_json`` with them) is the
last step: ``tests/test_architecture.py`` names the exception until then.
"""

from __future__ import annotations

from typing import Literal, TypedDict

from ckpt_cli.core.format.pins import PinJSON
from ckpt_cli.core.schema import JSONValue


class StepJSON(TypedDict):
    step: int
    name: str
    path: str
    status: Literal["committed", "incomplete", "uncommitted"]
    latest: bool
    committed_at: str
    time_source: Literal["commit_metadata", "commit_marker", "mtime"]
    size_bytes: int
    items: list[str]
    metrics: JSONValue
    formats: dict[str, str]
    problem: str | None
    pinned: PinJSON | None


class LsJSON(TypedDict):
    """``ckpt ls --json``: the steps of a root."""

    schema_version: int
    ok: bool
    root: str
    root_metadata: JSONValue
    latest_step: int | None
    total_bytes: int
    steps: list[StepJSON]
    ignored: list[str]
