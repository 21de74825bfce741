"""``tutorial_run``: the run the tutorial's own script saves, made once per session (per xdist
worker) and shared, so the tutorial, the README's quick start and the other docs tests do not
each pay for a JAX/Orbax save.

``python examples/first_checkpoint.py`` runs as the page says, through bash in a fresh directory;
the fixture keeps what it printed and the ``runs/first`` it wrote. A test copies the run into its
own ``tmp_path`` (:meth:`TutorialRun.copy_into`) and never changes the shared one.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.docs_examples import Command, prepare_workdir, run_command
from tests.support.paths import REPO

#: The command the tutorial and the README's quick start give.
SCRIPT_COMMAND = "python examples/first_checkpoint.py"


@dataclass(frozen=True)
class TutorialRun:
    workdir: Path  # where the script ran: runs/first, and copies of fixtures/ and examples/
    result: subprocess.CompletedProcess[str]

    @property
    def root(self) -> Path:
        return self.workdir / "runs" / "first"

    def copy_into(self, workdir: Path) -> Path:
        """``workdir`` as the reader's checkout right after the script: fixtures/, examples/ and
        a copy of runs/first (the commit times Orbax recorded come along)."""
        prepare_workdir(workdir)
        shutil.copytree(self.root, workdir / "runs" / "first", symlinks=True)
        return workdir


@pytest.fixture(scope="session")
def tutorial_run(tmp_path_factory: pytest.TempPathFactory) -> TutorialRun:
    workdir = tmp_path_factory.mktemp("tutorial")
    prepare_workdir(workdir)
    command = Command(REPO / "examples" / "first_checkpoint.py", 1, SCRIPT_COMMAND, 0, ())
    result = run_command(command, workdir)
    assert result.returncode == 0, result.stderr[-4000:]
    return TutorialRun(workdir, result)
