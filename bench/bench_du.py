"""Benchmark ``ckpt du`` against the routes a user has today: ``du -sb`` (sizes, no leaves, no
garbage) and ``ckpt ls`` (the read command ``du`` should cost about as much as).

Run from the repository root::

    .venv/bin/python bench/bench_du.py [--steps 1000] [--repeat 3] [--workdir DIR]

The root (built once, cached in ``bench/out/du/``, git-ignored): ``--steps`` copies of the real
Orbax step ``fixtures/ckpts/seed_mlp/500`` (OCDBT, merged root, 15 leaves), plus one unfinished
save copied under a ``.orbax-checkpoint-tmp`` name. Each command runs ``--repeat`` times in a
fresh process (import time counts, as at a shell) after one warm-up run whose output is
checked; the median wall time, CPU time and peak RSS are reported, with the core count and load.
Results: a table on stdout and JSON in ``bench/out/du.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
from pathlib import Path

from _harness import REPO, Run, bench_env, run_rss

STEP = REPO / "fixtures" / "ckpts" / "seed_mlp" / "500"


def build(root: Path, steps: int) -> None:
    if (root / f"{steps - 1}").is_dir():
        return
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    for i in range(steps):
        shutil.copytree(STEP, root / str(i))
    shutil.copytree(STEP, root / f"{steps}.orbax-checkpoint-tmp-1")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workdir", type=Path, default=REPO / "bench" / "out" / "du")
    a = ap.parse_args()
    root = a.workdir / f"root_{a.steps}steps"
    build(root, a.steps)
    ckpt = [sys.executable, "-m", "ckpt_cli"]
    routes = {
        "du -sb (today)": ["du", "-sb", str(root)],
        "ckpt ls": [*ckpt, "ls", str(root)],
        "ckpt du": [*ckpt, "du", str(root)],
        "ckpt du --json": [*ckpt, "du", str(root), "--json"],
    }
    warm = json.loads(run_rss(routes["ckpt du --json"]).out)
    assert len(warm["steps"]) == a.steps and len(warm["garbage"]) == 1, "unexpected du output"
    results: dict[str, dict[str, float]] = {}
    for name, cmd in routes.items():
        runs: list[Run] = [run_rss(cmd, env=bench_env()) for _ in range(a.repeat)]
        results[name] = {
            "wall_s": statistics.median(r.wall_s for r in runs),
            "cpu_s": statistics.median(r.cpu_s for r in runs),
            "rss_mib": max(r.rss_mib for r in runs),
        }
    base = results["ckpt ls"]["wall_s"]
    print(f"{a.steps} steps, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")
    for name, r in results.items():
        print(
            f"{name:<16} {r['wall_s']:7.2f} s  cpu {r['cpu_s']:6.2f} s  "
            f"{r['rss_mib']:6.0f} MiB  x{r['wall_s'] / base:.2f} of ckpt ls"
        )
    out = REPO / "bench" / "out" / "du.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"steps": a.steps, "cores": os.cpu_count(), "load": os.getloadavg()[0], **results}
    out.write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
