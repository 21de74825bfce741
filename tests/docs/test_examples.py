"""Every Python example in docs/ and README.md runs against real checkpoints (the fixtures).

Today's README once carried a migrate snippet that failed with ``NameError: resolve_item``: a
page whose example fails, or a block skipped without saying why, fails here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.docs_examples import (
    REPO,
    Block,
    dangling_markers,
    pages,
    python_blocks,
    run_page,
)

ALL_BLOCKS = [b for page in pages() for b in python_blocks(page)]
RUN_PAGES = sorted({b.page for b in ALL_BLOCKS if b.not_run is None})


def _param(page: Path) -> object:
    """A page whose examples restore or save with real Orbax (or Keras) is a slow round trip."""
    code = "\n".join(b.code for b in ALL_BLOCKS if b.page == page and b.not_run is None)
    slow = any(f"import {heavy}" in code for heavy in ("orbax", "jax", "keras"))
    return pytest.param(
        page, id=str(page.relative_to(REPO)), marks=[pytest.mark.slow] if slow else []
    )


def test_the_docs_have_python_examples_and_most_of_them_run() -> None:
    assert ALL_BLOCKS, "no ```python block found in docs/ or README.md"
    runnable = [b for b in ALL_BLOCKS if b.not_run is None]
    assert runnable, "every ```python block is marked not run: nothing is tested"
    assert RUN_PAGES


def test_a_block_skipped_says_why_right_before_its_fence() -> None:
    checked = pages()
    assert checked
    for page in checked:
        assert not dangling_markers(page), (
            f"{page.relative_to(REPO)}: `<!-- not run: ... -->` on line(s) "
            f"{dangling_markers(page)} is not right before a ```python fence"
        )


@pytest.mark.parametrize("page", [_param(p) for p in RUN_PAGES])
def test_the_examples_of_the_page_run(page: Path, tmp_path: Path) -> None:
    blocks = [b for b in ALL_BLOCKS if b.page == page]
    result = run_page(blocks, tmp_path)
    assert result.returncode == 0, f"{result.stderr[-4000:]}\n(stdout: {result.stdout[-1000:]})"
    ran = [line for line in result.stdout.splitlines() if line.startswith("ran ")]
    assert len(ran) == sum(b.not_run is None for b in blocks)


def test_the_runner_catches_a_failing_example(tmp_path: Path) -> None:
    """The check can fail: a block like the README's old migrate snippet is reported by line."""
    page = tmp_path / "page.md"
    page.write_text(
        "Text.\n\n```python\nx = 1\n```\n\n<!-- not run: shown only -->\n```python\nraise SystemExit(3)\n```\n"
        "\n```python\nref = resolve_item(open_location('runs/exp7'))\n```\n"
    )
    blocks = python_blocks(page)
    assert [b.line for b in blocks] == [3, 8, 12]
    assert [b.not_run for b in blocks] == [None, "shown only", None]
    work = tmp_path / "work"
    work.mkdir()
    result = run_page([Block(REPO / "README.md", b.line, b.code, b.not_run) for b in blocks], work)
    assert result.returncode == 1
    assert "NameError" in result.stderr and "resolve_item" in result.stderr
    assert "example failed: README.md:12" in result.stderr
