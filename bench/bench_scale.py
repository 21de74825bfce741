"""Benchmark scaled-out ``reshard`` and ``verify --deep``: throughput at 1, 2 and 4 workers on
this machine, and the per-unit overhead, so a cluster's speed-up can be predicted.

Run from the repository root::

    .venv/bin/python bench/bench_scale.py [--mib 256] [--workdir bench/out/scale]

The source is ``bench_reshard``'s (16 float32 leaves, mesh (8, 1), built once with real Orbax).
Contenders, all rewriting it for mesh (2, 4) with ``P('data', 'model')`` in the same run:

single       the single-process writer (no units), the reference
local xN     ``--executor local --workers N``: N spawned processes (N=1: units in-process)
dask xN      a Dask ``LocalCluster`` of N worker processes, 1 thread each, on 127.0.0.1
             (started before the clock runs, as a user's cluster would be)

Per-unit overhead: (units in-process - single) / units, at 4 MiB units; and the round trip of an
empty Dask task (``client.map`` of a no-op over 200 tasks). Expect a flat curve where the machine
has 2 cores: the single-process writer already keeps both busy (TensorStore encodes on its own
threads); the gain comes from more machines, each with its own NIC and cores.
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from pathlib import Path
from typing import Any

from _harness import run  # bench/ is on sys.path when a script runs
from bench_reshard import BUILD, LEAVES


def _leaves(src: Path) -> tuple[Any, Any]:
    from ckpt_cli.core.format.resolve import resolve_item
    from ckpt_cli.core.format.sharding import MeshSpec
    from ckpt_cli.core.inspect.item import inspect_item
    from ckpt_cli.core.reshard.execute import reshard_leaves
    from ckpt_cli.core.reshard.plan import plan_from_rules
    from ckpt_cli.core.reshard.rules import parse_rules
    from ckpt_cli.core.storage import LocalLocation
    from ckpt_cli.core.write.types import Compression

    ref = resolve_item(LocalLocation(str(src)))
    report = inspect_item(ref)
    mesh = MeshSpec.parse("data=2,model=4")
    rules = parse_rules({".*": ["data", "model"]}, mesh, "bench")
    plan = plan_from_rules(report, mesh, rules, 64 << 20)
    return ref, reshard_leaves(report, plan, False, Compression("zstd"), 1 << 30)


def reshard(src: Path, dst: Path, executor: Any, unit_bytes: int) -> tuple[float, Any]:
    from ckpt_cli.core.storage import LocalLocation
    from ckpt_cli.core.write.rewrite import write_step

    shutil.rmtree(dst, ignore_errors=True)
    ref, leaves = _leaves(src)
    t0 = time.perf_counter()
    out = write_step(
        ref, LocalLocation(str(dst)), leaves, use_ocdbt=True, use_zarr3=False,
        memory_limit=1 << 30, operation={"operation": "reshard"}, executor=executor,
        unit_bytes=unit_bytes,
    )  # fmt: skip
    return time.perf_counter() - t0, out.scale


def verify(src: Path, executor: Any, unit_bytes: int) -> float:
    from ckpt_cli.core.storage import LocalLocation
    from ckpt_cli.core.verify.run import verify_path
    from ckpt_cli.core.verify.types import VerifyOptions

    t0 = time.perf_counter()
    report = verify_path(
        LocalLocation(str(src)), VerifyOptions(deep=True), None, executor, unit_bytes
    )
    assert report.ok, report.problems
    return time.perf_counter() - t0


def _noop(x: int) -> int:
    return x


def main() -> None:
    from distributed import LocalCluster

    from ckpt_cli.core.executor import DaskExecutor, InlineExecutor, LocalExecutor

    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=256, help="source size in MiB")
    parser.add_argument("--workdir", default="bench/out/scale")
    parser.add_argument("--unit-mib", type=int, default=16)
    args = parser.parse_args()
    work = Path(args.workdir)
    rows = max(8, args.mib * 2**20 // (LEAVES * 4096 * 4) // 8 * 8)
    src = work / f"src-{rows}"
    if not (src / "1" / "commit_success.txt").exists():
        shutil.rmtree(src, ignore_errors=True)
        work.mkdir(parents=True, exist_ok=True)
        print(f"building {LEAVES} x float32[{rows},4096] on mesh (8,1) ...", flush=True)
        run(BUILD, str(src), str(rows))
    nbytes = LEAVES * rows * 4096 * 4
    unit = args.unit_mib << 20
    print(f"source {nbytes / 2**20:.0f} MiB, {os.cpu_count()} cores, units of {args.unit_mib} MiB")
    mib = nbytes / 2**20

    def line(name: str, seconds: float, extra: str = "") -> None:
        print(f"  {name:<12} {seconds:6.2f} s  {mib / seconds:7.1f} MiB/s  {extra}", flush=True)

    print("reshard (8,1) -> (2,4):")
    base, _ = reshard(src, work / "single", None, unit)
    line("single", base, "reference")
    inline, stats = reshard(src, work / "local1", InlineExecutor(), 4 << 20)
    per_unit = (inline - base) / stats.units
    line("local x1", inline, f"{stats.units} units (4 MiB asked) in-process")
    for n in (2, 4):
        with LocalExecutor(n) as ex:
            ex.map(_noop, list(range(n)))  # start the processes before the clock, as for Dask
            seconds, stats = reshard(src, work / f"local{n}", ex, unit)
        line(f"local x{n}", seconds, f"{base / seconds:.2f}x single, {stats.units} units")
    for n in (1, 2, 4):
        with (
            LocalCluster(
                n_workers=n, threads_per_worker=1, processes=True, host="127.0.0.1",
                dashboard_address="127.0.0.1:0", worker_dashboard_address=None,
            ) as cluster,
            DaskExecutor(cluster.scheduler_address) as ex,
        ):  # fmt: skip
            seconds, stats = reshard(src, work / f"dask{n}", ex, unit)
            line(
                f"dask x{n}",
                seconds,
                f"{base / seconds:.2f}x single, merge {stats.merge_seconds:.3f} s",
            )
            if n == 2:
                t0 = time.perf_counter()
                assert isinstance(ex, DaskExecutor)
                ex.map(_noop, list(range(200)))
                task = (time.perf_counter() - t0) / 200
                vs = verify(src, ex, unit)
    print("verify --deep:")
    vbase = verify(src, None, unit)
    line("single", vbase, "reference")
    line("dask x2", vs, f"{vbase / vs:.2f}x single")
    print(
        f"per-unit overhead: {per_unit * 1e3:.1f} ms in-process (open arrays, source store, a "
        f"pipeline per unit), {task * 1e3:.1f} ms per Dask task round trip (2 workers)"
    )
    print(
        "predicting a cluster: time ~ bytes / (workers x per-worker MiB/s) + units x overhead "
        "/ workers + merge; per-worker MiB/s is the 'local x1' figure on each machine"
    )


if __name__ == "__main__":
    main()
