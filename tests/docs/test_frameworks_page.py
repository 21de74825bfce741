"""docs/how-to/frameworks.md holds a section per framework, and the command lines of its
Orbax v1 section run as written on the committed v1 fixtures (exit codes and shown output)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.docs_examples import REPO, console_commands, first_mismatch, prepare_workdir

PAGE = REPO / "docs" / "how-to" / "frameworks.md"
#: Where the page says the reader's checkout is.
READER_DIR = "/home/you/ckpt"


def test_the_page_has_a_section_per_framework() -> None:
    headings = [
        line[3:].strip() for line in PAGE.read_text().splitlines() if line.startswith("## ")
    ]
    for name in (
        "What ckpt does with each kind of item",
        "Keras 3 OrbaxCheckpoint",
        "gemma and Kauldron",
        "MaxText",
        "Orbax v1 API",
        "Flax NNX",
        "A TPU chip",
    ):
        assert name in headings, f"frameworks.md lost its section {name!r}"


@pytest.mark.slow
def test_the_orbax_v1_commands_run_as_written(tmp_path: Path) -> None:
    prepare_workdir(tmp_path)
    commands = console_commands(PAGE, section="Orbax v1 API")
    assert len(commands) >= 6
    mismatch = first_mismatch(commands, tmp_path, READER_DIR)
    assert mismatch is None, mismatch
    assert (tmp_path / "runs" / "v1-back" / "5" / "state" / "_METADATA").is_file()
