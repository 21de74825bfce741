"""The sdist and wheel of the working tree, built as a release is, and venvs that hold the wheel
with no other ckpt in reach.

``dists`` copies what a clone would hold (the files git tracks, and the untracked ones it does not
ignore) into a temporary directory and runs ``python -m build`` there, so the tree itself gets no
``build/`` or ``*.egg-info``. ``wheel_venv`` is a new venv with that wheel installed alone, no
extras: pip fetches the declared dependencies, from its cache or the index, and nothing else. Both
are built once per test run: under xdist the first worker builds behind a lock and the others
reuse it. ``extras_venv`` holds the wheel with its ``dask`` and then its ``orbax`` extra.

Commands run in a venv with ``PYTHONPATH`` removed and a working directory outside the checkout,
so the ``ckpt_cli`` they import is the wheel's (``WheelVenv.run`` checks nothing; the tests do).
"""

from __future__ import annotations

import fcntl
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from ckpt_cli._version import __version__
from tests.support.paths import REPO

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

#: The distribution name on the package index (the import package stays ``ckpt_cli``).
DIST_NAME = "ckpt-orbax"
EXTRAS = set(
    tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
)
#: Other packages a page may tell to install, and why (none yet).
ALLOWED: dict[str, str] = {}
#: ``pip install ARGS`` up to the end of the line, a closing backtick or a comment.
INSTALL = re.compile(r"\b(?:pip|pipx) install ([^`#\n]*)")
#: The wheel: ``py3-none-any``, or tagged for a Python and platform (the compiled kernel inside);
#: a ``*`` for the tags where a page cannot know them.
WHEEL = re.compile(
    r"^(?:[\w./-]*/)?ckpt_orbax-(?P<version>[^-]+)-[\w.*]+(?:-[\w.*]+-[\w.*]+)?\.whl$"
)


def foreign(arguments: str) -> list[str]:
    """The requirements of the arguments of one install line that are not this project (by name,
    ``.`` or its wheel, of this version) with documented extras, nor allowed by name."""
    bad = []
    for word in shlex.split(arguments):
        if word.startswith("-"):
            continue
        name, _, extras = word.partition("[")
        wanted = set(filter(None, extras.rstrip("]").split(",")))
        wheel = WHEEL.match(name)
        if name in (DIST_NAME, ".") or wheel:
            if wanted - EXTRAS:
                bad.append(f"{word} (no such extra: {', '.join(sorted(wanted - EXTRAS))})")
            elif wheel and wheel.group("version") != __version__:
                bad.append(f"{word} (the wheel of this version is {__version__})")
        elif name not in ALLOWED:
            bad.append(word)
    return bad


def install_from(command: str, wheel: Path) -> str:
    """A documented ``pip install ckpt-orbax[...]`` line made to install ``wheel`` instead of
    reaching the index; a line naming any other package fails the test."""
    m = INSTALL.search(command)
    assert m, command
    assert not foreign(m.group(1)), f"{command!r} installs {foreign(m.group(1))}"
    words = [
        shlex.quote(str(wheel) + w[len(DIST_NAME) :])
        if w == DIST_NAME or w.startswith(f"{DIST_NAME}[")
        else shlex.quote(w)
        for w in shlex.split(m.group(1))
    ]
    assert str(wheel) in " ".join(words), f"{command!r} does not install {DIST_NAME}"
    return command[: m.start(1)] + " ".join(words)


@dataclass(frozen=True)
class Dists:
    sdist: Path
    wheel: Path


@dataclass(frozen=True)
class WheelVenv:
    root: Path
    wheel: Path

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """This environment with the venv first on PATH and nothing pointing at the checkout."""
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "CKPT_DEBUG")
        }
        env["PATH"] = f"{self.bin}{os.pathsep}{env.get('PATH', '')}"
        env["VIRTUAL_ENV"] = str(self.root)
        return {**env, **(extra or {})}

    def run(
        self, *args: str | Path, cwd: Path, timeout: float = 300
    ) -> subprocess.CompletedProcess[str]:
        """``args[0]`` is a script of the venv (``ckpt``, ``python``, ``pip``)."""
        cmd = [str(self.bin / str(args[0])), *map(str, args[1:])]
        return subprocess.run(
            cmd, cwd=cwd, env=self.env(), capture_output=True, text=True, timeout=timeout
        )

    def pip_install(self, *requirements: str, cwd: Path) -> None:
        r = self.run(
            "pip", "install", "--quiet", "--no-compile", *requirements, cwd=cwd, timeout=600
        )
        assert r.returncode == 0, f"pip install {' '.join(requirements)} failed:\n{r.stderr}"


def tree_files() -> list[str]:
    """What a clone of the working tree holds: tracked files and untracked ones git does not ignore."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    return [name for name in out.split("\0") if name and (REPO / name).is_file()]


def build_dists(out: Path) -> Dists:
    src = out / "src"
    for name in tree_files():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, src / name)
    dist = out / "dist"
    r = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(dist), str(src)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, f"python -m build failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    (sdist,) = dist.glob("*.tar.gz")
    (wheel,) = dist.glob("*.whl")
    return Dists(sdist, wheel)


def make_venv(root: Path, wheel: Path, extras: str = "") -> WheelVenv:
    """A new venv holding ``wheel`` (``extras``: ``"[dask]"``) and what it declares."""
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True, timeout=300)
    venv = WheelVenv(root, wheel)
    venv.pip_install(f"{wheel}{extras}", cwd=root)
    return venv


@contextmanager
def _once(tmp_path_factory: pytest.TempPathFactory, name: str) -> Iterator[tuple[Path, bool]]:
    """A directory shared by the workers of this run, and whether it still has to be made."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # this run's directory, above each worker's own
    path = base / name
    with (base / f"{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = path / ".done"
        yield path, not done.exists()
        path.mkdir(exist_ok=True)
        done.touch()


def _check_build_tools() -> None:
    for module in ("build", "twine"):
        try:
            __import__(module)
        except ImportError:
            pytest.fail(f"{module} is not installed: pip install -e '.[dev]' (make does)")


@pytest.fixture(scope="session")
def dists(tmp_path_factory: pytest.TempPathFactory) -> Dists:
    _check_build_tools()
    with _once(tmp_path_factory, "dists") as (path, todo):
        if todo:
            shutil.rmtree(path, ignore_errors=True)
            return build_dists(path)
    (sdist,) = (path / "dist").glob("*.tar.gz")
    (wheel,) = (path / "dist").glob("*.whl")
    return Dists(sdist, wheel)


@pytest.fixture(scope="session")
def wheel_venv(tmp_path_factory: pytest.TempPathFactory, dists: Dists) -> WheelVenv:
    """A venv holding the wheel alone: its declared dependencies, no extras, no checkout."""
    with _once(tmp_path_factory, "wheel-venv") as (path, todo):
        if todo:
            shutil.rmtree(path, ignore_errors=True)
            return make_venv(path, dists.wheel)
    return WheelVenv(path, dists.wheel)


@pytest.fixture(scope="session")
def extras_venv(tmp_path_factory: pytest.TempPathFactory, dists: Dists) -> WheelVenv:
    """A venv of the wheel with ``[dask]``, then ``[orbax]`` added: each extra resolves alone."""
    with _once(tmp_path_factory, "extras-venv") as (path, todo):
        if todo:
            shutil.rmtree(path, ignore_errors=True)
            venv = make_venv(path, dists.wheel, "[dask]")
            venv.pip_install(f"{dists.wheel}[orbax]", cwd=path)
            r = venv.run("python", "-c", "import jax, orbax.checkpoint", cwd=path)
            assert r.returncode == 0, (
                r.stderr
            )  # installed: a read command importing them would show
            return venv
    return WheelVenv(path, dists.wheel)
