"""Export and import through the library, and an export read back by the ``safetensors`` library."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import safetensors

from ckpt_cli.core.safetensors import find_files
from ckpt_cli.core.safetensors import import_ as importing
from ckpt_cli.core.safetensors.export import plan_export
from ckpt_cli.core.safetensors.export_run import execute as execute_export
from ckpt_cli.core.safetensors.import_run import execute as execute_import


def export(src: Path | str, out: Path, **kw: Any) -> Any:
    return execute_export(plan_export(str(src), str(out), **kw))


def load_dir(out: Path) -> tuple[dict[str, Any], dict[str, str] | None]:
    """Every tensor of an export as the library loads it (raw bytes as uint8 for float8)."""
    found = find_files(str(out))
    tensors: dict[str, Any] = {}
    metadata = None
    assert found.files
    for name in found.files:
        raw = {k: v for k, v in safetensors.deserialize((out / name).read_bytes())}
        with safetensors.safe_open(str(out / name), framework="np") as f:
            metadata = f.metadata()
            for k in f.keys():  # noqa: SIM118
                if f.get_slice(k).get_dtype().startswith("F8"):
                    tensors[k] = np.frombuffer(bytes(raw[k]["data"]), np.uint8)
                else:
                    tensors[k] = f.get_tensor(k)
                    assert tensors[k].tobytes() == bytes(raw[k]["data"])
    return tensors, metadata


def import_(src: Path, dst: Path, **kw: Any) -> Any:
    return execute_import(importing.plan_import(str(src), str(dst), **kw))
