"""A sharded save by real Orbax on 8 forced CPU devices, and every leaf's values read back
through ckpt's own reader (it reads layouts Orbax cannot)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ckpt_cli.core.format.resolve import resolve_item
from ckpt_cli.core.inspect.item import inspect_item
from ckpt_cli.core.storage import LocalLocation


def read_values(path: Path, step: int | None = None, item: str | None = None) -> dict[str, Any]:
    """Every leaf's values through ckpt's own reader (works on layouts Orbax cannot read)."""
    report = inspect_item(resolve_item(LocalLocation(str(path)), step, item))
    from ckpt_cli.core.format.arrays import ItemStore

    store = ItemStore(report.ref.location, report.zarr_format == 3)
    out: dict[str, Any] = {}
    for leaf in report.leaves:
        if leaf.array is not None:
            full = tuple(slice(0, n) for n in leaf.array.shape)
            got = store.reader(leaf.name, leaf.array, leaf.database).read(full)
            out[leaf.name] = np.asarray(got.result() if hasattr(got, "result") else got)
        else:
            out[leaf.name] = (leaf.value_type, leaf.value)
    return out


def assert_same_values(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a.keys() == b.keys()
    assert a
    for name in a:
        if isinstance(a[name], np.ndarray):
            assert a[name].dtype == b[name].dtype, name
            assert a[name].tobytes() == b[name].tobytes(), name  # bit-identical, NaNs included
        else:
            assert a[name] == b[name], name


def save_sharded(root: Path, mesh_shape: tuple[int, int] = (8, 1)) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp
    import orbax.checkpoint as ocp
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:8]).reshape(mesh_shape), ("data", "model"))
    rs = np.random.RandomState(0)
    tree = {
        "params": {
            "dense": {
                "kernel": jax.device_put(
                    jnp.asarray(rs.normal(size=(64, 32)).astype(np.float32)),
                    NamedSharding(mesh, P("data", None)),
                ),
                "bias": jax.device_put(jnp.zeros(32), NamedSharding(mesh, P())),
            },
            "embed": jax.device_put(
                jnp.asarray(rs.normal(size=(16, 8))).astype(jnp.bfloat16),
                NamedSharding(mesh, P("data", "model")),
            ),
        },
        "step": jnp.asarray(42, jnp.int32),
    }
    mgr = ocp.CheckpointManager(str(root))
    mgr.save(42, args=ocp.args.StandardSave(tree))
    mgr.wait_until_finished()
    mgr.close()
    return tree
