"""``--threads``: the same outputs at 1 and 4 threads (verify --deep and its record, digest,
export, reshard), the count reaching the pools and TensorStore, and bad values refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from ckpt_cli.core import threads as threads_mod
from ckpt_cli.core.digest import ld1_threads
from ckpt_cli.core.digest.records import DIGEST_FILE
from ckpt_cli.core.verify import deep
from tests.support.read_count import save_one_chunk_leaves
from tests.support.sharded import save_sharded


@pytest.fixture
def small_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Parts small enough that these checkpoints are hashed and checksummed in many ranges,
    and the process count put back after the in-process commands set it."""
    monkeypatch.setattr(threads_mod, "_chosen", None)
    monkeypatch.setattr(ld1_threads, "MIN_PIECE_BYTES", 100_000)
    monkeypatch.setattr(deep, "RANGE_BYTES", 1_000_003)  # odd: ranges cut inside the files


@pytest.fixture(scope="module")
def roots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A one-device save (an 8 MiB and a 2 MiB leaf, one chunk each: streamed) and a sharded one."""
    base = tmp_path_factory.mktemp("threads")
    save_one_chunk_leaves(base / "one")
    save_sharded(base / "sharded")
    return {"one": base / "one", "sharded": base / "sharded"}


def _record(cli: Any, root: Path, tmp: Path, n: int) -> dict[str, Any]:
    copy = tmp / f"{root.name}-{n}"
    shutil.copytree(root, copy)
    r = cli("verify", copy, "--record", "--threads", str(n))
    assert r.code == 0, r.stderr
    item = next(copy.glob(f"*/*/{DIGEST_FILE}"))
    record = json.loads(item.read_text())
    record.pop("created_at", None)
    deep_run = cli("verify", copy, "--deep", "--json", "--threads", str(n))
    assert deep_run.code == 0, deep_run.stderr
    return {"record": record, "deep": _stable(deep_run.json())}


def _stable(doc: Any) -> Any:
    """The document without what differs between any two runs (paths, times)."""
    if isinstance(doc, dict):
        skip = {"seconds", "path", "root", "location", "created_at", "elapsed_s"}
        return {k: _stable(v) for k, v in doc.items() if k not in skip}
    if isinstance(doc, list):
        return [_stable(v) for v in doc]
    return doc


@pytest.mark.parametrize("layout", ["one", "sharded"])
def test_verify_and_its_record_are_the_same_at_1_and_4_threads(
    cli: Any, roots: dict[str, Path], tmp_path: Path, small_parts: None, layout: str
) -> None:
    one, four = (_record(cli, roots[layout], tmp_path, n) for n in (1, 4))
    assert one == four
    leaves = one["record"]["leaves"]
    assert leaves and all(v.get("ld1", "").startswith("ld1:") for v in leaves.values())
    assert one["record"]["files"]


@pytest.mark.parametrize("layout", ["one", "sharded"])
def test_digest_is_the_same_at_1_and_4_threads(
    cli: Any, roots: dict[str, Path], small_parts: None, layout: str
) -> None:
    runs = [cli("digest", roots[layout], "--json", "--threads", n) for n in ("1", "4")]
    assert all(r.code == 0 for r in runs), runs[0].stderr + runs[1].stderr
    assert _stable(runs[0].json()) == _stable(runs[1].json())


def test_export_writes_the_same_bytes_at_1_and_4_threads(
    cli: Any, roots: dict[str, Path], tmp_path: Path, small_parts: None
) -> None:
    outs = []
    for n in (1, 4):
        out = tmp_path / f"export-{n}"
        r = cli("export", roots["one"], out, "--threads", str(n), "--memory-limit", "4MiB")
        assert r.code == 0, r.stderr
        outs.append({p.name: p.read_bytes() for p in sorted(out.iterdir())})
    assert outs[0] == outs[1] and outs[0]


def test_reshard_writes_the_same_values_at_1_and_4_threads(
    cli: Any, roots: dict[str, Path], tmp_path: Path, small_parts: None
) -> None:
    digests = []
    for n in (1, 4):
        out = tmp_path / f"reshard-{n}"
        r = cli("reshard", roots["sharded"], out, "--mesh", "data=2,model=4", "--threads", str(n))
        assert r.code == 0, r.stderr
        d = cli("digest", out, "--json", "--threads", "1")
        assert d.code == 0, d.stderr
        digests.append(_stable(d.json()))
    assert digests[0] == digests[1]


def test_the_count_reaches_the_pools_and_tensorstore(
    cli: Any,
    roots: dict[str, Path],
    tmp_path: Path,
    small_parts: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pools: list[int | None] = []
    specs: list[int] = []
    real_pool, real_spec = threads_mod.hash_pool, threads_mod.ts_context_spec

    def pool(n: int | None = None) -> Any:
        pools.append(n)
        return real_pool(n)

    def spec(*args: Any, **kwargs: Any) -> dict[str, Any]:
        out = real_spec(*args, **kwargs)
        specs.append(out["data_copy_concurrency"]["limit"])
        return out

    monkeypatch.setattr(threads_mod, "hash_pool", pool)
    monkeypatch.setattr(threads_mod, "ts_context_spec", spec)
    copy = tmp_path / "one"
    shutil.copytree(roots["one"], copy)
    r = cli("verify", copy, "--record", "--threads", "3")
    assert r.code == 0, r.stderr
    assert threads_mod.threads() == 3
    assert pools and set(pools) == {3}  # the 8 MiB leaf's slabs hashed in parts
    assert specs and set(specs) == {3}


def test_ckpt_threads_sets_the_default(
    cli: Any, roots: dict[str, Path], small_parts: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CKPT_THREADS", "2")
    r = cli("digest", roots["one"])
    assert r.code == 0, r.stderr
    assert threads_mod.threads() == 2


@pytest.mark.parametrize(
    ("args", "env", "phrase"),
    [
        (["--threads", "0"], None, "--threads '0' is not a thread count"),
        (["--threads", "many"], None, "--threads 'many' is not a thread count"),
        ([], "-1", "CKPT_THREADS '-1' is not a thread count"),
    ],
)
def test_a_bad_thread_count_is_a_usage_error(
    cli: Any,
    roots: dict[str, Path],
    small_parts: None,
    monkeypatch: pytest.MonkeyPatch,
    args: list[str],
    env: str | None,
    phrase: str,
) -> None:
    if env is not None:
        monkeypatch.setenv("CKPT_THREADS", env)
    r = cli("verify", roots["one"], "--deep", *args)
    assert r.code == 2
    assert phrase in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) <= 2  # the error, at most a hint
