"""Benchmark ``ckpt reshard`` against what users do today and against the TensorStore floor.

Run from the repository root::

    .venv/bin/python bench/bench_reshard.py [--gib 2] [--workdir bench/out/reshard]

The source (built once with real Orbax, cached in the work directory) is a checkpoint of ``--gib``
GiB of float32 in 16 leaves, saved on 8 forced CPU devices with mesh (8, 1) and ``P('data', None)``
(chunks of 1/8 of the rows, all columns; ``--chunk-mib 32``: saved from fewer devices, so a
chunk is 32 MiB). CPU time (user + system) of every contender is measured too. Every contender rewrites it for mesh (2, 4) with
``P('data', 'model')`` (chunks of 1/2 of the rows, 1/4 of the columns), each in a fresh
subprocess whose wall time and peak RSS (``ru_maxrss``) are measured, in the same run:

ckpt
    ``ckpt reshard SRC DST --mesh data=2,model=4 --rule '*=[data, model]'`` (default
    ``--memory-limit 1GiB``).
orbax (today's route)
    ``CheckpointManager.restore`` with ``StandardRestore`` of ``ShapeDtypeStruct``s carrying the
    target ``NamedSharding``, then ``save`` into a new root: the whole state passes through memory.
tensorstore (the floor)
    For each array, ``ts.open`` the source and a new zarr array with the target chunking in one
    OCDBT database, then ``dst.write(src)``: a plain copy with nothing else around it.

Then the restore time of the new layout on the new mesh is compared with restoring the old layout
onto the same mesh (Orbax restore with the target shardings, both in fresh subprocesses).
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

from _harness import REPO, run, run_usage  # bench/ is on sys.path when a script runs

LEAVES = 16
PRELUDE = """
import os, resource, sys, time
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
def done(t0):
    print("RESULT", time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""

BUILD = (
    PRELUDE
    + """
import jax, numpy as np, orbax.checkpoint as ocp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
root, rows = sys.argv[1], int(sys.argv[2])
devices = int(sys.argv[3]) if len(sys.argv) > 3 else 8  # bench_scale, remote_latency: 8
mesh = Mesh(np.array(jax.devices()[:devices]).reshape(devices, 1), ("data", "model"))
sh = NamedSharding(mesh, P("data", None))
rs = np.random.RandomState(0)
tree = {f"layer_{i:02d}": jax.make_array_from_callback(
    (rows, 4096), sh, lambda idx: rs.standard_normal((rows // devices, 4096)).astype(np.float32))
    for i in range(LEAVES)}
mgr = ocp.CheckpointManager(root)
mgr.save(1, args=ocp.args.StandardSave(tree))
mgr.wait_until_finished()
print("RESULT 0 0")
""".replace("LEAVES", str(LEAVES))
)

ORBAX_ROUTE = (
    PRELUDE
    + """
t0 = time.perf_counter()
import jax, numpy as np, orbax.checkpoint as ocp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
src, dst = sys.argv[1], sys.argv[2]
mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "model"))
mgr = ocp.CheckpointManager(src, item_handlers=ocp.StandardCheckpointHandler())
meta = mgr.item_metadata(1)
target = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype,
                      sharding=NamedSharding(mesh, P("data", "model"))), meta)
state = mgr.restore(1, args=ocp.args.StandardRestore(target))
out = ocp.CheckpointManager(dst)
out.save(1, args=ocp.args.StandardSave(state))
out.wait_until_finished()
done(t0)
"""
)

TS_FLOOR = (
    PRELUDE
    + """
t0 = time.perf_counter()
import json, tensorstore as ts
src, dst = sys.argv[1], sys.argv[2]
item = os.path.join(src, "1", "default")
names = [".".join(k["key"] for k in v["key_metadata"])
         for v in json.load(open(os.path.join(item, "_METADATA")))["tree_metadata"].values()]
ctx = ts.Context()
os.makedirs(dst)
for name in names:
    s = ts.open({"driver": "zarr", "kvstore": {"driver": "ocdbt", "base": "file://" + item + "/",
                 "path": name + "/"}}, context=ctx).result()
    rows, cols = s.shape
    d = ts.open({"driver": "zarr", "kvstore": {"driver": "ocdbt", "base": "file://" + dst + "/",
                 "path": name + "/"}, "metadata": {"shape": [rows, cols], "chunks": [rows // 2, cols // 4],
                 "dtype": "<f4", "compressor": {"id": "zstd", "level": 1}}},
                create=True, context=ctx).result()
    d.write(s).result()
done(t0)
"""
)

CKPT_ROUTE = (
    PRELUDE
    + """
t0 = time.perf_counter()
sys.argv = ["ckpt", "reshard", sys.argv[1], sys.argv[2], "--mesh", "data=2,model=4",
            "--rule", "*=[data, model]", "--json"]
from ckpt_cli.app import main
try:
    main()
except SystemExit as e:
    assert not e.code, e.code
done(t0)
"""
)

RESTORE = (
    PRELUDE
    + """
import jax, numpy as np, orbax.checkpoint as ocp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
root = sys.argv[1]
mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "model"))
mgr = ocp.CheckpointManager(root, item_handlers=ocp.StandardCheckpointHandler())
meta = mgr.item_metadata(1)
target = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype,
                      sharding=NamedSharding(mesh, P("data", "model"))), meta)
t0 = time.perf_counter()
state = mgr.restore(1, args=ocp.args.StandardRestore(target))
jax.block_until_ready(state)
done(t0)
"""
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=2.0)
    ap.add_argument("--workdir", default=str(REPO / "bench" / "out" / "reshard"))
    ap.add_argument(
        "--chunk-mib",
        type=int,
        default=None,
        help="source chunk size: the leaves saved from as many devices (of 8) as give it "
        "(default: 8 devices, 1/8 of the rows per chunk)",
    )
    args = ap.parse_args()
    work = Path(args.workdir)
    rows = int(args.gib * 2**30 / (LEAVES * 4096 * 4)) // 8 * 8
    leaf_mib = rows * 4096 * 4 / 2**20
    devices = 8 if args.chunk_mib is None else max(1, min(8, round(leaf_mib / args.chunk_mib)))
    src = work / (f"src_{rows}rows" if devices == 8 else f"src_{rows}rows_{devices}dev")
    if not (src / "1").is_dir():
        shutil.rmtree(src, ignore_errors=True)
        work.mkdir(parents=True, exist_ok=True)
        print(f"building {LEAVES} x float32[{rows},4096] on mesh ({devices},1) ...", flush=True)
        run(BUILD, str(src), str(rows), str(devices))
    size = sum(f.stat().st_size for f in src.rglob("*") if f.is_file())
    chunk_mib = leaf_mib / devices
    print(f"source: {src} ({size / 2**30:.2f} GiB on disk, {chunk_mib:g} MiB chunks)")
    results = {}
    for name, script in (
        ("ckpt reshard", CKPT_ROUTE),
        ("orbax restore+save", ORBAX_ROUTE),
        ("tensorstore copy (floor)", TS_FLOOR),
    ):
        dst = work / ("dst_" + name.split()[0])
        shutil.rmtree(dst, ignore_errors=True)
        print(f"running {name} ...", flush=True)
        results[name] = run_usage(script, str(src), str(dst))
    print("restoring on mesh (2,4) ...", flush=True)
    restore_old = run(RESTORE, str(src))
    restore_new = run(RESTORE, str(work / "dst_ckpt"))
    ours = results["ckpt reshard"]
    load = Path("/proc/loadavg").read_text().split()[:3]
    print(f"\nload: {load} (1, 5, 15 min)")
    print(f"{'contender':<26}{'wall s':>9}{'CPU s':>8}{'peak RSS':>12}{'vs ckpt CPU':>13}")
    for name, (secs, rss, cpu) in results.items():
        print(f"{name:<26}{secs:>9.2f}{cpu:>8.2f}{rss / 2**30:>10.2f} G{cpu / ours[2]:>12.2f}x")
    print(
        f"\nrestore on (2,4): old layout {restore_old[0]:.2f} s, resharded {restore_new[0]:.2f} s "
        f"({restore_old[0] / restore_new[0]:.2f}x)"
    )
    out = {
        "source_bytes": size,
        "rows": rows,
        "leaves": LEAVES,
        "chunk_mib": chunk_mib,
        "loadavg": load,
        "results": {
            k: {"seconds": v[0], "cpu_seconds": v[2], "peak_rss_bytes": v[1]}
            for k, v in results.items()
        },
        "restore_seconds": {"old_layout": restore_old[0], "resharded": restore_new[0]},
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    (REPO / "bench" / "out").mkdir(parents=True, exist_ok=True)
    name = "reshard.json" if devices == 8 else f"reshard_{chunk_mib:g}mib.json"
    (REPO / "bench" / "out" / name).write_text(json.dumps(out, indent=2))
    print(f"wrote bench/out/{name}")


if __name__ == "__main__":
    main()
