"""Progress on a terminal tells the truth: it reaches the end it announces, counts
bytes in the units the text uses (MiB, GiB), shows a rate and the time left; a writer prints
its plan before it starts writing; pipes and --json get no progress at all."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.support.interrupts import CAST_SPEC, CKPT, MIGRATE_BIG, RESHARD_BIG
from tests.support.terminal import _ANSI, Terminal

AMOUNT = re.compile(r"(\d+(?:\.\d+)?)/(\d+(?:\.\d+)?) (KiB|MiB|GiB)")
RATE = re.compile(r"\d+(?:\.\d+)? (?:B|KiB|MiB|GiB)/s")
TIME_LEFT = re.compile(r"\b\d+:\d\d:\d\d\b|\b\d+(?:\.\d+)?s left\b|\beta\b")

CASES = {
    "verify-deep": ["verify", "{root}", "--step", "1", "--deep"],
    "diff": ["diff", "{root}@1", "{root}@2", "--filter", "embed"],
    "inspect-stats": ["inspect", "{root}", "--stats", "--filter", "embed"],
    "reshard": RESHARD_BIG,
    "migrate": MIGRATE_BIG,
}


def _frames(raw: bytes) -> list[str]:
    """Every state the terminal showed: Rich redraws its bar after a carriage return."""
    text = _ANSI.sub("", raw.decode(errors="replace"))
    return [f.strip() for f in re.split(r"[\r\n]", text) if f.strip()]


def _run(name: str, big_root: Path, tmp_path: Path) -> tuple[list[str], bytes]:
    spec = tmp_path / "cast.yaml"
    spec.write_text(CAST_SPEC)
    args = [a.format(root=big_root, dst=tmp_path / "out", spec=spec) for a in CASES[name]]
    term = Terminal(args, 100)
    screen = term.finish(timeout=300)
    assert screen.code in (0, 1), screen.text
    return _frames(term.raw), term.raw


@pytest.mark.parametrize("name", list(CASES))
def test_progress_moves_in_binary_units_with_rate_and_time_left(
    name: str, big_root: Path, tmp_path: Path
) -> None:
    frames, _ = _run(name, big_root, tmp_path)
    amounts = [(float(m[1]), float(m[2]), m[3]) for f in frames if (m := AMOUNT.search(f))]
    assert amounts, frames[-20:]
    total = amounts[-1][1]
    # How many states a bar shows between 0 and the end depends on the machine's speed (Rich
    # redraws 10 times a second): that the work reports every block is proven on the events
    # themselves (tests/api/test_progress_events.py); here, what the bar shows of them.
    assert amounts[-1][0] == total, frames[-5:]
    assert not any(re.search(r"\d (?:MB|GB|kB)\b", f) for f in frames), "decimal units"
    assert any(RATE.search(f) for f in frames), frames[-20:]
    assert any(TIME_LEFT.search(f) for f in frames), frames[-20:]


@pytest.mark.parametrize("name", ["reshard", "migrate"])
def test_writers_print_the_plan_before_writing(name: str, big_root: Path, tmp_path: Path) -> None:
    frames, _ = _run(name, big_root, tmp_path)
    plan = next((i for i, f in enumerate(frames) if f.startswith("params.embed")), len(frames))
    first_bar = next(i for i, f in enumerate(frames) if "━" in f)
    assert plan < first_bar, frames[: first_bar + 5]


@pytest.mark.parametrize("name", ["verify-deep", "inspect-stats", "diff"])
def test_no_progress_through_a_pipe(name: str, big_root: Path) -> None:
    args = [a.format(root=big_root) for a in CASES[name]]
    proc = subprocess.run([CKPT, *args], capture_output=True, text=True, check=False)
    assert proc.returncode in (0, 1)
    assert proc.stdout
    assert proc.stderr == ""


def test_no_progress_with_json_on_a_terminal(big_root: Path) -> None:
    term = Terminal(["verify", big_root, "--step", "1", "--deep", "--json"], 100)
    screen = term.finish(timeout=300)
    assert screen.code == 0
    text = screen.text.strip()
    assert text.startswith("{") and text.endswith("}"), text[:300]
