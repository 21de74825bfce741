"""Startup stays light: ``--help``, ``ls``, ``inspect``, ``verify``, ``digest`` and
``doctor --like`` never import jax, orbax or keras (a Keras checkpoint included)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.paths import FIXTURES, REPO
from tests.support.startup_probe import PROBE

KERAS = REPO / "fixtures" / "frameworks" / "keras"


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["ls", str(FIXTURES / "seed_mlp")],
        ["ls", str(FIXTURES / "seed_mlp"), "--json"],
        ["inspect", str(FIXTURES / "sharded_4x2"), "--json"],
        ["inspect", str(FIXTURES / "seed_mlp"), "--stats", "--flat"],
        ["verify", str(FIXTURES / "seed_mlp"), "--deep", "--json"],
        ["verify", str(FIXTURES / "multiprocess"), "--sample", "50%", "--seed", "1"],
        ["doctor", str(FIXTURES / "seed_mlp"), "--like", str(FIXTURES / "seed_mlp"), "--json"],
        ["digest", str(FIXTURES / "sharded_4x2"), "--json"],
        ["digest", str(FIXTURES / "composite_best")],
        ["inspect", str(KERAS / "epochs"), "--item", "pytree", "--json"],
        ["verify", str(KERAS / "weights_bf16_ema"), "--deep"],
    ],
)
def test_read_paths_do_not_import_jax_or_orbax(args: list[str]) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(args)], capture_output=True, text=True, check=True
    )
    line = next(x for x in proc.stderr.splitlines() if x.startswith("HEAVY="))
    assert json.loads(line[len("HEAVY=") :]) == []
    assert proc.stdout  # the command really ran and printed something


#: Prints the thread count of the OpenBLAS numpy loaded (its pool), or "NOBLAS" for a numpy
#: built against another BLAS.
_BLAS_THREADS = """
import ctypes
maps = open("/proc/self/maps").read().split()
libs = sorted({p for p in maps if "openblas" in p.rsplit("/", 1)[-1]})
fns = [getattr(ctypes.CDLL(p), n, None) for p in libs for n in (
    "scipy_openblas_get_num_threads64_", "openblas_get_num_threads64_", "openblas_get_num_threads")]
fns = [f for f in fns if f is not None]
print(fns[0]() if fns else "NOBLAS")
"""


@pytest.mark.parametrize(("given", "want"), [(None, "1"), ("2", "2")])
def test_numpys_blas_pool_is_one_thread_unless_the_user_says(given: str | None, want: str) -> None:
    """ckpt's threads do the work; OpenBLAS's pool of a thread a CPU only spun. The pool numpy
    started is one thread (set before numpy is imported); a user's own setting is kept."""
    import os

    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    if given is not None:
        env["OPENBLAS_NUM_THREADS"] = given
    code = (
        f"import os, sys; sys.argv=['ckpt','verify','--deep',{str(FIXTURES / 'seed_mlp')!r}]\n"
        "from ckpt_cli.app import main\ntry:\n    main()\nexcept SystemExit:\n    pass\n"
        "assert 'numpy' in sys.modules\n" + _BLAS_THREADS
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    threads = proc.stdout.strip().splitlines()[-1]
    if threads == "NOBLAS":
        pytest.skip("numpy here is not built against OpenBLAS")
    assert threads == want


def test_help_does_not_import_tensorstore() -> None:
    code = "import sys; sys.argv=['ckpt','--help']\nfrom ckpt_cli.app import main\ntry:\n    main()\nexcept SystemExit:\n    pass\nprint('TS' if 'tensorstore' in sys.modules else 'NOTS')"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip().endswith("NOTS")


def test_local_ls_does_not_import_bucket_clients() -> None:
    code = (
        f"import sys; sys.argv=['ckpt','ls',{str(FIXTURES / 'seed_mlp')!r}]\n"
        "from ckpt_cli.app import main\ntry:\n    main()\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in ('botocore', 'google.auth', 'urllib.request') if m in sys.modules))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip().splitlines()[-1] == "[]"


def test_help_imports_no_core_module() -> None:
    """Commands import the core when they run: ``--help`` loads none of it (11 modules before
    the re-layout)."""
    code = (
        "import sys; sys.argv=['ckpt','--help']\nfrom ckpt_cli.app import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in sys.modules if m.startswith('ckpt_cli.core')))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip().splitlines()[-1] == "[]"
