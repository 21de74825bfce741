"""Benchmark ``ckpt migrate`` against the Orbax route users write today.

Run from the repository root::

    .venv/bin/python bench/bench_migrate.py [--gib 1] [--workdir bench/out/migrate]

The source (built once with real Orbax, cached in the work directory) is a CheckpointManager step
of ``--gib`` GiB (default 1.25: 1.15 GiB on disk) of float32 in 16 leaves ``params.layer_NN.kernel`` of shape [rows, 4096], saved
from one device. The migration renames every leaf to ``params.block_NN.w``, casts it to
bfloat16 and widens 4 of them to [rows, 4608] (new columns ``normal(0.02)``). Each contender runs
in a fresh subprocess whose wall time and peak RSS (``ru_maxrss``) are measured, in the same run:

ckpt
    ``ckpt migrate SRC DST --spec FILE`` with the default ``--memory-limit 1GiB``, and again with
    ``--memory-limit 256MiB``.
orbax (today's route)
    ``CheckpointManager.restore`` with ``PyTreeRestore(item=new tree, transforms={new key:
    Transform(original_key=old key, value_fn=cast and pad)})`` into host memory, then ``save``
    into a new root: the whole state passes through memory.

Both outputs are checked to agree on an unchanged leaf (bit for bit, bfloat16 rounding alike).
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

from _harness import REPO, run  # bench/ is on sys.path when a script runs

LEAVES, RESIZED, COLS, WIDE = 16, 4, 4096, 4608
PRELUDE = """
import os, resource, sys, time
def done(t0):
    print("RESULT", time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""

BUILD = (
    PRELUDE
    + f"""
import jax, numpy as np, orbax.checkpoint as ocp
root, rows = sys.argv[1], int(sys.argv[2])
rs = np.random.RandomState(0)
tree = {{"params": {{f"layer_{{i:02d}}": {{"kernel": jax.device_put(
    rs.standard_normal((rows, {COLS})).astype(np.float32))}} for i in range({LEAVES})}}}}
mgr = ocp.CheckpointManager(root)
mgr.save(1, args=ocp.args.StandardSave(tree))
mgr.wait_until_finished()
print("RESULT 0 0")
"""
)

SPEC = rf"""# bench/bench_migrate.py: rename + cast to bfloat16 + widen {RESIZED} leaves
rules:
  - {{op: rename, from: 'params\.layer_(\d+)\.kernel', to: 'params.block_\1.w'}}
  - {{op: cast, match: 'params\..*', dtype: bfloat16}}
  - {{op: resize, match: 'params\.block_0[0-{RESIZED - 1}]\.w', shape: [null, {WIDE}], init: 'normal(0.02)'}}
"""

ORBAX_ROUTE = (
    PRELUDE
    + f"""
t0 = time.perf_counter()
import jax, ml_dtypes, numpy as np, orbax.checkpoint as ocp
from orbax.checkpoint import transform_utils as tu
src, dst = sys.argv[1], sys.argv[2]

def fix(i):
    def value_fn(x):
        x = np.asarray(x).astype(ml_dtypes.bfloat16)
        if i < {RESIZED}:
            pad = np.random.default_rng(i).normal(0, 0.02, (x.shape[0], {WIDE - COLS}))
            x = np.concatenate([x, pad.astype(ml_dtypes.bfloat16)], axis=1)
        return x
    return value_fn

names = [f"{{i:02d}}" for i in range({LEAVES})]
item = {{"params": {{f"block_{{n}}": {{"w": 0}} for n in names}}}}
transforms = {{"params": {{f"block_{{n}}": {{"w": tu.Transform(
    original_key=f"params/layer_{{n}}/kernel", value_fn=fix(int(n)))}} for n in names}}}}
restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), item)
mgr = ocp.CheckpointManager(src, item_handlers=ocp.PyTreeCheckpointHandler())
state = mgr.restore(1, args=ocp.args.PyTreeRestore(
    item=item, transforms=transforms, restore_args=restore_args))
out = ocp.CheckpointManager(dst)
out.save(1, args=ocp.args.StandardSave(state))
out.wait_until_finished()
done(t0)
"""
)

CKPT_ROUTE = (
    PRELUDE
    + """
t0 = time.perf_counter()
sys.argv = ["ckpt", "migrate", *sys.argv[1:], "--json"]
from ckpt_cli.app import main
try:
    main()
except SystemExit as e:
    assert not e.code, e.code
done(t0)
"""
)

SAME = """
import sys
from ckpt_cli.core.format.arrays import ItemStore
from ckpt_cli.core.inspect.item import inspect_item
from ckpt_cli.core.format.resolve import resolve_item
from ckpt_cli.core.storage import open_location
def leaf(root, name):
    report = inspect_item(resolve_item(open_location(root)))
    info = next(x for x in report.leaves if x.name == name)
    store = ItemStore(report.ref.location, report.zarr_format == 3)
    return store.reader(name, info.array, info.database).read(()).result()
name = f"params.block_{sys.argv[3]}.w"
assert leaf(sys.argv[1], name).tobytes() == leaf(sys.argv[2], name).tobytes(), name
print("RESULT 0 0")
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=1.25)
    ap.add_argument("--workdir", default=str(REPO / "bench" / "out" / "migrate"))
    args = ap.parse_args()
    work = Path(args.workdir)
    rows = max(8, int(args.gib * 2**30 / (LEAVES * COLS * 4)))
    src = work / f"src_{rows}rows"
    if not (src / "1").is_dir():
        shutil.rmtree(src, ignore_errors=True)
        work.mkdir(parents=True, exist_ok=True)
        print(f"building {LEAVES} x float32[{rows},{COLS}] ...", flush=True)
        run(BUILD, str(src), str(rows))
    size = sum(f.stat().st_size for f in src.rglob("*") if f.is_file())
    spec = work / "spec.yaml"
    spec.write_text(SPEC)
    print(f"source: {src} ({size / 2**30:.2f} GiB on disk); spec: {spec}")
    contenders = {
        "ckpt migrate": (CKPT_ROUTE, ["--spec", str(spec)]),
        "ckpt migrate 256MiB": (CKPT_ROUTE, ["--spec", str(spec), "--memory-limit", "256MiB"]),
        "orbax transforms+save": (ORBAX_ROUTE, []),
    }
    results = {}
    for name, (script, extra) in contenders.items():
        dst = work / ("dst_" + name.replace(" ", "_").replace("+", "_"))
        shutil.rmtree(dst, ignore_errors=True)
        print(f"running {name} ...", flush=True)
        results[name] = run(script, str(src), str(dst), *extra)
    run(SAME, str(work / "dst_ckpt_migrate"), str(work / "dst_orbax_transforms_save"), "09")
    print("ckpt and orbax outputs agree on params.block_09.w (bit for bit)")
    ours = results["ckpt migrate"]
    print(f"\n{'contender':<24}{'wall s':>9}{'peak RSS':>12}{'vs ckpt time':>14}")
    for name, (secs, rss) in results.items():
        print(f"{name:<24}{secs:>9.2f}{rss / 2**30:>10.2f} G{secs / ours[0]:>13.2f}x")
    out = {
        "source_bytes": size,
        "rows": rows,
        "leaves": LEAVES,
        "resized": RESIZED,
        "results": {k: {"seconds": v[0], "peak_rss_bytes": v[1]} for k, v in results.items()},
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    (REPO / "bench" / "out").mkdir(parents=True, exist_ok=True)
    (REPO / "bench" / "out" / "migrate.json").write_text(json.dumps(out, indent=2))
    print("wrote bench/out/migrate.json")


if __name__ == "__main__":
    main()
