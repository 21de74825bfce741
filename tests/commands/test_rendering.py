"""Every command's text on a terminal 80 and 200 columns wide, and through a pipe.

On a pseudo-terminal of that size (``tests/support/terminal.py``) each command's output must fit:
no line wider than the window, every leaf name and file whole on one line, every message
whole (wrapped at spaces only) and no column of data dropped. Through a pipe: no trailing
spaces and no escape sequences. What must appear comes from the same command's ``--json``.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from ckpt_cli.commands import COMMANDS
from tests.support.interrupts import CKPT
from tests.support.paths import FIXTURES, REPO
from tests.support.terminal import run_on_terminal

DAMAGED = REPO / "fixtures" / "damaged"
SEED = FIXTURES / "seed_mlp"


@functools.cache
def _json_text(args: tuple[str, ...]) -> str:
    proc = subprocess.run([CKPT, *args, "--json"], capture_output=True, text=True, check=False)
    return proc.stdout


def _json(args: list[str]) -> Any:
    return json.loads(_json_text(tuple(args)))


def _metric(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


@dataclass(frozen=True)
class Case:
    """A command, what must appear whole on one line (names) and whole across lines (texts)."""

    args: list[str]
    names: Callable[[Any], list[str]] = lambda doc: []
    texts: Callable[[Any], list[str]] = lambda doc: []
    json_args: list[str] | None = None  # the --json command giving doc (default: args)
    codes: tuple[int, ...] = (0,)
    marks: dict[int, Any] = field(default_factory=dict)  # columns -> pytest mark


def _leaf_names(doc: Any) -> list[str]:
    return [leaf["name"] for leaf in doc["leaves"]]


def _problem_names(doc: Any) -> list[str]:
    return [x for p in doc["problems"] for x in (p["leaf"], p["file"]) if x]


def _problem_texts(doc: Any) -> list[str]:
    return [p["message"] for p in doc["problems"]]


def _ls_names(doc: Any) -> list[str]:
    out = []
    for s in doc["steps"]:
        out.append(str(s["step"]))
        out += [f"{k}={_metric(v)}" for k, v in (s["metrics"] or {}).items()]
    return out


def _prune_texts(doc: Any) -> list[str]:
    return [", ".join(k["reasons"]) for k in doc["keep"]]


def _keypath_parts(doc: Any) -> list[str]:
    return sorted({part for leaf in doc["leaves"] for part in leaf["name"].split(".")})


CASES: dict[str, Case] = {
    "ls": Case(["ls", SEED], names=_ls_names),
    "ls-metrics": Case(["ls", FIXTURES / "composite_best"], names=_ls_names),
    "inspect-tree": Case(["inspect", SEED], names=_keypath_parts),
    "inspect-flat": Case(["inspect", SEED, "--flat"], names=_leaf_names),
    "inspect-stats": Case(["inspect", SEED, "--flat", "--stats"], names=_leaf_names),
    "inspect-state": Case(["inspect", FIXTURES / "sharded_4x2"], names=_keypath_parts),
    "inspect-layout": Case(["inspect", FIXTURES / "sharded_4x2", "--layout", "params.w"]),
    "diff": Case(
        ["diff", f"{SEED}@300", f"{SEED}@500", "--all"],
        names=_leaf_names,
        codes=(1,),
    ),
    "prune-plan": Case(
        ["prune", SEED, "--keep-last", "1", "--dry-run"], names=lambda d: [], texts=_prune_texts
    ),
    "reshard-plan": Case(
        [
            "reshard",
            SEED,
            "/nonexistent/out",
            "--mesh",
            "data=4,model=2",
            "--rules",
            REPO / "examples" / "mesh_4x2.yaml",
            "--dry-run",
        ],
        names=lambda doc: [x["name"] for x in doc["leaves"] if x["new_chunk_shape"] is not None],
    ),
    "migrate-plan": Case(
        [
            "migrate",
            SEED,
            "/nonexistent/out",
            "--spec",
            REPO / "examples" / "widen_64_to_128.yaml",
            "--dry-run",
        ],
        names=_leaf_names,
    ),
}
for _name in sorted(p.name for p in DAMAGED.iterdir() if not p.name.startswith(("_", "R"))):
    CASES[f"verify-{_name}"] = Case(
        ["verify", DAMAGED / _name, "--deep"],
        names=_problem_names,
        texts=_problem_texts,
        codes=(0, 1),
    )


def _params() -> list[Any]:
    return [
        pytest.param(name, columns, id=f"{name}-{columns}")
        for name in CASES
        for columns in (80, 200)
    ]


def _words(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize(("name", "columns"), _params())
def test_output_fits_the_terminal(name: str, columns: int) -> None:
    case = CASES[name]
    args = [str(a) for a in case.args]
    screen = run_on_terminal(args, columns)
    assert screen.code in case.codes, screen.text + screen.stderr
    doc = _json([str(a) for a in (case.json_args or case.args)])
    names, texts = case.names(doc), case.texts(doc)
    assert screen.text.strip()
    assert not screen.too_wide(), "\n".join(
        f"{len(line)} > {columns}: {line}" for line in screen.too_wide()
    )
    missing = [n for n in names if not any(n in line for line in screen.lines)]
    assert not missing, f"not whole on one line: {missing}\n{screen.text}"
    flat = _words(screen.text)
    cut = [t for t in texts if _words(t) not in flat]
    assert not cut, f"not whole: {cut}\n{screen.text}"


@pytest.mark.parametrize("name", list(CASES))
def test_piped_output_is_plain(name: str) -> None:
    case = CASES[name]
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    proc = subprocess.run(
        [CKPT, *[str(a) for a in case.args]], capture_output=True, text=True, check=False, env=env
    )
    assert proc.returncode in case.codes, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines
    padded = [line for line in lines if line != line.rstrip()]
    assert not padded, f"{len(padded)} lines end in spaces, e.g. {padded[0]!r}"
    assert not re.search(r"\x1b\[", proc.stdout)
    doc = _json([str(a) for a in (case.json_args or case.args)])
    for n in case.names(doc):
        assert any(n in line for line in lines), n


def test_piped_ls_fits_columns_when_it_is_set() -> None:
    """``COLUMNS=60 ckpt ls RUN | less``: the table fits the width asked for, as on a terminal
    that wide (the metrics below each step, none dropped); without ``COLUMNS``, one line a
    step, however long."""
    root = FIXTURES / "composite_best"
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    wide = subprocess.run(
        [CKPT, "ls", str(root)], capture_output=True, text=True, check=False, env=env
    )
    assert wide.returncode == 0, wide.stderr
    assert max(len(line) for line in wide.stdout.splitlines()) > 60, wide.stdout
    narrow = subprocess.run(
        [CKPT, "ls", str(root)],
        capture_output=True,
        text=True,
        check=False,
        env={**env, "COLUMNS": "60"},
    )
    assert narrow.returncode == 0, narrow.stderr
    lines = narrow.stdout.splitlines()
    too_wide = [x for x in lines if len(x) > 60 and len(x.split()) > 1]
    assert not too_wide, narrow.stdout
    assert not re.search(r"\x1b\[", narrow.stdout)
    for name in _ls_names(_json(["ls", str(root)])):
        assert any(name in line for line in lines), (name, narrow.stdout)


@pytest.mark.parametrize("columns", [40, 60, 72, 80])
def test_diff_never_breaks_a_leaf_name(columns: int) -> None:
    """``opt_state.1`` and every other leaf name stay whole on one line however narrow the
    terminal: the table wraps at spaces or goes to blocks, never inside a name."""
    args = ["diff", f"{SEED}@300", f"{SEED}@500", "--all"]
    screen = run_on_terminal(args, columns)
    assert screen.code == 1, screen.text + screen.stderr
    names = _leaf_names(_json(args))
    assert "opt_state.1" in names
    for name in names:
        assert any(name in line.split() for line in screen.lines), f"{name} broken:\n{screen.text}"
    assert not screen.too_wide(), screen.too_wide()


def _piped_runs(command: str, tmp: Any) -> list[list[Any]]:
    """Command lines that show ``command``'s text (plans and results), in order; earlier ones
    make what later ones read."""
    root = tmp / "root"
    if not root.exists():
        import shutil

        shutil.copytree(SEED, root)
    spec = tmp / "spec.yaml"
    spec.write_text("rules: [{op: drop, match: rng}]\n")
    runs: dict[str, list[list[Any]]] = {
        "ls": [["ls", SEED, "-v"]],
        "inspect": [["inspect", SEED], ["inspect", SEED, "--flat", "--stats"]],
        "verify": [["verify", SEED, "--deep"], ["verify", DAMAGED / "missing-chunk"]],
        "digest": [["digest", SEED]],
        "diff": [["diff", f"{SEED}@300", f"{SEED}@500", "--all"]],
        "doctor": [["doctor", SEED, "--like", SEED]],
        "prune": [["prune", root, "--keep-last", "2", "--dry-run"]],
        "reshard": [["reshard", SEED, tmp / "rs", "--mesh", "data=1"]],
        "migrate": [["migrate", SEED, tmp / "mg", "--spec", spec]],
        "average": [
            ["average", SEED, tmp / "av", "--steps", "300,400,500", "--dry-run"],
            ["average", SEED, tmp / "av", "--steps", "300,500", "--ema", "0.9"],
        ],
        "export": [["export", SEED, tmp / "ex", "--max-shard-size", "8KiB"]],
        "import": [["export", SEED, tmp / "ex1"], ["import", tmp / "ex1", tmp / "im"]],
        "cp": [["cp", SEED, tmp / "cp"]],
        "pin": [["pin", root, "500", "--note", "kept"]],
        "unpin": [["pin", root, "500"], ["unpin", root, "500"]],
        "du": [["du", SEED], ["du", SEED, "--by", "leaf", "--top", "3"]],
        "trend": [["trend", SEED]],
    }
    return runs[command]


@pytest.mark.parametrize("command", [c.name for c in COMMANDS])
def test_every_command_piped_ends_no_line_in_whitespace(command: str, tmp_path: Any) -> None:
    """docs/how-to/terminal.md: through a pipe no line of any command ends in a space."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    for args in _piped_runs(command, tmp_path):
        proc = subprocess.run(
            [CKPT, *[str(a) for a in args]], capture_output=True, text=True, check=False, env=env
        )
        assert proc.returncode in (0, 1), (args, proc.stderr)
        assert proc.stdout.strip(), args
        for stream in (proc.stdout, proc.stderr):
            padded = [line for line in stream.splitlines() if line != line.rstrip()]
            assert not padded, (args, padded)


def test_counts_of_one_are_singular(cli: Any, tmp_path: Path) -> None:
    root = tmp_path / "run"
    shutil.copytree(SEED / "500", root / "500")
    ls = cli("ls", root)
    assert ls.code == 0 and "1 step," in ls.stdout, ls.stdout
    diff = cli("diff", f"{SEED}@300", f"{SEED}@500", "--filter", "^step$")
    assert diff.code == 1
    assert ": 1 leaf: " in diff.stdout, diff.stdout
    verify = cli("verify", root)
    assert verify.code == 0
    assert "1 step, 1 item," in verify.stdout and "(s)" not in verify.stdout, verify.stdout
