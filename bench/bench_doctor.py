"""Check ``ckpt doctor``'s preflight: predicted vs measured peak host RAM of Orbax's restore.

Run from the repository root::

    .venv/bin/python bench/bench_doctor.py [--sizes 256M,1G,2G] [--workdir bench/out/doctor]

For each size, a checkpoint of 8 float32 leaves ``[rows, 4096]`` is saved by the installed Orbax
on 8 forced CPU devices, mesh ``(8,)`` and ``P('x', None)`` (each device's chunk: 1/8 of the
rows, all columns). Two targets, each an abstract state whose ``ShapeDtypeStruct``s carry the
restore's ``NamedSharding`` (a ``--target`` function of this module):

same
    mesh ``(8,)``, ``P('x', None)``: each device keeps the chunk it saved.
changed
    mesh ``(2, 4)`` (``data``, ``model``), ``P(None, 'model')``: each device keeps a quarter of
    the columns of every row, replicated over ``data``; every stored chunk straddles four shards.

For each (size, target): ``ckpt doctor SRC --target bench_doctor:target_<name> --json`` gives
``memory.hosts[0].orbax_restore_peak_bytes``; then a fresh subprocess restores the checkpoint with
``CheckpointManager.restore(step, args=StandardRestore(target))`` and reports the peak RSS it
*added*: ``ru_maxrss`` after the restore (arrays ready) minus the RSS just before it (after the
imports, the manager and the abstract target are built). That increase is what the prediction
claims; the baseline (Python, jax, orbax: ~0.5 GiB) is the same for any checkpoint. The CPU
"devices" are host memory, so the restored arrays are part of the figure.
Every run is one process at a time; the load average is printed next to each row.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from _harness import REPO, run  # bench/ is on sys.path when a script runs

LEAVES, COLS = 8, 4096
ENV_SRC = "CKPT_BENCH_DOCTOR_SRC"
PRELUDE = """
import os, resource, sys, time
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
"""

BUILD = (
    PRELUDE
    + """
import jax, numpy as np, orbax.checkpoint as ocp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
root, rows = sys.argv[1], int(sys.argv[2])
mesh = Mesh(np.array(jax.devices()), ("x",))
sh = NamedSharding(mesh, P("x", None))
rs = np.random.RandomState(0)
tree = {f"layer_{i}": jax.make_array_from_callback(
    (rows, COLS), sh, lambda idx: rs.standard_normal((rows // 8, COLS)).astype(np.float32))
    for i in range(LEAVES)}
mgr = ocp.CheckpointManager(root)
mgr.save(1, args=ocp.args.StandardSave(tree))
mgr.wait_until_finished()
print("RESULT 0 0")
""".replace("LEAVES", str(LEAVES)).replace("COLS", str(COLS))
)

RESTORE = (
    PRELUDE
    + """
import jax, orbax.checkpoint as ocp
sys.path.insert(0, "BENCH")
import bench_doctor
root, which = sys.argv[1], sys.argv[2]
os.environ["ENV_SRC"] = root
target = getattr(bench_doctor, "target_" + which)()
mgr = ocp.CheckpointManager(root, item_handlers=ocp.StandardCheckpointHandler())
before = rss()
t0 = time.perf_counter()
state = mgr.restore(1, args=ocp.args.StandardRestore(target))
jax.block_until_ready(state)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print("RESULT", time.perf_counter() - t0, peak - before)
""".replace("BENCH", str(Path(__file__).resolve().parent)).replace("ENV_SRC", ENV_SRC)
)


def _target(mesh_shape: tuple[int, ...], axes: tuple[str, ...], spec: tuple[str | None, ...]):
    """The abstract state of the checkpoint in ``$CKPT_BENCH_DOCTOR_SRC`` on a mesh."""
    import jax
    import numpy as np
    import orbax.checkpoint as ocp
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[: int(np.prod(mesh_shape))]).reshape(mesh_shape), axes)
    sharding = NamedSharding(mesh, P(*spec))
    mgr = ocp.CheckpointManager(os.environ[ENV_SRC], item_handlers=ocp.StandardCheckpointHandler())
    meta = mgr.item_metadata(1)
    return jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=sharding), meta)


def target_same():
    return _target((8,), ("x",), ("x", None))


def target_changed():
    return _target((2, 4), ("data", "model"), (None, "model"))


TARGETS = ("same", "changed")


def _predict(src: Path, which: str) -> dict[str, int | float]:
    env = {
        **os.environ,
        "PYTHONPATH": f"{REPO}{os.pathsep}{Path(__file__).resolve().parent}",
        "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
        ENV_SRC: str(src),
    }
    cmd = [sys.executable, "-m", "ckpt_cli", "doctor", str(src)]
    cmd += ["--target", f"bench_doctor:target_{which}", "--json"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if out.returncode not in (0, 1):
        raise SystemExit(f"doctor failed ({out.returncode}): {out.stderr[-2000:]}")
    host = json.loads(out.stdout)["memory"]["hosts"][0]
    return {
        "orbax": host["orbax_restore_peak_bytes"],
        "amplification": host["read_amplification"],
    }


def _size(text: str) -> int:
    units = {"M": 2**20, "G": 2**30}
    return int(float(text[:-1]) * units[text[-1].upper()])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="256M,1G,2G")
    ap.add_argument("--targets", default=",".join(TARGETS))
    ap.add_argument("--workdir", default=str(REPO / "bench" / "out" / "doctor"))
    args = ap.parse_args()
    work = Path(args.workdir)
    rows_out = []
    print(
        f"{'size':>6} {'target':<8}{'predicted':>11}{'measured':>11}{'error':>8}{'ampl':>6}  load"
    )
    for size in args.sizes.split(","):
        rows = _size(size) // (LEAVES * COLS * 4) // 8 * 8
        src = work / f"src_{size}"
        if not (src / "1").is_dir():
            shutil.rmtree(src, ignore_errors=True)
            work.mkdir(parents=True, exist_ok=True)
            run(BUILD, str(src), str(rows))
        for which in args.targets.split(","):
            predicted = _predict(src, which)
            seconds, measured = run(RESTORE, str(src), which)
            error = (predicted["orbax"] - measured) / measured
            load = os.getloadavg()[0]
            print(
                f"{size:>6} {which:<8}{predicted['orbax'] / 2**30:>9.2f} G"
                f"{measured / 2**30:>9.2f} G{error:>+8.1%}{predicted['amplification']:>6.1f}"
                f"  {load:.2f}",
                flush=True,
            )
            rows_out.append(
                {
                    "size": size,
                    "target": which,
                    "predicted_bytes": predicted["orbax"],
                    "measured_bytes": measured,
                    "relative_error": error,
                    "read_amplification": predicted["amplification"],
                    "restore_seconds": seconds,
                    "load_average": load,
                }
            )
        shutil.rmtree(src, ignore_errors=True)
    out = {"results": rows_out, "when": time.strftime("%Y-%m-%d %H:%M:%S")}
    (REPO / "bench" / "out").mkdir(parents=True, exist_ok=True)
    (REPO / "bench" / "out" / "doctor.json").write_text(json.dumps(out, indent=2))
    print("wrote bench/out/doctor.json")


if __name__ == "__main__":
    main()
