"""Benchmark ``ckpt average`` of three steps against what a user does today: a numpy script that
restores every step with Orbax and averages them (``np.mean`` of the stacked values), and the same
script saving the result with Orbax, same run.

Run from the repository root::

    .venv/bin/python bench/bench_average.py              # 3 steps x 128 MiB
    .venv/bin/python bench/bench_average.py --mib 1024   # the issue's 3 x 1 GiB

The run is built once with REAL Orbax under ``bench/out/average/`` (git-ignored): a
CheckpointManager root of 3 steps, ``params.embed`` of ``--mib`` MiB float32 saved in 4 MiB
chunks (``SaveArgs(chunk_byte_size=)``), different at each step, a small kernel and the step.
Each contender runs ``--repeat`` times in a fresh process with a hot page cache; the median wall
and CPU (user + system) times and the peak RSS (``wait4``) are reported, with the load
(``uptime``) before and after and the core count. ``ckpt average`` runs with
``--memory-limit`` (default 256 MiB).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from _harness import bench_env  # bench/ is on sys.path when a script runs
from _harness import run_rss as _run_rss

REPO = Path(__file__).resolve().parent.parent
WORKDIR = REPO / "bench" / "out" / "average"
RESULT_JSON = REPO / "bench" / "out" / "average.json"
PYTHON = sys.executable
ENV = bench_env(JAX_PLATFORMS="cpu")
ENV.pop("XLA_FLAGS", None)
CKPT = [PYTHON, "-m", "ckpt_cli"]
STEPS = (1, 2, 3)

BUILD = r"""
import sys
import jax, numpy as np, orbax.checkpoint as ocp
root, mib = sys.argv[1], int(sys.argv[2])
rows = mib * (1 << 20) // (4 * 1024)
rng = np.random.default_rng(0)
embed = rng.standard_normal((rows, 1024), dtype=np.float32)
with ocp.CheckpointManager(root, options=ocp.CheckpointManagerOptions(create=True)) as mngr:
    for step in (1, 2, 3):
        embed[:: 7] += 0.01 * step
        state = {"params": {"embed": embed, "kernel": np.full((64, 64), step, np.float32)},
                 "step": np.int32(step)}
        save_args = jax.tree.map(lambda _: ocp.SaveArgs(chunk_byte_size=4 << 20), state)
        mngr.save(step, args=ocp.args.StandardSave(state, save_args=save_args))
        mngr.wait_until_finished()
"""

#: The route users have today: every step restored whole, then numpy's mean.
NUMPY = r"""
import sys
import jax, numpy as np, orbax.checkpoint as ocp
root, out = sys.argv[1], sys.argv[2]
trees = [ocp.StandardCheckpointer().restore(f"{root}/{s}/default") for s in (1, 2, 3)]
avg = jax.tree.map(lambda *x: np.mean(np.stack([np.asarray(v) for v in x]), axis=0).astype(x[-1].dtype), *trees)
print(float(avg["params"]["embed"][0, 0]))
if out != "-":
    with ocp.CheckpointManager(out, options=ocp.CheckpointManagerOptions(create=True)) as mngr:
        mngr.save(3, args=ocp.args.StandardSave(avg))
        mngr.wait_until_finished()
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mib", type=int, default=128, help="size of the large leaf per step")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--memory-limit", default="256MiB")
    args = ap.parse_args()
    root = WORKDIR / f"run_{args.mib}mib"
    out = WORKDIR / "out"
    if not (root / "3" / "commit_success.txt").exists():
        print(f"building {root} with Orbax ...", flush=True)
        subprocess.run([PYTHON, "-c", BUILD, str(root), str(args.mib)], check=True, env=ENV)
    subprocess.run(f"find {root} -type f -exec cat {{}} + > /dev/null", shell=True, check=True)
    load_before = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    steps = ",".join(map(str, STEPS))
    average = [*CKPT, "average", str(root), str(out), "--steps", steps]
    contenders = {
        "ckpt average": [*average, "--memory-limit", args.memory_limit, "--json"],
        "(a) orbax restore + numpy mean": [PYTHON, "-c", NUMPY, str(root), "-"],
        "(b) (a) + orbax save": [PYTHON, "-c", NUMPY, str(root), str(out)],
    }
    rows = []
    for name, cmd in contenders.items():
        runs = []
        for _ in range(args.repeat):
            shutil.rmtree(out, ignore_errors=True)
            runs.append(_run_rss(cmd, (0,), ENV))
        runs.sort(key=lambda r: r.cpu_s)
        rows.append(
            {
                "contender": name,
                "wall_s": round(sorted(r.wall_s for r in runs)[len(runs) // 2], 2),
                "cpu_s": round(runs[len(runs) // 2].cpu_s, 2),
                "peak_rss_mib": round(max(r.rss_mib for r in runs)),
            }
        )
    shutil.rmtree(out, ignore_errors=True)
    load_after = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    ours, numpy_only, numpy_save = rows
    result = {
        "cpus": os.cpu_count(),
        "steps": len(STEPS),
        "leaf_mib": args.mib,
        "memory_limit": args.memory_limit,
        "load_before": load_before,
        "load_after": load_after,
        "rows": rows,
        "cpu_vs_numpy": round(ours["cpu_s"] / numpy_only["cpu_s"], 2),
        "cpu_vs_numpy_and_save": round(ours["cpu_s"] / numpy_save["cpu_s"], 2),
        "rss_vs_numpy": round(ours["peak_rss_mib"] / numpy_only["peak_rss_mib"], 2),
    }
    for r in rows:
        print(
            f"{r['contender']:<32} {r['wall_s']:>7.2f} s wall {r['cpu_s']:>7.2f} s CPU "
            f"{r['peak_rss_mib']:>6} MiB"
        )
    print(json.dumps(result, indent=2))
    RESULT_JSON.parent.mkdir(parents=True, exist_ok=True)
    RESULT_JSON.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
