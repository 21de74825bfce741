"""Find the fenced ``python`` blocks of the docs and README, and run them the way a reader would.

A block is run unless the line right before its opening fence is the HTML comment
``<!-- not run: REASON -->``. The blocks of one page run in order, in one namespace (later
examples use the names earlier ones made), in a fresh interpreter whose working directory holds
copies of ``fixtures/`` and ``examples/``, so ``fixtures/ckpts/seed_mlp`` means what it means
from the repository root and no example can change the committed fixtures.

The ``$ `` lines of ``console`` blocks are commands (a line ending in ``\\`` continues on the
next); the lines after one, up to the next ``$ ``, are its documented stdout (a line ``...``
stands for lines left out). A trailing comment saying ``exit N`` documents a non-zero exit code.
:func:`run_command` runs one through bash, as written, with ``ckpt`` and ``python`` meaning this
checkout and this interpreter, no terminal and no ``COLUMNS``; :func:`first_mismatch` runs a
page's and compares, after :func:`normalized` masks what changes from run to run.

With ``CKPT_UPDATE_DOCS=1`` in the environment, :func:`first_mismatch` does not stop at a shown
output that differs: it writes what the command printed into the page instead (the run's
directory written as the page writes it, trailing spaces dropped) and goes on; a wrong exit code
still fails. A block that still matches once masked is left as it is, so regenerating a page
does not churn its dates and sizes; a block cut with ``...`` keeps as many lines before the
first ``...`` and after the last as it had.
"""

from __future__ import annotations

import os
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
EXIT = re.compile(r"#.*\bexit (?P<code>\d+)")
#: Set to 1 to rewrite the shown output of the docs' commands instead of comparing it.
UPDATE_DOCS = "CKPT_UPDATE_DOCS"


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


def prepare_workdir(workdir: Path) -> None:
    """Copies of ``fixtures/`` and ``examples/`` in ``workdir``: paths mean what they mean from
    the repository root, and nothing run there can change the committed files. The Orbax
    release matrix (25 MB, which no page changes) is a link to the repository's."""
    for name in ("fixtures", "examples"):
        if not (workdir / name).exists():
            skip = shutil.ignore_patterns("matrix") if name == "fixtures" else None
            shutil.copytree(REPO / name, workdir / name, symlinks=True, ignore=skip)
    matrix = workdir / "fixtures" / "matrix"
    if not matrix.exists():
        matrix.symlink_to(REPO / "fixtures" / "matrix", target_is_directory=True)


def run_page(
    blocks: list[Block], workdir: Path, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """Run the runnable blocks of one page in a fresh interpreter inside ``workdir``."""
    prepare_workdir(workdir)
    script = _RUNNER.format(blocks=[(b.where, b.code) for b in blocks if b.not_run is None])
    return subprocess.run(
        [sys.executable, "-c", script],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@dataclass(frozen=True)
class Command:
    page: Path
    line: int  # 1-based line of the ``$ `` line
    text: str  # as written, continuation lines included
    exit_code: int  # 0, or the ``exit N`` of its trailing comment
    output: tuple[str, ...]  # the documented stdout lines, possibly none

    @property
    def where(self) -> str:
        page = self.page.relative_to(REPO) if self.page.is_relative_to(REPO) else self.page.name
        return f"{page}:{self.line}"


def console_commands(page: Path, section: str | None = None) -> list[Command]:
    """The commands of the page's ``console`` blocks, in order; with ``section``, only those under
    the ``## section`` heading."""
    lines = page.read_text().splitlines()
    commands: list[Command] = []
    heading: str | None = None
    i = 0
    while i < len(lines):
        if lines[i].startswith("## "):
            heading = lines[i][3:].strip()
        m = FENCE.match(lines[i])
        i += 1
        if not m or m.group("info").strip() != "console":
            continue
        body: list[tuple[int, str]] = []
        while i < len(lines) and lines[i].strip() != "```":
            body.append((i + 1, lines[i]))
            i += 1
        i += 1
        if section is None or heading == section:
            commands += _commands_of(page, body)
    return commands


SHELL_INFOS = ("sh", "bash", "shell")
#: A ``ckpt`` line of a shell block, environment assignments before it allowed.
_CKPT_LINE = re.compile(r"^(\w+=\S+\s+)*ckpt\s")


def shell_commands(page: Path) -> list[Command]:
    """The ``ckpt`` lines of the page's ``sh``/``bash`` blocks (``NAME=value ckpt ...`` too),
    continuation lines included; the other lines of those blocks (``pip install``, ``make``) are
    not ``ckpt``'s. They show no output."""
    lines = page.read_text().splitlines()
    found: list[Command] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        i += 1
        if not m or m.group("info").strip() not in SHELL_INFOS:
            continue
        while i < len(lines) and lines[i].strip() != "```":
            number, text = i + 1, lines[i].strip()
            while text.endswith("\\") and i + 1 < len(lines):
                i += 1
                text += "\n" + lines[i]
            i += 1
            if _CKPT_LINE.match(text):
                m_exit = EXIT.search(text.splitlines()[-1])
                code = int(m_exit.group("code")) if m_exit else 0
                found.append(Command(page, number, text, code, ()))
        i += 1
    return found


def _commands_of(page: Path, body: list[tuple[int, str]]) -> list[Command]:
    found: list[Command] = []
    j = 0
    while j < len(body):
        number, line = body[j]
        if not line.startswith("$ "):
            j += 1
            continue
        text = line[2:]
        while text.endswith("\\") and j + 1 < len(body):
            j += 1
            text += "\n" + body[j][1]
        j += 1
        output = []
        while j < len(body) and not body[j][1].startswith("$ "):
            output.append(body[j][1])
            j += 1
        m = EXIT.search(text.splitlines()[-1])
        code = int(m.group("code")) if m else 0
        found.append(Command(page, number, text, code, tuple(output)))
    return found


#: What would make a command's output differ from the page's: forced colour, a debug traceback.
#: ``COLUMNS`` too: a pipe honours it (``text_width``), and the pages show what a pipe prints
#: without it (``--help`` then lays itself out for 80 columns, Rich's width off a terminal).
_UNSET = (
    "FORCE_COLOR",
    "CLICOLOR_FORCE",
    "CKPT_DEBUG",
    "TTY_COMPATIBLE",
    "TTY_INTERACTIVE",
    "COLUMNS",
    "LINES",
)


def run_command(
    command: Command, workdir: Path, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """Run one documented command through bash in ``workdir``: ``ckpt`` is this checkout's
    (``python -m ckpt_cli`` with the repository first on the path), ``python`` this interpreter.
    Output is what a reader's pipe gets, the same on every machine: no terminal (stdout and
    stderr are pipes), no ``COLUMNS`` (``--help`` at 80 columns), ``TZ=UTC``, no forced colour."""
    env = {k: v for k, v in os.environ.items() if k not in _UNSET}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    env.update(TZ="UTC", CKPT_DOCS_PYTHON=sys.executable)
    prelude = 'ckpt() { "$CKPT_DOCS_PYTHON" -m ckpt_cli "$@"; }\nset -o pipefail\n'
    return subprocess.run(
        ["bash", "-c", prelude + command.text],
        cwd=workdir,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


_VOLATILE = [
    (re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d"), "YYYY-MM-DD hh:mm"),
    (re.compile(r"\b\d+[smhd] ago\b"), "N ago"),
    (re.compile(r"\d+(\.\d+)? s \([\d.]+ [KMG]?i?B/s\)"), "T s (R/s)"),
    # A loss after training: its last digits depend on the CPU's vector instructions.
    (re.compile(r"\bloss \d+\.\d+"), "loss L"),
    # Sizes on disk: OCDBT packs the same values into files of slightly different sizes.
    (re.compile(r"\b\d+(\.\d+)? [KMG]?i?B\b"), "SIZE"),
    # Offsets in an exported safetensors file: its header holds the source's path, whose length
    # (the test's temporary directory) moves every tensor's bytes.
    (re.compile(r"\bends at byte [\d,]+, the file has [\d,]+"), "ends at byte B, the file has F"),
]


def normalized(text: str, workdir: Path, documented_dir: str) -> list[str]:
    """Lines with what changes from run to run masked (times, ages, speeds, sizes, losses), the
    run's directory written as the page writes it, and runs of spaces (column widths) collapsed."""
    text = text.replace(str(workdir), documented_dir)
    for pattern, mask in _VOLATILE:
        text = pattern.sub(mask, text)
    return [" ".join(line.split()) for line in text.splitlines() if line.strip()]


def first_mismatch(
    commands: list[Command], workdir: Path, documented_dir: str, *, show_all: bool = False
) -> str | None:
    """Run the commands in order in ``workdir``; stop at the first whose exit code or shown
    output is not what the page says, and say how (``None``: every one ran as documented).
    With ``show_all``, a command that prints something must show it on the page.
    With ``CKPT_UPDATE_DOCS=1``, outputs that differ are written into their pages instead."""
    update = os.environ.get(UPDATE_DOCS) == "1"
    rewrites: dict[Path, dict[Command, list[str]]] = {}
    try:
        for command in commands:
            result = run_command(command, workdir)
            if result.returncode != command.exit_code:
                return (
                    f"{command.where}: `{command.text}` exited {result.returncode}, the page says "
                    f"{command.exit_code}\n{result.stderr[-2000:]}"
                )
            printed = normalized(result.stdout, workdir, documented_dir)
            shown = normalized("\n".join(command.output), workdir, documented_dir)
            if (command.output or (show_all and printed)) and not shows(printed, shown):
                if not update:
                    return (
                        f"{command.where}: `{command.text}` printed\n{result.stdout}\n"
                        f"(rerun with {UPDATE_DOCS}=1 to write it into the page)"
                    )
                lines = result.stdout.replace(str(workdir), documented_dir).rstrip().splitlines()
                lines = _cut_as_before([x.rstrip() for x in lines], list(command.output))
                rewrites.setdefault(command.page, {})[command] = lines
        return None
    finally:
        for page, outputs in rewrites.items():
            rewrite_outputs(page, outputs)


def _cut_as_before(printed: list[str], shown: list[str]) -> list[str]:
    """A block the page had cut with ``...`` stays cut: as many lines before its first ``...``
    and after its last as it had, the rest left out."""
    cuts = [i for i, line in enumerate(shown) if line.strip() == "..."]
    if not cuts:
        return printed
    head, tail = cuts[0], len(shown) - 1 - cuts[-1]
    if head + tail >= len(printed):
        return printed
    return [*printed[:head], shown[cuts[0]], *(printed[len(printed) - tail :] if tail else [])]


def rewrite_outputs(page: Path, outputs: dict[Command, list[str]]) -> None:
    """Replace the shown output of each command of ``page`` (found by its line) with ``lines``."""
    lines = page.read_text().splitlines()
    for command in sorted(outputs, key=lambda c: c.line, reverse=True):
        start = command.line - 1 + command.text.count("\n") + 1
        assert lines[command.line - 1].startswith("$ "), f"{command.where} moved"
        lines[start : start + len(command.output)] = outputs[command]
    page.write_text("\n".join(lines) + "\n")


def shows(printed: list[str], shown: list[str]) -> bool:
    """Whether the documented lines are the printed ones. A line ``...`` in the documentation
    stands for lines left out: the parts between such lines must appear in order, each part as
    consecutive lines."""
    if "..." not in shown:
        return printed == shown
    parts: list[list[str]] = [[]]
    for line in shown:
        if line == "...":
            parts.append([])
        else:
            parts[-1].append(line)
    at = 0
    for n, part in enumerate(parts):
        if not part:
            continue
        found = next(
            (
                i
                for i in range(at, len(printed) - len(part) + 1)
                if printed[i : i + len(part)] == part
            ),
            None,
        )
        anchored = n > 0 or found == 0  # no leading ``...``: the output starts with the part
        if found is None or not anchored:
            return False
        at = found + len(part)
    return parts[-1] == [] or at == len(printed)  # no trailing ``...``: the output ends there
