"""Writers of values refuse NaN/Inf (a run that diverged) with one line, exit 3 and nothing
written, unless ``--allow-nonfinite``: on the real Orbax saves of a diverging run
(``fixtures/diverged/``: every parameter and Adam moment all-NaN from step 5)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.support.paths import REPO

LINEN = REPO / "fixtures" / "diverged" / "linen"
CAST = REPO / "fixtures" / "frameworks" / "tpu" / "cast_bf16.yaml"


def _writes(kind: str, out: Path, step: int) -> list[str]:
    return {
        "average": ["average", LINEN, out, "--steps", f"{step - 1},{step}"],
        "export": ["export", LINEN, out, "--step", str(step)],
        "migrate": ["migrate", LINEN, out, "--step", str(step), "--spec", CAST],
        "reshard": ["reshard", LINEN, out, "--step", str(step), "--mesh", "data=1"],
        "reshard --workers": [
            "reshard",
            LINEN,
            out,
            "--step",
            str(step),
            "--mesh",
            "data=1",
            "--workers",
            "2",
            "--force-split",
            "--unit-bytes",
            "4KiB",
        ],
    }[kind]


KINDS = ["average", "export", "migrate", "reshard", "reshard --workers"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_writer_refuses_a_step_holding_nan(cli, tmp_path: Path, kind: str) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "out"
    r = cli(*_writes(kind, out, 6))
    assert r.code == 3, (kind, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "holds NaN/Inf" in lines[0] and "--allow-nonfinite" in lines[0]
    assert "Traceback" not in r.stderr
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name != "out"], "no leftover beside it"


@pytest.mark.parametrize("kind", KINDS)
def test_a_writer_writes_a_finite_step(cli, tmp_path: Path, kind: str) -> None:  # type: ignore[no-untyped-def]
    r = cli(*_writes(kind, tmp_path / "out", 4))
    assert r.code == 0, (kind, r.stderr)


def test_allow_nonfinite_writes_the_values_as_they_are(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import safetensors.numpy

    out = tmp_path / "hf"
    r = cli("export", LINEN, out, "--step", "6", "--allow-nonfinite")
    assert r.code == 0, r.stderr
    tensors = safetensors.numpy.load_file(out / "model.safetensors")
    assert tensors and np.isnan(tensors["params.hidden.kernel"]).all()
    back = cli("import", out, tmp_path / "back")
    assert back.code == 3 and "holds NaN/Inf" in back.stderr
    assert not (tmp_path / "back").exists()
    again = cli("import", out, tmp_path / "back", "--allow-nonfinite")
    assert again.code == 0, again.stderr
