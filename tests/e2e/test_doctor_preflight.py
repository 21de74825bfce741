"""``ckpt doctor``'s preflight on a real Orbax checkpoint: ``--hosts`` splits the restore's
devices in JAX's order, the per-host figures add up, and the read amplification it predicts is
what TensorStore reads when each host's shards are read (its own chunk-read counter)."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.slow

ROWS, COLS = 64, 256

TARGETS = f"""
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P


def _state(mesh_shape, axes, spec):
    mesh = Mesh(np.array(jax.devices()).reshape(mesh_shape), axes)
    sharding = NamedSharding(mesh, P(*spec))
    return {{"w": jax.ShapeDtypeStruct(({ROWS}, {COLS}), np.float32, sharding=sharding),
             "step": jax.ShapeDtypeStruct((), np.int32, sharding=NamedSharding(mesh, P()))}}


def same():
    return _state((8,), ("x",), ("x", None))


def columns():
    # every stored chunk (8 rows, all columns) straddles the four column shards
    return _state((2, 4), ("data", "model"), (None, "model"))
"""


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """``w`` float32[64, 256] saved by Orbax on mesh (8,) with ``P('x', None)``: chunks of 8
    rows and all columns; and the targets module."""
    import jax
    import orbax.checkpoint as ocp
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    (tmp_path / "preflight_targets.py").write_text(textwrap.dedent(TARGETS))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("preflight_targets", None)
    import preflight_targets as t

    mesh = Mesh(np.array(jax.devices()), ("x",))
    values = np.random.RandomState(0).standard_normal((ROWS, COLS)).astype(np.float32)
    state = {
        "w": jax.device_put(values, NamedSharding(mesh, P("x", None))),
        "step": jax.device_put(np.int32(3), NamedSharding(mesh, P())),
    }
    with ocp.CheckpointManager(str(tmp_path / "run")) as mgr:
        mgr.save(3, args=ocp.args.StandardSave(state))
        mgr.wait_until_finished()
    return t


def _hosts(cli, tmp_path: Path, target: str, *extra: str) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    r = cli("doctor", tmp_path / "run", "--target", f"preflight_targets:{target}", *extra, "--json")
    assert r.code == 0, r.stderr
    memory: dict[str, Any] = r.json()["memory"]
    return memory


@pytest.mark.parametrize(("target", "replication"), [("same", 1), ("columns", 2)])
@pytest.mark.parametrize("hosts", [1, 2, 4, 8])
def test_per_host_bytes_add_up_to_the_total_times_replication(
    cli, world, tmp_path: Path, target: str, replication: int, hosts: int
) -> None:  # type: ignore[no-untyped-def]
    memory = _hosts(cli, tmp_path, target, "--hosts", str(hosts))
    per = memory["hosts"]
    assert len(per) == hosts
    assert [h["devices"] for h in per] == [
        list(range(i * 8 // hosts, (i + 1) * 8 // hosts)) for i in range(hosts)
    ]
    w = ROWS * COLS * 4
    step = 4 * 8  # the int32 step, replicated on every device
    assert sum(h["device_bytes"] for h in per) == w * replication + step
    assert memory["max_device_bytes"] == w // (8 // replication) + 4
    for h in per:
        assert h["orbax_restore_peak_bytes"] >= h["device_bytes"]
        assert h["kept_bytes"] <= h["device_bytes"]


def test_hosts_that_do_not_divide_the_devices_is_a_usage_error(cli, world, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    r = cli("doctor", tmp_path / "run", "--target", "preflight_targets:same", "--hosts", "3")
    assert r.code == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "--hosts 3" in lines[0] and "8 devices" in lines[0]
    assert "Traceback" not in r.stderr
    r = cli("doctor", tmp_path / "run", "--target", "preflight_targets:same", "--hosts", "0")
    assert r.code == 2 and "Traceback" not in r.stderr


def _chunk_reads(read: Any) -> int:
    """TensorStore's own count of chunks it read (decoded) while ``read()`` ran."""
    import tensorstore as ts

    def count() -> int:
        metrics = ts.experimental_collect_matching_metrics("/tensorstore/cache/chunk_cache/reads")
        return sum(int(v["value"]) for m in metrics for v in m["values"])

    before = count()
    read()
    return count() - before


@pytest.mark.parametrize("hosts", [1, 2])
def test_read_amplification_is_what_tensorstore_reads(
    cli, world, tmp_path: Path, hosts: int
) -> None:  # type: ignore[no-untyped-def]
    import tensorstore as ts

    from ckpt_cli.core.doctor.preflight import device_boxes, target_placements

    memory = _hosts(cli, tmp_path, "columns", "--hosts", str(hosts))
    item = tmp_path / "run" / "3" / "default"
    spec = {
        "driver": "zarr",
        "kvstore": {"driver": "ocdbt", "base": f"file://{item}/", "path": "w/"},
    }
    store = ts.open(spec).result()
    chunk_bytes = int(np.prod(store.chunk_layout.read_chunk.shape)) * 4
    placement = target_placements("preflight_targets:columns")["w"]
    per_host = 8 // hosts
    assert memory["hosts"]
    for h in memory["hosts"]:
        boxes = {
            box for d, box in device_boxes((ROWS, COLS), placement) if d // per_host == h["host"]
        }
        assert boxes
        chunks = 0
        for box in boxes:  # as Orbax does: each distinct shard once, a fresh read (no cache)
            index = tuple(slice(a, b) for a, b in box)
            chunks += _chunk_reads(lambda i=index: ts.open(spec).result()[i].read().result())
        measured_w = chunks * chunk_bytes
        kept_w = sum(int(np.prod([b - a for a, b in box])) * 4 for box in boxes)
        step_bytes = 4  # the scalar, kept and read whole
        assert h["read_bytes"] == measured_w + step_bytes
        assert h["kept_bytes"] == kept_w + step_bytes
        assert h["read_amplification"] == pytest.approx(
            (measured_w + step_bytes) / (kept_w + step_bytes), abs=1e-3
        )
        assert h["read_amplification"] > 3.9  # each column shard decodes all 8 chunks
    assert "reshard first" in (memory["advice"] or "")
    same = _hosts(cli, tmp_path, "same")
    assert same["hosts"][0]["read_amplification"] == 1.0 and same["advice"] is None


def test_the_preflighted_restore_runs_and_trains_one_step(cli, world, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The restore the preflight sized: Orbax restores onto the (2, 4) mesh, one step trains."""
    import jax
    import jax.numpy as jnp
    import optax

    from tests.support.orbax_truth import orbax_restores

    ok, state = orbax_restores(tmp_path / "run", world.columns())
    assert ok
    assert state["w"].sharding.spec == jax.sharding.PartitionSpec(None, "model")
    tx = optax.sgd(0.1)
    opt = tx.init(state["w"])
    loss, grad = jax.value_and_grad(lambda w: jnp.mean(w**2))(state["w"])
    updates, opt = tx.update(grad, opt, state["w"])
    w = optax.apply_updates(state["w"], updates)
    step = state["step"] + 1
    assert int(step) == 4 and np.isfinite(float(loss))
    assert float(jnp.mean(w**2)) < float(loss)
    r = cli("doctor", tmp_path / "run", "--target", "preflight_targets:columns")
    assert r.code == 0 and "preflight" in r.stdout and "reshard first" in r.stdout
