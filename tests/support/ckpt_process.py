"""Helpers of the hostile-input and fault tests: ckpt in a subprocess (with fault injection and
resource limits), snapshots of directory trees, fresh Orbax checkpoints.

Everything here drives ckpt from the outside (its command line, the file system), so the tests
hold whatever the layout of ``ckpt_cli`` becomes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.paths import FIXTURES, REPO

SHIM = Path(__file__).with_name("shim.py")
#: Enough address space for any ckpt command on the small fixtures (measured: reshard runs in
#: 1.5 GB), small enough that a runaway allocation fails fast instead of swapping the machine.
MEM_LIMIT = 1536 << 20
INTERNAL_ERROR = "internal error"
#: Every process ``start`` made, so that a failing test leaves none behind (``reap``).
STARTED: list[subprocess.Popen[str]] = []


@dataclass
class Run:
    code: int
    stdout: str
    stderr: str

    @property
    def lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.strip()]

    def json(self) -> Any:
        return json.loads(self.stdout)


def env(**extra: str) -> dict[str, str]:
    out = dict(os.environ)
    out.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    out["PYTHONPATH"] = str(REPO) + os.pathsep + out.get("PYTHONPATH", "")
    out.pop("CKPT_DEBUG", None)
    out.update(extra)
    return out


def command(args: list[str], spec: dict[str, Any] | None = None) -> list[str]:
    return [sys.executable, str(SHIM), json.dumps(spec or {}), "--", *map(str, args)]


def ckpt(
    *args: Any,
    spec: dict[str, Any] | None = None,
    mem_limit: int | None = MEM_LIMIT,
    timeout: float = 120,
    cwd: Path | None = None,
    extra_env: dict[str, str] | None = None,
) -> Run:
    """Run ``ckpt ARGS`` to the end in a subprocess (a hang past ``timeout`` is exit -9)."""
    spec = dict(spec or {})
    if mem_limit:
        spec.setdefault("mem_limit", mem_limit)
    proc = subprocess.Popen(
        command(list(args), spec),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd or REPO,
        env=env(**(extra_env or {})),
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return Run(-9, out, err + f"\n[test: killed after {timeout} s]")
    return Run(proc.returncode, out, err)


def start(
    *args: Any,
    spec: dict[str, Any] | None = None,
    mem_limit: int | None = MEM_LIMIT,
    extra_env: dict[str, str] | None = None,
) -> subprocess.Popen[str]:
    spec = dict(spec or {})
    if mem_limit:
        spec.setdefault("mem_limit", mem_limit)
    proc = subprocess.Popen(
        command(list(args), spec),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=env(**(extra_env or {})),
        start_new_session=True,
    )
    STARTED.append(proc)
    return proc


def reap() -> None:
    """Kill what ``start`` made and is still running (stopped ones included)."""
    while STARTED:
        proc = STARTED.pop()
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()


def state(pid: int) -> str:
    """The process state letter of /proc/PID/stat (R, S, T stopped, Z zombie), '' when gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return raw.rsplit(")", 1)[1].split()[0]


def wait_stopped_or_exited(proc: subprocess.Popen[str], timeout: float = 120) -> bool:
    """True once the process stopped itself (SIGSTOP from the shim), False once it exited."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        if state(proc.pid) == "T":
            return True
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)
    raise AssertionError(f"process {proc.args} neither stopped nor exited in {timeout} s")


def finish(proc: subprocess.Popen[str], timeout: float = 120) -> Run:
    if state(proc.pid) == "T":
        os.kill(proc.pid, signal.SIGCONT)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return Run(-9, out, err + f"\n[test: killed after {timeout} s]")
    return Run(proc.returncode, out, err)


def kill(proc: subprocess.Popen[str], sig: int = signal.SIGKILL) -> Run:
    with_cont = state(proc.pid) == "T" and sig != signal.SIGKILL
    os.kill(proc.pid, sig)
    if with_cont:
        os.kill(proc.pid, signal.SIGCONT)
    return finish(proc)


def snapshot(path: Path) -> dict[str, str]:
    """Every entry below ``path`` (symlinks not followed) -> what it is: a file's sha256, a
    link's target, 'dir'. Compare two snapshots to prove nothing changed."""
    out: dict[str, str] = {}
    if not os.path.lexists(path):
        return out
    for dirpath, dirs, files in os.walk(path):
        for name in dirs + files:
            p = Path(dirpath) / name
            rel = str(p.relative_to(path))
            if p.is_symlink():
                out[rel] = "link:" + os.readlink(p)
            elif p.is_dir():
                out[rel] = "dir"
            else:
                out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def changed_outside(before: dict[str, str], after: dict[str, str], inside: str) -> list[str]:
    """Entries of a parent directory's snapshot that changed, other than under ``inside``."""
    keys = set(before) | set(after)
    return sorted(
        k
        for k in keys
        if before.get(k) != after.get(k) and k != inside and not k.startswith(inside + "/")
    )


def copy_fixture(name: str, dst: Path) -> Path:
    shutil.copytree(FIXTURES / name, dst, symlinks=True)
    return dst


def edit_json(path: Path, fn: Any) -> None:
    doc = json.loads(path.read_text())
    new = fn(doc)
    path.write_text(json.dumps(doc if new is None else new))


def committed_steps(root: Path) -> list[int]:
    """Steps ckpt lists as committed."""
    run = ckpt("ls", root, "--json", mem_limit=None)
    if run.code != 0:
        return []
    return [s["step"] for s in run.json()["steps"] if s["status"] == "committed"]


def orbax_steps(root: Path) -> list[int]:
    """What a real Orbax CheckpointManager lists (in a subprocess: one case per process)."""
    code = (
        "import sys, orbax.checkpoint as ocp; "
        "m = ocp.CheckpointManager(sys.argv[1]); print(m.all_steps()); m.close()"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(root)],
        capture_output=True,
        text=True,
        env=env(),
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return sorted(json.loads(out.stdout.strip().splitlines()[-1]))


def orbax_restore(root: Path, step: int) -> str:
    """'' when real Orbax restores the step (host numpy arrays), else its error's first line."""
    code = (
        "import sys, orbax.checkpoint as ocp\n"
        "m = ocp.CheckpointManager(sys.argv[1])\n"
        "try:\n"
        "    m.restore(int(sys.argv[2]))\n"
        "    print('OK')\n"
        "except Exception as e:\n"
        "    print('FAIL', type(e).__name__, str(e).splitlines()[0] if str(e) else '')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(root), str(step)],
        capture_output=True,
        text=True,
        env=env(),
        timeout=180,
    )
    last = (out.stdout.strip().splitlines() or ["FAIL no output " + out.stderr[-300:]])[-1]
    return "" if last == "OK" else last


def save_orbax(root: Path, step: int = 5, mib: int = 1, seed: int = 0) -> Path:
    """A fresh real Orbax checkpoint (CheckpointManager, StandardSave) of about ``mib`` MiB of
    float32 random values: params (two Dense layers), an int step. In a subprocess."""
    code = f"""
import os, sys, numpy as np, jax, jax.numpy as jnp, orbax.checkpoint as ocp
side = max(8, int(({mib} * (1 << 20) / 8) ** 0.5))
rng = np.random.default_rng({seed})
tree = {{"params": {{"Dense_0": {{"kernel": jnp.asarray(rng.standard_normal((side, side), dtype=np.float32)),
                                "bias": jnp.asarray(rng.standard_normal((side,), dtype=np.float32))}},
                    "Dense_1": {{"kernel": jnp.asarray(rng.standard_normal((side, side), dtype=np.float32))}}}},
        "step": jnp.int32({step})}}
m = ocp.CheckpointManager(sys.argv[1])
m.save({step}, args=ocp.args.StandardSave(tree))
m.wait_until_finished()
m.close()
"""
    out = subprocess.run(
        [sys.executable, "-c", code, str(root)], capture_output=True, text=True, env=env()
    )
    assert out.returncode == 0, out.stderr
    return root


def phantoms(root: Path) -> list[str]:
    """Step-named directories holding nothing but digest files (and the dirs leading to them)."""
    out = []
    for step in sorted(root.iterdir()):
        if not step.name.isdigit() or not step.is_dir():
            continue
        files = [p for p in step.rglob("*") if p.is_file()]
        if files and all(p.name.startswith((".", "_CKPT_DIGESTS")) for p in files):
            out.append(step.name)
    return out
