"""A training state saved by Orbax from a real TPU chip (fixtures/frameworks/tpu/: one TPU v5e
device, so every array is one chunk of a ``SingleDeviceSharding`` array; ``truth.json`` holds
what the chip restored). Every command reads it cleanly, and ckpt's outputs restore with the
chip's values and train on. That the outputs restore onto the chip itself with the same next
loss is recorded in ``device_log.txt`` (``on_device.sh``, run with the ``device`` tool).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.paths import REPO

TPU = REPO / "fixtures" / "frameworks" / "tpu"
RUN = TPU / "run"
MAKE = TPU / "make.py"
TRUTH = json.loads((TPU / "truth.json").read_text())


def _restored(root: Path, command: str = "leaves", item: str = "state") -> Any:
    """What Orbax restores of step 3 into the chip-saved model's abstract state (on the CPU)."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
    out = subprocess.run(
        [sys.executable, str(MAKE), command, str(root), "3", item],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_fixture_was_saved_on_a_tpu_chip() -> None:
    assert TRUTH["platform"] == "tpu" and "TPU" in TRUTH["device"]
    log = (TPU / "device_log.txt").read_text()
    # On the chip: the original, ckpt's reshard output and ckpt's import output, one step each.
    resumed = [json.loads(line) for line in log.splitlines() if line.startswith('{"root"')]
    assert len(resumed) == 3 and {r["platform"] for r in resumed} == {"tpu"}
    assert {r["next_loss"] for r in resumed} == {TRUTH["next_loss"]}
    assert [r["root"].rsplit("/", 1)[1] for r in resumed] == ["work", "reshard", "import"]


def test_ls_inspect_verify_digest_are_clean(cli) -> None:  # type: ignore[no-untyped-def]
    ls = cli("ls", RUN, "--json").json()
    assert [s["step"] for s in ls["steps"]] == [2, 3]
    assert {s["status"] for s in ls["steps"]} == {"committed"}
    assert ls["steps"][-1]["items"] == ["state"]
    inspect = cli("inspect", RUN, "--step", "3", "--json")
    assert inspect.code == 0
    state = inspect.json()["training_state"]
    assert state["complete"] and state["missing"] == []
    leaves = {leaf["name"] for leaf in inspect.json()["leaves"]}
    assert set(TRUTH["leaves"]) <= leaves
    verify = cli("verify", RUN, "--deep", "--json")
    assert verify.code == 0, verify.stdout
    assert verify.json()["ok"] and verify.json()["problems"] == []
    digest = cli("digest", RUN, "--step", "3")
    assert digest.code == 0
    assert len(digest.stdout.splitlines()) == len(TRUTH["leaves"])


def test_a_byte_flipped_after_record_is_caught(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    assert cli("verify", run, "--record").code == 0
    assert cli("verify", run, "--deep").code == 0
    data = [p for p in (run / "3" / "state").rglob("d/*") if p.is_file()]
    assert data
    f = max(data, key=lambda p: p.stat().st_size)
    b = bytearray(f.read_bytes())
    b[len(b) // 2] ^= 1
    f.write_bytes(bytes(b))
    r = cli("verify", run, "--step", "3", "--deep", "--json")
    assert r.code == 1 and not r.json()["ok"]


@pytest.mark.slow
def test_the_fixture_restores_on_the_cpu_as_it_did_on_the_chip() -> None:
    assert _restored(RUN) == TRUTH["leaves"]


@pytest.mark.slow
def test_reshard_output_restores_with_the_chip_values_and_trains_on(  # type: ignore[no-untyped-def]
    cli, tmp_path: Path
) -> None:
    out = tmp_path / "reshard"
    r = cli(
        "reshard", RUN, out, "--mesh", "data=2,model=2", "--rule", "params.*kernel=[null, model]"
    )
    assert r.code == 0, r.stderr
    assert _restored(out) == TRUTH["leaves"]
    assert _restored(out, "resume")["next_loss"] == _restored(RUN, "resume")["next_loss"]
    like = cli("doctor", RUN, "--like", out, "--json")
    assert like.code == 0 and like.json()["verdict"] == "restores"


@pytest.mark.slow
def test_migrate_cast_keeps_every_other_leaf(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "bf16"
    r = cli("migrate", RUN, out, "--spec", TPU / "cast_bf16.yaml")
    assert r.code == 0, r.stderr
    inspect = {leaf["name"]: leaf for leaf in cli("inspect", out, "--json").json()["leaves"]}
    kernels = [n for n in TRUTH["leaves"] if n.startswith("params.") and n.endswith(".kernel")]
    assert kernels and all(inspect[n]["dtype"] == "bfloat16" for n in kernels)
    restored = _restored(out)
    for name, truth in TRUTH["leaves"].items():
        if name not in kernels:
            assert restored[name] == truth, name
    assert cli("verify", out, "--deep").code == 0


@pytest.mark.slow
def test_export_then_import_restores_under_the_item_name(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    exported, back = tmp_path / "export", tmp_path / "back"
    assert cli("export", RUN, exported, "--step", "3").code == 0
    r = cli("import", exported, back)
    assert r.code == 0, r.stderr
    # the step and the item export recorded (ckpt.step, ckpt.item), with no --step or --item
    assert [p.name for p in back.iterdir()] == ["3"]
    assert [p.name for p in (back / "3").iterdir() if p.is_dir()] == ["state"]
    assert _restored(back) == TRUTH["leaves"]
    other = tmp_path / "other"
    assert cli("import", exported, other, "--step", "7", "--item", "model").code == 0
    assert [p.name for p in other.iterdir()] == ["7"]
    assert (other / "7" / "model" / "_METADATA").is_file()
