"""A small sharded training state saved through ``ckpt_cli.orbax.DigestingCheckpointManager``.

Shared by the in-process test (8 CPU devices) and the two-process one: ``python -m
tests.support.savetime ROOT PORT PROCESS`` is one of two JAX processes (4 CPU devices each,
``jax.distributed`` on 127.0.0.1:PORT) that train ``SAVED_STEP`` steps on a (4, 2) mesh over
all 8 devices and save the step asynchronously as ``Composite(state=..., meta=...)``. It
prints one JSON line: ``{"process": i, "digested_bytes": n}``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

SAVED_STEP = 2
LR = 1e-2


def make_mesh() -> Any:
    import jax
    from jax.sharding import Mesh

    return Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))


def shardings(mesh: Any) -> dict[str, Any]:
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    return {
        "w": NamedSharding(mesh, P("data", "model")),
        "v": NamedSharding(mesh, P(None, "model")),
        "b": NamedSharding(mesh, P()),
    }


def initial_state(mesh: Any) -> dict[str, Any]:
    """Params (a (4,2)-sharded kernel, a half-replicated one, a replicated bias), adam's state,
    a step counter."""
    import jax
    import jax.numpy as jnp
    import optax

    rs = np.random.RandomState(0)
    values = {
        "w": rs.normal(size=(64, 1024)).astype(np.float32),
        "v": rs.normal(size=(1024, 6)).astype(np.float32),
        "b": rs.normal(size=(6,)).astype(np.float32),
    }
    shard = shardings(mesh)
    params = {
        k: jax.make_array_from_callback(a.shape, shard[k], lambda i, a=a: a[i])
        for k, a in values.items()
    }
    state = {"params": params, "opt_state": optax.adam(LR).init(params), "step": jnp.int32(0)}
    return global_scalars(state, mesh)


def global_scalars(state: dict[str, Any], mesh: Any) -> dict[str, Any]:
    """Scalars (the step, adam's count) as replicated global arrays: a multi-process save
    refuses arrays local to one device."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    def put(x: Any) -> Any:
        if getattr(x, "ndim", None) != 0:
            return x
        host = np.asarray(x)
        return jax.make_array_from_callback((), NamedSharding(mesh, P()), lambda _: host)

    return jax.tree.map(put, state)


def batch(step: int) -> tuple[Any, Any]:
    rs = np.random.RandomState(100 + step)
    return rs.normal(size=(8, 64)).astype(np.float32), rs.normal(size=(8, 6)).astype(np.float32)


def loss_fn(params: dict[str, Any], x: Any, y: Any) -> Any:
    import jax.numpy as jnp

    out = jnp.tanh(x @ params["w"]) @ params["v"] + params["b"]
    return jnp.mean((out - y) ** 2)


def train_step(state: dict[str, Any]) -> tuple[dict[str, Any], float]:
    """One step: jax.grad of the loss, adam's update applied."""
    import jax
    import optax

    x, y = batch(int(state["step"]))
    loss, grads = jax.value_and_grad(loss_fn)(state["params"], x, y)
    updates, opt_state = optax.adam(LR).update(grads, state["opt_state"], state["params"])
    params = optax.apply_updates(state["params"], updates)
    new = {"params": params, "opt_state": opt_state, "step": state["step"] + 1}
    return global_scalars(new, make_mesh()), float(loss)


def train_and_save(root: Path) -> tuple[dict[str, Any], int]:
    """``SAVED_STEP`` steps, then an async Composite save through the digesting manager; the
    state saved and the bytes this process digested."""
    import orbax.checkpoint as ocp

    from ckpt_cli.orbax import DigestingCheckpointManager

    state = initial_state(make_mesh())
    for _ in range(SAVED_STEP):
        state, _ = train_step(state)
    options = ocp.CheckpointManagerOptions(enable_async_checkpointing=True)
    with DigestingCheckpointManager(ocp.CheckpointManager(root, options=options)) as mngr:
        args = ocp.args.Composite(
            state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave({"lr": LR})
        )
        mngr.save(SAVED_STEP, args=args)
        digested = mngr.digested_bytes
    return state, digested


def main() -> None:
    root, port, process = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=process)
    _, digested = train_and_save(Path(root))
    print(json.dumps({"process": process, "digested_bytes": digested}), flush=True)
    jax.distributed.shutdown()


if __name__ == "__main__":
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    main()


def recorded(item: Path) -> dict[str, str]:
    """The ld1 digest of every leaf in the item's digest record."""
    leaves = json.loads((item / "_CKPT_DIGESTS.json").read_text())["leaves"]
    return {name: str(d["ld1"]) for name, d in leaves.items()}


def digested(root: Path, step: int, item: str) -> dict[str, str | None] | None:
    """What ``ckpt digest --json`` prints for every leaf of ``root/step/item`` (a fresh
    process: TensorStore's cache in this one may hold chunks read before a flip); None when
    it cannot read the item at all (a damaged b-tree node: an error, not a value)."""
    import subprocess

    cmd = [sys.executable, "-m", "ckpt_cli", "digest", str(root), "--step", str(step), "--json"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    run = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    doc = json.loads(run.stdout)
    if "items" not in doc:
        return None
    items = [it for it in doc["items"] if it["item"] == item]
    assert len(items) == 1, (run.stdout, run.stderr)
    return {leaf["name"]: leaf["digest"] for leaf in items[0]["leaves"]}


def flip_a_byte(root: Path, step: int, item: str, record: dict[str, str]) -> list[str]:
    """One byte flipped in the middle of a data file of the item, the largest first; a file
    whose flip changes no leaf (a b-tree node: ``ckpt digest`` fails outright, or an unused
    one) is put back and the next tried. The leaves whose digest no longer matches ``record``."""
    base = root / str(step) / item
    files = sorted([*base.glob("ocdbt.process_*/d/*"), *base.glob("d/*")], key=_size)
    assert files, f"no data file under {base}"
    for target in reversed(files):
        data = target.read_bytes()
        flipped = bytearray(data)
        flipped[len(data) // 2] ^= 0x40
        target.write_bytes(bytes(flipped))
        now = digested(root, step, item)
        changed = [name for name in record if now and now.get(name) != record[name]]
        if changed:
            return changed
        target.write_bytes(data)
    raise AssertionError(f"no flipped byte under {base} changed a digest")


def _size(p: Path) -> int:
    return p.stat().st_size
