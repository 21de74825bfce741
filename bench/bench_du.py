"""Benchmark ``ckpt du`` against the routes a user has today: ``du -sb`` (sizes, no leaves, no
garbage) and ``ckpt ls`` / ``ckpt ls -v`` (the read command ``du`` should cost about as much as).

Run from the repository root::

    .venv/bin/python bench/bench_du.py [--steps 1000] [--repeat 3] [--workdir DIR]
        [--bucket] [--baseline DIR] [--deep-steps 20]

The root (built once, cached in ``bench/out/du/``, git-ignored): ``--steps`` copies of the real
Orbax step ``fixtures/ckpts/seed_mlp/500`` (OCDBT, merged root, 15 leaves), plus one unfinished
save copied under a ``.orbax-checkpoint-tmp`` name. Each command runs ``--repeat`` times in a
fresh process (import time counts, as at a shell) after one warm-up run whose output is
checked; the median wall time, CPU time and peak RSS are reported, with the core count and load.

``--bucket``: the root is also put into moto's S3 server (in this process, on 127.0.0.1:
``tests/support/remote_servers.py``, which counts every request), with one multipart upload
left open, and ``ckpt ls -v`` / ``ckpt du`` run against it too; the table gives each route's
requests per run (``LIST`` = ListObjectsV2 pages of 1,000 keys, ``GET``...). moto is Python: on
a small host its own work bounds the wall time, so the request counts matter more there; and
a child forked from this process (which then holds moto) reports its parent's pages in its
peak RSS: take memory figures from a run without ``--bucket``.
``--baseline DIR``: ``ckpt du`` also runs with another commit's package
(``git archive REV ckpt_cli | tar -x -C DIR``), in the same run. ``--deep-steps N``: ``ckpt du
--deep`` on the first N steps' copy (every leaf read and hashed), against ``ckpt digest`` of
one step times N.
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
from typing import Any

from _harness import REPO, Run, bench_env, run_rss

sys.path.insert(0, str(REPO))
from tests.support.remote_servers import BUCKET, S3Server, local_files, s3_environment

STEP = REPO / "fixtures" / "ckpts" / "seed_mlp" / "500"


def build(root: Path, steps: int) -> None:
    if (root / f"{steps - 1}").is_dir():
        return
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    for i in range(steps):
        shutil.copytree(STEP, root / str(i))
    shutil.copytree(STEP, root / f"{steps}.orbax-checkpoint-tmp-1")


def put_root(server: S3Server, root: Path, prefix: str) -> str:
    """The root as objects under ``prefix``, and one multipart upload left open in it."""
    client = server.client()
    client.create_bucket(Bucket=BUCKET)
    server.put_objects((f"{prefix}/{rel}", p.read_bytes()) for rel, p in local_files(root))
    key = f"{prefix}/0/default/d/{'a' * 32}"
    upload = client.create_multipart_upload(Bucket=BUCKET, Key=key)["UploadId"]
    client.upload_part(Bucket=BUCKET, Key=key, PartNumber=1, UploadId=upload, Body=b"x" * 4096)
    return f"s3://{BUCKET}/{prefix}"


def measure(
    cmd: list[str], env: dict[str, str], repeat: int, server: S3Server | None
) -> dict[str, Any]:
    if server is not None:
        server.reset_counts()
    runs: list[Run] = [run_rss(cmd, env=env) for _ in range(repeat)]
    out: dict[str, Any] = {
        "wall_s": statistics.median(r.wall_s for r in runs),
        "cpu_s": statistics.median(r.cpu_s for r in runs),
        "rss_mib": max(r.rss_mib for r in runs),
    }
    if server is not None:
        out["requests"] = {k: v // repeat for k, v in sorted(server.counts.items())}
    return out


def routes(
    root: Path, a: argparse.Namespace, url: str | None, s3_env: dict[str, str]
) -> dict[str, tuple[list[str], dict[str, str]]]:
    ckpt = [sys.executable, "-m", "ckpt_cli"]
    local = bench_env()
    out = {
        "du -sb (today)": (["du", "-sb", str(root)], local),
        "ckpt ls": ([*ckpt, "ls", str(root)], local),
        "ckpt ls -v": ([*ckpt, "ls", "-v", str(root)], local),
        "ckpt du": ([*ckpt, "du", str(root)], local),
        "ckpt du --json": ([*ckpt, "du", str(root), "--json"], local),
    }
    # -P: the current directory (this checkout) is not put before PYTHONPATH's package.
    old = [sys.executable, "-P", "-m", "ckpt_cli"]
    if a.baseline:
        base = {**local, "PYTHONPATH": str(a.baseline.resolve())}
        out["ckpt du (baseline)"] = ([*old, "du", str(root)], base)
    if url is not None:
        out["s3: ckpt ls -v"] = ([*ckpt, "ls", "-v", url], s3_env)
        out["s3: ckpt du"] = ([*ckpt, "du", url], s3_env)
        if a.baseline:
            base = {**s3_env, "PYTHONPATH": str(a.baseline.resolve())}
            out["s3: ckpt du (baseline)"] = ([*old, "du", url], base)
    if a.deep_steps:
        few = root.parent / f"root_{a.deep_steps}steps"
        build(few, a.deep_steps)
        out[f"ckpt du --deep ({a.deep_steps} steps)"] = ([*ckpt, "du", str(few), "--deep"], local)
        out["ckpt digest (1 step)"] = ([*ckpt, "digest", str(few / "0" / "default")], local)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workdir", type=Path, default=REPO / "bench" / "out" / "du")
    ap.add_argument("--bucket", action="store_true")
    ap.add_argument("--baseline", type=Path, default=None)
    ap.add_argument("--deep-steps", type=int, default=0)
    a = ap.parse_args()
    root = a.workdir / f"root_{a.steps}steps"
    build(root, a.steps)
    server = S3Server().start() if a.bucket else None
    url = put_root(server, root, "du-bench") if server else None
    s3_env = bench_env(**s3_environment(server.endpoint)) if server else {}
    todo = routes(root, a, url, s3_env)
    warm = json.loads(run_rss([*todo["ckpt du --json"][0]], env=todo["ckpt du"][1]).out)
    assert len(warm["steps"]) == a.steps and len(warm["garbage"]) == 1, "unexpected du output"
    results: dict[str, dict[str, Any]] = {}
    for name, (cmd, env) in todo.items():
        remote = name.startswith("s3:")
        run_rss(cmd, env=env)  # warm-up: the page cache, moto's first answers
        results[name] = measure(cmd, env, a.repeat, server if remote else None)
    base = results["ckpt ls"]["wall_s"]
    print(f"{a.steps} steps, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")
    for name, r in results.items():
        requests = " ".join(f"{k} {v}" for k, v in r.get("requests", {}).items())
        print(
            f"{name:<28} {r['wall_s']:7.2f} s  cpu {r['cpu_s']:6.2f} s  "
            f"{r['rss_mib']:6.0f} MiB  x{r['wall_s'] / base:.2f} of ckpt ls  {requests}"
        )
    out = REPO / "bench" / "out" / "du.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"steps": a.steps, "cores": os.cpu_count(), "load": os.getloadavg()[0], **results}
    out.write_text(json.dumps(doc, indent=1))
    if server is not None:
        server.stop()


if __name__ == "__main__":
    main()
