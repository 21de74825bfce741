"""Without the ``orbax`` extra (jax, flax, optax, orbax-checkpoint), the paths that need it say
so in one line and exit 3 with the line that installs it, never ``internal error: No module
named 'jax'`` (exit 70); the others run as ever. Each run is a real ``ckpt`` process in which
those packages cannot be imported (``tests/support/without_modules.py``)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.paths import FIXTURES, REPO

SEED = FIXTURES / "seed_mlp"
EXTRA = "jax,jaxlib,flax,optax,orbax"
NEEDS = "ckpt: error: --target needs jax, which is not installed (pip install 'ckpt-orbax[orbax]')"


def run_without_extra(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    runner = REPO / "tests" / "support" / "without_modules.py"
    return subprocess.run(
        [sys.executable, str(runner), EXTRA, "--", *args],
        capture_output=True,
        text=True,
        check=False,
        cwd=cwd,
    )


@pytest.fixture
def model(tmp_path: Path) -> str:
    """A --target module in the working directory; it imports jax, as real ones do."""
    (tmp_path / "newmodel.py").write_text(
        textwrap.dedent("""
            import jax

            def abstract():
                return {"w": jax.ShapeDtypeStruct((2,), "float32")}
        """)
    )
    return "newmodel:abstract"


def _args(command: str, model: str, tmp_path: Path) -> list[str]:
    spec = tmp_path / "spec.yaml"
    spec.write_text("rules: [{op: drop, match: rng}]\n")
    exported = tmp_path / "exported"
    exported.mkdir(exist_ok=True)
    return {
        "doctor": ["doctor", str(SEED), "--target", model],
        "doctor-hosts": ["doctor", str(SEED), "--target", model, "--hosts", "2"],
        "migrate": [
            "migrate",
            str(SEED),
            str(tmp_path / "out"),
            "--spec",
            str(spec),
            "--target",
            model,
        ],
        "import": ["import", str(exported), str(tmp_path / "in"), "--target", model],
    }[command]


@pytest.mark.parametrize("command", ["doctor", "doctor-hosts", "migrate", "import"])
def test_target_says_it_needs_the_orbax_extra(command: str, model: str, tmp_path: Path) -> None:
    if command == "import":
        export = run_without_extra(["export", str(SEED), str(tmp_path / "exported")], tmp_path)
        assert export.returncode == 0, export.stderr
    args = _args(command, model, tmp_path)
    r = run_without_extra(args, tmp_path)
    assert r.returncode == 3, r.stderr
    assert r.stderr.splitlines() == [NEEDS], r.stderr
    assert r.stdout == ""
    doc = run_without_extra([*args, "--json"], tmp_path)
    assert doc.returncode == 3, doc.stderr
    error = json.loads(doc.stdout)["error"]
    assert error == {
        "code": "unsupported",
        "message": "--target needs jax, which is not installed",
        "hint": "pip install 'ckpt-orbax[orbax]'",
    }
    assert not (tmp_path / "out").exists() and not (tmp_path / "in").exists()


def test_a_migrate_function_whose_module_needs_jax_names_the_extra(tmp_path: Path) -> None:
    (tmp_path / "fns.py").write_text("import jax\n\ndef double(x):\n    return x * 2\n")
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        "rules: [{op: python, match: 'params\\.Dense_0\\.bias', function: 'fns:double'}]\n"
    )
    args = ["migrate", str(SEED), str(tmp_path / "out"), "--spec", str(spec), "--allow-python"]
    r = run_without_extra(args, tmp_path)
    assert r.returncode == 3, r.stderr
    (line,) = r.stderr.splitlines()
    assert "cannot import fns: ModuleNotFoundError: No module named 'jax'" in line
    assert line.endswith("(pip install 'ckpt-orbax[orbax]')"), line


def test_the_commands_that_need_no_extra_run_without_it(tmp_path: Path) -> None:
    for args in (
        ["ls", str(SEED)],
        ["verify", str(SEED), "--deep"],
        ["doctor", str(SEED), "--like", str(SEED)],
        [
            "migrate",
            str(SEED),
            str(tmp_path / "m"),
            "--spec",
            str(REPO / "examples" / "widen_64_to_128.yaml"),
        ],
    ):
        r = run_without_extra(args, tmp_path)
        assert r.returncode == 0, (args, r.stderr)
