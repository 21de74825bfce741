"""Benchmark ``ckpt trend`` of a run against ``verify --deep`` of the same steps and against
what a user does today (an Orbax restore of every step, then numpy), same run.

Run from the repository root::

    .venv/bin/python bench/bench_trend.py              # 4 steps x 256 MiB
    .venv/bin/python bench/bench_trend.py --mib 1024   # the issue's 4 x 1 GiB
    .venv/bin/python bench/bench_trend.py --workers 2 --no-numpy   # trend on 1 vs 2 workers

The run is built once with REAL Orbax under ``bench/out/trend/`` (git-ignored): a
CheckpointManager root of 4 steps, ``params.embed`` of ``--mib`` MiB float32 saved in 4 MiB
chunks (``SaveArgs(chunk_byte_size=)``; ``--chunk-mib``, 0: one chunk, as a save from one
device writes it), changed a little at each step, and a small kernel.
Each contender runs ``--repeat`` times in a fresh process with a hot page cache, the contenders
taking turns; the median wall and CPU time (user + system) and the peak RSS (``wait4``) are
reported, with the load (``uptime``) before and after: on a shared host, load stretches wall
time far more than CPU time. ``ckpt trend, CKPT_KERNELS=0`` is trend with its statistics in
numpy (``core/trend/kernel.py``); ``--no-orbax`` leaves out the Orbax restore, which holds
about 10 GiB at ``--mib 1024``. ``--workers N`` adds ``ckpt trend --workers N --force-split``
(local worker processes, units of the default ``--unit-bytes``; its peak RSS is the largest
process's: the driver or one worker); ``--no-numpy`` leaves out the numpy contender.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from _harness import (
    Run,
    bench_env,  # bench/ is on sys.path when a script runs
)
from _harness import run_rss as _run_rss

REPO = Path(__file__).resolve().parent.parent
WORKDIR = REPO / "bench" / "out" / "trend"
RESULT_JSON = REPO / "bench" / "out" / "trend.json"
PYTHON = sys.executable
ENV = bench_env(JAX_PLATFORMS="cpu")
ENV.pop("XLA_FLAGS", None)
CKPT = [PYTHON, "-m", "ckpt_cli"]
STEPS = 4

BUILD = r"""
import sys
import jax, numpy as np, orbax.checkpoint as ocp
root, mib, chunk_mib = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rows = mib * (1 << 20) // (4 * 1024)
embed = np.random.default_rng(0).standard_normal((rows, 1024), dtype=np.float32)
with ocp.CheckpointManager(root, options=ocp.CheckpointManagerOptions(create=True)) as mngr:
    for step in range(1, 5):
        embed[:: 97] += 0.01
        state = {"params": {"embed": embed, "kernel": np.full((64, 64), step, np.float32)}}
        chunks = ocp.SaveArgs(chunk_byte_size=chunk_mib << 20) if chunk_mib else ocp.SaveArgs()
        save_args = jax.tree.map(lambda _: chunks, state)
        mngr.save(step, args=ocp.args.StandardSave(state, save_args=save_args))
        mngr.wait_until_finished()
"""

RESTORE = r"""
import sys
import numpy as np, orbax.checkpoint as ocp
root = sys.argv[1]
prev = None
for step in range(1, 5):
    tree = ocp.StandardCheckpointer().restore(f"{root}/{step}/default")
    x = np.asarray(tree["params"]["embed"], np.float64)
    norm = float(np.sqrt(np.sum(x * x)))
    if prev is not None:
        d = x - prev
        print(step, norm, float(np.sqrt(np.sum(d * d))))
    prev = x
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mib", type=int, default=256, help="size of the large leaf per step")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument(
        "--chunk-mib",
        type=int,
        default=4,
        help="chunk size the leaves are saved in; 0: one chunk per leaf (a save from one device)",
    )
    ap.add_argument(
        "--no-orbax",
        action="store_true",
        help="leave out the Orbax restore (it holds ~10 GiB at --mib 1024)",
    )
    ap.add_argument(
        "--workers",
        type=int,
        default=0,
        help="also time trend on this many local worker processes (--force-split)",
    )
    ap.add_argument("--no-numpy", action="store_true", help="leave out CKPT_KERNELS=0")
    args = ap.parse_args()
    root = (
        WORKDIR / f"run_{args.mib}mib"
        if args.chunk_mib == 4
        else (WORKDIR / f"run_{args.mib}mib_chunk{args.chunk_mib}mib")
    )
    if not (root / str(STEPS) / "commit_success.txt").exists():
        print(f"building {root} with Orbax ...", flush=True)
        subprocess.run(
            [PYTHON, "-c", BUILD, str(root), str(args.mib), str(args.chunk_mib)],
            check=True,
            env=ENV,
        )
    subprocess.run(f"find {root} -type f -exec cat {{}} + > /dev/null", shell=True, check=True)
    load_before = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    trend_cmd = [*CKPT, "trend", str(root), "--json"]
    contenders = {
        "ckpt trend": (trend_cmd, ENV),
        "ckpt verify --deep": ([*CKPT, "verify", str(root), "--deep", "--json"], ENV),
    }
    if args.workers:
        scaled = [*trend_cmd, "--workers", str(args.workers), "--force-split"]
        contenders[f"ckpt trend --workers {args.workers}"] = (scaled, ENV)
    if not args.no_numpy:
        # The same trend with its statistics in numpy (what it ran before the kernel).
        contenders["ckpt trend, CKPT_KERNELS=0"] = (trend_cmd, {**ENV, "CKPT_KERNELS": "0"})
    if not args.no_orbax:
        contenders["(a) orbax restore + numpy"] = ([PYTHON, "-c", RESTORE, str(root)], ENV)
    runs: dict[str, list[Run]] = {name: [] for name in contenders}
    for _ in range(args.repeat):  # interleaved: a change of load falls on every contender
        for name, (cmd, env) in contenders.items():
            runs[name].append(_run_rss(cmd, (0,), env))
    rows = []
    for name, got in runs.items():
        mid = len(got) // 2
        rows.append(
            {
                "contender": name,
                "wall_s": round(sorted(r.wall_s for r in got)[mid], 2),
                "cpu_s": round(sorted(r.cpu_s for r in got)[mid], 2),
                "peak_rss_mib": round(max(r.rss_mib for r in got)),
            }
        )
    load_after = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    named = {r["contender"]: r for r in rows}
    trend, verify = named["ckpt trend"], named["ckpt verify --deep"]
    numpy_trend = named.get("ckpt trend, CKPT_KERNELS=0")
    workers = named.get(f"ckpt trend --workers {args.workers}")
    orbax = named.get("(a) orbax restore + numpy")
    result = {
        "cpus": os.cpu_count(),
        "steps": STEPS,
        "leaf_mib": args.mib,
        "chunk_mib": args.chunk_mib or args.mib,
        "load_before": load_before,
        "load_after": load_after,
        "rows": rows,
        "trend_vs_verify_time": round(trend["wall_s"] / verify["wall_s"], 2),
        "trend_vs_verify_cpu": round(trend["cpu_s"] / verify["cpu_s"], 2),
    }
    if numpy_trend is not None:
        result["numpy_trend_vs_verify_time"] = round(numpy_trend["wall_s"] / verify["wall_s"], 2)
        result["numpy_trend_vs_verify_cpu"] = round(numpy_trend["cpu_s"] / verify["cpu_s"], 2)
    if workers is not None:
        result["workers"] = args.workers
        result["workers_vs_one_time"] = round(workers["wall_s"] / trend["wall_s"], 2)
        result["workers_vs_verify_time"] = round(workers["wall_s"] / verify["wall_s"], 2)
        docs = [json.loads(runs[name][0].out) for name in ("ckpt trend", workers["contender"])]
        result["workers_scale"] = docs[1].pop("scale")
        docs[0].pop("scale")
        result["workers_same_document"] = docs[0] == docs[1]
    if orbax is not None:
        result["trend_vs_orbax_time"] = round(trend["wall_s"] / orbax["wall_s"], 2)
        result["trend_vs_orbax_rss"] = round(trend["peak_rss_mib"] / orbax["peak_rss_mib"], 2)
    for r in rows:
        print(
            f"{r['contender']:<28} {r['wall_s']:>7.2f} s wall {r['cpu_s']:>7.2f} s CPU"
            f" {r['peak_rss_mib']:>6} MiB"
        )
    print(json.dumps(result, indent=2))
    RESULT_JSON.parent.mkdir(parents=True, exist_ok=True)
    RESULT_JSON.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
