"""What an import's expressions read: a tensor of a safetensors file as a node of the rule
language (``TensorSource``: any region read with positioned reads), and the files an import
holds open (``ImportContext``: one descriptor each)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ckpt_cli.core.safetensors.reader import SafetensorsReader
from ckpt_cli.core.spec import ops


@dataclass(frozen=True, eq=False)
class TensorSource(ops.Node):
    """A tensor of a safetensors file: any region is read with positioned reads."""

    fresh = True  # each region read into a new array (``SafetensorsReader.read_box``)
    path: str
    tensor: str

    def fetch(self, region: ops.Region, ctx: ops.EvalContext) -> Any:
        assert isinstance(ctx, ImportContext)
        return ctx.file(self.path).read_box(self.tensor, region)


class ImportContext(ops.EvalContext):
    """The open files of an import (one descriptor each) for the expressions that read them."""

    def __init__(self) -> None:
        super().__init__(store=None, functions={})  # type: ignore[arg-type]
        self.files: dict[str, SafetensorsReader] = {}

    def file(self, path: str) -> SafetensorsReader:
        if path not in self.files:
            self.files[path] = SafetensorsReader.open(path)
        return self.files[path]

    def close(self) -> None:
        for r in self.files.values():
            r.close()
        self.files.clear()
