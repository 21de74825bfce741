"""A signal while the pipeline waits for a leaf's create or a block's commit leaves that
request where ``drain_quietly`` waits for it, so nothing TensorStore started lands after the
caller has deleted the tmp step (a migrate under SIGINT once left its step behind)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from ckpt_cli.core.write.pipeline import Pipeline

SHAPE = (64, 64)


class _Held:
    """A future whose first wait is cut by a signal (``KeyboardInterrupt``); later waits wait."""

    def __init__(self, real: Any, log: list[str], name: str) -> None:
        self.real, self.log, self.name = real, log, name
        self.waits = 0

    def done(self) -> bool:
        return bool(self.real.done())

    def result(self) -> Any:
        self.waits += 1
        if self.waits == 1:
            self.log.append(f"signal in {self.name}")
            raise KeyboardInterrupt
        self.log.append(f"drained {self.name}")
        return self.real.result()


class _Array:
    """A TensorStore array whose writes' commits are ``_Held``."""

    def __init__(self, real: Any, log: list[str]) -> None:
        self.real, self.log, self.dtype = real, log, real.dtype

    def __getitem__(self, region: Any) -> Any:
        real, log = self.real[region], self.log

        def write(values: Any, **kw: Any) -> Any:
            return SimpleNamespace(commit=_Held(real.write(values, **kw).commit, log, "commit"))

        return SimpleNamespace(write=write)


@pytest.mark.parametrize("where", ["create", "commit"])
def test_a_request_cut_by_a_signal_is_still_drained(where: str) -> None:
    import tensorstore as ts

    from ckpt_cli.core.write.types import ArrayOut, LeafOut

    log: list[str] = []
    values = np.arange(np.prod(SHAPE), dtype=np.float32).reshape(SHAPE)
    leaf = LeafOut(
        keypath=("w",),
        key_types=(),
        value_type="jax.Array",
        array=ArrayOut("float32", SHAPE, SHAPE, zarr3=False),
        source=lambda region: values[region].copy(),  # type: ignore[arg-type]
    )

    def open_array(_: LeafOut) -> Any:
        spec = {"driver": "zarr", "kvstore": "memory://", "metadata": {"chunks": list(SHAPE)}}
        fut = ts.open(spec, create=True, dtype=ts.float32, shape=list(SHAPE))
        if where == "create":
            return _Held(fut, log, "create")
        return SimpleNamespace(result=lambda: _Array(fut.result(), log))

    writer = SimpleNamespace(
        in_flight=8,
        memory_limit=1 << 30,
        finite_label=None,
        slab_reads=False,
        open_array=open_array,
        dest="memory://",
    )
    pipe = Pipeline(writer, [(leaf, [(slice(0, 64), slice(0, 64))])], None)  # type: ignore[arg-type]
    with pytest.raises(KeyboardInterrupt):
        pipe.run()
    pipe.drain_quietly()
    assert log == [f"signal in {where}", f"drained {where}"], log
