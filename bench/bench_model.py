"""Fit the cost model of ``verify --deep`` and ``reshard`` to measured runs, check it against
them, and predict a 1 TB checkpoint on a 64-worker Dask cluster.

Run from the repository root::

    .venv/bin/python bench/bench_model.py [--quick] [--json]

The model and its formulas: ``tests/support/cost_model.py``. Every run is a fresh ``python -m
ckpt_cli`` subprocess whose wall time and peak RSS (``wait4``) are measured, once. The grid
varies the bytes (64-512 MiB of float32), the chunk size (``SaveArgs(chunk_byte_size)``: 4 or
32 MiB; 128 KiB leaves of one chunk each with 512 leaves), the leaves (16 or 512), the workers
(``--executor local --workers 1/2/4``) and the store: local disk, or moto's S3 server behind
``tests/support/latency_proxy.py`` (25 ms or 0 ms per request, 16 MiB/s per client process),
which counts requests and bytes. Runs marked ``fit`` fit the coefficients; every run is then
predicted and compared (``ok``: within 25 %). ``--quick``: a tiny grid for a smoke run (too small to pin
every coefficient: its fit is no figure to quote).
``--json``: the runs, coefficients and prediction also go to ``bench/out/model.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "bench")]

import remote_latency  # noqa: E402
from _harness import bench_env, run_rss  # noqa: E402
from _harness import run as run_script  # noqa: E402

from tests.support import cost_model as cm  # noqa: E402
from tests.support.latency_proxy import LatencyProxy  # noqa: E402
from tests.support.remote_servers import CREDENTIALS  # noqa: E402

OUT = REPO / "bench" / "out"
MIB = cm.MIB
BW = 16 * MIB  # per client process, behind the proxy
BUILD = """
import sys, jax, numpy as np, orbax.checkpoint as ocp
root, nbytes, chunk, leaves = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rows = nbytes // leaves // 4096
rs = np.random.default_rng(0)
tree = {f"layer_{i:03d}": rs.standard_normal((rows, 1024), dtype=np.float32) for i in range(leaves)}
args = jax.tree.map(lambda _: ocp.SaveArgs(chunk_byte_size=chunk), tree)
mgr = ocp.CheckpointManager(root)
mgr.save(1, args=ocp.args.StandardSave(tree, save_args=args))
mgr.wait_until_finished()
print("RESULT 0 0")
"""


@dataclass(frozen=True)
class Case:
    command: str  # "verify" (--deep) or "reshard"
    mib: int
    chunk_mib: float
    leaves: int
    workers: int = 1
    latency: float | None = None  # None: local disk; else behind the proxy (seconds)
    fit: bool = True


def _grid(quick: bool) -> list[Case]:
    both = ("verify", "reshard")
    if quick:
        local = [(16, 4, 16, 1, True), (32, 4, 16, 1, True), (16, 0.125, 128, 1, True),
                 (32, 4, 16, 2, True), (32, 4, 16, 1, False)]  # fmt: skip
        remote = [Case("verify", 16, 4, 16, 1, 0.025), Case("verify", 16, 4, 16, 2, 0.025, False)]
    else:
        local = [(64, 4, 16, 1, True), (256, 4, 16, 1, False), (512, 4, 16, 1, True),
                 (512, 32, 16, 1, False), (64, 0.125, 512, 1, True), (256, 32, 16, 4, True),
                 (256, 32, 16, 2, False), (256, 32, 16, 1, True)]  # fmt: skip
        remote = [
            Case("verify", 64, 4, 16, 1, 0.025), Case("verify", 64, 4, 16, 2, 0.025, False),
            Case("verify", 64, 4, 16, 4, 0.025), Case("verify", 64, 4, 16, 1, 0.0, False),
            Case("verify", 64, 0.125, 512, 1, 0.025), Case("verify", 64, 0.125, 512, 4, 0.025, False),
            Case("reshard", 64, 4, 16, 1, 0.025), Case("reshard", 64, 4, 16, 4, 0.025, False),
        ]  # fmt: skip
    return [Case(c, m, ch, lv, w, None, f) for m, ch, lv, w, f in local for c in both] + remote


def load() -> float:
    return os.getloadavg()[0]


def dataset(case: Case) -> Path:
    path = OUT / "model" / f"data_{case.mib}mib_{case.chunk_mib:g}chunk_{case.leaves}leaves"
    if not (path / "1" / "commit_success.txt").exists():
        shutil.rmtree(path, ignore_errors=True)
        print(f"building {path.name} with Orbax ...", file=sys.stderr, flush=True)
        nbytes, chunk = case.mib * MIB, int(case.chunk_mib * MIB)
        run_script(BUILD, str(path), str(nbytes), str(chunk), str(case.leaves))
    return path


def unit_bytes(case: Case) -> int:
    """Units of an eighth of the checkpoint, at least a chunk: every worker gets several."""
    return int(max(case.chunk_mib, case.mib / 8) * MIB)


def argv(case: Case, src: str, dst: str) -> list[str]:
    if case.command == "verify":
        cmd = ["verify", src, "--deep", "--json"]
    else:
        cmd = ["reshard", src, dst, "--mesh", "data=2,model=4", "--rule", "*=[data, model]"]
        cmd.append("--json")
    if case.workers > 1:
        cmd += ["--executor", "local", "--workers", str(case.workers)]
        cmd += ["--unit-bytes", f"{unit_bytes(case) // 1024}KiB"]
        cmd.append("--force-split")  # the model fits the split run, whatever it would decide
    return [sys.executable, "-m", "ckpt_cli", *cmd]


def measure_local(case: Case) -> dict[str, Any]:
    src = dataset(case)
    dst = OUT / "model" / "out"
    shutil.rmtree(dst, ignore_errors=True)
    os.sync()  # the last build's or run's writes go to disk before the clock runs, not during
    before = load()
    r = run_rss(argv(case, str(src), str(dst)))
    shutil.rmtree(dst, ignore_errors=True)
    return {"wall_s": r.wall_s, "rss_mib": r.rss_mib, "requests": 0, "net_bytes": 0,
            "load": round(max(before, load()), 2)}  # fmt: skip


class Remote:
    """moto in its own process; a proxy per latency, each capping every client process."""

    def __init__(self) -> None:
        self.moto = remote_latency.Moto()
        self.proxies: dict[float, LatencyProxy] = {}
        self.uploaded: set[Path] = set()
        os.environ.update(CREDENTIALS)

    def measure(self, case: Case, n: int) -> dict[str, Any]:
        assert case.latency is not None
        src = dataset(case)
        url = f"s3://data/{src.name}"
        if src not in self.uploaded:
            remote_latency.upload(self.moto, src, url)
            self.uploaded.add(src)
        self.moto.create_bucket("out")
        proxy = self.proxies.get(case.latency)
        if proxy is None:
            proxy = LatencyProxy(self.moto.endpoint, delay=case.latency, bandwidth=BW).start()
            self.proxies[case.latency] = proxy
        env = bench_env(CKPT_S3_ENDPOINT=proxy.endpoint)
        proxy.reset()
        os.sync()
        before = load()
        r = run_rss(argv(case, url, f"s3://out/run-{n}"), env=env)
        proxy.wait_idle()
        st = proxy.stats()
        return {"wall_s": r.wall_s, "rss_mib": r.rss_mib, "requests": st.requests,
                "net_bytes": st.bytes_in + st.bytes_out, "load": round(max(before, load()), 2),
                "max_in_flight": st.max_in_flight}  # fmt: skip

    def stop(self) -> None:
        for p in self.proxies.values():
            p.stop()
        self.moto.stop()


def setting(case: Case, m: dict[str, Any]) -> cm.Setting:
    remote = case.latency is not None
    return cm.Setting(
        command=case.command, nbytes=case.mib * MIB, chunk=int(case.chunk_mib * MIB),
        leaves=case.leaves, workers=case.workers, requests=m["requests"],
        latency=case.latency or 0.0, bandwidth=BW if remote else None, net_bytes=m["net_bytes"],
        unit=unit_bytes(case), local_store=remote,
    )  # fmt: skip


def measure_all(cases: list[Case]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    remote = Remote() if any(c.latency is not None for c in cases) else None
    try:
        for n, case in enumerate(cases):
            print(f"{describe(case)} ... (load {load():.2f})", file=sys.stderr, flush=True)
            if case.latency is None:
                m = measure_local(case)
            else:
                assert remote is not None
                m = remote.measure(case, n)
            print(f"  {m['wall_s']:.2f} s, {m['rss_mib']:.0f} MiB", file=sys.stderr, flush=True)
            rows.append({"case": asdict(case), **m})
    finally:
        if remote is not None:
            remote.stop()
    return rows


def describe(case: Case) -> str:
    where = "disk" if case.latency is None else f"s3 {case.latency * 1000:.0f}ms 16MiB/s"
    chunk = f"{case.chunk_mib:g}MiB" if case.chunk_mib >= 1 else f"{case.chunk_mib * 1024:g}KiB"
    return (
        f"{case.command:<7} {case.mib:>3} MiB {chunk:>6} chunks {case.leaves:>3} leaves "
        f"w{case.workers} {where}"
    )


def fit(rows: list[dict[str, Any]]) -> cm.Coefficients:
    fit_rows = [r for r in rows if r["case"]["fit"]]
    runs = [(setting(Case(**r["case"]), r), r["wall_s"]) for r in fit_rows]
    c = cm.fit_time(runs, cm.Coefficients())
    return cm.fit_memory(
        [(s, r["rss_mib"] * MIB) for (s, _), r in zip(runs, fit_rows, strict=True)], c
    )


def requests_per_unit(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Requests per (chunk + leaf) of each command, from the runs behind the proxy: what the
    1 TB prediction needs to count requests."""
    out: dict[str, float] = {}
    for cmd in ("verify", "reshard"):
        mine = [r for r in rows if r["case"]["command"] == cmd and r["requests"]]
        ratios = [
            r["requests"] / (r["case"]["mib"] / r["case"]["chunk_mib"] + r["case"]["leaves"])
            for r in mine
        ]
        out[cmd] = sum(ratios) / len(ratios) if ratios else 1.0
    return out


def check(rows: list[dict[str, Any]], c: cm.Coefficients) -> list[dict[str, Any]]:
    table = []
    for r in rows:
        case = Case(**r["case"])
        s = setting(case, r)
        t, m = cm.predict_time(s, c), cm.predict_memory(s, c) / MIB
        te, me = cm.relative_error(t, r["wall_s"]), cm.relative_error(m, r["rss_mib"])
        table.append({"run": describe(case), "fit": case.fit, "measured_s": round(r["wall_s"], 2),
                      "predicted_s": round(t, 2), "time_error": round(te, 3),
                      "measured_mib": round(r["rss_mib"]), "predicted_mib": round(m),
                      "memory_error": round(me, 3), "load": r["load"],
                      "ok": abs(te) <= 0.25 and abs(me) <= 0.25})  # fmt: skip
    return table


def print_table(table: list[dict[str, Any]]) -> None:
    print("| run | fit | s measured | s predicted | err | MiB measured | MiB predicted | err "
          "| load | within 25 % |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for t in table:
        print(
            f"| {t['run']} | {'fit' if t['fit'] else 'check'} | {t['measured_s']:.2f} "
            f"| {t['predicted_s']:.2f} | {t['time_error']:+.0%} | {t['measured_mib']} "
            f"| {t['predicted_mib']} | {t['memory_error']:+.0%} | {t['load']:.1f} "
            f"| {'yes' if t['ok'] else 'NO'} |"
        )
    ok = sum(t["ok"] for t in table)
    held = [t for t in table if not t["fit"]]
    print(f"{ok} of {len(table)} runs within 25 % (time and memory); held out of the fit: "
          f"{sum(t['ok'] for t in held)} of {len(held)}")  # fmt: skip


def print_coefficients(c: cm.Coefficients, per: dict[str, float]) -> None:
    for cmd, k in sorted(c.time.items()):
        m = c.memory[cmd]
        print(f"{cmd}: start {k['start']:.2f} s, per leaf {k['per_leaf'] * 1e3:.2f} ms, CPU "
              f"{k['cpu_per_byte'] * MIB * 1e3:.2f} ms/MiB; memory base {m['base'] / MIB:.0f} MiB + min(1 GiB, "
              f"{m['per_chunk_byte']:.2f} x chunk + {m['per_byte']:.3f} x bytes) + "
              f"{m['per_leaf'] / 1024:.1f} KiB x leaves; {per[cmd]:.2f} requests per chunk or "
              "leaf")  # fmt: skip
    sh = c.shared
    w1, ww = (min(max(sh[k], 1.0), cm.MAX_WINDOW) for k in ("window_1", "window_w"))
    print(
        f"shared: worker start-up {sh['startup']:.2f} s (x workers / cores), requests in "
        f"flight {w1:.1f} for one process, {ww:.1f} per worker (held within 1-64); the local "
        f"S3 server and proxy {sh['store_per_byte'] * MIB * 1e3:.1f} ms/MiB"
    )


#: The assumptions of the 1 TB prediction.
TB = {"nbytes": 1 << 40, "chunk": 32 * MIB, "leaves": 2000, "workers": 64, "hosts": 64,
      "cores": 128, "latency": 0.025}  # fmt: skip


def predict_tb(c: cm.Coefficients, per: dict[str, float]) -> list[dict[str, Any]]:
    out = []
    for cmd in ("verify", "reshard"):
        for bw in (16 * MIB, 200 * MIB):
            chunks = TB["nbytes"] // TB["chunk"]
            s = cm.Setting(
                command=cmd, nbytes=TB["nbytes"], chunk=TB["chunk"], leaves=TB["leaves"],
                workers=TB["workers"], hosts=TB["hosts"], cores=TB["cores"],
                requests=round(per[cmd] * (chunks + TB["leaves"])), latency=TB["latency"],
                bandwidth=bw, net_bytes=TB["nbytes"] * (1 if cmd == "verify" else 2),
            )  # fmt: skip
            terms = cm.time_terms(s, c)
            out.append({"command": cmd, "bandwidth_mib_s": bw // MIB, "requests": s.requests,
                        "seconds": cm.predict_time(s, c), "terms": terms,
                        "rss_mib": cm.predict_memory(s, c) / MIB})  # fmt: skip
    print(f"1 TiB, {TB['chunk'] // MIB} MiB chunks, {TB['leaves']} leaves, {TB['workers']} "
          f"Dask workers on {TB['hosts']} hosts of 2 cores, {TB['latency'] * 1e3:.0f} ms per "
          "request, the bandwidth per worker process below:")  # fmt: skip
    for p in out:
        terms = ", ".join(f"{k} {v:.0f} s" for k, v in p["terms"].items())
        print(f"  {p['command']:<7} at {p['bandwidth_mib_s']} MiB/s per worker: "
              f"{p['seconds'] / 60:.1f} min ({terms}); {p['requests']} requests; "
              f"peak RSS per process {p['rss_mib']:.0f} MiB")  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a tiny grid (smoke, < 2 min)")
    parser.add_argument("--json", action="store_true", help="also write bench/out/model.json")
    parser.add_argument(
        "--refit", type=Path, default=None, help="fit and print the runs of a model.json again"
    )
    opts = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    if opts.refit:
        doc = json.loads(opts.refit.read_text())
        rows, load0, when = doc["runs"], doc["load_before"], doc["when"]
    else:
        remote_latency._compiled()
        started, load0 = time.time(), os.getloadavg()
        rows = measure_all(_grid(opts.quick))
        when = time.strftime("%Y-%m-%d %H:%M:%S")
        print(f"{time.time() - started:.0f} s of runs", file=sys.stderr)
    c = fit(rows)
    per = requests_per_unit(rows)
    table = check(rows, c)
    loads = sorted(r["load"] for r in rows)
    print(f"runs finished {when} UTC on {os.cpu_count()} cores; load average (1 min) before "
          f"{load0[0]:.2f}, during the runs {loads[0]:.1f}-{loads[-1]:.1f}")  # fmt: skip
    print_coefficients(c, per)
    print_table(table)
    tb = predict_tb(c, per)
    if opts.json and not opts.refit:
        doc = {"when": when, "load_before": load0, "load_after": os.getloadavg(), "runs": rows,
               "table": table, "coefficients": asdict(c), "requests_per_unit": per, "tb": tb,
               "tb_assumptions": TB}  # fmt: skip
        (OUT / "model.json").write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
