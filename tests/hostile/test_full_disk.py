"""A full disk or a read-only file system under a writer is a storage error, not a bug: exit 3,
code ``storage-error``, one stderr line naming what could not be written and what to do, and
nothing left behind that was not there before (no lock file, no destination directory, no tmp
step).

The file system is a real one: a tmpfs of a few MiB mounted for the test (root may mount one;
the tests skip, saying why, where mount is not permitted), filled to the last byte by a file,
or remounted read-only.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from tests.support.ckpt_process import (
    INTERNAL_ERROR,
    Run,
    ckpt,
    command,
    copy_fixture,
    env,
    snapshot,
)

FILLER = "filler"
SPEC = (
    "rules:\n  - {op: rename, from: 'params\\.Dense_(\\d+)\\.(.*)', to: 'params.layer_\\1.\\2'}\n"
)


@dataclass(frozen=True)
class Disk:
    """``mnt``: the small file system (holding ``root``, a copy of seed_mlp); ``side``: the
    sources of the writers (a checkpoint, a safetensors file, a spec) on the ordinary disk."""

    mnt: Path
    side: Path

    def fill(self, free_kib: int = 0) -> None:
        """Fill the file system to the last byte, then give ``free_kib`` back."""
        fd = os.open(self.mnt / FILLER, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            while True:
                os.write(fd, bytes(1 << 16 if free_kib == 0 else 4096))
        except OSError as e:
            assert e.errno == 28, e
        finally:
            os.close(fd)
        if free_kib:
            filler = self.mnt / FILLER
            os.truncate(filler, max(0, filler.stat().st_size - free_kib * 1024))
        probe = self.mnt / "probe"
        if free_kib == 0:
            with pytest.raises(OSError, match="No space left"):
                probe.write_bytes(b"x" * 4096)
            probe.unlink()

    def read_only(self) -> None:
        subprocess.run(["mount", "-o", "remount,ro", str(self.mnt)], check=True)

    def owned_by_another_user(self) -> None:
        """Everything on the file system belongs to ``nobody`` (others may read, not write)."""
        subprocess.run(["chown", "-R", "65534:65534", str(self.mnt)], check=True)


#: Root without the powers that skip permission checks: a write into another user's directory
#: is refused (EACCES), as it is for any user.
NO_ROOT_POWERS = ["setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner"]


def _ckpt_without_root_powers(args: list[object]) -> Run:
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is not installed: cannot drop root's file powers")
    done = subprocess.run(
        [*NO_ROOT_POWERS, *command([*args], {})], capture_output=True, text=True, env=env()
    )
    return Run(done.returncode, done.stdout, done.stderr)


def _mount(mnt: Path) -> None:
    mnt.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m,mode=0755", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(
            f"mounting a tmpfs is not permitted here ({done.stderr.strip()}): the full-disk "
            "tests need a real small file system (run them as root)"
        )


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Disk]:
    import safetensors.numpy

    side = tmp_path / "side"
    side.mkdir()
    copy_fixture("seed_mlp", side / "src")
    rng = np.random.default_rng(0)
    tensors = {
        "model.embed.weight": rng.standard_normal((64, 16), dtype=np.float32),
        "model.head.bias": rng.standard_normal((10,), dtype=np.float32),
    }
    safetensors.numpy.save_file(tensors, str(side / "model.safetensors"))
    (side / "spec.yaml").write_text(SPEC)
    mnt = tmp_path / "fs"
    _mount(mnt)
    try:
        copy_fixture("seed_mlp", mnt / "root")
        yield Disk(mnt, side)
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


#: Every command that writes, as run against the small file system ``d``.
COMMANDS: dict[str, Callable[[Disk], list[object]]] = {
    "reshard": lambda d: ["reshard", d.side / "src", d.mnt / "dst", "--mesh", "data=8"],
    "migrate": lambda d: ["migrate", d.side / "src", d.mnt / "dst", "--spec", d.side / "spec.yaml"],
    "average": lambda d: ["average", d.side / "src", d.mnt / "dst", "--steps", "300,400,500"],
    "cp": lambda d: ["cp", d.side / "src", d.mnt / "dst"],
    "export": lambda d: ["export", d.side / "src", d.mnt / "dst"],
    "import": lambda d: ["import", d.side / "model.safetensors", d.mnt / "dst"],
    "prune": lambda d: ["prune", d.mnt / "root", "--keep-last", "1", "--yes"],
    "pin": lambda d: ["pin", d.mnt / "root", "500"],
    "verify --record": lambda d: ["verify", d.mnt / "root", "--record"],
    "verify --junit": lambda d: ["verify", d.side / "src", "--junit", d.mnt / "report.xml"],
}
#: The writers that take their source elsewhere; the free space lets them take the lock and
#: start the step (tmp dir, owner record), then runs out inside the data or metadata writes.
MID_WRITE = {"reshard": 16, "migrate": 16, "average": 16, "import": 16, "export": 16}


def _run_refused(d: Disk, name: str, expect: str, *, as_user: bool = False) -> Run:
    before = snapshot(d.mnt)
    assert "root/500/default" in before
    args = [*COMMANDS[name](d), "--json"]
    run = _ckpt_without_root_powers(args) if as_user else ckpt(*args, mem_limit=None)
    assert INTERNAL_ERROR not in run.stderr and "Traceback" not in run.stderr, run.stderr
    assert run.code == 3, (run.code, run.stderr)
    assert len(run.lines) == 1, run.stderr
    error = run.json()["error"]
    assert error["code"] == "storage-error", error
    assert expect in run.stderr and expect in error["message"], run.stderr
    assert snapshot(d.mnt) == before
    if expect == "No space left on device":
        assert "free space" in error["hint"], error
    return run


#: prune frees space: on a full disk it runs (deleting needs none), see below.
WRITERS = [name for name in COMMANDS if name != "prune"]


@pytest.mark.parametrize("name", WRITERS)
def test_a_full_disk_is_a_storage_error(disk: Disk, name: str) -> None:
    disk.fill()
    run = _run_refused(disk, name, "No space left on device")
    assert str(disk.mnt) in run.stderr  # names what could not be written


@pytest.mark.parametrize("name", list(COMMANDS))
def test_a_read_only_file_system_is_a_storage_error(disk: Disk, name: str) -> None:
    disk.read_only()
    run = _run_refused(disk, name, "Read-only file system")
    assert "read-only" in run.json()["error"]["hint"]


@pytest.mark.parametrize("name", list(COMMANDS))
def test_no_permission_is_a_storage_error(disk: Disk, name: str) -> None:
    disk.owned_by_another_user()
    run = _run_refused(disk, name, "Permission denied", as_user=True)
    assert "permissions" in run.json()["error"]["hint"]


@pytest.mark.parametrize(("name", "free_kib"), list(MID_WRITE.items()))
def test_a_disk_that_fills_while_writing_leaves_nothing(
    disk: Disk, name: str, free_kib: int
) -> None:
    """The lock, the tmp step and its owner record fit; TensorStore's data and metadata writes
    (or export's file) do not: TensorStore's own error text for ENOSPC is mapped too."""
    disk.fill(free_kib)
    run = _run_refused(disk, name, "No space left on device")
    assert "tensorstore_spec" not in run.stderr and "os_error_code" not in run.stderr


def test_prune_frees_a_full_disk(disk: Disk) -> None:
    """The command an operator runs to free a full disk works there: its lock holds with an
    empty owner record (the flock is the lock), the steps go, space comes back."""
    disk.fill()
    root = disk.mnt / "root"
    steps = sorted(int(p.name) for p in root.iterdir() if p.name.isdigit())
    assert len(steps) > 1, steps
    assert os.statvfs(disk.mnt).f_bavail == 0
    run = ckpt(*COMMANDS["prune"](disk), "--json", mem_limit=None)
    assert run.code == 0, run.stderr
    assert INTERNAL_ERROR not in run.stderr and "Traceback" not in run.stderr
    assert [p.name for p in root.iterdir() if p.name.isdigit()] == [str(steps[-1])]
    assert not any(p.name.startswith((".ckpt-prune.lock", ".ckpt-trash")) for p in root.iterdir())
    assert os.statvfs(disk.mnt).f_bavail > 0
    assert ckpt("verify", root, mem_limit=None).code == 0


def test_the_writer_succeeds_once_space_is_freed(disk: Disk) -> None:
    """The refusal leaves the destination as it was: the same command then simply works."""
    disk.fill()
    args = COMMANDS["reshard"](disk)
    assert ckpt(*args, mem_limit=None).code == 3
    (disk.mnt / FILLER).unlink()
    run = ckpt(*args, mem_limit=None)
    assert run.code == 0, run.stderr
    assert ckpt("verify", disk.mnt / "dst", "--deep", mem_limit=None).code == 0


def test_cp_keeps_what_it_copied_for_the_rerun(disk: Disk) -> None:
    """cp stopped by a full disk mid-copy keeps the steps it finished and the unfinished one
    under its tmp name with ckpt's owner record (never under the step's name), and its rerun
    after space is freed completes the copy."""
    disk.fill(160)
    args = COMMANDS["cp"](disk)
    run = ckpt(*args, "--json", mem_limit=None)
    assert run.code == 3 and run.json()["error"]["code"] == "storage-error", run.stderr
    dst = disk.mnt / "dst"
    assert dst.is_dir()
    left = sorted(p.name for p in dst.iterdir())
    assert left, "cp wrote nothing before the disk filled: give it more room"
    assert ".ckpt-write.lock" not in left
    tmp = [n for n in left if ".orbax-checkpoint-tmp-" in n]
    assert tmp and all((dst / n / ".ckpt-owner").is_file() for n in tmp), left
    done = [n for n in left if n.isdigit()]
    assert len(done) < 3 and all((dst / n / "commit_success.txt").is_file() for n in done), left
    (disk.mnt / FILLER).unlink()
    again = ckpt(*args, mem_limit=None)
    assert again.code == 0, again.stderr
    assert sorted(p.name for p in dst.iterdir()) == ["300", "400", "500"]
    assert ckpt("verify", dst, "--deep", mem_limit=None).code == 0


def test_a_storage_refusal_that_escaped_every_writer_is_not_a_bug() -> None:
    """The boundary's last resort: an unmapped ENOSPC (TensorStore's text or an OSError)."""
    from ckpt_cli.errors import storage_refusal

    raw = OSError(28, "No space left on device", "/data/x")
    refusal = storage_refusal(raw)
    assert refusal is not None and refusal.code == "storage-error"
    assert refusal.message == "cannot access /data/x: No space left on device"
    text = ValueError("Failed to write 143 bytes to file 5: ... [os_error_code='30'] [spec='{}']")
    refusal = storage_refusal(text)
    assert refusal is not None and refusal.message.endswith("Read-only file system")
    collected = shutil.Error([("/a", "/b", "[Errno 13] Permission denied: '/b'")])
    refusal = storage_refusal(collected)
    assert refusal is not None and refusal.message.endswith("Permission denied")
    assert storage_refusal(ValueError("a bug")) is None
    assert storage_refusal(OSError(5, "Input/output error")) is None
