"""Run ``ckpt`` as if some packages were not installed: ``python tests/support/without_modules.py
jax,flax,orbax -- ARGS...``. Each named top-level module (and its submodules) fails to import
with the ``ModuleNotFoundError`` a missing package gives (``No module named 'jax'``), from a
finder placed first on ``sys.meta_path`` before ckpt starts."""

from __future__ import annotations

import importlib.abc
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType


class Missing(importlib.abc.MetaPathFinder):
    def __init__(self, names: set[str]) -> None:
        self.names = names

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname.split(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return None


def main() -> None:
    sep = sys.argv.index("--")
    names = set(sys.argv[1].split(","))
    for loaded in [m for m in sys.modules if m.split(".")[0] in names]:
        del sys.modules[loaded]
    sys.meta_path.insert(0, Missing(names))
    sys.argv = ["ckpt", *sys.argv[sep + 1 :]]
    from ckpt_cli.app import main as ckpt

    ckpt()


if __name__ == "__main__":
    main()
