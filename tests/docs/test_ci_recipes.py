"""docs/how-to/ci.md's recipes, run as written: the commands of each fenced block on a real
checkpoint and on a damaged one, through bash, in a venv holding the wheel built from the working
tree alone. A recipe's ``pip install ckpt-orbax`` installs that wheel (its path in place of the
name, never the package index); a ``pip install`` of anything else fails."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from ckpt_cli.core.prune.execute import prune_lock
from ckpt_cli.core.storage import LocalLocation
from tests.support.paths import FIXTURES, REPO
from tests.support.prune_roots import copy_steps
from tests.support.schemas import validator
from tests.support.wheel import WheelVenv, install_from

PAGE = REPO / "docs" / "how-to" / "ci.md"
#: A recipe: the shell commands of one fenced block of the page.
Recipe = Callable[[], list[str]]
DAMAGED = FIXTURES.parent / "damaged" / "flipped-byte"  # recorded digests, one byte flipped


def _blocks(lang: str) -> list[str]:
    found = re.findall(rf"```{lang}\n(.*?)```", PAGE.read_text(), re.S)
    assert found, f"no {lang} block in {PAGE.name}"
    return found


def _shell(lines: list[str]) -> list[str]:
    cmds = [line.strip() for line in lines if line.strip()]
    assert cmds and all("ckpt " in c or "pip install " in c for c in cmds), cmds
    return cmds


def github() -> list[str]:
    steps = yaml.safe_load(_blocks("yaml")[0])
    return _shell([line for s in steps if "run" in s for line in s["run"].splitlines()])


def gitlab() -> list[str]:
    jobs = yaml.safe_load(_blocks("yaml")[1])
    return _shell([line for job in jobs.values() for line in job["script"]])


def cron() -> list[str]:
    lines = [
        line.split(None, 5)[5]
        for line in _blocks("cron")[0].splitlines()
        if line.strip() and not line.startswith("#") and not re.match(r"^\w+=", line)
    ]
    return _shell(lines)


def run(cmds: list[str], root: Path, cwd: Path, venv: WheelVenv) -> int:
    """Runs ``cmds`` in ``venv`` until one fails; a ``pip install`` installs the built wheel."""
    env = venv.env({"CKPT_ROOT": str(root)})
    code = 0
    for cmd in cmds:
        if "pip install " in cmd:
            cmd = install_from(cmd, venv.wheel)
        code = subprocess.run(["bash", "-c", cmd], cwd=cwd, env=env, timeout=300).returncode
        if code:
            break
    return code


def _junit(path: Path) -> tuple[int, int]:
    suites = ET.parse(path).getroot()
    return int(suites.get("tests", "0")), int(suites.get("failures", "0"))


@pytest.mark.slow  # in a venv of the built wheel
@pytest.mark.parametrize("recipe", [github, gitlab], ids=["github", "gitlab"])
def test_verify_recipe_passes_a_good_checkpoint(
    recipe: Recipe, tmp_path: Path, wheel_venv: WheelVenv
) -> None:
    root = Path(shutil.copytree(FIXTURES / "seed_mlp", tmp_path / "run"))
    assert run(recipe(), root, tmp_path, wheel_venv) == 0
    tests, failures = _junit(tmp_path / "ckpt-verify.xml")
    assert tests > 1 and failures == 0
    doc = json.loads((tmp_path / "ckpt-verify.json").read_text())
    assert validator("verify").is_valid(doc) and doc["ok"] is True
    assert doc["checked"]["coverage"]["complete"] is True


@pytest.mark.slow  # in a venv of the built wheel
@pytest.mark.parametrize("recipe", [github, gitlab], ids=["github", "gitlab"])
def test_verify_recipe_fails_a_damaged_checkpoint(
    recipe: Recipe, tmp_path: Path, wheel_venv: WheelVenv
) -> None:
    root = Path(shutil.copytree(DAMAGED, tmp_path / "run"))
    assert run(recipe(), root, tmp_path, wheel_venv) == 1
    _, failures = _junit(tmp_path / "ckpt-verify.xml")
    assert failures >= 1
    doc = json.loads((tmp_path / "ckpt-verify.json").read_text())
    assert validator("verify").is_valid(doc) and doc["ok"] is False
    assert {"digest-mismatch", "datafile-checksum-mismatch"} & {p["code"] for p in doc["problems"]}


@pytest.mark.slow  # in a venv of the built wheel
def test_gitlab_recipe_rotates(tmp_path: Path, wheel_venv: WheelVenv) -> None:
    root = Path(shutil.copytree(FIXTURES / "seed_mlp", tmp_path / "run"))
    assert run(gitlab(), root, tmp_path, wheel_venv) == 0
    doc = json.loads((tmp_path / "ckpt-verify.json").read_text())
    assert doc["checked"]["rotation"]["cycle_complete"] is True
    assert (root / "500" / "default" / "_CKPT_VERIFY_STATE.json").is_file()


@pytest.mark.slow  # in a venv of the built wheel
def test_cron_prune_logs_one_json_line_per_run(tmp_path: Path, wheel_venv: WheelVenv) -> None:
    root = copy_steps(tmp_path / "run", range(1, 7))
    assert run(cron(), root, tmp_path, wheel_venv) == 0
    assert sorted(p.name for p in root.iterdir() if not p.name.startswith(".")) == ["4", "5", "6"]
    with prune_lock(LocalLocation(str(root))):
        assert run(cron(), root, tmp_path, wheel_venv) == 3
    lines = (tmp_path / "ckpt-prune.jsonl").read_text().splitlines()
    assert len(lines) == 2
    first, second = (json.loads(line) for line in lines)
    for doc in (first, second):
        assert validator("prune").is_valid(doc)
    assert first["ok"] is True and [d["step"] for d in first["delete"]] == [1, 2, 3]
    assert second["ok"] is False and second["error"]["code"] == "locked"
    alert = subprocess.run(
        ["bash", "-c", "jq -c 'select(.ok == false) | .error' ckpt-prune.jsonl"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    if alert.returncode == 0:  # jq is optional on a test machine; the filter is the page's
        assert json.loads(alert.stdout)["code"] == "locked"


@pytest.mark.parametrize("recipe", [github, gitlab], ids=["github", "gitlab"])
def test_verify_recipes_install_this_project_first(recipe: Recipe) -> None:
    assert recipe()[0] == "pip install ckpt-orbax"


def test_a_recipe_installs_the_built_wheel_and_nothing_else() -> None:
    wheel = Path("/w/ckpt_orbax-1-py3-none-any.whl")
    assert install_from("pip install 'ckpt-orbax[dask]'", wheel) == f"pip install '{wheel}[dask]'"
    assert install_from("- pip install ckpt-orbax", wheel) == f"- pip install {wheel}"
    for line in ("pip install ckpt-cli", "pip install ckpt-orbax ckpt", "pip install ."):
        with pytest.raises(AssertionError):
            install_from(line, wheel)
