"""Every core of the host: ckpt's data commands at ``--threads 1,2,4,8,all`` against Orbax, in one run.

Run from the repository root (any machine; no sockets, so the TPU host too)::

    .venv/bin/python bench/bench_cores.py                 # 1 GiB per layout
    .venv/bin/python bench/bench_cores.py --quick         # 64 MiB: a smoke run
    .venv/bin/python bench/bench_cores.py --gib 4 --threads 1,4,all --json bench/out/cores.json
    .venv/bin/python bench/bench_cores.py --layouts one --leaf-mib 128 --env CKPT_PART_READS=0

Two checkpoints of ``--gib`` GiB of float32 (random normal: zstd cannot shrink them) are saved
by real Orbax once and cached under ``--workdir``:

one
    a one-device layout: leaves of ``--leaf-mib`` (32) MiB saved from ONE CPU device
    (``--xla_force_host_platform_device_count=1``), so each leaf is one stored chunk, as a
    model saved from one accelerator is.
sharded
    leaves of 64 MiB sharded ``P('data', None)`` over 8 forced CPU devices: 8 MiB chunks.

Every contender runs in a fresh process (imports count, as at a shell), with a hot page cache,
``JAX_PLATFORMS=cpu`` (on the TPU host the chip stays free), in the caller's environment with
this checkout first on ``PYTHONPATH``. Per thread count: ``verify --deep`` (digests recorded
once beforehand: every leaf's ld1 and every file's CRC-32 checked), ``digest``, ``export``
(safetensors; again at ``--memory-limit 1GiB``), ``reshard`` to mesh (2, 4) and ``migrate`` (cast every leaf to bfloat16). Once:
Orbax restore to host memory (``restore_type=np.ndarray``; whole process, and the restore call
alone), Orbax restore + save (the writers' route) and ``cat`` of the item's files. Printed: wall
and CPU seconds (user + system, ``wait4``), cores used (CPU / wall), peak RSS, GiB/s of array
bytes, and the ratio of wall time to Orbax restore's whole process; whether export's bytes and
digest's output are the same at every thread count. ``--json PATH`` writes all rows.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import sys
from pathlib import Path
from typing import Any

from _harness import REPO, Run, bench_env, run_rss  # bench/ is on sys.path when a script runs

GIB = 1 << 30
MIB = 1 << 20
PY = sys.executable
CPUS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1

BUILD = r"""
import os, sys
layout, root, total, leaf = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
devices = 1 if layout == "one" else 8
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
import jax, numpy as np, orbax.checkpoint as ocp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
mesh = Mesh(np.array(jax.devices()[:devices]), ("data",))
sharding = NamedSharding(mesh, P("data", None))
rng = np.random.default_rng(0)
rows = leaf // (1024 * 4)
tree = {}
for i in range(max(1, total // leaf)):
    host = rng.standard_normal((rows, 1024), dtype=np.float32)
    tree[f"layer_{i:03d}"] = jax.device_put(host, sharding)
    del host
opts = ocp.CheckpointManagerOptions(enable_async_checkpointing=False)
with ocp.CheckpointManager(root, options=opts) as mgr:
    mgr.save(1, args=ocp.args.StandardSave({"params": tree}))
"""

RESTORE = r"""
import sys, time
import jax, numpy as np, orbax.checkpoint as ocp
item = sys.argv[1]
ckptr = ocp.PyTreeCheckpointer()
meta = ckptr.metadata(item).item_metadata.tree
args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), meta)
t = time.perf_counter()
tree = ckptr.restore(item, args=ocp.args.PyTreeRestore(restore_args=args))
restore_s = time.perf_counter() - t
if len(sys.argv) > 2:  # the writers' route: save what was restored
    with ocp.CheckpointManager(sys.argv[2]) as mgr:
        mgr.save(1, args=ocp.args.StandardSave(tree))
        mgr.wait_until_finished()
print(f"RESTORE {restore_s:.4f} {sum(x.nbytes for x in jax.tree.leaves(tree))}")
"""

CAST_SPEC = "rules:\n  - {op: cast, match: 'params\\..*', dtype: bfloat16}\n"


ENV = bench_env(JAX_PLATFORMS="cpu")


def ckpt(args: list[str], extra: dict[str, str] | None = None) -> Run:
    return run_rss([PY, "-m", "ckpt_cli", *args], env={**ENV, **(extra or {})})


def build(work: Path, layout: str, total: int, leaf: int) -> Path:
    root = work / f"{layout}_{total // MIB}mib_{leaf // MIB}mib"
    if not (root / "1").is_dir():
        shutil.rmtree(root, ignore_errors=True)
        work.mkdir(parents=True, exist_ok=True)
        print(f"building {layout}: {total // leaf} leaves of {leaf // MIB} MiB ...", flush=True)
        run_rss([PY, "-c", BUILD, layout, str(root), str(total), str(leaf)], env=ENV)
        ckpt(["verify", str(root), "--record"])  # digests for verify --deep to check
    return root


def item_files(root: Path) -> list[Path]:
    return sorted(p for p in (root / "1").rglob("*") if p.is_file())


def cat(root: Path) -> Run:
    return run_rss(["sh", "-c", 'cat "$@" > /dev/null', "cat", *map(str, item_files(root))])


def median(runs: list[Run]) -> Run:
    walls = [r.wall_s for r in runs]
    return runs[walls.index(statistics.median_low(walls))]


def timed(make: Any, repeat: int, before: Any = None) -> Run:
    out = []
    for _ in range(repeat):
        if before is not None:
            before()
        out.append(make())
    return median(out)


def contenders(root: Path, out: Path, spec: Path) -> dict[str, Any]:
    """name -> (args for ckpt given the output path, output path or None)."""
    r = str(root)
    return {
        "verify --deep": (["verify", r, "--deep"], None),
        "digest": (["digest", r], None),
        "export": (["export", r, str(out / "export")], out / "export"),
        # At the default 256MiB, blocks in flight are a quarter of it: two 32 MiB chunks.
        "export 1GiB": (
            ["export", r, str(out / "export"), "--memory-limit", "1GiB"],
            out / "export",
        ),
        "reshard (2,4)": (
            [
                "reshard",
                r,
                str(out / "reshard"),
                "--mesh",
                "data=2,model=4",
                "--rule",
                "*=[data, model]",
            ],
            out / "reshard",
        ),
        "migrate cast": (
            ["migrate", r, str(out / "migrate"), "--spec", str(spec)],
            out / "migrate",
        ),
    }


def sweep(
    root: Path,
    work: Path,
    outdir: Path,
    counts: list[int],
    repeat: int,
    variants: list[dict[str, str]],
) -> tuple[list[dict], dict]:
    """Every ckpt contender at every thread count, once as it is and once under each of
    ``variants`` (environment settings, ``--env``), in turn: the A/B of a switch in one run."""
    spec = work / "cast.yaml"
    spec.write_text(CAST_SPEC)
    rows: list[dict[str, Any]] = []
    same: dict[str, set[str]] = {"export": set(), "digest": set()}
    for name, (args, out) in contenders(root, outdir, spec).items():
        for n in counts:
            for extra in [{}, *variants]:
                clear = (lambda o=out: shutil.rmtree(o, ignore_errors=True)) if out else None
                run = timed(
                    lambda a=args, n=n, e=extra: ckpt([*a, "--threads", str(n)], e), repeat, clear
                )
                label = f"ckpt {name}" + "".join(f" [{k}={v}]" for k, v in extra.items())
                rows.append({"contender": label, "threads": n, "run": run})
                if name == "digest":
                    same["digest"].add(hashlib.sha256(run.out.encode()).hexdigest())
                if name.startswith("export") and out is not None:
                    same["export"].add(tree_hash(out))
                if out is not None:
                    shutil.rmtree(out, ignore_errors=True)
                print(f"  {label} --threads {n}: {run.wall_s:.2f} s", flush=True)
    return rows, {k: len(v) == 1 for k, v in same.items()}


def tree_hash(path: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(path.rglob("*")):
        if p.is_file():
            h.update(p.name.encode())
            with p.open("rb") as f:
                while chunk := f.read(16 * MIB):
                    h.update(chunk)
    return h.hexdigest()


def orbax_runs(root: Path, out: Path, repeat: int) -> list[dict[str, Any]]:
    item = str(root / "1" / "default")
    dst = out / "orbax"
    restore = timed(lambda: run_rss([PY, "-c", RESTORE, item], env=ENV), repeat)
    rsave = timed(
        lambda: run_rss([PY, "-c", RESTORE, item, str(dst)], env=ENV),
        repeat,
        lambda: shutil.rmtree(dst, ignore_errors=True),
    )
    shutil.rmtree(dst, ignore_errors=True)
    only = float(restore.out.split("RESTORE")[1].split()[0])
    return [
        {"contender": "orbax restore (whole process)", "threads": None, "run": restore},
        {"contender": "orbax restore (restore call only)", "threads": None, "wall": only},
        {"contender": "orbax restore + save", "threads": None, "run": rsave},
        {"contender": "cat of the files", "threads": None, "run": timed(lambda: cat(root), repeat)},
    ]


def table(layout: str, rows: list[dict[str, Any]], nbytes: int) -> list[dict[str, Any]]:
    base = next(r["run"].wall_s for r in rows if r["contender"].startswith("orbax restore (w"))
    out = []
    print(f"\n{layout}: {nbytes / GIB:.2f} GiB of arrays; {CPUS} CPUs, load {os.getloadavg()}")
    w = max(36, *(len(r["contender"]) + 2 for r in rows))
    print(f"{'contender':<{w}}{'threads':>8}{'wall s':>9}{'cpu s':>8}{'cores':>7}"
          f"{'RSS MiB':>9}{'GiB/s':>8}{'vs restore':>11}")  # fmt: skip
    for r in rows:
        run = r.get("run")
        wall = run.wall_s if run else r["wall"]
        row = {
            "layout": layout,
            "contender": r["contender"],
            "threads": r["threads"],
            "wall_s": round(wall, 3),
            "cpu_s": round(run.cpu_s, 3) if run else None,
            "cores": round(run.cpu_s / wall, 2) if run else None,
            "rss_mib": round(run.rss_mib) if run else None,
            "gib_s": round(nbytes / GIB / wall, 3),
            "ratio_to_restore": round(wall / base, 3),
        }
        out.append(row)
        dash = "-"
        print(f"{row['contender']:<{w}}{row['threads'] or dash!s:>8}{wall:>9.2f}"
              f"{row['cpu_s'] if run else dash!s:>8}{row['cores'] if run else dash!s:>7}"
              f"{row['rss_mib'] if run else dash!s:>9}{row['gib_s']:>8.2f}"
              f"{row['ratio_to_restore']:>10.2f}x")  # fmt: skip
    return out


def _env_setting(text: str) -> tuple[str, str]:
    """``NAME=VALUE`` as a pair; anything else is the command line's error (exit 2)."""
    name, eq, value = text.partition("=")
    if not eq or not name or not name.replace("_", "").isalnum():
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=VALUE (e.g. CKPT_PART_READS=0)")
    return name, value


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=1.0, help="array bytes per layout")
    ap.add_argument("--quick", action="store_true", help="64 MiB per layout, 8 MiB leaves")
    ap.add_argument("--threads", default="1,2,4,8,all", help="thread counts; all: the CPUs")
    ap.add_argument("--layouts", default="one,sharded")
    ap.add_argument("--leaf-mib", type=int, default=32, help="one-device leaf (= chunk) size")
    ap.add_argument("--repeat", type=int, default=1, help="runs per contender (median)")
    ap.add_argument("--workdir", default=str(REPO / "bench" / "out" / "cores"))
    ap.add_argument(
        "--env",
        action="append",
        default=[],
        type=_env_setting,
        metavar="NAME=VALUE",
        help="also run every ckpt contender with this set (e.g. CKPT_PART_READS=0: the "
        "TensorStore route of a switch); repeatable, each a variant of its own",
    )
    ap.add_argument("--json", dest="json_out", help="write every row here")
    ap.add_argument(
        "--outdir", help="where outputs are written (default WORKDIR/out; tmpfs keeps disk out)"
    )
    a = ap.parse_args()
    if sys.flags.dont_write_bytecode:
        print(
            "note: PYTHONDONTWRITEBYTECODE is set: every contender compiles the modules that have "
            "no compiled copy yet, each run (run `python -m compileall` on them first)",
            flush=True,
        )
    total = 64 * MIB if a.quick else int(a.gib * GIB)
    leaf = {"one": (8 if a.quick else a.leaf_mib) * MIB, "sharded": (8 if a.quick else 64) * MIB}
    counts = sorted({CPUS if t == "all" else int(t) for t in a.threads.split(",")})
    work = Path(a.workdir)
    out = Path(a.outdir) if a.outdir else work / "out"
    report: dict[str, Any] = {"cpus": CPUS, "threads": counts, "layouts": {}}
    for layout in a.layouts.split(","):
        root = build(work, layout, total, leaf[layout])
        nbytes = (total // leaf[layout]) * leaf[layout]
        cat(root)  # a hot page cache for everyone
        print(f"{layout}: {root}", flush=True)
        variants = [dict([e]) for e in a.env]
        rows, same = sweep(root, work, out, counts, a.repeat, variants)
        rows = orbax_runs(root, out, a.repeat) + rows
        report["layouts"][layout] = {"rows": table(layout, rows, nbytes), "same_output": same}
        print(f"same output at every thread count: {same}")
    report["load"] = os.getloadavg()
    if a.json_out:
        Path(a.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json_out).write_text(json.dumps(report, indent=1))
        print(f"wrote {a.json_out}")


if __name__ == "__main__":
    main()
