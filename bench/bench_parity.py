"""Benchmark ``ckpt diff ORBAX SAFETENSORS --spec FILE`` (weight parity) against reading both.

Run from the repository root::

    .venv/bin/python bench/bench_parity.py [--mib 256] [--workdir bench/out/parity]

The source (built once with real Orbax, cached in the work directory) is a CheckpointManager step
of ``--mib`` MiB of float32 ``params.layer_NN.kernel`` [4096, 4096] leaves (64 MiB each, saved
from 8 devices with rows sharded: 8 MiB chunks; ``--devices 1``: one chunk a leaf), exported
once by ``ckpt export`` with a spec that transposes every kernel to ``[out, in]`` and renames it
to ``layers.NN.weight`` (the PyTorch layout: each block of a tensor reads a column band of the
source). Each contender runs in a fresh process; wall time, CPU time and peak RSS are measured
in the same run:

``ckpt diff SRC EXPORT --spec`` (default ``--memory-limit 1GiB``, and ``256MiB``)
    the parity check: both sides streamed block by block, every value compared.
``verify --deep SRC`` + ``verify --deep EXPORT``
    reading both sides once each, as the issue's goal words it (a diff within 1.5x of the
    two): ckpt's deep verify of the Orbax step (every chunk decoded, counted and hashed) and of
    the export (every tensor read: NaN/Inf counts, the ``ld1`` digests export recorded).
``verify --deep SRC`` + ``digest EXPORT``
    the same with the ``ld1`` digest of every tensor of the export in place of its verify.
``orbax restore + load_file + numpy``
    the route of today (MaxText's script): both models whole in memory, compared by numpy.

The machine is shared: the load average is printed beside the figures.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from _harness import REPO, Run, run, run_rss, run_usage  # bench/ is on sys.path when a script runs

ROWS, COLS = 4096, 4096
LEAF_BYTES = ROWS * COLS * 4

# As a training job saves it: rows sharded over 8 devices, so a chunk is one device's shard
# (8 MiB; ``--devices 1``: one 64 MiB chunk per leaf).
BUILD = f"""
import os, sys
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
import jax, numpy as np, orbax.checkpoint as ocp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
root, leaves, devices = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rows = NamedSharding(Mesh(np.array(jax.devices()[:devices]), ("data",)), P("data", None))
rs = np.random.RandomState(0)
def leaf():
    return jax.device_put(rs.standard_normal(({ROWS}, {COLS})).astype(np.float32), rows)
tree = {{"params": {{f"layer_{{i:02d}}": {{"kernel": leaf()}} for i in range(leaves)}}}}
mgr = ocp.CheckpointManager(root)
mgr.save(1, args=ocp.args.StandardSave(tree))
mgr.wait_until_finished()
print("RESULT 0 0")
"""

SPEC = r"""version: 1
rules:
  - {op: transpose, match: 'params\.layer_\d+\.kernel', axes: [1, 0]}
  - {op: rename, from: 'params\.layer_(\d+)\.kernel', to: 'layers.\1.weight'}
"""

# Today's route: both models whole, compared by numpy (stops at nothing: every tensor).
TODAY = """
import resource, sys, time
t0 = time.perf_counter()
import numpy as np, orbax.checkpoint as ocp, safetensors.numpy
src, export = sys.argv[1], sys.argv[2]
import jax
mgr = ocp.CheckpointManager(src, item_handlers=ocp.PyTreeCheckpointHandler())
meta = mgr.item_metadata(1)
restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), meta)
tree = mgr.restore(1, args=ocp.args.PyTreeRestore(restore_args=restore_args))
hf = {}
import glob
for f in sorted(glob.glob(export + "/*.safetensors")):
    hf.update(safetensors.numpy.load_file(f))
worst = 0.0
for name, layer in tree["params"].items():
    a = np.asarray(layer["kernel"]).T
    b = hf["layers." + name.split("_")[1] + ".weight"]
    worst = max(worst, float(np.abs(a.astype(np.float64) - b).max()))
assert worst == 0.0, worst
print("RESULT", time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""


def ckpt(*args: str, ok: tuple[int, ...] = (0,)) -> Run:
    return run_rss([sys.executable, "-m", "ckpt_cli", *args], ok=ok)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--workdir", default=str(REPO / "bench" / "out" / "parity"))
    ap.add_argument("--devices", type=int, choices=(1, 2, 4, 8), default=8)
    ap.add_argument("--skip-today", action="store_true", help="leave out the in-memory route")
    args = ap.parse_args()
    work = Path(args.workdir)
    leaves = max(1, args.mib * 2**20 // LEAF_BYTES)
    tag = f"{leaves}x{args.devices}"
    src, export, spec = work / f"src_{tag}", work / f"export_{tag}", work / "transpose.yaml"
    work.mkdir(parents=True, exist_ok=True)
    spec.write_text(SPEC)
    if not (src / "1").is_dir():
        shutil.rmtree(src, ignore_errors=True)
        print(f"building {leaves} x float32[{ROWS},{COLS}] on {args.devices} devices", flush=True)
        run(BUILD, str(src), str(leaves), str(args.devices))
    if not export.is_dir():
        ckpt("export", str(src), str(export), "--spec", str(spec))
    total = leaves * LEAF_BYTES
    print(f"source: {src}, export: {export} ({total / 2**30:.2f} GiB of tensors each)")
    results: dict[str, Run] = {}
    print("running ckpt diff --spec ...", flush=True)
    results["ckpt diff --spec"] = ckpt("diff", str(src), str(export), "--spec", str(spec))
    results["ckpt diff --spec 256MiB"] = ckpt(
        "diff", str(src), str(export), "--spec", str(spec), "--memory-limit", "256MiB"
    )
    print("running verify --deep of both, digest ...", flush=True)
    verify = ckpt("verify", str(src), "--deep")
    verify_export = ckpt("verify", str(export), "--deep")
    digest = ckpt("digest", str(export))
    results["verify --deep SRC"] = verify
    results["verify --deep EXPORT"] = verify_export
    results["digest EXPORT"] = digest
    both = verify.wall_s + verify_export.wall_s
    if not args.skip_today:
        print("running orbax restore + load_file + numpy ...", flush=True)
        secs, rss, cpu = run_usage(TODAY, str(src), str(export))
        results["orbax+load_file+numpy"] = Run(secs, rss / 2**20, "", cpu)
    load = Path("/proc/loadavg").read_text().split()[:3]
    print(f"\n{os.cpu_count()} cores, load {load} (1, 5, 15 min)")
    print(f"{'contender':<26}{'wall s':>9}{'CPU s':>8}{'peak RSS':>12}")
    for name, r in results.items():
        print(f"{name:<26}{r.wall_s:>9.1f}{r.cpu_s:>8.1f}{r.rss_mib:>9.0f} MiB")
    d = results["ckpt diff --spec"]
    cpu = verify.cpu_s + verify_export.cpu_s
    print(
        f"diff / verify --deep of both: {d.wall_s / both:.2f}x wall (goal <= 1.5x), {d.cpu_s / cpu:.2f}x CPU"
    )
    with_digest = verify.wall_s + digest.wall_s
    print(f"diff / (verify --deep SRC + digest EXPORT): {d.wall_s / with_digest:.2f}x wall")
    print(f"diff peak RSS: {d.rss_mib:.0f} MiB (goal <= 300 MiB at 2 GiB)")


if __name__ == "__main__":
    main()
