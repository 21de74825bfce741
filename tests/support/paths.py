"""Where the repository and its committed fixtures are."""

from __future__ import annotations

from pathlib import Path

#: The repository root (this file is tests/support/paths.py).
REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "fixtures" / "ckpts"
