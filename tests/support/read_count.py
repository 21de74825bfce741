"""How many bytes TensorStore (and ckpt's own decoders) read from local files while a block of code ran, against the bytes
a checkpoint's array data takes on disk: a reader that decodes each stored chunk once reads each
data file once (plus small OCDBT manifests and b-tree nodes)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def file_bytes_read() -> int:
    """TensorStore's process-wide count of bytes read by its ``file`` kvstore so far."""
    import tensorstore as ts

    metrics = ts.experimental_collect_matching_metrics("/tensorstore/kvstore/file/bytes_read")
    return sum(int(v.get("value", 0)) for m in metrics for v in m.get("values", []))


@contextlib.contextmanager
def counting_reads() -> Iterator[list[int]]:
    """Yields a list that holds, once the block ends, the bytes read inside it (TensorStore's
    and those ckpt's decoders read from the data files themselves), then the latter alone
    (``chunkread.FileValue``)."""
    import threading

    from ckpt_cli.core.format import chunkread

    box: list[int] = []
    direct = [0]
    lock = threading.Lock()
    real = chunkread.FileValue.read

    def read(self: Any, key: str, byte_range: slice) -> Any:
        got = real(self, key, byte_range)
        with lock:
            direct[0] += len(got.value)
        return got

    before = file_bytes_read()
    chunkread.FileValue.read = read  # type: ignore[method-assign]
    try:
        yield box
    finally:
        chunkread.FileValue.read = real  # type: ignore[method-assign]
    box.extend([file_bytes_read() - before + direct[0], direct[0]])


def stored_data_bytes(item: Path) -> int:
    """Bytes of the OCDBT data files (``d/``) of an item: every stored chunk once."""
    files = [p for p in item.rglob("*") if p.is_file() and p.parent.name == "d"]
    assert files, f"no OCDBT data files under {item}"
    return sum(p.stat().st_size for p in files)


def save_one_chunk_leaves(root: Path) -> dict[str, object]:
    """A CheckpointManager step 0 saved by the installed Orbax: numpy leaves, each one stored
    chunk (8 MiB and 2 MiB), random values (zstd leaves them about that size)."""
    import numpy as np
    import orbax.checkpoint as ocp

    rng = np.random.default_rng(0)
    state: dict[str, object] = {
        "params": {
            "w": rng.standard_normal((1024, 2048), dtype=np.float32),
            "b": rng.standard_normal((512, 1024), dtype=np.float32),
        }
    }
    with ocp.CheckpointManager(root) as mgr:
        mgr.save(0, args=ocp.args.StandardSave(state))
        mgr.wait_until_finished()
    return state


def file_values_opened(monkeypatch: Any, module: Any) -> list[str]:
    """The data files a reader opens to read chunks from directly (``FileValue``, replaced in
    ``module``, where the reader looks the name up), in order, while the test runs."""
    opened: list[str] = []
    real = module.FileValue

    class Spy(real):  # type: ignore[misc, valid-type]
        def __init__(self, place: Any) -> None:
            opened.append(place[0])
            super().__init__(place)

    monkeypatch.setattr(module, "FileValue", Spy)
    return opened


def orbax_restore_params(root: Path) -> dict[str, Any]:
    """Orbax's restore of step 0's ``params`` (a ``save_one_chunk_leaves`` layout, written by
    ckpt or Orbax) as numpy arrays."""
    import jax
    import numpy as np
    import orbax.checkpoint as ocp

    with ocp.CheckpointManager(root, item_handlers=ocp.PyTreeCheckpointHandler()) as mgr:
        meta = mgr.item_metadata(0)
        args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), meta)
        state = mgr.restore(0, args=ocp.args.PyTreeRestore(restore_args=args))
    return dict(state["params"])
