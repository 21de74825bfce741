"""Whether a scaled-out run splits into units on workers: only when its estimated time in one
process (bytes at a deliberately low single-process rate, ``RATE_ENV`` to override) is at
least ``SPLIT_FACTOR`` times the workers' start-up (``should_split``); else it runs in one
process and says why (docs/explanation/scale-out.md).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ckpt_cli.core.executor import _STARTED, ExecutorSpec, LocalExecutor
from ckpt_cli.errors import UsageError

#: What one process moves a second when it rewrites (``reshard``, ``migrate``: read, decode,
#: encode, write) on a local file system and against an object store: deliberately low, so that
#: a split is declined only where it cannot pay (ckpt bench's single-process reshard runs at
#: 150-400 MiB/s locally).
LOCAL_RATE = 128 << 20
OBJECT_STORE_RATE = 32 << 20
#: What one process reads a second in ``verify --deep/--record`` (read, decode, count, hash: no
#: encode, no write), as deliberately low: 2x and 1.25x the rewrite's rates, where verify ran
#: 1.7-2.0x reshard's rate on a file system (256 MiB, page-cached, load 4.2-4.9) and 1.36x
#: through a bucket (512 MiB behind 25 ms and 16 MiB/s per process, load under 1).
VERIFY_LOCAL_RATE = 256 << 20
VERIFY_OBJECT_STORE_RATE = 40 << 20
#: Start-up of local workers (spawn, import TensorStore) until the pool reports its measured
#: ``ready_seconds``, and of a Dask run (connect, preload, the first task's round trip).
LOCAL_STARTUP_SECONDS = 2.0
DASK_STARTUP_SECONDS = 2.0
#: A run splits when its estimated single-process time is at least this many start-ups.
SPLIT_FACTOR = 4
#: The single-process rate every split decision assumes instead of the constants above, in MiB
#: a second (a positive number): for storage much slower or faster than they expect.
RATE_ENV = "CKPT_SPLIT_RATE"


@dataclass(frozen=True)
class SplitDecision:
    """Whether a scaled-out run splits into units; ``reason`` says why not (None: it splits)."""

    split: bool
    reason: str | None = None


def decide_split(
    nbytes: int,
    rate: float,
    startup_seconds: float,
    *,
    force: bool = False,
    factor: float = SPLIT_FACTOR,
) -> SplitDecision:
    """Split when ``nbytes`` at ``rate`` (bytes a second, one process) take at least ``factor``
    times the workers' start-up, or when ``force``."""
    from ckpt_cli.core.units import human_bytes

    alone = nbytes / rate
    if force or alone >= factor * startup_seconds:
        return SplitDecision(True)
    return SplitDecision(
        False,
        f"{human_bytes(nbytes)} take about {alone:.2f} s in one process "
        f"(at {human_bytes(int(rate))}/s), under {factor:g} x the workers' start-up "
        f"({startup_seconds:.1f} s): ran in one process (--force-split splits anyway)",
    )


def startup_seconds(spec: ExecutorSpec) -> float:
    """The workers' start-up: the early-started local pool's measured ``ready_seconds`` once
    it is ready, else the documented constant."""
    started = _STARTED.get(spec)
    if isinstance(started, LocalExecutor) and started.ready_seconds is not None:
        return started.ready_seconds
    return DASK_STARTUP_SECONDS if spec.kind == "dask" else LOCAL_STARTUP_SECONDS


def single_rate(*, remote: bool, reads_only: bool = False) -> float:
    """The single-process rate (bytes a second) a split decision assumes: ``RATE_ENV`` if set,
    else the constant for a rewrite or a read-only pass (``reads_only``: verify), on a file
    system or through an object store (``remote``)."""
    raw = os.environ.get(RATE_ENV, "").strip()
    if raw:
        try:
            mib = float(raw)
        except ValueError:
            mib = 0.0
        if not 0 < mib < 1 << 40:
            raise UsageError(
                f"{RATE_ENV}={raw[:40]!r}: give the single-process rate in MiB a second, "
                "a positive number"
            )
        return mib * (1 << 20)
    if reads_only:
        return VERIFY_OBJECT_STORE_RATE if remote else VERIFY_LOCAL_RATE
    return OBJECT_STORE_RATE if remote else LOCAL_RATE


def should_split(
    spec: ExecutorSpec, nbytes: int, *, remote: bool, reads_only: bool = False
) -> SplitDecision:
    """``decide_split`` for ``spec`` moving ``nbytes`` (``remote``: through an object store;
    ``reads_only``: read and decode only, as ``verify``) at ``single_rate``."""
    rate = single_rate(remote=remote, reads_only=reads_only)
    return decide_split(nbytes, rate, startup_seconds(spec), force=spec.force_split)
