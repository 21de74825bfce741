"""Keras's own loaders in one process per test worker (``keras_server.py``), and the Keras
fixtures with their truth (``fixtures/frameworks/keras/``: what Keras restored from them)."""

from __future__ import annotations

import functools
import importlib.util
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.orbax_restorer import OrbaxRestorer
from tests.support.paths import REPO

SERVER = Path(__file__).with_name("keras_server.py")
KERAS_FIXTURES = REPO / "fixtures" / "frameworks" / "keras"


@functools.cache
def keras_truth() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((KERAS_FIXTURES / "truth.json").read_text())
    return doc


class KerasLoader(OrbaxRestorer):
    """A running ``keras_server.py``: loads the latest step of a root as a Keras user does."""

    def __init__(self, devices: int = 8) -> None:
        flags = f"--xla_force_host_platform_device_count={devices}"
        super().__init__(SERVER, env={**os.environ, "XLA_FLAGS": flags})

    def load(self, root: Path, model_json: str | None = None) -> dict[str, Any]:
        """``keras.saving.load_model(root)``, or ``model_from_json(model_json).load_weights``;
        raises with Keras's first line."""
        if model_json is None:
            out = self.ask(op="load_model", root=str(root))
        else:
            out = self.ask(op="load_weights", root=str(root), model_json=model_json)
        if not out["ok"]:
            raise AssertionError(f"Keras cannot load {root}: {out['error']}")
        return out


@pytest.fixture(scope="session")
def keras_loader() -> Iterator[KerasLoader]:
    # Found, not imported: Keras imports JAX, which stays out of the test process.
    if importlib.util.find_spec("keras") is None:
        pytest.skip("Keras 3 is not installed (it is in the dev extra)")
    loader = KerasLoader()
    try:
        yield loader
    finally:
        loader.close()
