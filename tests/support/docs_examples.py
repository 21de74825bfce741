"""Find the fenced ``python`` blocks of the docs and README, and run them the way a reader would.

A block is run unless the line right before its opening fence is the HTML comment
``<!-- not run: REASON -->``. The blocks of one page run in order, in one namespace (later
examples use the names earlier ones made), in a fresh interpreter whose working directory holds
copies of ``fixtures/`` and ``examples/``, so ``fixtures/ckpts/seed_mlp`` means what it means
from the repository root and no example can change the committed fixtures.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
NOT_RUN = re.compile(r"^\s*<!--\s*not run:\s*(?P<reason>\S.*?)\s*-->\s*$")
FENCE = re.compile(r"^(?P<indent>\s*)```(?P<info>.*)$")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    code: str
    not_run: str | None  # the reason, when marked

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def pages() -> list[Path]:
    return [*sorted((REPO / "docs").rglob("*.md")), REPO / "README.md"]


def python_blocks(page: Path) -> list[Block]:
    """Every fenced block whose info string starts with ``python`` (``python title=...`` too)."""
    lines = page.read_text().splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        info = m.group("info").strip()
        start = i
        i += 1
        body: list[str] = []
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i])
            i += 1
        i += 1  # the closing fence
        if info.split(" ", 1)[0].split("{", 1)[0] not in ("python", "py"):
            continue
        marker = NOT_RUN.match(lines[start - 1]) if start > 0 else None
        code = textwrap.dedent("\n".join(body))
        blocks.append(Block(page, start + 1, code, marker.group("reason") if marker else None))
    return blocks


def dangling_markers(page: Path) -> list[int]:
    """Lines of ``not run`` markers that are not right before a ``python`` fence."""
    lines = page.read_text().splitlines()
    bad = []
    for n, line in enumerate(lines):
        if NOT_RUN.match(line):
            nxt = lines[n + 1] if n + 1 < len(lines) else ""
            m = FENCE.match(nxt)
            if not m or not m.group("info").strip().startswith(("python", "py")):
                bad.append(n + 1)
    return bad


_RUNNER = """
import sys, traceback
blocks = {blocks!r}
namespace = {{"__name__": "__main__"}}
for where, code in blocks:
    try:
        exec(compile(code, where, "exec"), namespace)
    except BaseException:
        sys.stderr.write("example failed: " + where + "\\n")
        traceback.print_exc()
        sys.exit(1)
    print("ran " + where)
"""


def run_page(
    blocks: list[Block], workdir: Path, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """Run the runnable blocks of one page in a fresh interpreter inside ``workdir``."""
    for name in ("fixtures", "examples"):
        if not (workdir / name).exists():
            shutil.copytree(REPO / name, workdir / name, symlinks=True)
    script = _RUNNER.format(blocks=[(b.where, b.code) for b in blocks if b.not_run is None])
    return subprocess.run(
        [sys.executable, "-c", script],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
