"""The thread count: affinity, cgroup quotas (v2 and v1), ``CKPT_THREADS``, bad values, and the
TensorStore context built with it."""

from __future__ import annotations

import platform
import threading
from pathlib import Path

import pytest

from ckpt_cli.core import threads
from ckpt_cli.core.threads import Spare
from ckpt_cli.errors import UsageError

V2_OWN = "0::/job.slice/run\n"


def _v2(root: Path, text: str, at: str = "job.slice/run") -> Path:
    d = root / at
    d.mkdir(parents=True, exist_ok=True)
    (d / "cpu.max").write_text(text)
    return root


def test_affinity_alone(tmp_path: Path) -> None:
    assert threads.available_cpus({0, 1, 2, 5}, tmp_path, V2_OWN) == 4


@pytest.mark.parametrize(
    ("cpu_max", "want"),
    [("200000 100000\n", 2), ("150000 100000", 2), ("50000 100000", 1), ("max 100000", 8)],
)
def test_a_cgroup_v2_quota_caps_the_affinity(tmp_path: Path, cpu_max: str, want: int) -> None:
    root = _v2(tmp_path, cpu_max)
    assert threads.available_cpus(set(range(8)), root, V2_OWN) == want


def test_a_v2_quota_at_the_mount_point(tmp_path: Path) -> None:
    """In a container the cgroup namespace puts the process's own group at the root."""
    (tmp_path / "cpu.max").write_text("300000 100000")
    assert threads.available_cpus(set(range(16)), tmp_path, "0::/\n") == 3


def test_a_quota_above_the_affinity_changes_nothing(tmp_path: Path) -> None:
    root = _v2(tmp_path, "1600000 100000")
    assert threads.available_cpus({0, 1}, root, V2_OWN) == 2


def test_a_cgroup_v1_quota(tmp_path: Path) -> None:
    d = tmp_path / "cpu,cpuacct"
    d.mkdir()
    (d / "cpu.cfs_quota_us").write_text("400000\n")
    (d / "cpu.cfs_period_us").write_text("100000\n")
    assert threads.available_cpus(set(range(32)), tmp_path, "4:cpu,cpuacct:/\n") == 4
    (d / "cpu.cfs_quota_us").write_text("-1\n")  # no quota
    assert threads.available_cpus(set(range(32)), tmp_path, "4:cpu,cpuacct:/\n") == 32


def test_unreadable_or_odd_cgroup_files_mean_no_quota(tmp_path: Path) -> None:
    root = _v2(tmp_path, "garbage")
    assert threads.cgroup_cpus(root, V2_OWN) is None
    assert threads.cgroup_cpus(tmp_path / "missing", V2_OWN) is None


def test_ckpt_threads_overrides_the_cpus() -> None:
    assert threads.resolve_threads(None, {"CKPT_THREADS": "6"}) == 6
    assert threads.resolve_threads(3, {"CKPT_THREADS": "6"}) == 3  # --threads wins


@pytest.mark.parametrize("bad", ["0", "-2", "four", "1.5"])
def test_a_bad_ckpt_threads_is_a_usage_error(bad: str) -> None:
    with pytest.raises(UsageError, match="CKPT_THREADS"):
        threads.resolve_threads(None, {"CKPT_THREADS": bad})


def test_the_default_is_the_available_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CKPT_THREADS", raising=False)
    monkeypatch.setattr(threads, "available_cpus", lambda *a: 5)
    assert threads.resolve_threads(None) == 5


def test_the_tensorstore_context_follows_the_threads() -> None:
    spec = threads.ts_context_spec(3, cache_pool={"total_bytes_limit": 7})
    assert spec["data_copy_concurrency"] == {"limit": 3}
    assert spec["file_io_concurrency"] == {"limit": threads.FILE_IO_MIN}
    assert spec["cache_pool"] == {"total_bytes_limit": 7}
    assert threads.ts_context_spec(64)["file_io_concurrency"] == {"limit": 64}
    wrote = threads.ts_context_spec(4, threads.WRITE_FILE_IO)
    assert wrote["file_io_concurrency"] == {"limit": threads.WRITE_FILE_IO}


def test_the_contexts_ckpt_creates_use_the_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """The source and writer contexts of verify, export, reshard and import take the number
    (import writes through ``item._context`` too)."""
    from ckpt_cli.core.format.arrays import cached_context
    from ckpt_cli.core.safetensors import export_run
    from ckpt_cli.core.write import item

    monkeypatch.setattr(threads, "_chosen", 3)
    for ctx in (
        cached_context(1 << 20),
        export_run._context(1 << 20),
        item.writer_context(),
    ):
        assert ctx.spec.to_json()["data_copy_concurrency"] == {"limit": 3}


def test_use_threads_sets_the_process_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(threads, "_chosen", None)
    assert threads.use_threads(7) == 7 and threads.threads() == 7
    with pytest.raises(UsageError):
        threads.use_threads(0)


GLIBC = platform.libc_ver()[0] == "glibc"


@pytest.mark.skipif(not GLIBC, reason="mallopt is glibc's")
def test_a_command_keeps_freed_buffers_on_glibc() -> None:
    assert threads.tune_allocator({}) is True


@pytest.mark.parametrize(
    "environ",
    [{"CKPT_MALLOC": "0"}, {"MALLOC_TRIM_THRESHOLD_": "131072"}, {"MALLOC_ARENA_MAX": "2"}],
)
def test_the_users_malloc_settings_win(environ: dict[str, str]) -> None:
    assert threads.tune_allocator(environ) is False


def test_a_command_run_tunes_the_allocator(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every command's run context calls it once (the library alone never does)."""
    from typer.testing import CliRunner

    from ckpt_cli.app import app
    from tests.support.paths import FIXTURES

    calls: list[object] = []
    monkeypatch.setattr(threads, "tune_allocator", lambda *a: calls.append(a) or True)
    result = CliRunner().invoke(app, ["ls", str(FIXTURES / "seed_mlp")])
    assert result.exit_code == 0, result.output
    assert calls == [()]


def test_a_spare_is_one_idle_object_a_thread() -> None:
    spare: Spare[object] = Spare()
    first, second = object(), object()
    assert spare.take() is None
    spare.give(first)
    spare.give(second)  # the slot is full: the first stays
    assert spare.held() is first
    assert spare.take() is first
    assert spare.take() is None  # taken: a nested use makes its own
    spare.give(second)
    seen: list[object | None] = []
    other = threading.Thread(target=lambda: seen.append(spare.take()))
    other.start()
    other.join()
    assert seen == [None]  # another thread has a slot of its own
    assert spare.held() is second
