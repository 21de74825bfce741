"""Benchmark ``ckpt verify --deep`` (with recorded digests) against the alternatives, same run.

Run from the repository root::

    .venv/bin/python bench/bench_verify.py            # 0.25 GiB and 0.75 GiB checkpoints
    .venv/bin/python bench/bench_verify.py --full     # 1 GiB and 3 GiB (needs ~12 GiB RAM for Orbax)

Checkpoints are built once with REAL Orbax (a CheckpointManager root, one step, 512 leaves:
256 float32 kernels of random normal values, ``(rows, 1024)`` with ``rows`` set by the size,
sharded over 8 forced CPU devices with ``P('data', None)``, ``P(None, 'model')``,
``P('data', 'model')`` and replicated layouts, and 256 replicated biases) and cached under
``bench/out/verify/`` (git-ignored; delete a directory to rebuild it). The leaf count is the same
at every size, so the RSS comparison shows what the bytes cost; metadata (OCDBT tree nodes,
chunk keys) grows with the number of leaves, not with their size.

On the larger checkpoint, with a hot page cache (every file is read once before timing), each
contender runs ``--repeat`` times in a fresh process; the median wall time is reported, with the
peak RSS of that process (``wait4``):

ckpt verify --deep
    structure, every chunk decoded, NaN/Inf per leaf, every leaf digest and every file checksum
    checked against ``_CKPT_DIGESTS.json`` (recorded once beforehand with ``--record``); and the
    same without the record (decoding and NaN/Inf only), to show what the digests cost.
orbax restore (a)
    the only deep check users have today: ``StandardCheckpointer().restore`` of the item with
    ``RestoreArgs(restore_type=np.ndarray)`` for every leaf, i.e. every array decoded into host
    memory. Its restore-only time (after ``import orbax``) is reported too.
cat (b)
    the floor: ``cat`` of every file of the item to /dev/null.

Then ``verify --deep``'s peak RSS on the smaller checkpoint, to show that memory does not grow
with the checkpoint. Results: a table on stdout and JSON in ``bench/out/verify.json``.

``--chunk-mib 8,32`` instead: peak RSS of ``verify --deep`` (with a record) and of ``diff``
(step 1 against step 2) on a ``--gib`` root whose leaves are each one chunk of that size (a
single-device save, as Orbax writes a whole shard), to show that memory does not follow the
chunk size; one run each, the load average printed beside each figure.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from _harness import Run, bench_env  # bench/ is on sys.path when a script runs
from _harness import run_rss as _run_rss

REPO = Path(__file__).resolve().parent.parent
WORKDIR = REPO / "bench" / "out" / "verify512"
RESULT_JSON = REPO / "bench" / "out" / "verify.json"
PYTHON = sys.executable
ENV = bench_env()
CKPT = [PYTHON, "-m", "ckpt_cli"]
GIB = 1 << 30

BUILD = r"""
import os, sys
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
import jax, numpy as np, orbax.checkpoint as ocp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

root, total = sys.argv[1], int(sys.argv[2])
mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
specs = [P("data", None), P(None, "model"), P("data", "model"), P()]
rng = np.random.default_rng(0)
layers = 256  # the same 512 leaves at every size: only the bytes grow
rows = max(8, total // (layers * 1024 * 4) // 8 * 8)
tree = {}
for i in range(layers):
    spec = specs[i % len(specs)]
    kernel = rng.standard_normal((rows, 1024), dtype=np.float32)
    tree[f"layer_{i:04d}"] = {
        "kernel": jax.device_put(kernel, NamedSharding(mesh, spec)),
        "bias": jax.device_put(rng.standard_normal(1024, dtype=np.float32), NamedSharding(mesh, P())),
    }
with ocp.CheckpointManager(root) as mgr:
    mgr.save(0, args=ocp.args.StandardSave({"params": tree}))
    mgr.wait_until_finished()
print(layers * 2, "leaves of", rows, "x 1024")
"""

RESTORE = r"""
import os, sys, time
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"  # the saving topology
import numpy as np, jax, orbax.checkpoint as ocp
item = sys.argv[1]
ckptr = ocp.PyTreeCheckpointer()
meta = ckptr.metadata(item).item_metadata.tree
args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), meta)
t1 = time.perf_counter()
tree = ckptr.restore(item, args=ocp.args.PyTreeRestore(restore_args=args))
n = sum(x.nbytes for x in jax.tree.leaves(tree))
t2 = time.perf_counter()
print(f"RESTORE {t2 - t1:.4f} {n}")
"""


CHUNKED = r"""
import sys
import jax, numpy as np, orbax.checkpoint as ocp
root, total, chunk = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = np.random.default_rng(0)
rows = chunk // (1024 * 4)
tree = {f"w{i:03d}": rng.standard_normal((rows, 1024), dtype=np.float32) for i in range(total // chunk)}
with ocp.CheckpointManager(root) as mgr:
    for step in (1, 2):
        tree["w000"][:4] += 1.0
        mgr.save(step, args=ocp.args.StandardSave({k: jax.device_put(v) for k, v in tree.items()}))
        mgr.wait_until_finished()
"""


def chunk_sizes(chunks: list[int], gib: float) -> None:
    """Peak RSS of verify --deep and diff on one-chunk leaves of each size (one run each)."""
    total = int(gib * GIB)
    env = {**ENV, "JAX_PLATFORMS": "cpu"}
    env.pop("XLA_FLAGS", None)  # one device: each leaf is one chunk
    result = []
    for mib in chunks:
        root = WORKDIR.with_name(f"verify_chunks_{gib:g}GiB_{mib}MiB")
        if not (root / "1" / "default" / "_CKPT_DIGESTS.json").exists():
            print(f"building {root.name} with Orbax ...", flush=True)
            cmd = [PYTHON, "-c", CHUNKED, str(root), str(total), str(mib << 20)]
            subprocess.run(cmd, check=True, env=env, stdout=sys.stderr)
            run_rss([*CKPT, "verify", str(root), "--step", "1", "--record"])
        warm(root)
        deep = run_rss([*CKPT, "verify", str(root), "--step", "1", "--deep", "--json"])
        load_v = os.getloadavg()[0]
        doc = json.loads(deep.out)
        assert set(doc["checked"]["digests"].values()) == {"checked"}, doc
        diff = run_rss([*CKPT, "diff", f"{root}@1", f"{root}@2"], ok=(0, 1))
        load_d = os.getloadavg()[0]
        result.append(
            {
                "chunk_mib": mib,
                "verify_deep": {
                    "wall_s": round(deep.wall_s, 2),
                    "peak_rss_mib": round(deep.rss_mib),
                    "load": load_v,
                },
                "diff": {
                    "wall_s": round(diff.wall_s, 2),
                    "peak_rss_mib": round(diff.rss_mib),
                    "load": load_d,
                },
            }
        )
        print(
            f"{gib:g} GiB, {mib} MiB chunks: verify --deep {deep.wall_s:.1f} s "
            f"{deep.rss_mib:.0f} MiB (load {load_v:.1f}); diff {diff.wall_s:.1f} s "
            f"{diff.rss_mib:.0f} MiB (load {load_d:.1f})",
            flush=True,
        )
    out = RESULT_JSON.with_name("verify_chunks.json")
    out.write_text(json.dumps(result, indent=2) + "\n")


def run_rss(cmd: list[str], ok: tuple[int, ...] = (0,)) -> Run:
    return _run_rss(cmd, ok, ENV)


def median(cmd: list[str], repeat: int) -> tuple[Run, list[Run]]:
    runs = [run_rss(cmd) for _ in range(repeat)]
    best = sorted(runs, key=lambda r: r.wall_s)[len(runs) // 2]
    return best, runs


def ensure(path: Path, size: int) -> Path:
    if not (path / "0" / "default" / "_CKPT_DIGESTS.json").exists():
        print(f"building {path.name} with Orbax ...", flush=True)
        subprocess.run(
            [PYTHON, "-c", BUILD, str(path), str(size)], check=True, env=ENV, stdout=sys.stderr
        )
        rec = run_rss([*CKPT, "verify", str(path), "--record", "--json"])
        if not json.loads(rec.out)["ok"]:
            raise SystemExit(f"recording digests on {path} failed: {rec.out[-2000:]}")
    return path


def disk_bytes(item: Path) -> int:
    return sum(p.stat().st_size for p in item.rglob("*") if p.is_file())


def warm(item: Path) -> None:
    subprocess.run(f"find {item} -type f -exec cat {{}} + > /dev/null", shell=True, check=True)


def row(name: str, r: Run, nbytes: int, extra: str = "") -> dict[str, Any]:
    return {
        "contender": name,
        "wall_s": round(r.wall_s, 3),
        "gib_per_s": round(nbytes / GIB / r.wall_s, 3),
        "peak_rss_mib": round(r.rss_mib, 1),
        "note": extra,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--full", action="store_true", help="1 GiB and 3 GiB instead of 0.25 and 0.75")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--chunk-mib", help="e.g. 8,32: peak RSS by chunk size instead")
    ap.add_argument("--gib", type=float, default=1.0, help="size for --chunk-mib")
    args = ap.parse_args()
    if args.chunk_mib:
        chunk_sizes([int(c) for c in args.chunk_mib.split(",")], args.gib)
        return
    small, large = (1 * GIB, 3 * GIB) if args.full else (GIB // 4, 3 * GIB // 4)
    WORKDIR.mkdir(parents=True, exist_ok=True)
    roots = {s: ensure(WORKDIR / f"ckpt_{s / GIB:g}GiB", s) for s in (small, large)}
    item = roots[large] / "0" / "default"
    nbytes = disk_bytes(item)
    warm(item)

    ours, _ = median([*CKPT, "verify", str(roots[large]), "--deep", "--json"], args.repeat)
    doc = json.loads(ours.out)
    assert doc["ok"] and set(doc["checked"]["digests"].values()) == {"checked"}, doc
    record = item / "_CKPT_DIGESTS.json"
    record.rename(record.with_suffix(".off"))
    try:  # the same deep pass without a record: decoding and NaN/Inf only
        plain, _ = median([*CKPT, "verify", str(roots[large]), "--deep", "--json"], args.repeat)
    finally:
        record.with_suffix(".off").rename(record)
    restore, runs = median([PYTHON, "-c", RESTORE, str(item)], args.repeat)
    restore_only = statistics.median(float(r.out.split()[1]) for r in runs)
    cat, _ = median(["sh", "-c", f"find {item} -type f -exec cat {{}} + > /dev/null"], args.repeat)
    warm(roots[small] / "0" / "default")
    ours_small, _ = median([*CKPT, "verify", str(roots[small]), "--deep", "--json"], args.repeat)

    rows = [
        row("ckpt verify --deep (digests)", ours, nbytes),
        row("ckpt verify --deep (no record)", plain, nbytes),
        row("(a) orbax restore to host", restore, nbytes, f"restore only {restore_only:.2f} s"),
        row("(b) cat > /dev/null", cat, nbytes),
    ]
    result = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "checkpoint_bytes": nbytes,
        "leaves": doc["checked"]["leaves"],
        "rows": rows,
        "ratios": {
            "ours_vs_orbax_restore": round(restore.wall_s / ours.wall_s, 2),
            "ours_vs_cat": round(ours.wall_s / cat.wall_s, 2),
        },
        "rss_mib_by_size": {
            f"{small / GIB:g} GiB": round(ours_small.rss_mib, 1),
            f"{large / GIB:g} GiB": round(ours.rss_mib, 1),
        },
    }
    print(
        f"checkpoint: {nbytes / GIB:.2f} GiB on disk, {doc['checked']['leaves']} leaves, hot cache"
    )
    print(f"{'contender':32} {'wall s':>8} {'GiB/s':>7} {'peak RSS MiB':>13}  note")
    for r in rows:
        print(
            f"{r['contender']:32} {r['wall_s']:8.2f} {r['gib_per_s']:7.2f} "
            f"{r['peak_rss_mib']:13.0f}  {r['note']}"
        )
    print(
        f"ckpt is {result['ratios']['ours_vs_orbax_restore']}x faster than an Orbax restore and "
        f"takes {result['ratios']['ours_vs_cat']}x the time of cat"
    )
    print("peak RSS of verify --deep by checkpoint size:", result["rss_mib_by_size"])
    RESULT_JSON.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
