"""Check ``ckpt doctor``'s preflight: predicted vs measured peak host RAM of Orbax's restore and
of ``ckpt reshard`` to the same layout.

Run from the repository root::

    .venv/bin/python bench/bench_doctor.py [--sizes 256M,1G,2G] [--only orbax|reshard]

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

Then ``ckpt reshard SRC OUT --mesh M`` to that layout (*same*: ``--mesh x=8``, the recorded
``P('x', None)`` kept; *changed*: ``--mesh data=2,model=4 --rule '*=[null, model]'``) runs in a
fresh process at the default ``--memory-limit``; its ``ru_maxrss`` (``os.wait4``: the whole
process, interpreter and imports included) is compared with ``memory.reshard_peak_bytes``, which
predicts exactly that.
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

from _harness import REPO, run, run_rss  # bench/ is on sys.path when a script runs

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
#: ``ckpt reshard``'s arguments for the layout of each target.
RESHARD = {
    "same": ["--mesh", "x=8"],
    "changed": ["--mesh", "data=2,model=4", "--rule", "*=[null, model]"],
}


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
        "reshard": json.loads(out.stdout)["memory"]["reshard_peak_bytes"],
    }


def _reshard(src: Path, which: str, work: Path) -> tuple[float, int]:
    """``ckpt reshard`` to the target's layout in a fresh process: wall seconds, peak RSS."""
    out = work / f"resharded_{which}"
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "ckpt_cli", "reshard", str(src), str(out), *RESHARD[which]]
    done = run_rss([*cmd, "--json"])
    shutil.rmtree(out, ignore_errors=True)
    return done.wall_s, round(done.rss_mib * 2**20)


def _row(size: str, which: str, kind: str, predicted: int, measured: int, ampl: float) -> dict:
    error = (predicted - measured) / measured
    load = os.getloadavg()[0]
    print(
        f"{size:>6} {which:<8}{kind:<8}{predicted / 2**30:>9.2f} G{measured / 2**30:>9.2f} G"
        f"{error:>+8.1%}{ampl:>6.1f}  {load:.2f}",
        flush=True,
    )
    return {
        "size": size,
        "target": which,
        "what": kind,
        "predicted_bytes": predicted,
        "measured_bytes": measured,
        "relative_error": error,
        "read_amplification": ampl,
        "load_average": load,
    }


def _size(text: str) -> int:
    units = {"M": 2**20, "G": 2**30}
    return int(float(text[:-1]) * units[text[-1].upper()])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="256M,1G,2G")
    ap.add_argument("--targets", default=",".join(TARGETS))
    ap.add_argument("--only", choices=("orbax", "reshard"), default=None)
    ap.add_argument("--workdir", default=str(REPO / "bench" / "out" / "doctor"))
    args = ap.parse_args()
    work = Path(args.workdir)
    rows_out = []
    print(
        f"{'size':>6} {'target':<8}{'what':<8}{'predicted':>11}{'measured':>11}{'error':>8}", end=""
    )
    print(f"{'ampl':>6}  load")
    for size in args.sizes.split(","):
        rows = max(8, _size(size) // (LEAVES * COLS * 4) // 8 * 8)
        src = work / f"src_{size}"
        if not (src / "1").is_dir():
            shutil.rmtree(src, ignore_errors=True)
            work.mkdir(parents=True, exist_ok=True)
            run(BUILD, str(src), str(rows))
        for which in args.targets.split(","):
            predicted = _predict(src, which)
            ampl = float(predicted["amplification"])
            if args.only != "reshard":
                seconds, measured = run(RESTORE, str(src), which)
                rows_out.append(_row(size, which, "orbax", int(predicted["orbax"]), measured, ampl))
                rows_out[-1]["seconds"] = seconds
            if args.only != "orbax":
                seconds, measured = _reshard(src, which, work)
                predicted_bytes = int(predicted["reshard"])
                rows_out.append(_row(size, which, "reshard", predicted_bytes, measured, ampl))
                rows_out[-1]["seconds"] = seconds
        shutil.rmtree(src, ignore_errors=True)
    out = {"results": rows_out, "when": time.strftime("%Y-%m-%d %H:%M:%S")}
    (REPO / "bench" / "out").mkdir(parents=True, exist_ok=True)
    (REPO / "bench" / "out" / "doctor.json").write_text(json.dumps(out, indent=2))
    print("wrote bench/out/doctor.json")


if __name__ == "__main__":
    main()
