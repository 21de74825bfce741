"""``ckpt du``: where a checkpoint's bytes go, and which of them nothing reads."""

from ckpt_cli.core.du.run import disk_usage
from ckpt_cli.core.du.types import (
    DuJSON,
    Duplicate,
    DuReport,
    Garbage,
    ItemUsage,
    LeafUsage,
    StepUsage,
)

__all__ = [
    "DuJSON",
    "DuReport",
    "Duplicate",
    "Garbage",
    "ItemUsage",
    "LeafUsage",
    "StepUsage",
    "disk_usage",
]
