"""Benchmark the save-time ``ld1`` digests: an Orbax save's wall time with and without
``ckpt_cli.orbax.DigestingCheckpointManager``, measured in the same run.

Run from the repository root::

    .venv/bin/python bench/bench_savetime.py              # 1 GiB of float32, 3 rounds
    .venv/bin/python bench/bench_savetime.py --mib 256 --repeat 5

The state: 8 float32 arrays (``--mib`` MiB in all) on a (4, 2) mesh of 8 forced CPU devices,
half sharded over both axes, half over ``model`` only (so replicas are skipped). One timed save
is ``save`` + ``wait_until_finished`` of an async ``CheckpointManager`` into a fresh directory
(the record is written by the wrapper's ``wait_until_finished``); plain and digesting saves
alternate (which goes first alternates too, and ``os.sync()`` runs before each, outside the
timing), ``--repeat`` rounds, the median of each is reported with the load average (the
machine may be shared: wall time counts the neighbours too). Beside it, the CPU time of
hashing the same shards once in this thread (``leaf_partials``, what the wrapper's background
thread does): the overhead's bound when no core is free, and a figure the neighbours' load
hardly moves, as wall-time differences on a shared machine are easily noise.

Results: a table on stdout and JSON in ``bench/out/savetime.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def make_state(mib: int) -> dict[str, Any]:
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("data", "model"))
    cols = 1024
    rows = max(8, (mib << 20) // 8 // 4 // cols // 8 * 8)
    rs = np.random.default_rng(0)
    state = {}
    for i in range(8):
        spec = P("data", "model") if i % 2 == 0 else P(None, "model")
        host = rs.standard_normal((rows, cols), dtype=np.float32)
        state[f"layer{i}"] = jax.device_put(host, NamedSharding(mesh, spec))
    return state


def timed_save(root: Path, state: dict[str, Any], digesting: bool) -> float:
    import orbax.checkpoint as ocp

    from ckpt_cli.orbax import DigestingCheckpointManager

    options = ocp.CheckpointManagerOptions(enable_async_checkpointing=True)
    mngr: Any = ocp.CheckpointManager(root, options=options)
    if digesting:
        mngr = DigestingCheckpointManager(mngr)
    t = time.perf_counter()
    mngr.save(1, args=ocp.args.StandardSave(state))
    mngr.wait_until_finished()
    wall = time.perf_counter() - t
    mngr.close()
    if digesting:
        assert (root / "1" / "default" / "_CKPT_DIGESTS.json").is_file()
    return wall


def digest_cpu(state: dict[str, Any]) -> float:
    """CPU seconds of hashing this process's shards of ``state`` into ``ld1`` partials."""
    from ckpt_cli.orbax import _owned_boxes, leaf_partials

    boxes = _owned_boxes("default", state, primary=True)
    t = time.process_time()
    leaf_partials(boxes)
    return time.process_time() - t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=3)
    opts = parser.parse_args()
    state = make_state(opts.mib)
    nbytes = sum(x.nbytes for x in state.values())
    load_before = os.getloadavg()
    times: dict[str, list[float]] = {"plain": [], "digesting": []}
    base = Path(tempfile.mkdtemp(prefix="bench-savetime-"))
    try:
        timed_save(base / "warmup", state, True)
        for r in range(opts.repeat):
            # Alternate which kind goes first, and write back the previous save's dirty pages
            # before each timed one: otherwise the kernel's writeback of one save lands in the
            # next one's wall time (individual saves varied 0.8-3.4 s without it).
            kinds = ("plain", "digesting") if r % 2 == 0 else ("digesting", "plain")
            for kind in kinds:
                root = base / f"{kind}-{r}"
                os.sync()
                times[kind].append(timed_save(root, state, kind == "digesting"))
                shutil.rmtree(root)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    plain, dig = (statistics.median(times[k]) for k in ("plain", "digesting"))
    cpu = digest_cpu(state)
    result = {
        "bytes": nbytes,
        "repeat": opts.repeat,
        "plain_s": times["plain"],
        "digesting_s": times["digesting"],
        "median_plain_s": plain,
        "median_digesting_s": dig,
        "overhead": dig / plain - 1,
        "digest_cpu_s": cpu,
        "digest_cpu_share": cpu / plain,
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "cpus": os.cpu_count(),
    }
    print(f"save of {nbytes / 2**30:.2f} GiB (async, 8 CPU devices), median of {opts.repeat}:")
    print(f"  plain       {plain:7.2f} s   {times['plain']}")
    print(f"  digesting   {dig:7.2f} s   {times['digesting']}")
    print(f"  overhead    {100 * (dig / plain - 1):+6.1f} %")
    print(f"  hashing     {cpu:7.2f} s CPU ({100 * cpu / plain:.1f} % of the plain save)")
    print(f"  load avg    before {load_before}, after {result['loadavg_after']}")
    out = REPO / "bench" / "out"
    out.mkdir(exist_ok=True)
    (out / "savetime.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
