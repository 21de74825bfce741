"""A real async Orbax trainer for the fault suite: saves a step every INTERVAL ms.

``python tests/support/trainer.py ROOT STEPS INTERVAL_MS`` saves steps 1..STEPS with
``CheckpointManager(enable_async_checkpointing=True)`` (no retention of its own: prune is the
only deleter), printing ``saved N`` as each save is handed to Orbax and, at the end,
``steps [..]``: what Orbax lists once every save has finished. Before that listing it writes
``ROOT.saved`` and waits for ``ROOT.go``: Orbax's listing stats each step directory it found and
fails if one is deleted in between, so the test stops pruning before the trainer lists.
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")


def main() -> None:
    import jax.numpy as jnp
    import numpy as np
    import orbax.checkpoint as ocp

    root, steps, interval = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]) / 1000
    rng = np.random.default_rng(0)
    params = {
        "w": jnp.asarray(rng.standard_normal((256, 256), dtype=np.float32)),
        "b": jnp.zeros((256,), jnp.float32),
    }
    options = ocp.CheckpointManagerOptions(enable_async_checkpointing=True, max_to_keep=None)
    with ocp.CheckpointManager(os.path.abspath(root), options=options) as mgr:
        for step in range(1, steps + 1):
            params = {"w": params["w"] * 0.999, "b": params["b"] + 1}
            mgr.save(step, args=ocp.args.StandardSave({"params": params, "step": step}))
            print(f"saved {step}", flush=True)
            time.sleep(interval)
        mgr.wait_until_finished()
        with open(root + ".saved", "w"):
            pass
        deadline = time.monotonic() + 300
        while not os.path.exists(root + ".go") and time.monotonic() < deadline:
            time.sleep(0.05)
        mgr.reload()
        print("steps " + json.dumps(sorted(mgr.all_steps())), flush=True)


if __name__ == "__main__":
    main()
