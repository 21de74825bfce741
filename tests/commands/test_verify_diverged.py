"""``verify --deep`` on a run that diverged (``fixtures/diverged/``, real Orbax saves: every
parameter and Adam moment all-NaN from step 5): every problem carries its step, the text says
one block per leaf across steps and the run's verdict (first step with NaN/Inf, last without),
the record counts each leaf's NaN/Inf; a clean save's dead weight is named, never a problem."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from tests.support.paths import REPO

LINEN = REPO / "fixtures" / "diverged" / "linen"
TRUTH: dict[str, Any] = json.loads((REPO / "fixtures" / "diverged" / "truth.json").read_text())


def test_every_problem_carries_its_step_and_the_verdict_names_the_steps(cli) -> None:  # type: ignore[no-untyped-def]
    r = cli("verify", LINEN, "--deep", "--json")
    assert r.code == 0, r.stdout
    doc = r.json()
    problems = doc["problems"]
    assert problems and all(p["code"] == "nonfinite" for p in problems)
    assert sorted({p["step"] for p in problems}) == [5, 6, 7, 8]
    assert all(n["step"] in (5, 6, 7, 8) for n in doc["nonfinite"])
    truth = TRUTH["linen"]
    d = doc["divergence"]
    assert (d["first_nonfinite_step"], d["last_finite_step"]) == (
        truth["first_nonfinite_step"],
        truth["last_finite_step"],
    )
    assert sorted(d["leaves"]) == sorted(n.split("/", 1)[1] for n in truth["nonfinite_at_first"])
    assert d["nonfinite_steps"] == [5, 6, 7, 8]


def test_the_text_is_one_block_per_leaf_and_ends_with_the_verdict(cli) -> None:  # type: ignore[no-untyped-def]
    r = cli("verify", LINEN, "--deep")
    assert r.code == 0
    leaves = len(TRUTH["linen"]["nonfinite_at_first"])
    assert r.stdout.count("warning  nonfinite") == leaves == 12
    assert "NaN/Inf at steps 5, 6, 7, 8" in r.stdout
    assert "diverged: NaN/Inf from step 5 on" in r.stdout and "last step without: 4" in r.stdout
    last = r.stdout.strip().splitlines()[-1]
    assert last.startswith("OK (bytes intact; values NaN/Inf from step 5)"), last
    assert cli("verify", LINEN, "--deep", "--fail-on-nonfinite").code == 1


def test_the_record_counts_each_leafs_nan_and_inf(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    root = shutil.copytree(LINEN, tmp_path / "linen")
    assert cli("verify", root, "--record").code == 0
    for step, want in ((4, 0), (6, 32)):
        record = json.loads((root / str(step) / "state" / "_CKPT_DIGESTS.json").read_text())
        assert record["leaves"]["params.hidden.kernel"]["nonfinite"] == want
    assert cli("verify", root, "--deep").code == 0  # the record still reads and checks


def test_a_clean_saves_unreferenced_files_are_named_never_a_problem(cli) -> None:  # type: ignore[no-untyped-def]
    scalars = REPO / "fixtures" / "matrix" / "v1-0.12.8" / "scalars" / "ckpt"
    r = cli("verify", scalars, "--json")
    assert r.code == 0
    doc = r.json()
    assert doc["problems"] == []
    unreferenced = doc["checked"]["unreferenced_files"]
    assert unreferenced and all("ocdbt.process_0/d/" in f for f in unreferenced)
