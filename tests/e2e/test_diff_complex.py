"""``diff`` of complex leaves saved by the installed Orbax: the imaginary parts count.

Two steps whose complex64 leaf differs only in its imaginary part were reported equal (values
were compared as float64, which drops the imaginary part).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ckpt_cli.core.diff.items import diff_paths

pytestmark = pytest.mark.slow


def _save(root: Path, steps: dict[int, dict[str, np.ndarray]]) -> None:
    import jax.numpy as jnp
    import orbax.checkpoint as ocp

    mgr = ocp.CheckpointManager(str(root))
    for step, tree in steps.items():
        mgr.save(step, args=ocp.args.StandardSave({k: jnp.asarray(v) for k, v in tree.items()}))
    mgr.wait_until_finished()
    mgr.close()


def test_imaginary_parts_count(tmp_path: Path) -> None:
    z = np.array([1 + 2j, -3 + 0.5j, 0 - 1j], dtype=np.complex64)
    w = z.real + 1j * (z.imag + np.array([0, 0.25, 0], dtype=np.float32))
    root = tmp_path / "run"
    _save(root, {1: {"z": z, "same": z}, 2: {"z": w.astype(np.complex64), "same": z}})
    report = diff_paths(str(root), str(root), step_a=1, step_b=2)
    by = {d.name: d for d in report.leaves}
    assert by["same"].status == "equal"
    d = by["z"]
    assert (d.status, d.mismatched, d.elements) == ("different", 1, 3)
    assert d.max_abs == pytest.approx(0.25)
    assert diff_paths(str(root), str(root), step_a=1, step_b=2, atol=0.3).equal
