"""The Dask worker plugin that imports ``workers.WORKER_PRELOAD`` on every worker as the client
connects (and on any worker that joins later), so that no task pays for the imports.

Apart from ``executor`` because it subclasses ``distributed.WorkerPlugin``: imported only when
``--executor dask`` is used.
"""

from __future__ import annotations

import importlib
from typing import Any

from distributed import WorkerPlugin


class Preload(WorkerPlugin):  # type: ignore[misc]
    """Imports ``modules`` in the worker's ``setup``."""

    name = "ckpt-preload"

    def __init__(self, modules: tuple[str, ...]) -> None:
        self.modules = modules

    def setup(self, worker: Any) -> None:
        for name in self.modules:
            importlib.import_module(name)


def register(client: Any, modules: tuple[str, ...]) -> None:
    """Register the plugin with ``client``'s cluster (returns once the workers ran it)."""
    client.register_plugin(Preload(modules), name=Preload.name)
