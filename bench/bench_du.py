"""Benchmark ``ckpt du`` against the routes a user has today: ``du -sb`` (sizes, no leaves, no
garbage) and ``ckpt ls`` / ``ckpt ls -v`` (the read command ``du`` should cost about as much as).

Run from the repository root::

    .venv/bin/python bench/bench_du.py [--steps 1000] [--repeat 3] [--workdir DIR]
        [--bucket moto] [--bucket seaweedfs] [--latency 0ms] [--no-local]
        [--baseline DIR] [--deep-steps 20]

The root (built once, cached in ``bench/out/du/``, git-ignored): ``--steps`` copies of the real
Orbax step ``fixtures/ckpts/seed_mlp/500`` (OCDBT, merged root, 15 leaves), plus one unfinished
save copied under a ``.orbax-checkpoint-tmp`` name. Each command runs ``--repeat`` times in a
fresh process (import time counts, as at a shell) after one warm-up run whose output is
checked; the routes then run in turn, ``--repeat`` rounds (the load on a shared host moves: in turn,
each route sees it alike), and the median wall time, CPU time and peak RSS are reported, with the
core count and each run's load.

``--bucket SERVER`` (``moto``, ``seaweedfs``; repeat it for both): the root is also put into
that S3 server, started in a process of its own on 127.0.0.1 (``tests/support/moto_server.py``,
``tests.support.remote_servers.SeaweedServer``), with one multipart upload left open in it, and
``ckpt ls -v`` / ``ckpt du`` run against it through ``tests/support/latency_proxy.py`` (in this
process, ``--latency`` added to each request: 0 by default), which counts every request (``LIST``
= ListObjectsV2 pages of 1,000 keys, ``GET``...), the most in flight at once and the mean in
flight (the requests' summed durations over the wall time); the server's CPU seconds during
each run are read from /proc. moto is Python: on a small host its own CPU bounds the wall
time (``srv cpu``), SeaweedFS (Go) much less. ``--no-local``: the bucket routes only.
``--baseline DIR``: ``ckpt du`` also runs with another commit's package
(``git archive REV ckpt_cli | tar -x -C DIR``), in the same run. ``--deep-steps N``: ``ckpt du
--deep`` on the first N steps' copy (every leaf read and hashed), against ``ckpt digest`` of
one step times N.
Results: a table on stdout and JSON in ``bench/out/du.json``.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import shutil
import signal
import statistics
import sys
from pathlib import Path
from typing import Any

from _harness import REPO, bench_env, run_rss

sys.path.insert(0, str(REPO))
from tests.support.latency_proxy import LatencyProxy, parse_delay
from tests.support.moto_server import spawn
from tests.support.remote_servers import (
    BUCKET,
    SeaweedServer,
    s3_client,
    s3_environment,
)

STEP = REPO / "fixtures" / "ckpts" / "seed_mlp" / "500"


def build(root: Path, steps: int) -> None:
    if (root / f"{steps - 1}").is_dir():
        return
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    for i in range(steps):
        shutil.copytree(STEP, root / str(i))
    shutil.copytree(STEP, root / f"{steps}.orbax-checkpoint-tmp-1")


class Server:
    """An S3 server in a process of its own, a latency proxy (this process) in front of it."""

    def __init__(self, kind: str, latency: float) -> None:
        self.kind = kind
        self.seaweed: SeaweedServer | None = None
        self.moto: Any = None
        if kind == "seaweedfs":
            self.seaweed = SeaweedServer().start()
            self.pid, endpoint = self.seaweed._proc.pid, self.seaweed.endpoint  # type: ignore[union-attr]
        else:
            self.moto, endpoint = spawn()
            self.pid = self.moto.pid
            s3_client(endpoint).create_bucket(Bucket=BUCKET)
        self.direct = endpoint
        self.proxy = LatencyProxy(endpoint, delay=latency, keep_log=True).start()

    def cpu(self) -> float:
        """CPU seconds the server process has used so far (user + system, /proc)."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        self.proxy.stop()
        if self.seaweed is not None:
            self.seaweed.stop()
        elif self.moto is not None and self.moto.poll() is None:
            os.killpg(self.moto.pid, signal.SIGTERM)
            self.moto.wait(timeout=20)


def put_root(server: Server, root: Path, prefix: str) -> str:
    """The root as objects under ``prefix`` (put directly, not through the proxy), and one
    multipart upload left open in it."""
    from bench_remote import upload
    from botocore.config import Config

    client = s3_client(server.direct, Config(max_pool_connections=16))
    upload(client, root, prefix)
    key = f"{prefix}/0/default/d/{'a' * 32}"
    upload = client.create_multipart_upload(Bucket=BUCKET, Key=key)["UploadId"]
    client.upload_part(Bucket=BUCKET, Key=key, PartNumber=1, UploadId=upload, Body=b"x" * 4096)
    return f"s3://{BUCKET}/{prefix}"


def once(cmd: list[str], env: dict[str, str], server: Server | None) -> dict[str, Any]:
    """One run: wall, CPU and peak RSS of the command; behind a server, its requests by kind,
    the most in flight, the mean in flight and the server's CPU seconds."""
    if server is not None:
        server.proxy.reset()
        cpu, mine = server.cpu(), _self_cpu()
    r = run_rss(cmd, env=env)
    out: dict[str, Any] = {"wall_s": r.wall_s, "cpu_s": r.cpu_s, "rss_mib": r.rss_mib}
    out["load"] = os.getloadavg()[0]
    if server is not None:
        server.proxy.wait_idle()
        st = server.proxy.stats()
        busy = sum(max(q.ended, q.started) - q.started for q in st.log if q.ended)
        out["server_cpu_s"] = server.cpu() - cpu
        out["proxy_cpu_s"] = _self_cpu() - mine
        out["requests"] = st.by_kind
        out["max_in_flight"] = st.max_in_flight
        out["mean_in_flight"] = busy / r.wall_s
    return out


def _self_cpu() -> float:
    """CPU seconds of this process (the latency proxy's thread, mostly)."""
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians of the runs (the most in flight: the largest), each run's wall time and load."""
    out: dict[str, Any] = {
        k: statistics.median(r[k] for r in runs)
        for k in ("wall_s", "cpu_s", "server_cpu_s", "proxy_cpu_s", "mean_in_flight")
        if k in runs[0]
    }
    out["rss_mib"] = max(r["rss_mib"] for r in runs)
    out["walls_s"] = [round(r["wall_s"], 2) for r in runs]
    out["loads"] = [round(r["load"], 1) for r in runs]
    if "requests" in runs[0]:
        out["requests"] = runs[-1]["requests"]
        out["max_in_flight"] = max(r["max_in_flight"] for r in runs)
    return out


def routes(root: Path, a: argparse.Namespace) -> dict[str, tuple[list[str], dict[str, str]]]:
    ckpt = [sys.executable, "-m", "ckpt_cli"]
    local = bench_env()
    out = {
        "du -sb (today)": (["du", "-sb", str(root)], local),
        "ckpt ls": ([*ckpt, "ls", str(root)], local),
        "ckpt ls -v": ([*ckpt, "ls", "-v", str(root)], local),
        "ckpt du": ([*ckpt, "du", str(root)], local),
        "ckpt du --json": ([*ckpt, "du", str(root), "--json"], local),
    }
    if a.baseline:
        base = {**local, "PYTHONPATH": str(a.baseline.resolve())}
        out["ckpt du (baseline)"] = ([*OLD, "du", str(root)], base)
    if a.deep_steps:
        few = root.parent / f"root_{a.deep_steps}steps"
        build(few, a.deep_steps)
        out[f"ckpt du --deep ({a.deep_steps} steps)"] = ([*ckpt, "du", str(few), "--deep"], local)
        out["ckpt digest (1 step)"] = ([*ckpt, "digest", str(few / "0" / "default")], local)
    return out


# -P: the current directory (this checkout) is not put before PYTHONPATH's package.
OLD = [sys.executable, "-P", "-m", "ckpt_cli"]


def bucket_routes(
    kind: str, url: str, env: dict[str, str], baseline: Path | None
) -> dict[str, tuple[list[str], dict[str, str]]]:
    ckpt = [sys.executable, "-m", "ckpt_cli"]
    out = {
        f"{kind}: ckpt ls -v": ([*ckpt, "ls", "-v", url], env),
        f"{kind}: ckpt du": ([*ckpt, "du", url], env),
    }
    if baseline:
        base = {**env, "PYTHONPATH": str(baseline.resolve())}
        out[f"{kind}: ckpt du (baseline)"] = ([*OLD, "du", url], base)
    return out


def check(cmd: list[str], env: dict[str, str], steps: int, garbage: int) -> None:
    doc = json.loads(run_rss([*cmd, "--json"], env=env).out)
    assert len(doc["steps"]) == steps and len(doc["garbage"]) == garbage, "unexpected du output"


def run_routes(
    todo: dict[str, tuple[list[str], dict[str, str]]], repeat: int, server: Server | None
) -> dict[str, dict[str, Any]]:
    """Each route once to warm up (the page cache, the server's first answers), then
    ``repeat`` rounds of every route in turn: on a shared host the load moves, and taking
    the routes in turn spreads it over them alike."""
    for cmd, env in todo.values():
        run_rss(cmd, env=env)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in todo}
    for _ in range(repeat):
        for name, (cmd, env) in todo.items():
            runs[name].append(once(cmd, env, server))
            print(
                f"  {name}: {runs[name][-1]['wall_s']:.2f} s, load {runs[name][-1]['load']:.1f}",
                flush=True,
            )
    return {name: summary(r) for name, r in runs.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workdir", type=Path, default=REPO / "bench" / "out" / "du")
    ap.add_argument("--bucket", action="append", choices=["moto", "seaweedfs"], default=[])
    ap.add_argument("--latency", type=parse_delay, default=0.0)
    ap.add_argument("--no-local", action="store_true")
    ap.add_argument("--baseline", type=Path, default=None)
    ap.add_argument("--deep-steps", type=int, default=0)
    a = ap.parse_args()
    # Byte-compiled as ``pip install`` leaves it: under PYTHONDONTWRITEBYTECODE an editable
    # checkout is compiled again on every run (0.2 s of CPU, more for the larger import).
    for tree in (REPO, *([a.baseline] if a.baseline else [])):
        compileall.compile_dir(str(tree / "ckpt_cli"), quiet=1)
    root = a.workdir / f"root_{a.steps}steps"
    build(root, a.steps)
    results: dict[str, dict[str, Any]] = {}
    if not a.no_local:
        todo = routes(root, a)
        check(todo["ckpt du"][0], todo["ckpt du"][1], a.steps, 1)
        results.update(run_routes(todo, a.repeat, None))
    for kind in a.bucket:
        server = Server(kind, a.latency)
        try:
            url = put_root(server, root, "du-bench")
            env = bench_env(**s3_environment(server.proxy.endpoint))
            todo = bucket_routes(kind, url, env, a.baseline)
            check(todo[f"{kind}: ckpt du"][0], env, a.steps, 2)
            results.update(run_routes(todo, a.repeat, server))
        finally:
            server.stop()
    print(f"{a.steps} steps, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")
    for name, r in results.items():
        requests = " ".join(f"{k} {v}" for k, v in r.get("requests", {}).items())
        flight = (
            f"  srv cpu {r['server_cpu_s']:5.2f} s  proxy cpu {r['proxy_cpu_s']:5.2f} s  "
            f"in flight max {r['max_in_flight']} "
            f"mean {r['mean_in_flight']:.1f}"
            if "requests" in r
            else ""
        )
        print(
            f"{name:<28} {r['wall_s']:7.2f} s  cpu {r['cpu_s']:6.2f} s  "
            f"{r['rss_mib']:6.0f} MiB{flight}  {requests}"
        )
    out = REPO / "bench" / "out" / "du.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"steps": a.steps, "cores": os.cpu_count(), "load": os.getloadavg()[0], **results}
    out.write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
