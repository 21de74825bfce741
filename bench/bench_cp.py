"""Benchmark ``ckpt cp`` of a root of many small steps into S3, against the routes users have.

Run from the repository root::

    .venv/bin/python bench/bench_cp.py [--steps 40] [--latency 0.025]

The root is ``--steps`` copies of a real Orbax step (seed_mlp's, 15 files of 2 KiB each). moto's
S3 server runs in this process on 127.0.0.1; every request it serves first sleeps
``--latency`` seconds in its own thread, standing in for the round trip to a real bucket
(requests in flight overlap, as they would). Each contender writes into a fresh prefix:

* ``boto serial``: a loop of ``put_object`` (what a one-off script does);
* ``boto 10 threads``: the same with 10 uploads at once (``aws s3 cp --recursive``'s default
  ``max_concurrent_requests``), no commit order at all;
* ``ckpt cp --concurrency 1`` and ``ckpt cp`` (16): in this process through ``plan_copy`` and
  ``execute_copy`` (import time excluded: a warm-up copy runs first);
* ``ckpt cp rerun``: the same copy again, every file already there (known from the listing's
  ETags and the source's bytes, nothing read back).

Reported: wall time, PUT and GET requests, the floor ``requests x latency / in flight`` and the
ratio to ``boto serial``. Results: a table on stdout and ``bench/out/cp.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO)]

from tests.support.prune_roots import copy_steps  # noqa: E402
from tests.support.remote_servers import BUCKET, S3Server, local_files, s3_environment  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--latency", type=float, default=0.025)
    args = ap.parse_args()

    server = S3Server().start()
    os.environ.update(s3_environment(server.endpoint))
    client = server.client()
    client.create_bucket(Bucket=BUCKET)
    lock = threading.Lock()

    def delay(method: str, path: str) -> None:
        time.sleep(args.latency)

    tmp = Path(tempfile.mkdtemp(prefix="bench-cp-"))
    root = copy_steps(tmp / "run", range(1, args.steps + 1))
    files = list(local_files(root))
    total = sum(p.stat().st_size for _, p in files)

    from ckpt_cli.core.copy.execute import execute_copy
    from ckpt_cli.core.copy.plan import plan_copy

    def ckpt(prefix: str, concurrency: int) -> None:
        plan = plan_copy(str(root), f"s3://{BUCKET}/{prefix}", concurrency=concurrency)
        execute_copy(plan)

    def boto(prefix: str, threads: int) -> None:
        def put(item: tuple[str, Path]) -> None:
            rel, p = item
            client.put_object(Bucket=BUCKET, Key=f"{prefix}/{rel}", Body=p.read_bytes())

        if threads == 1:
            for item in files:
                put(item)
        else:
            with ThreadPoolExecutor(threads) as pool:
                list(pool.map(put, files))

    ckpt("warm-up", 16)  # imports TensorStore, opens the store
    rerun_prefix = f"c-{uuid.uuid4().hex[:6]}"
    contenders: list[tuple[str, Any, int]] = [
        ("boto serial", lambda p: boto(p, 1), 1),
        ("boto 10 threads", lambda p: boto(p, 10), 10),
        ("ckpt cp --concurrency 1", lambda p: ckpt(p, 1), 1),
        ("ckpt cp", lambda p: ckpt(rerun_prefix, 16), 16),
        ("ckpt cp rerun", lambda p: ckpt(rerun_prefix, 16), 16),
    ]
    server.before_request = delay
    rows = []
    for name, fn, inflight in contenders:
        server.reset_counts()
        started = time.perf_counter()
        fn(f"b-{uuid.uuid4().hex[:6]}")
        wall = time.perf_counter() - started
        with lock:
            counts = dict(server.counts)
        requests = sum(counts.values())
        rows.append(
            {
                "contender": name,
                "seconds": round(wall, 2),
                "requests": counts,
                "floor_s": round(requests * args.latency / inflight, 2),
            }
        )
    server.before_request = None
    server.stop()
    base = rows[0]["seconds"]
    print(
        f"{args.steps} steps, {len(files)} files, {total / 1024:.0f} KiB; "
        f"{args.latency * 1000:.0f} ms per request; load {os.getloadavg()[0]:.1f}"
    )
    print(f"{'contender':<26}{'seconds':>9}{'floor s':>9}{'x serial':>10}  requests")
    for r in rows:
        r["speedup"] = round(base / r["seconds"], 1) if r["seconds"] else None
        print(
            f"{r['contender']:<26}{r['seconds']:>9.2f}{r['floor_s']:>9.2f}"
            f"{r['speedup']:>10}  {json.dumps(r['requests'], sort_keys=True)}"
        )
    out = REPO / "bench" / "out"
    out.mkdir(parents=True, exist_ok=True)
    (out / "cp.json").write_text(
        json.dumps(
            {"steps": args.steps, "files": len(files), "bytes": total, "rows": rows}, indent=1
        )
    )


if __name__ == "__main__":
    main()
