"""Scaled-out reshard, migrate and verify on a local Dask cluster (2 worker processes on
127.0.0.1) and on local worker processes, compared with the single-process results: equal
values (``ckpt diff`` exit 0), equal recorded leaf digests, a real Orbax restore, a worker
killed mid-run, and a failing unit that leaves no step behind."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ckpt_cli.core.format.arrays import ItemStore
from ckpt_cli.core.write.types import BlockSource
from tests.support.cluster import local_cluster
from tests.support.sharded import assert_same_values, read_values

pytestmark = pytest.mark.slow


@pytest.fixture
def cli(cli):  # type: ignore[no-untyped-def]
    """The entry point, the writers told to carry NaN: the source holds one on purpose
    (``embed[3, 7]``), to prove its count adds up over units; without the flag they refuse it."""

    def run(*args: Any) -> Any:
        more = ("--allow-nonfinite",) if args and args[0] in ("reshard", "migrate") else ()
        return cli(*args, *more)

    return run


distributed = pytest.importorskip("distributed")

RULES = "params.*=[data]"


def save_big(root: Path) -> dict[str, Any]:
    """An Orbax save whose embedding (4 MiB) spans several units, plus small leaves."""
    import jax
    import jax.numpy as jnp
    import orbax.checkpoint as ocp
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:8]).reshape(8, 1), ("data", "model"))
    rs = np.random.RandomState(0)
    embed = rs.normal(size=(2048, 512)).astype(np.float32)
    embed[3, 7] = np.nan
    tree = {
        "params": {
            "embed": jax.device_put(jnp.asarray(embed), NamedSharding(mesh, P("data", None))),
            "dense": {
                "kernel": jax.device_put(
                    jnp.asarray(rs.normal(size=(64, 32)).astype(np.float32)),
                    NamedSharding(mesh, P("data", None)),
                ),
                "bias": jax.device_put(jnp.zeros(32), NamedSharding(mesh, P())),
            },
        },
        "step": jnp.asarray(7, jnp.int32),
    }
    mgr = ocp.CheckpointManager(str(root))
    mgr.save(7, args=ocp.args.StandardSave(tree))
    mgr.wait_until_finished()
    mgr.close()
    return tree


@pytest.fixture(scope="module")
def src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("scale") / "src"
    save_big(root)
    return root


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    with local_cluster() as c:
        yield c


def leaf_digests(step_dir: Path) -> dict[str, Any]:
    record = json.loads((step_dir / "default" / "_CKPT_DIGESTS.json").read_text())
    return record["leaves"]  # type: ignore[no-any-return]


def test_reshard_on_dask_equals_single_process(
    cli: Any, src: Path, cluster: Any, tmp_path: Path
) -> None:
    single, scaled = tmp_path / "single", tmp_path / "scaled"
    args = ["reshard", src, "--mesh", "data=4,model=2", "--rule", RULES]
    assert cli(*args[:2], single, *args[2:]).code == 0
    r = cli(
        *args[:2], scaled, *args[2:],
        "--executor", "dask", "--scheduler", cluster.scheduler_address,
        "--unit-bytes", "1MiB", "--force-split", "--json",
    )  # fmt: skip
    assert r.code == 0, r.stderr
    scale = r.json()["scale"]
    assert scale["executor"] == "dask" and scale["workers"] == 2
    assert scale["units"] >= 4 and scale["databases"] == 2
    item = scaled / "7" / "default"
    dbs = sorted(p.name for p in item.iterdir() if p.name.startswith("ocdbt.process_w"))
    assert len(dbs) == 2 and (item / "manifest.ocdbt").is_file()
    assert cli("diff", single, scaled).code == 0
    assert_same_values(read_values(single), read_values(scaled))
    for out in (single, scaled):
        assert cli("verify", out, "--record").code == 0
    assert leaf_digests(single / "7") == leaf_digests(scaled / "7")

    # Orbax restores the merged output with the new shardings.
    import jax
    import orbax.checkpoint as ocp
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("data", "model"))
    values = read_values(single)
    abstract = {
        "params": {
            "embed": jax.ShapeDtypeStruct((2048, 512), np.float32, sharding=NamedSharding(mesh, P("data"))),
            "dense": {
                "kernel": jax.ShapeDtypeStruct((64, 32), np.float32, sharding=NamedSharding(mesh, P("data"))),
                "bias": jax.ShapeDtypeStruct((32,), np.float32, sharding=NamedSharding(mesh, P("data"))),
            },
        },
        "step": jax.ShapeDtypeStruct((), np.int32, sharding=NamedSharding(mesh, P())),
    }  # fmt: skip
    mgr = ocp.CheckpointManager(str(scaled))
    restored = mgr.restore(7, args=ocp.args.StandardRestore(abstract))
    mgr.close()
    got = np.asarray(restored["params"]["embed"])
    assert got.tobytes() == values["params.embed"].tobytes()
    assert restored["params"]["embed"].sharding.spec == P("data")


def test_migrate_on_dask_equals_single_process(
    cli: Any, src: Path, cluster: Any, tmp_path: Path
) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        "version: 1\nseed: 3\nrules:\n"
        "  - {op: cast, match: 'params\\.embed', dtype: bfloat16}\n"
        "  - {op: resize, match: 'params\\.dense\\.kernel', shape: [null, 48], init: lecun_normal}\n"
        "  - {op: resize, match: 'params\\.dense\\.bias', shape: [48], init: zeros}\n"
        "  - {op: reshape, match: 'step', shape: [1]}\n"
    )
    single, scaled = tmp_path / "single", tmp_path / "scaled"
    assert cli("migrate", src, single, "--spec", spec).code == 0
    r = cli(
        "migrate", src, scaled, "--spec", spec, "--executor", "dask",
        "--scheduler", cluster.scheduler_address, "--unit-bytes", "1MiB", "--force-split",
        "--json",
    )  # fmt: skip
    assert r.code == 0, r.stderr
    assert r.json()["scale"]["units"] >= 2
    assert cli("diff", single, scaled).code == 0
    assert_same_values(read_values(single), read_values(scaled))


def test_local_worker_processes_equal_single_process(cli: Any, src: Path, tmp_path: Path) -> None:
    single, scaled = tmp_path / "single", tmp_path / "scaled"
    args = ["reshard", src, "--mesh", "data=2", "--rule", RULES, "--zarr3"]
    assert cli(*args[:2], single, *args[2:]).code == 0
    r = cli(
        *args[:2],
        scaled,
        *args[2:],
        "--workers",
        "2",
        "--unit-bytes",
        "1MiB",
        "--force-split",
        "--json",
    )
    assert r.code == 0, r.stderr
    scale = r.json()["scale"]
    # Workers start with their imports done, so one may take every unit before the other is
    # up: one database per worker that completed units (two merged: the Dask test above).
    assert scale["executor"] == "local" and scale["units"] >= 2
    assert 1 <= scale["databases"] <= 2
    assert cli("diff", single, scaled).code == 0
    assert_same_values(read_values(single), read_values(scaled))


def test_the_pool_is_started_before_the_command_plans(
    cli: Any, src: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ckpt_cli.core import executor
    from ckpt_cli.core.reshard import plan as plan_module

    seen: list[list[str]] = []
    real = plan_module.plan_reshard

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append([type(e).__name__ for e in executor._STARTED.values()])
        return real(*args, **kwargs)

    monkeypatch.setattr(plan_module, "plan_reshard", spy)
    args = [src, "--mesh", "data=2", "--rule", RULES, "--workers", "2", "--force-split", "--json"]
    assert cli("reshard", args[0], tmp_path / "dry", *args[1:], "--dry-run").code == 0
    r = cli("reshard", args[0], tmp_path / "out", *args[1:])
    assert r.code == 0, r.stderr
    # --dry-run starts no worker; a run has its pool while it plans, and takes it to write.
    assert seen == [[], ["LocalExecutor"]]
    assert not executor._STARTED
    assert r.json()["scale"]["workers"] == 2


def test_executor_usage_errors(
    cli: Any, src: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DASK_SCHEDULER_ADDRESS", raising=False)
    base = ["reshard", src, tmp_path / "out", "--mesh", "data=2"]
    r = cli(*base, "--executor", "spark")
    assert r.code == 2 and "use local or dask" in r.stderr
    r = cli(*base, "--scheduler", "tcp://127.0.0.1:1")
    assert r.code == 2 and "--scheduler applies to --executor dask" in r.stderr
    r = cli(*base, "--executor", "dask")
    assert r.code == 2 and "DASK_SCHEDULER_ADDRESS" in r.stderr
    assert not (tmp_path / "out").exists()


def _reshard_parts(src: Path, memory_limit: int = 64 << 20) -> tuple[Any, list[Any]]:
    from ckpt_cli.core.format.resolve import resolve_item
    from ckpt_cli.core.format.sharding import MeshSpec
    from ckpt_cli.core.inspect.item import inspect_item
    from ckpt_cli.core.reshard.execute import reshard_leaves
    from ckpt_cli.core.reshard.plan import plan_from_rules
    from ckpt_cli.core.reshard.rules import parse_rules
    from ckpt_cli.core.storage import LocalLocation
    from ckpt_cli.core.write.types import Compression

    ref = resolve_item(LocalLocation(str(src)))
    report = inspect_item(ref)
    mesh = MeshSpec.parse("data=4,model=2")
    rules = parse_rules({"params.*": ["data"]}, mesh, "test")
    plan = plan_from_rules(report, mesh, rules, 1 << 20)
    return ref, reshard_leaves(report, plan, False, Compression("zstd"), memory_limit)


@dataclass(frozen=True)
class SlowPlan:
    """A reshard recipe that takes its time, so a worker can be killed while holding units."""

    inner: Any
    delay: float

    @property
    def source(self) -> str:
        return str(self.inner.source)

    @property
    def source_zarr3(self) -> bool:
        return bool(self.inner.source_zarr3)

    @property
    def splittable(self) -> bool:
        return True

    def build(self, store: ItemStore) -> BlockSource:
        time.sleep(self.delay)
        return self.inner.build(store)  # type: ignore[no-any-return]


@dataclass(frozen=True)
class FailingPlan(SlowPlan):
    def build(self, store: ItemStore) -> BlockSource:
        from ckpt_cli.errors import StorageError

        raise StorageError("injected read failure")


def test_killed_worker_is_retried_with_identical_output(
    cli: Any, src: Path, tmp_path: Path
) -> None:
    from ckpt_cli.core.executor import DaskExecutor
    from ckpt_cli.core.storage import LocalLocation
    from ckpt_cli.core.write.rewrite import write_step

    single = tmp_path / "single"
    assert cli("reshard", src, single, "--mesh", "data=4,model=2", "--rule", RULES).code == 0
    ref, leaves = _reshard_parts(src)
    slow = [replace(x, plan=SlowPlan(x.plan, 0.4)) if x.plan else x for x in leaves]
    # A cluster of its own: one of its workers gets killed.
    with local_cluster() as cluster, DaskExecutor(cluster.scheduler_address) as executor:
        assert isinstance(executor, DaskExecutor)
        pids = executor.client.run(os.getpid)
        victim = next(iter(pids.values()))
        killed = threading.Event()

        def on_bytes(n: int) -> None:
            if not killed.is_set():  # the first unit is done: every worker holds another
                os.kill(victim, signal.SIGKILL)
                killed.set()

        out = write_step(
            ref, LocalLocation(str(tmp_path / "scaled")), slow, use_ocdbt=True,
            use_zarr3=False, memory_limit=64 << 20, operation={"operation": "reshard"},
            executor=executor, unit_bytes=512 << 10, on_bytes=on_bytes,
        )  # fmt: skip
        assert killed.is_set() and out.scale is not None and out.scale.units >= 4
        with pytest.raises(ProcessLookupError):
            os.kill(victim, 0)
        survivors = executor.client.run(os.getpid)
        assert victim not in survivors.values()
    assert cli("diff", single, tmp_path / "scaled").code == 0
    assert_same_values(read_values(single), read_values(tmp_path / "scaled"))


def test_failed_unit_leaves_no_step(src: Path, tmp_path: Path) -> None:
    from ckpt_cli.core.executor import LocalExecutor
    from ckpt_cli.core.storage import LocalLocation
    from ckpt_cli.core.write.rewrite import write_step
    from ckpt_cli.errors import StorageError

    ref, leaves = _reshard_parts(src)
    bad = [
        replace(x, plan=FailingPlan(x.plan, 0)) if x.name == "params.dense.kernel" else x
        for x in leaves
    ]
    dest = tmp_path / "out"
    with LocalExecutor(2) as executor, pytest.raises(StorageError, match="injected"):
        write_step(
            ref, LocalLocation(str(dest)), bad, use_ocdbt=True, use_zarr3=False,
            memory_limit=64 << 20, operation={"operation": "reshard"}, executor=executor,
            unit_bytes=1 << 20,
        )  # fmt: skip
    assert not dest.exists()  # no step, no tmp step, not even the root the write made


class TwoSlotInline:
    """Runs units here, one after another, but declares two units per worker, as the pools do,
    and keeps every unit it ran."""

    name = "local"
    workers = 1
    units_per_worker = 2

    def __init__(self) -> None:
        self.units: list[Any] = []

    def map(self, fn: Any, units: Any, on_done: Any = None) -> list[Any]:
        out = []
        for unit in units:
            self.units.append(unit)
            out.append(fn(unit))
            if on_done is not None:
                on_done(out[-1])
        return out


def test_a_worker_running_two_units_holds_no_more_than_the_memory_limit(
    src: Path, tmp_path: Path
) -> None:
    from ckpt_cli.core.storage import LocalLocation
    from ckpt_cli.core.write.rewrite import write_step

    limit = 64 << 20
    ref, leaves = _reshard_parts(src, limit)
    executor = TwoSlotInline()
    write_step(
        ref, LocalLocation(str(tmp_path / "out")), leaves, use_ocdbt=True, use_zarr3=False,
        memory_limit=limit, operation={"operation": "reshard"}, executor=executor,
        unit_bytes=1 << 20,
    )  # fmt: skip
    assert len(executor.units) >= 2
    # Each unit plans its blocks within half the limit: two at once fit in the whole.
    assert {u.memory_limit for u in executor.units} == {limit // 2}
    single = tmp_path / "single"
    write_step(
        ref, LocalLocation(str(single)), leaves, use_ocdbt=True, use_zarr3=False,
        memory_limit=limit, operation={"operation": "reshard"},
    )  # fmt: skip
    assert_same_values(read_values(single), read_values(tmp_path / "out"))


def test_workers_read_the_written_files_back_in_ranges_for_the_record(
    cli: Any, src: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil

    from ckpt_cli.core.digest import filesums
    from ckpt_cli.core.digest.records import file_checksum
    from ckpt_cli.core.storage import LocalLocation

    monkeypatch.setattr(filesums, "RANGE_UNIT_BYTES", 64 << 10)  # the 4 MiB data file: 64 ranges
    recorded = tmp_path / "src"
    shutil.copytree(src, recorded)
    assert cli("verify", recorded, "--record").code == 0
    out = tmp_path / "out"
    args = ["reshard", recorded, out, "--mesh", "data=2", "--rule", RULES]
    r = cli(*args, "--workers", "2", "--unit-bytes", "1MiB", "--force-split")
    assert r.code == 0, r.stderr
    item = out / "7" / "default"
    files = json.loads((item / "_CKPT_DIGESTS.json").read_text())["files"]
    assert max(size for size in (f["size"] for f in files.values())) > 64 << 10
    for rel, got in files.items():
        want = file_checksum(LocalLocation(str(item / rel)))
        assert (got["size"], got["crc32"]) == (want.size, want.crc32), rel
    assert cli("verify", out, "--deep").code == 0


def test_a_unit_rewritten_gives_the_same_bytes(src: Path, tmp_path: Path) -> None:
    import tensorstore as ts

    from ckpt_cli.core.storage import LocalLocation
    from ckpt_cli.core.write.distributed import _create_arrays, plan_write_units, run_write_unit
    from ckpt_cli.core.write.item import OCDBT_CONFIG, ItemWriter

    _, leaves = _reshard_parts(src)
    dest = LocalLocation(str(tmp_path / "item"))
    dest.make_dirs()
    _create_arrays(ItemWriter(dest, use_ocdbt=True, use_zarr3=False, memory_limit=64 << 20), leaves)
    units = plan_write_units(
        leaves, dest, use_ocdbt=True, memory_limit=64 << 20, unit_bytes=1 << 20
    )
    unit = next(u for u in units if u.leaves[0].keypath == ("params", "embed"))
    first = run_write_unit(replace(unit, run="a"))
    second = run_write_unit(replace(unit, run="b"))
    assert first.database != second.database

    def contents(db: str | None) -> dict[bytes, bytes]:
        kv = ts.KvStore.open(
            {"driver": "ocdbt", "base": dest.child(str(db)).kvstore_spec(), "config": OCDBT_CONFIG}
        ).result()
        return {k: bytes(kv.read(k).result().value) for k in kv.list().result()}

    a, b = contents(first.database), contents(second.database)
    assert a == b and len(a) >= 1 and all(k.startswith(b"params.embed/") for k in a)


def _verify_json(cli: Any, *args: Any) -> tuple[int, dict[str, Any]]:
    r = cli("verify", *args, "--json")
    return r.code, r.json()


def _same_findings(a: dict[str, Any], b: dict[str, Any]) -> None:
    for key in ("ok", "nonfinite", "summary"):
        assert a[key] == b[key], key
    assert a["checked"]["bytes_decoded"] == b["checked"]["bytes_decoded"]
    assert [(p["code"], p["leaf"], p["file"]) for p in a["problems"]] == [
        (p["code"], p["leaf"], p["file"]) for p in b["problems"]
    ]


def test_verify_deep_on_dask_equals_single_process(
    cli: Any, src: Path, cluster: Any, tmp_path: Path
) -> None:
    import shutil

    dask = ["--executor", "dask", "--scheduler", cluster.scheduler_address, "--unit-bytes", "1MiB",
            "--force-split"]  # fmt: skip
    # No record: the 4 MiB leaf is split over units; NaN counts add up.
    code_a, single = _verify_json(cli, src, "--deep")
    code_b, scaled = _verify_json(cli, src, "--deep", *dask)
    assert code_a == code_b == 0
    assert single["scale"] is None and scaled["scale"]["split"] and scaled["scale"]["units"] > 1
    _same_findings(single, scaled)
    assert [(n["leaf"], n["nan"], n["inf"]) for n in scaled["nonfinite"]] == [
        ("params.embed", 1, 0)
    ]
    # --record: leaf digests (one worker per leaf) and file CRCs equal the single-process ones.
    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(src, a)
    shutil.copytree(src, b)
    assert cli("verify", a, "--record").code == 0
    assert cli("verify", b, "--record", *dask).code == 0
    rec_a = json.loads((a / "7" / "default" / "_CKPT_DIGESTS.json").read_text())
    rec_b = json.loads((b / "7" / "default" / "_CKPT_DIGESTS.json").read_text())
    assert rec_a["leaves"] == rec_b["leaves"] and rec_a["files"] == rec_b["files"]
    # A flipped byte is caught the same way by the workers.
    damaged = Path(__file__).resolve().parents[2] / "fixtures" / "damaged" / "flipped-byte"
    code_a, single = _verify_json(cli, damaged, "--deep")
    code_b, scaled = _verify_json(cli, damaged, "--deep", *dask)
    assert code_a == code_b == 1
    _same_findings(single, scaled)
    assert {p["code"] for p in scaled["problems"]} >= {"digest-mismatch"}
