"""The tutorial runs as written: its script saves a real Orbax checkpoint, then every ``$ ckpt``
command of the page runs on it through bash, with the exit code the page states and, where the
page shows output, that output (times, ages and speeds masked)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.docs_examples import (
    REPO,
    console_commands,
    first_mismatch,
    prepare_workdir,
    python_blocks,
    run_page,
    shows,
)

PAGE = REPO / "docs" / "tutorials" / "first-checkpoint.md"
SCRIPT = REPO / "examples" / "first_checkpoint.py"
#: Where the page says the reader's checkout is.
READER_DIR = "/home/you/ckpt"


def test_the_tutorial_shows_the_script_the_repository_ships() -> None:
    blocks = python_blocks(PAGE)
    assert len(blocks) == 1 and blocks[0].not_run is None
    assert blocks[0].code.strip() == SCRIPT.read_text().strip()


def test_the_tutorial_uses_every_read_command_it_promises() -> None:
    commands = [c.text for c in console_commands(PAGE)]
    assert commands
    for needle in (
        "ckpt ls ",
        "ckpt inspect ",
        "ckpt verify runs/first --record",
        "ckpt verify runs/first --deep",
        "ckpt diff ",
        "ckpt prune runs/first --keep-last 1 --dry-run",
        "ckpt export ",
    ):
        assert any(c.startswith(needle) for c in commands), f"the tutorial lost `{needle}`"


@pytest.mark.slow
def test_the_tutorial_runs_as_written(tmp_path: Path) -> None:
    saved = run_page(python_blocks(PAGE), tmp_path)
    assert saved.returncode == 0, saved.stderr[-4000:]
    assert (tmp_path / "runs" / "first" / "300" / "default" / "_METADATA").is_file()
    commands = console_commands(PAGE)
    assert len(commands) >= 9
    mismatch = first_mismatch(commands, tmp_path, READER_DIR)
    assert mismatch is None, mismatch
    assert (tmp_path / "runs" / "first-safetensors" / "model.safetensors").is_file()


def test_the_runner_catches_a_wrong_exit_code_or_output(tmp_path: Path) -> None:
    """The check can fail: a stated exit code that is not the real one, or shown output that is
    not what the command prints, is reported with its line."""
    page = tmp_path / "page.md"
    page.write_text(
        "## Try\n\n```console\n$ ckpt verify /no/such/run    # exit 3\n"
        "$ ckpt ls fixtures/ckpts/seed_mlp \\\n    --json    # exit 3\n```\n\n"
        "## Other\n\n```console\n$ ckpt ls fixtures/ckpts/seed_mlp\n/home/you/ckpt/fixtures/ckpts/seed_mlp\n"
        " step  status  size\n```\n"
    )
    work = tmp_path / "work"
    work.mkdir()
    prepare_workdir(work)
    tried = console_commands(page, section="Try")
    assert [(c.line, c.exit_code) for c in tried] == [(4, 3), (5, 3)]
    assert tried[1].text == "ckpt ls fixtures/ckpts/seed_mlp \\\n    --json    # exit 3"
    assert first_mismatch(tried[:1], work, READER_DIR) is None
    wrong_code = first_mismatch(tried, work, READER_DIR)
    assert wrong_code and wrong_code.startswith("page.md:5: `ckpt ls")
    assert "exited 0, the page says 3" in wrong_code
    other = console_commands(page, section="Other")
    assert len(other) == 1 and other[0].output
    wrong_output = first_mismatch(other, work, READER_DIR)
    assert wrong_output and wrong_output.startswith("page.md:12: `ckpt ls")
    assert "printed" in wrong_output and "committed" in wrong_output


def test_an_ellipsis_line_stands_for_lines_left_out_and_only_there() -> None:
    printed = ["head", "a", "b", "c", "tail"]
    assert shows(printed, printed)
    assert shows(printed, ["head", "...", "c", "tail"])
    assert shows(printed, ["...", "b", "...", "tail"])
    assert shows(printed, ["...", "b", "..."])
    assert not shows(printed, ["head", "...", "c"])  # the output goes on after c
    assert not shows(printed, ["a", "...", "tail"])  # the output starts before a
    assert not shows(printed, ["head", "...", "c", "b", "..."])  # out of order
    assert not shows(printed, ["head", "a", "c", "..."])  # a part is consecutive lines
