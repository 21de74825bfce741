"""``ops.then`` of a block decoded on the read pool runs the function there, once the block
lands (a cast of every block in flight at once); of anything else, as before."""

from __future__ import annotations

import threading
from concurrent.futures import Future

import numpy as np
import pytest

from ckpt_cli.core.spec import ops
from ckpt_cli.core.threads import read_pool


def test_a_pool_future_is_chained_on_the_read_pool() -> None:
    gate = threading.Event()

    def read() -> np.ndarray:
        gate.wait(10)
        return np.arange(6, dtype=np.float32)

    ran_on: list[str] = []

    def double(v: np.ndarray) -> np.ndarray:
        ran_on.append(threading.current_thread().name)
        return v * 2

    value = read_pool().submit(read)
    out = ops.then(value, double)
    assert isinstance(out, Future) and not out.done() and not ran_on  # nothing waited here
    gate.set()
    assert np.array_equal(out.result(10), np.arange(6) * 2)
    assert len(ran_on) == 1 and ran_on[0].startswith("ckpt-read")


def test_errors_of_the_read_and_of_the_function_reach_the_caller() -> None:
    failed: Future[np.ndarray] = Future()
    failed.set_exception(OSError("disk"))
    with pytest.raises(OSError, match="disk"):
        ops.then(failed, lambda v: v).result(10)

    def refuse(v: np.ndarray) -> np.ndarray:
        raise ValueError("does not fit")

    with pytest.raises(ValueError, match="does not fit"):
        ops.then(read_pool().submit(lambda: np.zeros(2)), refuse).result(10)


def test_plain_values_and_other_futures_keep_their_route() -> None:
    assert ops.then(3, lambda v: v + 1) == 4

    class Other:
        def result(self) -> int:
            return 5

    pending = ops.then(Other(), lambda v: v * 2)
    assert isinstance(pending, ops.Pending) and pending.result() == 10


def test_a_chained_block_is_freed_without_the_garbage_collector() -> None:
    """No reference cycle through the read's callbacks: once the caller drops the futures, the
    block read is freed by reference counting (a cycle kept every block of a migrate alive
    until a collection: gigabytes)."""
    import gc
    import time
    import weakref

    refs: list[weakref.ref[np.ndarray]] = []

    def make() -> np.ndarray:
        block = np.zeros(1000)
        refs.append(weakref.ref(block))
        return block

    gc.collect()
    gc.disable()
    try:
        value = read_pool().submit(make)
        out = ops.then(value, lambda v: float(v.sum()))
        assert out.result(10) == 0.0
        del value, out
        deadline = time.monotonic() + 5
        while refs[0]() is not None and time.monotonic() < deadline:
            time.sleep(0.01)  # the pool's thread lets go of its finished task
        assert refs and refs[0]() is None
    finally:
        gc.enable()


def test_a_block_landing_while_the_interpreter_exits_is_dropped_quietly(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """After Ctrl-C the interpreter refuses new pool tasks while queued reads still land: their
    chained work is dropped (the future cancelled), never a traceback from the callback."""
    from ckpt_cli.core import threads

    class Closed:
        def submit(self, *args: object) -> None:
            raise RuntimeError("cannot schedule new futures after interpreter shutdown")

    monkeypatch.setattr(threads, "read_pool", lambda n=None: Closed())
    value: Future[np.ndarray] = Future()
    out = ops.then(value, lambda v: v)
    with caplog.at_level("DEBUG", logger="concurrent.futures"):
        value.set_result(np.zeros(2))
    assert out.cancelled()
    assert not caplog.records, [r.getMessage() for r in caplog.records]
