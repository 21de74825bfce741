"""The wheel runs alone: built from the working tree as a release is, installed by itself in a new
venv (no extras, no checkout in reach), every read command runs on the fixtures with the exit code
it documents; then with each extra installed, the read commands still import no JAX and
``--executor dask`` runs on a local Dask cluster. The sdist and the wheel pass
``twine check --strict``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

from ckpt_cli._version import ISSUES, __version__
from tests.support.paths import FIXTURES
from tests.support.startup_probe import PROBE
from tests.support.wheel import DIST_NAME, Dists, WheelVenv

#: Builds the wheel and installs it in new venvs (pip): in `make test` and CI, not `make check`.
pytestmark = pytest.mark.slow

SEED = FIXTURES / "seed_mlp"
DAMAGED = FIXTURES.parent / "damaged" / "flipped-byte"  # recorded digests, one byte flipped

#: Every read command, with the exit code it gives on these fixtures.
READS: list[tuple[list[str], int]] = [
    (["ls", str(SEED)], 0),
    (["ls", str(SEED), "--json"], 0),
    (["inspect", str(SEED)], 0),
    (["inspect", str(FIXTURES / "sharded_4x2"), "--stats", "--flat"], 0),
    (["verify", str(SEED)], 0),
    (["verify", str(SEED), "--deep", "--json"], 0),
    (["verify", str(DAMAGED), "--deep"], 1),
    (["diff", f"{SEED}@400", f"{SEED}@500"], 1),
    (["diff", str(SEED), str(SEED), "--json"], 0),
    (["digest", str(SEED), "--json"], 0),
    (["du", str(SEED), "--by", "leaf"], 0),
    (["du", str(FIXTURES / "with_tmp"), "--json"], 0),
]


def _ids(cases: list[tuple[list[str], int]]) -> list[str]:
    return [" ".join(a if "/" not in a else Path(a).name for a in args) for args, _ in cases]


def _metadata(wheel: Path) -> dict[str, list[str]]:
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        message = Parser().parsestr(z.read(name).decode())
    fields: dict[str, list[str]] = {}
    for key, value in message.items():
        fields.setdefault(key, []).append(value)
    return fields


def test_the_sdist_and_the_wheel_pass_twine_check_strict(dists: Dists) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", str(dists.sdist), str(dists.wheel)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("PASSED") == 2, r.stdout


def test_the_wheel_carries_the_name_version_and_urls_of_the_project(dists: Dists) -> None:
    py = f"cp{sys.version_info.major}{sys.version_info.minor}"
    assert dists.wheel.name.startswith(f"ckpt_orbax-{__version__}-{py}-{py}-"), dists.wheel.name
    assert dists.sdist.name == f"ckpt_orbax-{__version__}.tar.gz"
    meta = _metadata(dists.wheel)
    assert meta["Name"] == [DIST_NAME] and meta["Version"] == [__version__]
    assert f"Issues, {ISSUES}" in meta["Project-URL"]
    assert {"orbax", "dask"} <= set(meta["Provides-Extra"])
    required = {r.split(";")[0].split(">")[0].split("<")[0].strip() for r in meta["Requires-Dist"]}
    assert {"typing-extensions", "isal"} <= required
    with zipfile.ZipFile(dists.wheel) as z:
        entry = z.read(f"ckpt_orbax-{__version__}.dist-info/entry_points.txt").decode()
    assert "ckpt = ckpt_cli.app:main" in entry


def test_the_wheel_carries_the_compiled_kernel_and_the_sdist_its_source(
    dists: Dists, wheel_venv: WheelVenv, tmp_path: Path
) -> None:
    with zipfile.ZipFile(dists.wheel) as z:
        kernels = [n for n in z.namelist() if n.startswith("ckpt_cli/_kernels.")]
    assert [n for n in kernels if n.endswith(".so")], kernels
    with tarfile.open(dists.sdist) as t:
        assert f"ckpt_orbax-{__version__}/ckpt_cli/_kernels.c" in t.getnames()
    code = "from ckpt_cli.core.digest import ld1_kernel; print(ld1_kernel.available())"
    r = wheel_venv.run("python", "-c", code, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == "True", r.stdout + r.stderr


def test_without_a_compiler_the_wheel_still_builds_without_the_kernel(
    dists: Dists, tmp_path: Path
) -> None:
    env = {**os.environ, "CC": "false", "LDSHARED": "false"}
    r = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(dists.sdist)],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    (wheel,) = tmp_path.glob("ckpt_orbax-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    assert "ckpt_cli/core/digest/ld1_kernel.py" in names
    assert not [n for n in names if n.startswith("ckpt_cli/_kernels.") and n.endswith(".so")]


def test_the_wheel_alone_brings_no_extra_and_no_checkout(
    wheel_venv: WheelVenv, tmp_path: Path
) -> None:
    code = (
        "import importlib.util as u, json, ckpt_cli; print(json.dumps([ckpt_cli.__file__, "
        "[m for m in ('jax', 'orbax', 'flax', 'distributed') if u.find_spec(m)]]))"
    )
    r = wheel_venv.run("python", "-c", code, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    where, found = json.loads(r.stdout)
    assert Path(where).is_relative_to(wheel_venv.root), where
    assert found == []


def test_ckpt_version_from_the_wheel(wheel_venv: WheelVenv, tmp_path: Path) -> None:
    r = wheel_venv.run("ckpt", "--version", cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == f"ckpt {__version__}", r.stderr


@pytest.mark.parametrize(("args", "code"), READS, ids=_ids(READS))
def test_every_read_command_runs_from_the_wheel_alone(
    wheel_venv: WheelVenv, tmp_path: Path, args: list[str], code: int
) -> None:
    r = wheel_venv.run("ckpt", *args, cwd=tmp_path)
    assert r.returncode == code, r.stderr
    assert r.stdout and "Traceback" not in r.stderr and "internal error" not in r.stderr
    if "--json" in args:
        assert "schema_version" in json.loads(r.stdout)


def test_export_runs_from_the_wheel_alone(wheel_venv: WheelVenv, tmp_path: Path) -> None:
    r = wheel_venv.run("ckpt", "export", SEED, tmp_path / "pt", "--params-only", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "pt" / "model.safetensors").stat().st_size > 0


def test_the_dask_executor_without_its_extra_names_the_extra(
    wheel_venv: WheelVenv, tmp_path: Path
) -> None:
    r = wheel_venv.run(
        "ckpt", "verify", SEED, "--deep", "--executor", "dask", "--scheduler", "tcp://127.0.0.1:9",
        cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 3, r.stderr
    assert "pip install 'ckpt-orbax[dask]'" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize(("args", "code"), READS, ids=_ids(READS))
def test_read_commands_import_no_jax_with_the_orbax_extra_installed(
    extras_venv: WheelVenv, tmp_path: Path, args: list[str], code: int
) -> None:
    r = extras_venv.run("python", "-c", PROBE, json.dumps(args), cwd=tmp_path)
    lines = dict(line.split("=", 1) for line in r.stderr.splitlines() if "=" in line[:6])
    assert json.loads(lines["HEAVY"]) == [] and int(lines["EXIT"]) == code, r.stderr


#: Runs ``ckpt ARGS --scheduler ADDRESS`` against a one-worker Dask cluster on 127.0.0.1.
ON_A_CLUSTER = """
import subprocess, sys
from distributed import LocalCluster
with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1",
                  dashboard_address="127.0.0.1:0", worker_dashboard_address=None) as cluster:
    r = subprocess.run(["ckpt", *sys.argv[1:], "--scheduler", cluster.scheduler_address])
sys.exit(r.returncode)
"""


def test_verify_runs_on_dask_from_the_wheel_with_the_dask_extra(
    extras_venv: WheelVenv, tmp_path: Path
) -> None:
    args = ["verify", str(SEED), "--deep", "--executor", "dask", "--force-split", "--json"]
    r = extras_venv.run("python", "-c", ON_A_CLUSTER, *args, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    assert doc["ok"] is True and doc["scale"]["split"] is True, doc.get("scale")
