"""A cost model of ``verify --deep`` and ``reshard``: wall time and peak RSS as functions of the
checkpoint and the setting, with coefficients fitted to measured runs (``bench/bench_model.py``).

Pure Python (no numpy: the fit is a Nelder-Mead search on the mean squared log error).

Time, for one command::

    time = start + leaves x per_leaf
         + startup x workers / cores                 (only with workers > 1: spawning them)
         + net_bytes x store_per_byte                (only when the store runs on these cores)
         + max(bytes x cpu_per_byte / hosts,         (decode, digests, encode: CPU)
               net_bytes / (workers x bandwidth),    (a per-process bandwidth cap)
               requests x latency / (workers x window))   (latency, ``window`` requests in flight)

``window`` is ``window_1`` for one process and ``window_w`` per worker process (the issue
measured 7 and 3-4), held within 1-64; ``startup`` is the wall time a worker costs before its first request,
spread over the ``cores`` that start them; ``hosts`` the machines whose CPUs share the decode
(1 here: every worker on this 2-core machine). The three terms of the max overlap (reads are
pipelined), so the slowest one sets the pace. ``store_per_byte`` is the CPU the S3 server and
the latency proxy spend per byte when they share this machine's cores with ckpt (the bench's
moto): it slows every remote run here and is not charged to a cluster reading a real store.

Workers above 1 mean a split run: ``verify`` and ``reshard`` decline a split whose estimate
says the start-up would not pay (``split.should_split``), and the bench passes
``--force-split`` to measure the split; a declined run is the one-process run (workers = 1).

Memory (peak RSS of the largest process)::

    rss = base + min(budget, per_chunk_byte x chunk + per_byte x held) + per_leaf x leaves

where ``budget`` is ``--memory-limit`` (1 GiB by default) and ``held`` the bytes one process
works on: the whole checkpoint for one process, a unit (``--unit-bytes``) for a worker. What a
process holds grows with the chunk (decoded chunks, the codec's buffers) and the data in
flight until the limit caps it.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

MIB = 1 << 20

#: The coefficients of time: per command, then shared by both commands.
TIME_PER_COMMAND = ("start", "per_leaf", "cpu_per_byte")
TIME_SHARED = ("startup", "window_1", "window_w", "store_per_byte")
MEMORY_TERMS = ("base", "per_chunk_byte", "per_byte", "per_leaf")
#: A window is at least one request and at most ``--max-requests``' default (64).
MAX_WINDOW = 64.0


@dataclass(frozen=True)
class Setting:
    """One run's inputs. ``bandwidth`` in bytes/s per process (None: no cap); ``latency`` in
    seconds; ``requests``: requests to the store (0 on a local disk)."""

    command: str
    nbytes: int
    chunk: int
    leaves: int
    workers: int = 1
    requests: int = 0
    latency: float = 0.0
    bandwidth: float | None = None
    net_bytes: int = 0
    hosts: int = 1
    cores: int = 2
    local_store: bool = False
    budget: int = 1024 * MIB
    unit: int = 256 * MIB

    @property
    def held(self) -> int:
        """Bytes one process works on: all of them, or a unit (workers)."""
        return self.nbytes if self.workers == 1 else min(self.unit, self.nbytes)


@dataclass
class Coefficients:
    """Fitted values: ``time[command][term]``, ``shared[term]``, ``memory[command][term]``."""

    time: dict[str, dict[str, float]] = field(default_factory=dict)
    shared: dict[str, float] = field(default_factory=dict)
    memory: dict[str, dict[str, float]] = field(default_factory=dict)


def time_terms(s: Setting, c: Coefficients) -> dict[str, float]:
    """Each term of the time formula, in seconds (``predict_time`` adds them up)."""
    k, sh = c.time[s.command], c.shared
    window = min(max(sh["window_1"] if s.workers == 1 else sh["window_w"], 1.0), MAX_WINDOW)
    return {
        "start": k["start"],
        "leaves": s.leaves * k["per_leaf"],
        "startup": sh["startup"] * s.workers / s.cores if s.workers > 1 else 0.0,
        "cpu": s.nbytes * k["cpu_per_byte"] / s.hosts,
        "bandwidth": s.net_bytes / (s.workers * s.bandwidth) if s.bandwidth else 0.0,
        "latency": s.requests * s.latency / (s.workers * window),
        "store": s.net_bytes * sh["store_per_byte"] if s.local_store else 0.0,
    }


def predict_time(s: Setting, c: Coefficients) -> float:
    t = time_terms(s, c)
    fixed = t["start"] + t["leaves"] + t["startup"] + t["store"]
    return fixed + max(t["cpu"], t["bandwidth"], t["latency"])


def predict_memory(s: Setting, c: Coefficients) -> float:
    m = c.memory[s.command]
    held = min(s.budget, m["per_chunk_byte"] * s.chunk + m["per_byte"] * s.held)
    return m["base"] + held + m["per_leaf"] * s.leaves


def relative_error(predicted: float, measured: float) -> float:
    return (predicted - measured) / measured


def _toward(centre: list[float], worst: list[float], t: float) -> list[float]:
    """The point ``centre + t x (worst - centre)`` (reflect: -1, expand: -2, contract: 0.5)."""
    return [c + t * (w - c) for c, w in zip(centre, worst, strict=True)]


def nelder_mead(
    f: Callable[[list[float]], float], x0: Sequence[float], steps: int = 4000
) -> list[float]:
    """Minimise ``f`` from ``x0`` (a plain Nelder-Mead simplex, step 1 in every direction)."""
    n = len(x0)
    simplex = [list(x0)] + [
        [x + (1.0 if i == j else 0.0) for j, x in enumerate(x0)] for i in range(n)
    ]
    values = [f(p) for p in simplex]
    for _ in range(steps):
        order = sorted(range(n + 1), key=values.__getitem__)
        simplex, values = [simplex[i] for i in order], [values[i] for i in order]
        if values[-1] - values[0] < 1e-12:
            break
        centre = [sum(p[j] for p in simplex[:-1]) / n for j in range(n)]
        worst = simplex[-1]
        r = _toward(centre, worst, -1.0)
        fr = f(r)
        if fr < values[0]:
            e = _toward(centre, worst, -2.0)
            fe = f(e)
            simplex[-1], values[-1] = (e, fe) if fe < fr else (r, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = r, fr
        else:
            cpoint = _toward(centre, worst, 0.5)
            fc = f(cpoint)
            if fc < values[-1]:
                simplex[-1], values[-1] = cpoint, fc
            else:
                best = simplex[0]
                simplex = [best] + [
                    [(b + x) / 2 for b, x in zip(best, p, strict=True)] for p in simplex[1:]
                ]
                values = [values[0]] + [f(p) for p in simplex[1:]]
    return simplex[min(range(n + 1), key=values.__getitem__)]


def _log_error(pairs: Sequence[tuple[float, float]]) -> float:
    return sum(math.log(max(p, 1e-9) / m) ** 2 for p, m in pairs) / len(pairs)


#: Where the search starts (the coefficients are searched as logarithms: all are positive).
TIME_START = {"start": 2.0, "per_leaf": 1e-3, "cpu_per_byte": 2e-9}
SHARED_START = {"startup": 2.0, "window_1": 7.0, "window_w": 4.0, "store_per_byte": 50e-9}


def fit_time(runs: Sequence[tuple[Setting, float]], c: Coefficients) -> Coefficients:
    """Fit the time coefficients of every command in ``runs`` (setting, measured seconds)."""
    assert runs, "nothing to fit"
    commands = sorted({s.command for s, _ in runs})
    names = [(cmd, t) for cmd in commands for t in TIME_PER_COMMAND] + [
        ("", t) for t in TIME_SHARED
    ]

    def unpack(x: list[float]) -> Coefficients:
        out = replace(c, time={cmd: {} for cmd in commands}, shared={})
        for (cmd, t), v in zip(names, x, strict=True):
            if cmd:
                out.time[cmd][t] = math.exp(v)
            else:
                out.shared[t] = math.exp(v)
        return out

    def loss(x: list[float]) -> float:
        k = unpack(x)
        return _log_error([(predict_time(s, k), m) for s, m in runs])

    x0 = [math.log(TIME_START[t] if cmd else SHARED_START[t]) for cmd, t in names]
    best = x0
    # The max() makes the surface piecewise: search again from the start point moved by a
    # factor of e^-2..e^2 in every coordinate (a fixed seed: the same runs give the same fit).
    rng = random.Random(0)
    for start in [x0] + [[v + rng.uniform(-2, 2) for v in x0] for _ in range(7)]:
        for _ in range(3):
            start = nelder_mead(loss, start)
        best = min(best, start, key=loss)
    return unpack(best)


def fit_memory(runs: Sequence[tuple[Setting, float]], c: Coefficients) -> Coefficients:
    """Fit the ``MEMORY_TERMS`` of each command in ``runs`` (setting, measured bytes)."""
    assert runs, "nothing to fit"
    out = replace(c, memory=dict(c.memory))
    for cmd in sorted({s.command for s, _ in runs}):
        mine = [(s, m) for s, m in runs if s.command == cmd]

        def loss(x: list[float], mine: list[tuple[Setting, float]] = mine, cmd: str = cmd) -> float:
            out.memory[cmd] = dict(zip(MEMORY_TERMS, (math.exp(v) for v in x), strict=True))
            return _log_error([(predict_memory(s, out), m) for s, m in mine])

        x = [math.log(200 * MIB), math.log(2.0), math.log(0.1), math.log(50e3)]
        for _ in range(3):
            x = nelder_mead(loss, x)
        loss(x)
    return out
