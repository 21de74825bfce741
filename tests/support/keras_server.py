"""Load checkpoints with Keras's own loaders (Keras 3, JAX backend), many per process: a line
server like ``orbax_server.py``.

    python tests/support/keras_server.py      # reads one JSON request per line on stdin

Requests: ``{"op": "load_model", "root": R}`` is ``keras.saving.load_model(R)`` (the model
rebuilt from the ``model_config`` item of R's latest step); ``{"op": "load_weights", "root": R,
"model_json": J}`` is ``keras.models.model_from_json(J).load_weights(R)``. Both load the latest
step of a root, as Keras does. The answer holds ``read``: every leaf of the ``pytree`` item as
Keras's loader reads it (``ocp.load_checkpointables(step, {"pytree": None})``: keypath, dtype,
shape, sha256 of the C-order bytes, values), ``state``: ``model.get_state_tree()`` after the
load, and ``prediction``: the model on the seeded probe input of the fixtures' truth.
"""

from __future__ import annotations

import os
import sys

os.environ["KERAS_BACKEND"] = "jax"
# 8 CPU devices unless the caller says otherwise (a machine with one device, for a checkpoint
# saved on 8).
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import hashlib
import logging
import warnings
from pathlib import Path
from typing import Any

logging.disable(logging.WARNING)
warnings.simplefilter("ignore")  # "Sharding info not provided": Keras restores without a target

import jax  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402
from keras.src.saving.orbax_util import find_latest_orbax_checkpoint  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.support.line_server import serve  # noqa: E402


def describe(tree: Any) -> list[dict[str, Any]]:
    out = []
    for path, value in jax.tree_util.tree_flatten_with_path(tree)[0]:
        a = np.array(np.asarray(value), order="C", copy=True)
        out.append(
            {
                "keypath": [p.key for p in path],
                "dtype": a.dtype.name,
                "shape": list(a.shape),
                "sha256": hashlib.sha256(a.tobytes()).hexdigest(),
                "values": a.astype(np.float64).ravel().tolist(),
            }
        )
    return sorted(out, key=lambda leaf: leaf["keypath"])


def answer(request: dict[str, Any]) -> dict[str, Any]:
    root = str(Path(request["root"]).resolve())
    # A fresh session: Keras names seed-generator variables by a per-process counter, and a
    # second model in one session would not find the saved seed_generator_state by its path.
    keras.backend.clear_session()
    if request["op"] == "load_model":
        model = keras.saving.load_model(root)
    else:
        model = keras.models.model_from_json(request["model_json"])
        model.load_weights(root)
    step = find_latest_orbax_checkpoint(root)
    read = ocp.v1.load_checkpointables(step, {"pytree": None})["pytree"]
    probe = np.random.RandomState(request.get("probe_seed", 7)).randn(4, 8).astype("float32")
    return {
        "step": Path(step).name,
        "read": describe(read),
        "state": describe(model.get_state_tree()),
        "prediction": np.asarray(model.predict(probe, verbose=0), np.float32).tolist(),
    }


if __name__ == "__main__":
    sys.exit(serve(answer, {"keras": keras.__version__}))
