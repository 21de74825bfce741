"""Benchmark ``ckpt export`` / ``ckpt import`` against the routes users write today.

Run from the repository root::

    .venv/bin/python bench/bench_export.py [--gib 1] [--workdir bench/out/export]

The source (built once with real Orbax, cached in the work directory) is a CheckpointManager step
of ``--gib`` GiB of parameters: pairs of leaves ``params.layer_NN.kernel`` float32[4096, 4096]
and ``params.layer_NN.kernel_bf16`` bfloat16[4096, 4096], saved from 8 (forced CPU) devices with
rows sharded, so a chunk is one device's shard (8 MiB; ``--chunk-mib 32``: 2 devices, 32 MiB
chunks) and a bigger model has more leaves. Each
contender runs in a fresh subprocess whose wall time and peak RSS (``ru_maxrss``) are measured,
in the same run, with its CPU time (user + system, which the load of a shared machine stretches
far less than wall time):

export
    ``ckpt export SRC DST`` (default ``--memory-limit 256MiB``, and ``1GiB``) against
    "Orbax restore + ``safetensors.numpy.save_file``": ``PyTreeRestore`` into host numpy
    arrays, flatten to dotted names, one ``model.safetensors`` (no fsync; ckpt syncs its files
    before the rename).
import
    ``ckpt import DST-of-ckpt-export NEW`` (defaults ``--memory-limit 256MiB
    --max-chunk-bytes 16MiB``, and ``1GiB``/``64MiB``) against "``safetensors.numpy.load_file``
    + Orbax save": the whole file into memory, nested back into a tree, ``StandardSave``.

Every output is checked: the two exports hold the same bytes for every tensor (read back through
``safetensors.safe_open``), and the two imports restore to equal values in Orbax. The machine is
shared: the load average is printed beside the figures; compare contenders of one run.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from _harness import REPO, bench_env, run, run_usage  # bench/ is on sys.path when a script runs

ROWS, COLS = 4096, 4096  # every leaf pair: float32 64 MiB + bfloat16 32 MiB
PAIR_BYTES = ROWS * COLS * 6
PRELUDE = """
import os, resource, sys, time
def done(t0):
    print("RESULT", time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""

# The source as a training job saves it: 8 devices, rows sharded, so each chunk is one
# device's shard (8 MiB); a bigger model has more leaves, not bigger chunks.
BUILD = (
    PRELUDE
    + f"""
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
import jax, ml_dtypes, numpy as np, orbax.checkpoint as ocp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
root, pairs, devices = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
mesh = Mesh(np.array(jax.devices()[:devices]), ("data",))
rows = NamedSharding(mesh, P("data", None))
rs = np.random.RandomState(0)
def leaf(i):
    x = rs.standard_normal(({ROWS}, {COLS})).astype(np.float32)
    return {{"kernel": jax.device_put(x, rows),
             "kernel_bf16": jax.device_put(x.astype(ml_dtypes.bfloat16), rows)}}
tree = {{"params": {{f"layer_{{i:02d}}": leaf(i) for i in range(pairs)}}}}
mgr = ocp.CheckpointManager(root)
mgr.save(1, args=ocp.args.StandardSave(tree))
mgr.wait_until_finished()
print("RESULT 0 0")
"""
)

# Today's export: restore everything into host memory, then one save_file call.
ORBAX_EXPORT = (
    PRELUDE
    + """
t0 = time.perf_counter()
import jax, numpy as np, orbax.checkpoint as ocp
import safetensors.numpy
src, dst = sys.argv[1], sys.argv[2]
mgr = ocp.CheckpointManager(src, item_handlers=ocp.PyTreeCheckpointHandler())
meta = mgr.item_metadata(1)
restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), meta)
state = mgr.restore(1, args=ocp.args.PyTreeRestore(restore_args=restore_args))
flat = {".".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path): np.asarray(v)
        for path, v in jax.tree_util.tree_flatten_with_path(state)[0]}
os.makedirs(dst, exist_ok=True)
safetensors.numpy.save_file(flat, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
done(t0)
"""
)

# Today's import: load the whole file, nest the names, save with Orbax.
ORBAX_IMPORT = (
    PRELUDE
    + """
t0 = time.perf_counter()
import glob, jax, numpy as np, orbax.checkpoint as ocp
import safetensors.numpy
src, dst = sys.argv[1], sys.argv[2]
tree = {}
for path in sorted(glob.glob(os.path.join(src, "*.safetensors"))):
    for name, value in safetensors.numpy.load_file(path).items():
        node = tree
        *parents, last = name.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
mgr = ocp.CheckpointManager(dst)
mgr.save(1, args=ocp.args.StandardSave(tree))
mgr.wait_until_finished()
done(t0)
"""
)

CKPT = (
    PRELUDE
    + """
t0 = time.perf_counter()
sys.argv = ["ckpt", *sys.argv[1:], "--json"]
from ckpt_cli.app import main
try:
    main()
except SystemExit as e:
    assert not e.code, e.code
done(t0)
"""
)

SAME_EXPORT = """
import glob, os, sys
import ml_dtypes  # registers bfloat16 with numpy, which safe_open(framework="np") asks for
import safetensors
def tensors(d):
    out = {}
    for path in sorted(glob.glob(os.path.join(d, "*.safetensors"))):
        with safetensors.safe_open(path, framework="np") as f:
            for k in f.keys():
                out[k] = (path, k)
    return out
a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
assert a and sorted(a) == sorted(b), (sorted(a)[:3], sorted(b)[:3])
for k in a:  # one tensor at a time: this check must not need the whole model in memory either
    with safetensors.safe_open(a[k][0], framework="np") as f, safetensors.safe_open(b[k][0], framework="np") as g:
        assert f.get_tensor(k).tobytes() == g.get_tensor(k).tobytes(), k
print("RESULT 0 0")
"""

SAME_IMPORT = """
import sys, jax, numpy as np, orbax.checkpoint as ocp
def restore(root):
    mgr = ocp.CheckpointManager(root, item_handlers=ocp.PyTreeCheckpointHandler())
    step = mgr.latest_step()
    args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), mgr.item_metadata(step))
    return mgr.restore(step, args=ocp.args.PyTreeRestore(restore_args=args))
name = sys.argv[3].split(".")
a, b = restore(sys.argv[1]), restore(sys.argv[2])
for k in name:
    a, b = a[k], b[k]
assert np.asarray(a).tobytes() == np.asarray(b).tobytes(), sys.argv[3]
print("RESULT 0 0")
"""


def ckpt_has(command: str) -> bool:
    """Whether this checkout's ckpt has ``command``. Run with the caller's environment: with
    only ``PYTHONPATH`` and ``PATH`` set, a host whose packages come from its environment (the
    TPU host) could not import ckpt at all, and that read as "does not exist yet"."""
    proc = subprocess.run(
        [sys.executable, "-m", "ckpt_cli", command, "--help"],
        capture_output=True,
        cwd=REPO,
        env=bench_env(),
    )
    if proc.returncode and "No such command" not in proc.stderr.decode(errors="replace"):
        raise SystemExit(
            f"ckpt does not start here:\n{proc.stderr.decode(errors='replace')[-2000:]}"
        )
    return proc.returncode == 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--workdir", default=str(REPO / "bench" / "out" / "export"))
    ap.add_argument(
        "--chunk-mib",
        type=int,
        choices=(8, 16, 32, 64),
        default=8,
        help="float32 chunk size: the leaves saved from 64/N devices (bfloat16 chunks half)",
    )
    args = ap.parse_args()
    work = Path(args.workdir)
    pairs = max(1, round(args.gib * 2**30 / PAIR_BYTES))
    devices = 64 // args.chunk_mib
    src = work / f"src_{pairs}pairs" if devices == 8 else work / f"src_{pairs}pairs_{devices}dev"
    if not (src / "1").is_dir():
        shutil.rmtree(src, ignore_errors=True)
        work.mkdir(parents=True, exist_ok=True)
        print(
            f"building {pairs} x (float32 + bfloat16)[{ROWS},{COLS}] on {devices} devices ...",
            flush=True,
        )
        run(BUILD, str(src), str(pairs), str(devices))
    size = sum(f.stat().st_size for f in src.rglob("*") if f.is_file())
    tensor_bytes = pairs * PAIR_BYTES
    print(
        f"source: {src} ({tensor_bytes / 2**30:.2f} GiB of tensors, {size / 2**30:.2f} GiB on disk)"
    )
    have_export, have_import = ckpt_has("export"), ckpt_has("import")
    # name -> (script, arguments before the output path, arguments after it)
    Contender = tuple[str, list[str], list[str]]
    exports: dict[str, Contender] = {"orbax restore+save_file": (ORBAX_EXPORT, [str(src)], [])}
    if have_export:
        exports["ckpt export"] = (CKPT, ["export", str(src)], [])
        exports["ckpt export 1GiB"] = (CKPT, ["export", str(src)], ["--memory-limit", "1GiB"])
    else:
        print("ckpt export does not exist yet: only the reference route runs")
    results: dict[str, tuple[float, int, float]] = {}
    outputs: dict[str, Path] = {}

    def race(prefix: str, contenders: dict[str, Contender]) -> None:
        for name, (script, head, tail) in contenders.items():
            dst = work / (prefix + name.replace(" ", "_").replace("+", "_"))
            shutil.rmtree(dst, ignore_errors=True)
            print(f"running {name} ...", flush=True)
            results[name] = run_usage(script, *head, str(dst), *tail)
            outputs[name] = dst

    race("export_", exports)
    if have_export:
        run(SAME_EXPORT, str(outputs["orbax restore+save_file"]), str(outputs["ckpt export"]))
        print("both exports hold the same bytes in every tensor")
    exported = str(outputs.get("ckpt export", outputs["orbax restore+save_file"]))
    imports: dict[str, Contender] = {"load_file+orbax save": (ORBAX_IMPORT, [exported], [])}
    if have_import:
        imports["ckpt import"] = (CKPT, ["import", exported], [])
        imports["ckpt import 1GiB"] = (
            CKPT,
            ["import", exported],
            ["--memory-limit", "1GiB", "--max-chunk-bytes", "64MiB"],
        )
    else:
        print("ckpt import does not exist yet: only the reference route runs")
    race("import_", imports)
    if have_import:
        run(
            SAME_IMPORT,
            str(outputs["load_file+orbax save"]),
            str(outputs["ckpt import"]),
            f"params.layer_{pairs - 1:02d}.kernel_bf16",
        )
        print("both imports restore the same values")
    print(f"\nload: {Path('/proc/loadavg').read_text().split()[:3]} (1, 5, 15 min)")
    print(f"{'contender':<26}{'wall s':>9}{'CPU s':>8}{'peak RSS':>12}{'GiB/s':>8}")
    for name, (secs, rss, cpu) in results.items():
        rate = tensor_bytes / 2**30 / secs
        print(f"{name:<26}{secs:>9.2f}{cpu:>8.2f}{rss / 2**20:>9.0f} MiB{rate:>8.2f}")
    out = {
        "tensor_bytes": tensor_bytes,
        "source_bytes_on_disk": size,
        "leaves": pairs * 2,
        "chunk_mib": args.chunk_mib,
        "loadavg": Path("/proc/loadavg").read_text().split()[:3],
        "results": {
            k: {"seconds": v[0], "cpu_seconds": v[2], "peak_rss_bytes": v[1]}
            for k, v in results.items()
        },
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    (REPO / "bench" / "out").mkdir(parents=True, exist_ok=True)
    suffix = "" if args.chunk_mib == 8 else f"_{args.chunk_mib}mib"
    target = REPO / "bench" / "out" / f"export_{args.gib:g}gib{suffix}.json"
    target.write_text(json.dumps(out, indent=2))
    print(f"wrote {target.relative_to(REPO)}")


if __name__ == "__main__":
    main()
