"""Benchmark ``ckpt diff`` of one large leaf against ``verify --deep`` of the same step and
against an Orbax restore of both steps compared with numpy, same run.

Run from the repository root::

    .venv/bin/python bench/bench_diff.py               # a 512 MiB leaf (issue 12's case)
    .venv/bin/python bench/bench_diff.py --mib 256     # smaller, on a busy machine

The checkpoint is built once with REAL Orbax and cached under ``bench/out/diff/`` (git-ignored;
delete it to rebuild): a CheckpointManager root, steps 1 and 2, ``params.embed`` of ``--mib``
MiB float32 random normal values saved from one device (so the leaf is ONE chunk, as a
single-device job writes it), a few small leaves; step 2 changes four rows of the embedding.
With a hot page cache each contender runs ``--repeat`` times in a fresh process; the median
wall time is reported with that process's peak RSS (``wait4``):

ckpt diff A@1 A@2 --filter embed
    both sides read and compared (the exit status is 1: they differ).
ckpt verify A --step 1 --deep
    one side read, decoded and checked: what streaming costs on the same bytes.
(b) ckpt diff at ``--baseline REV`` (optional)
    the same diff run from the ``ckpt_cli/`` of an older commit (``git archive``, same venv):
    e.g. ``--baseline 9f38a34~1``, the diff before it streamed (whole chunks, float64 copies).
(a) orbax restore + numpy
    what a user does today: restore ``params.embed`` of both steps as numpy arrays, then
    ``np.abs(a - b).max()`` and ``np.count_nonzero(a != b)``.

The machine's load (``uptime``) is printed before and after: the figures are ratios of one run.
Results: a table on stdout and JSON in ``bench/out/diff.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

from _harness import Run, bench_env  # bench/ is on sys.path when a script runs
from _harness import run_rss as _run_rss

REPO = Path(__file__).resolve().parent.parent
WORKDIR = REPO / "bench" / "out" / "diff"
RESULT_JSON = REPO / "bench" / "out" / "diff.json"
PYTHON = sys.executable
ENV = bench_env(JAX_PLATFORMS="cpu")
ENV.pop("XLA_FLAGS", None)
CKPT = [PYTHON, "-m", "ckpt_cli"]
MIB = 1 << 20

BUILD = r"""
import sys
import jax, numpy as np, orbax.checkpoint as ocp
root, mib = sys.argv[1], int(sys.argv[2])
rows = mib * (1 << 20) // (4 * 1024)
embed = np.random.default_rng(0).standard_normal((rows, 1024), dtype=np.float32)
with ocp.CheckpointManager(root, options=ocp.CheckpointManagerOptions(create=True)) as mngr:
    for step in (1, 2):
        if step == 2:
            embed[:4] += 1.0
        rng = np.random.default_rng(step)
        state = {
            "params": {
                "embed": jax.device_put(embed),
                "dense": {"kernel": rng.standard_normal((64, 128), dtype=np.float32)},
            },
            "step": np.int64(step),
        }
        mngr.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state)))
        mngr.wait_until_finished()
"""

RESTORE = r"""
import sys, time
import numpy as np, orbax.checkpoint as ocp
root = sys.argv[1]
t0 = time.perf_counter()
out = []
for step in (1, 2):
    item = f"{root}/{step}/state"
    ckptr = ocp.PyTreeCheckpointer()
    meta = ckptr.metadata(item).item_metadata.tree
    args = {"params": {"embed": ocp.RestoreArgs(restore_type=np.ndarray)}}
    tree = ckptr.restore(
        item,
        args=ocp.args.PyTreeRestore(
            item={"params": {"embed": meta["params"]["embed"]}},
            restore_args=args,
            partial_restore=True,
        ),
    )
    out.append(tree["params"]["embed"])
a, b = out
print("DIFF", float(np.abs(a - b).max()), int(np.count_nonzero(a != b)))
"""


def run_rss(cmd: list[str], ok: tuple[int, ...] = (0,)) -> Run:
    return _run_rss(cmd, ok, ENV)


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def baseline(rev: str) -> Path:
    """``ckpt_cli/`` of ``rev`` extracted under bench/out/ (run with this venv's libraries)."""
    sha = subprocess.run(
        ["git", "rev-parse", "--short", rev], capture_output=True, text=True, check=True, cwd=REPO
    ).stdout.strip()
    out = REPO / "bench" / "out" / f"baseline-{sha}"
    if not (out / "ckpt_cli").exists():
        out.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(
            ["git", "archive", sha, "ckpt_cli"], capture_output=True, check=True, cwd=REPO
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(out)], input=archive, check=True)
    return out


def ensure(root: Path, mib: int) -> Path:
    if not (root / "2" / "commit_success.txt").exists():
        print(f"building {root} with Orbax ({mib} MiB leaf) ...", flush=True)
        subprocess.run([PYTHON, "-c", BUILD, str(root), str(mib)], check=True, env=ENV)
    return root


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mib", type=int, default=512, help="size of the large leaf")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--baseline", help="a git revision whose ckpt diff runs as a contender")
    args = ap.parse_args()
    root = ensure(WORKDIR / f"big_{args.mib}mib", args.mib)
    subprocess.run(f"find {root} -type f -exec cat {{}} + > /dev/null", shell=True, check=True)
    load_before = uptime()
    contenders = {
        "ckpt diff @1 @2 --filter embed": (
            [*CKPT, "diff", f"{root}@1", f"{root}@2", "--filter", "embed"],
            (1,),
        ),
        "ckpt verify --step 1 --deep": (
            [*CKPT, "verify", str(root), "--step", "1", "--deep"],
            (0,),
        ),
        "(a) orbax restore both + numpy": ([PYTHON, "-c", RESTORE, str(root)], (0,)),
    }
    if args.baseline:
        old = baseline(args.baseline)
        contenders[f"(b) ckpt diff at {args.baseline}"] = (
            [
                PYTHON,
                "-c",
                f"import sys; sys.path.insert(0, {str(old)!r}); "
                "from ckpt_cli.app import main; sys.argv[0] = 'ckpt'; main()",
                "diff",
                f"{root}@1",
                f"{root}@2",
                "--filter",
                "embed",
            ],
            (1,),
        )
    rows = []
    for name, (cmd, ok) in contenders.items():
        runs = sorted((run_rss(cmd, ok) for _ in range(args.repeat)), key=lambda r: r.wall_s)
        best = runs[len(runs) // 2]
        rows.append(
            {
                "contender": name,
                "wall_s": round(best.wall_s, 2),
                "peak_rss_mib": round(max(r.rss_mib for r in runs), 0),
                "runs_s": [round(r.wall_s, 2) for r in runs],
            }
        )
    load_after = uptime()
    diff, verify, orbax = rows[0], rows[1], rows[2]
    result = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "leaf_mib": args.mib,
        "load_before": load_before,
        "load_after": load_after,
        "rows": rows,
        "ratios": {
            "diff_vs_verify_time": round(diff["wall_s"] / verify["wall_s"], 2),
            "diff_vs_verify_rss": round(diff["peak_rss_mib"] / verify["peak_rss_mib"], 2),
            "diff_vs_orbax_time": round(diff["wall_s"] / orbax["wall_s"], 2),
            "diff_vs_orbax_rss": round(diff["peak_rss_mib"] / orbax["peak_rss_mib"], 2),
        },
    }
    if len(rows) > 3:
        old_row = rows[3]
        result["ratios"]["diff_vs_baseline_time"] = round(diff["wall_s"] / old_row["wall_s"], 2)
        result["ratios"]["diff_vs_baseline_rss"] = round(
            diff["peak_rss_mib"] / old_row["peak_rss_mib"], 2
        )
    print(f"leaf: params.embed, {args.mib} MiB float32, one chunk; hot page cache")
    print(f"load before: {load_before}")
    print(f"{'contender':34} {'wall s':>8} {'peak RSS MiB':>13}  runs")
    for r in rows:
        print(f"{r['contender']:34} {r['wall_s']:8.2f} {r['peak_rss_mib']:13.0f}  {r['runs_s']}")
    print(f"load after:  {load_after}")
    print("ratios:", result["ratios"])
    RESULT_JSON.parent.mkdir(parents=True, exist_ok=True)
    RESULT_JSON.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
