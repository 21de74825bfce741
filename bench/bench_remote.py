"""Benchmark ``ckpt ls`` and ``ckpt inspect`` on ``s3://`` against a store on 127.0.0.1.

Run from the repository root::

    .venv/bin/python bench/bench_remote.py [--steps 1000] [--leaves 10000] [--repeat 3]

The checkpoints are the ones ``bench_ls_inspect.py`` builds with real Orbax (cached under
``bench/out/ls_inspect/``): a root of ``--steps`` steps and a step whose item holds ``--leaves``
leaves. They are uploaded as plain objects to moto's S3 server, started in this process on a
free port of 127.0.0.1 (``tests/support/remote_servers.py``), which counts every request it serves.

Each command runs ``--repeat`` times in a fresh subprocess (import time counts) after a warm-up
whose output is checked, against the bucket and against the same files on local disk; the median
wall time, the ratio and the requests one run made (``LIST`` = ListObjectsV2 pages of 1,000 keys,
``GET``, ``HEAD``, ``PUT``) are reported. The server is Python: its per-request cost (about 1-3
ms here) stands in for network latency, so request counts matter more than seconds.
Results: a table on stdout and the same as JSON in ``bench/out/remote.json``.

With ``--latency 25ms`` (and ``--bandwidth 32MiB/s``) every command runs behind
``tests/support/latency_proxy.py`` instead, moto in a process of its own: see ``remote_latency.py``::

    .venv/bin/python bench/bench_remote.py --latency 25ms --bandwidth 32MiB/s [--only ls,prune]

``--server seaweedfs`` puts SeaweedFS (``weed server -s3``, a real S3 server in Go) behind the
proxy instead of moto; each read command then also runs straight to the server, and the table
gives the latency cost (wall time behind the proxy minus wall time direct)::

    .venv/bin/python bench/bench_remote.py --server seaweedfs --latency 25ms --only ls,inspect
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "bench")]

import bench_ls_inspect as base  # noqa: E402
import remote_latency  # noqa: E402

from tests.support.latency_proxy import parse_bandwidth, parse_delay  # noqa: E402
from tests.support.remote_servers import BUCKET, S3Server, local_files, s3_environment  # noqa: E402


def upload(client: Any, src: Path, prefix: str) -> int:
    files = list(local_files(src))

    def put(item: tuple[str, Path]) -> None:
        rel, p = item
        client.put_object(Bucket=BUCKET, Key=f"{prefix}/{rel}", Body=p.read_bytes())

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(put, files))
    return len(files)


def run(args: list[str], env: dict[str, str]) -> tuple[float, str]:
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "ckpt_cli", *args], capture_output=True, text=True, env=env
    )
    elapsed = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"ckpt {' '.join(args)} failed: {proc.stderr.strip()}")
    return elapsed, proc.stdout


def measure(
    server: S3Server, args: list[str], env: dict[str, str], repeat: int
) -> tuple[float, dict[str, int], Any]:
    _, out = run(args, env)  # warm-up, checked by the caller
    server.reset_counts()
    times = [run(args, env)[0] for _ in range(repeat)]
    counts = {k: v // repeat for k, v in sorted(server.counts.items())}
    return statistics.median(times), counts, json.loads(out)


def server_floor(server: S3Server, client: Any, n: int = 300) -> float:
    """Seconds the server needs per small GET, one at a time: moto is Python, so on a small
    machine its own work, not ckpt's, bounds a run of thousands of requests."""
    import http.client

    client.put_object(Bucket=BUCKET, Key="probe", Body=b"{}")
    conn = http.client.HTTPConnection("127.0.0.1", server.port)
    started = time.perf_counter()
    for _ in range(n):
        conn.request("GET", f"/{BUCKET}/probe")
        conn.getresponse().read()
    conn.close()
    return (time.perf_counter() - started) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--leaves", type=int, default=10000)
    parser.add_argument("--repeat", type=int, default=None, help="3; 1 with --latency")
    parser.add_argument("--workdir", type=Path, default=REPO / "bench" / "out" / "ls_inspect")
    parser.add_argument("--latency", type=parse_delay, default=None, help="e.g. 25ms")
    parser.add_argument(
        "--server",
        choices=("moto", "seaweedfs"),
        default="moto",
        help="the S3 server behind the proxy (with --latency): moto or SeaweedFS (weed)",
    )
    parser.add_argument("--bandwidth", type=parse_bandwidth, default=None, help="e.g. 32MiB/s")
    parser.add_argument(
        "--baseline",
        type=Path,
        default=None,
        help="with --latency: a directory holding another commit's ckpt_cli package "
        "(git archive REV ckpt_cli | tar -x -C DIR): read commands also run with it",
    )
    parser.add_argument("--data-mib", type=int, default=64)
    parser.add_argument("--prune-steps", type=int, default=500)
    parser.add_argument("--only", default=None, help="ls,inspect,verify,deep,sample,diff,...")
    parser.add_argument("--output", type=Path, default=None)
    parser.add_argument("--scale", action="store_true", help="1/2/4/8 workers and Dask")
    # 64 MiB: a unit is read with all its chunks in flight at once, so its requests in flight
    # are at most unit bytes / chunk bytes; a worker runs two units at once (the next starts
    # while the previous drains). The checkpoint's chunks are --data-mib / 128 (4 MiB at 512
    # MiB): 64 MiB units keep 16 reads per unit, 32 per worker, the single process's reads in
    # flight (reshard: 41 with its writes). With --data-mib 128 give 16MiB (1 MiB chunks).
    parser.add_argument("--unit-bytes", default="64MiB", help="with --scale")
    parser.add_argument(
        "--scale-workers", default="4", help="with --scale: local worker counts, e.g. 1,2,4,8"
    )
    opts = parser.parse_args()
    if opts.scale:
        opts.latency = 0.025 if opts.latency is None else opts.latency
        remote_latency.scale_main(opts)
        return
    if opts.latency is not None:
        opts.repeat = opts.repeat or 1
        remote_latency.main(opts)
        return
    opts.repeat = opts.repeat or 3
    opts.workdir.mkdir(parents=True, exist_ok=True)
    root = base.ensure(
        opts.workdir / f"root_{opts.steps}steps", "root", base.build_root, opts.steps
    )
    item = base.ensure(
        opts.workdir / f"item_{opts.leaves}leaves", "item", base.build_item, opts.leaves
    )

    server = S3Server().start()
    client = server.client()
    client.create_bucket(Bucket=BUCKET)
    started = time.perf_counter()
    uploaded = upload(client, root, "root") + upload(client, item, "item")
    print(f"uploaded {uploaded} objects in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    env = {**os.environ, **s3_environment(server.endpoint), "PYTHONPATH": str(REPO)}

    rows = []
    for what, local, url, check in (
        (f"ls ({opts.steps} steps)", root, f"s3://{BUCKET}/root", "steps"),
        (f"inspect ({opts.leaves} leaves)", item, f"s3://{BUCKET}/item", "leaves"),
    ):
        cmd = what.split()[0]
        remote_s, counts, doc = measure(server, [cmd, url, "--json"], env, opts.repeat)
        local_s, _, local_doc = measure(server, [cmd, str(local), "--json"], env, opts.repeat)
        assert len(doc[check]) == len(local_doc[check]), what
        rows.append(
            {
                "command": what,
                "local_s": round(local_s, 3),
                "s3_s": round(remote_s, 3),
                "ratio": round(remote_s / local_s, 2),
                "requests": counts,
            }
        )
    floor = server_floor(server, client)
    server.stop()
    print(f"{'command':<24} {'local s':>8} {'s3 s':>8} {'s3/local':>9}  requests per run")
    for r in rows:
        reqs = ", ".join(f"{k} {v}" for k, v in r["requests"].items())
        print(
            f"{r['command']:<24} {r['local_s']:>8.2f} {r['s3_s']:>8.2f} {r['ratio']:>8.1f}x  {reqs}"
        )
    for r in rows:
        n = sum(r["requests"].values())
        print(
            f"  {r['command']}: {n} requests x {floor * 1000:.1f} ms (this server's time per "
            f"small GET, one at a time) = {n * floor:.1f} s of server work"
        )
    out = REPO / "bench" / "out" / "remote.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"steps": opts.steps, "leaves": opts.leaves, "server_s_per_get": floor, "rows": rows}
    out.write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
