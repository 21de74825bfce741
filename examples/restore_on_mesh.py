"""Restore the latest step of a root on 8 CPU devices with the shardings recorded in it.

Shows where each array landed (its NamedSharding and the shape of one device's shard), which is
what a job on the new mesh sees after ``ckpt reshard``.

    python examples/restore_on_mesh.py demo_runs/exp7-4x2
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax
import orbax.checkpoint as ocp


def main() -> None:
    root = os.path.abspath(sys.argv[1])
    mgr = ocp.CheckpointManager(root, item_handlers=ocp.StandardCheckpointHandler())
    step = mgr.latest_step()
    state = mgr.restore(step)  # no target: Orbax uses the recorded _sharding
    print(f"restored step {step} of {root} on {jax.device_count()} devices")
    for path, value in jax.tree_util.tree_flatten_with_path(state)[0]:
        name = jax.tree_util.keystr(path)
        sharding = getattr(value, "sharding", None)
        if hasattr(sharding, "spec"):
            shard = value.addressable_shards[0].data.shape
            print(
                f"  {name:<42} {value.dtype}{list(value.shape)} {sharding.spec} shard {list(shard)}"
            )
        else:
            print(f"  {name:<42} {type(value).__name__}")


if __name__ == "__main__":
    main()
