"""The worker side of a scaled-out run: what a worker process imports before its first unit
(``WORKER_PRELOAD``), the ``UNITS_PER_WORKER`` units it runs at once on threads (the local
pool's worker loop, ``threaded_worker``; a Dask task's slot, ``in_slot``), and the counters
tests and the bench read (``units_running``, ``worker_state``). ``executor.py`` drives them.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")

#: What a worker imports before its first unit: TensorStore (1.5-3 s of wall time on a loaded
#: machine) and the modules the units run in.
WORKER_PRELOAD = (
    "tensorstore",
    "ckpt_cli.core.write.distributed",
    "ckpt_cli.core.verify.distributed",
    "ckpt_cli.core.trend.distributed",
)
#: Times this process ran the worker initializer (1 in a pool worker, 0 in the driver).
_WORKER_STARTS = 0
#: Units one worker process runs at once: the next one starts while the previous one drains.
UNITS_PER_WORKER = 2
#: Units running in this process now, and the most that ever ran at once (tests, the bench).
_RUNNING = [0, 0]
_RUNNING_LOCK = threading.Lock()
_SLOTS = threading.BoundedSemaphore(UNITS_PER_WORKER)


def threaded_pool() -> Any:
    """A ``ProcessPoolExecutor`` whose worker processes run ``threaded_worker`` (made when a
    local pool is first wanted: ``concurrent.futures.process`` loads ``multiprocessing``)."""
    from concurrent.futures import ProcessPoolExecutor

    class ThreadedPool(ProcessPoolExecutor):
        # The one change to Python's pool: the loop each worker process runs. Everything else
        # (submission, results, a dead worker breaking the pool, shutdown) is Python's own.
        def _spawn_process(self) -> None:
            pool: Any = self  # Python's private pool attributes, untyped
            p = pool._mp_context.Process(
                target=threaded_worker,
                args=(pool._call_queue, pool._result_queue, pool._initializer, pool._initargs),
            )
            p.start()
            pool._processes[p.pid] = p

    return ThreadedPool


def threaded_worker(call_queue: Any, result_queue: Any, initializer: Any, initargs: Any) -> None:
    """A local worker process: Python's worker loop, except that it takes the next call while
    up to ``UNITS_PER_WORKER`` run, each on a thread of its own."""
    from concurrent.futures import process

    wrap: Any = process._ExceptionWithTraceback
    send: Any = process._sendback_result

    if initializer is not None:
        try:
            initializer(*initargs)
        except BaseException:
            return  # the pool sees the process gone and breaks, as Python's own loop does

    def run(item: Any) -> None:
        try:
            r = counted(item.fn, *item.args, **item.kwargs)
        except BaseException as e:
            send(result_queue, item.work_id, exception=wrap(e, e.__traceback__))
        else:
            send(result_queue, item.work_id, result=r)
        finally:
            _SLOTS.release()

    threads: list[threading.Thread] = []
    while True:
        _SLOTS.acquire()
        item = call_queue.get(block=True)
        if item is None:  # shutdown: finish the units running, then wake the pool's manager
            for t in threads:
                t.join()
            result_queue.put(os.getpid())
            return
        threads = [t for t in threads if t.is_alive()]
        threads.append(threading.Thread(target=run, args=(item,), daemon=True))
        threads[-1].start()
        del item


def counted(fn: Callable[..., R], *args: Any, **kwargs: Any) -> R:
    """``fn(*args)``, counted in ``_RUNNING`` while it runs."""
    with _RUNNING_LOCK:
        _RUNNING[0] += 1
        _RUNNING[1] = max(_RUNNING)
    try:
        return fn(*args, **kwargs)
    finally:
        with _RUNNING_LOCK:
            _RUNNING[0] -= 1


def in_slot(fn: Callable[[T], R], unit: T, stop: str | None = None) -> R:
    """A Dask task: run ``unit`` in one of this worker's ``UNITS_PER_WORKER`` slots, seceded
    from the worker's thread pool so that the worker starts its next task meanwhile (the task
    after that waits here for a slot, holding its thread: at most ``UNITS_PER_WORKER`` units
    run in a worker process, and each of its threads holds at most one more).

    ``stop``: the name of a Dask ``Event`` the driver sets when it gives the run up (Ctrl-C, a
    failed unit), asked at the scheduler just before the unit starts. A cancel reaches the
    worker on another connection than the driver's question "what still runs there?", so a
    task the worker held ready could start after the answer "nothing", and write into a step
    the driver was removing. Asked here, the event orders the two: a unit that starts has seen
    it unset, so it was already running when the driver set it, and the driver waits for it."""
    _SLOTS.acquire()
    try:
        try:
            from distributed import secede

            secede()
        except Exception:  # not on a Dask worker's thread (a test calling it directly)
            pass
        if stop is not None:
            from distributed import Event

            if Event(stop).is_set():
                raise RuntimeError("the ckpt run that submitted this unit was stopped")
        return counted(fn, unit)
    finally:
        _SLOTS.release()


def units_running(_: object = None) -> tuple[int, int, int]:
    """This process's id, the units it runs now and the most it ran at once (tests, bench)."""
    with _RUNNING_LOCK:
        return os.getpid(), _RUNNING[0], _RUNNING[1]


def preload(modules: Iterable[str]) -> None:
    """Import ``modules`` (a worker, before its first unit)."""
    import importlib

    for name in modules:
        importlib.import_module(name)


def start_worker(modules: tuple[str, ...]) -> None:
    """A local worker's initializer: ignore SIGINT (Ctrl-C reaches the whole process group, and
    the driver, which stops the workers, decides how the run ends: no traceback from each
    worker), then import ``modules``."""
    import signal

    global _WORKER_STARTS
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _WORKER_STARTS += 1
    preload(modules)


def ready_task() -> None:
    """The no-op task that makes a pool spawn its workers at once."""


def worker_state(_: object = None) -> tuple[int, int, tuple[str, ...]]:
    """This process's id, how many times it ran the worker initializer, and which modules of
    ``WORKER_PRELOAD`` it holds (a task for tests and the bench)."""
    held = tuple(m for m in WORKER_PRELOAD if m in sys.modules)
    return os.getpid(), _WORKER_STARTS, held
