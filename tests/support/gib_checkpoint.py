"""A 1 GiB checkpoint saved by real Orbax, for the time-boxed verify tests and bench.

Saved in a subprocess (8 forced CPU devices, so every leaf is sharded into 8 chunks of 8 MiB),
with values that do not compress (uniform float32): the data files hold the full GiB and every
chunk costs a real decode. Built once per test session; ``--record`` digests are added by the
tests that need them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

LEAVES = 16
ROWS, COLS = 8192, 2048  # float32: 64 MiB per leaf, 16 leaves = 1 GiB

_SCRIPT = """
import sys
import jax, numpy as np, orbax.checkpoint as ocp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
leaves, rows, cols = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
mesh = Mesh(np.array(jax.devices()).reshape(8), ("data",))
sharding = NamedSharding(mesh, P("data", None))
rng = np.random.default_rng(17)
state = {}
for i in range(leaves):
    host = rng.random((rows, cols), dtype=np.float32)
    state[f"layer_{i:02d}"] = jax.device_put(host, sharding)
    del host
opts = ocp.CheckpointManagerOptions(enable_async_checkpointing=False)
with ocp.CheckpointManager(sys.argv[1], options=opts) as mgr:
    mgr.save(1, args=ocp.args.StandardSave({"params": state}))
"""


def make_big(root: Path, leaves: int = LEAVES, rows: int = ROWS, cols: int = COLS) -> Path:
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(root), str(leaves), str(rows), str(cols)],
        check=True,
        env=env,
        timeout=600,
    )
    return root
