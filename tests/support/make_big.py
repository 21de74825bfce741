"""Save the large checkpoint the signal tests interrupt, with the installed Orbax.

``python tests/support/make_big.py ROOT MIB``: a CheckpointManager root with steps 1 and 2 of a
flax-style training state (``state`` item): ``params.embed`` holds MIB MiB of float32 (one
chunk: a single-device save, as a small job writes it), small Dense kernels and biases, Adam
moments of the small leaves, ``step`` and an RNG key. Step 2 changes a few rows of the embedding,
so ``diff ROOT@1 ROOT@2`` has something to report. Random values: zstd cannot shrink them, so
reading takes as long as the size says.
"""

from __future__ import annotations

import os
import sys

import jax
import numpy as np
import orbax.checkpoint as ocp


def state(step: int, embed: np.ndarray) -> dict[str, object]:
    rng = np.random.default_rng(step)
    small = {
        "Dense_0": {"kernel": rng.standard_normal((64, 128), dtype=np.float32)},
        "Dense_0_bias": rng.standard_normal((128,), dtype=np.float32),
    }
    return {
        "params": {"embed": jax.device_put(embed), **small},
        "opt_state": {"0": {"mu": small, "nu": small, "count": np.int32(step)}},
        "step": np.int64(step),
        "rng": np.asarray(jax.random.key_data(jax.random.PRNGKey(step))),
    }


def main() -> None:
    root, mib = os.path.abspath(sys.argv[1]), int(sys.argv[2])  # Orbax wants an absolute path
    rows = mib * (1 << 20) // (4 * 1024)
    embed = np.random.default_rng(0).standard_normal((rows, 1024), dtype=np.float32)
    options = ocp.CheckpointManagerOptions(max_to_keep=None, create=True)
    with ocp.CheckpointManager(root, options=options) as mngr:
        for step in (1, 2):
            if step == 2:
                embed[:4] += 1.0
            mngr.save(
                step,
                args=ocp.args.Composite(state=ocp.args.StandardSave(state(step, embed))),
                metrics={"loss": 1.0 / step},
            )
            mngr.wait_until_finished()


if __name__ == "__main__":
    main()
