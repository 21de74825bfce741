"""A new command is one module and one registry entry: a toy command, added that way to a copy
of the repository, appears everywhere a list of commands is kept, with nothing else edited.

The copy holds ``ckpt_cli/``, ``docs/``, ``tests/``, mkdocs.yml, README.md, CHANGELOG.md and
pyproject.toml; into it go ``ckpt_cli/commands/toy.py`` and the registry entry (its import and
its line in ``COMMANDS``). Then, run from the copy: the app and ``ckpt --help`` list it, its
schema is generated, ``ckpt_cli.execute`` dispatches its plan, the reference page, README's and
docs/index.md's command lists, json.md's version table and the site's nav (a strict MkDocs
build) have it, and the error-matrix and storage-option tests collect it and fail naming what to
add for it. Everything but the toy's own module is untouched: the diff of the copy is asserted.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ckpt_cli.commands import COMMANDS
from tests.support.paths import REPO

TOY = textwrap.dedent(
    '''
    """``ckpt toy``: the registry test's toy command (a writer, to exercise ``execute``)."""

    from __future__ import annotations

    from dataclasses import dataclass
    from typing import TYPE_CHECKING, TypedDict

    import typer

    from ckpt_cli.commands._command import Command, JsonOutput, Writer
    from ckpt_cli.commands._context import run_context
    from ckpt_cli.commands._options import JsonOpt, PathArg
    from ckpt_cli.commands._output import emit_json

    if TYPE_CHECKING:
        from ckpt_cli.core.progress import ProgressFn


    class ToyJSON(TypedDict):
        schema_version: int
        ok: bool
        path: str


    @dataclass(frozen=True)
    class ToyPlan:
        SCHEMA_VERSION = 7
        path: str

        def to_json(self) -> ToyJSON:
            return {"schema_version": self.SCHEMA_VERSION, "ok": True, "path": self.path}


    def run_toy(plan: ToyPlan, on_progress: ProgressFn | None = None) -> str:
        return f"toyed {plan.path}"


    def toy(ctx: typer.Context, path: PathArg, json_out: JsonOpt = False) -> None:
        """Count the toys of a checkpoint: the registry test's command."""
        run_context(ctx, json_out)
        if json_out:
            emit_json(ToyPlan(path))
        else:
            typer.echo(f"toy {path}")


    def _json() -> JsonOutput:
        return JsonOutput((ToyJSON,), ToyPlan.SCHEMA_VERSION)


    def _writer() -> Writer[ToyPlan, str]:
        return Writer(ToyPlan, run_toy)


    COMMAND = Command(
        name="toy",
        function=toy,
        summary="count the toys of a checkpoint",
        json_output=_json,
        writer=_writer,
        examples=("runs/exp7",),
    )
    '''
).lstrip()

#: What the copy's run prints: every place a list of commands is kept, as the copy builds it.
PROBE = textwrap.dedent(
    """
    import importlib.util, json, sys
    from pathlib import Path

    import yaml

    import ckpt_cli
    from ckpt_cli.app import app
    from ckpt_cli.commands._schemas import command_schemas
    from ckpt_cli.commands.toy import ToyPlan

    def load(name):
        spec = importlib.util.spec_from_file_location(name, Path("docs") / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    gen, lists, hooks = load("gen_reference"), load("gen_lists"), load("hooks")
    stale = gen.stale_pages() + lists.stale_blocks()
    gen.write_pages()
    _, problems = lists.write_blocks()
    nav = yaml.safe_load(Path("mkdocs.yml").read_text())["nav"]
    print(json.dumps({
        "package": ckpt_cli.__file__,
        "app": [c.name for c in app.registered_commands],
        "schema": command_schemas()["toy"]["title"],
        "executed": ckpt_cli.execute(ToyPlan("runs/x")),
        "stale": stale,
        "problems": problems,
        "nav": yaml.safe_dump(hooks.with_commands(nav, lists.nav_entries())),
    }))
    """
)


def _copy(tmp: Path) -> Path:
    repo = tmp / "repo"
    ignore = shutil.ignore_patterns("__pycache__", ".mypy_cache", ".ruff_cache")
    for name in ("ckpt_cli", "docs", "tests"):
        shutil.copytree(REPO / name, repo / name, ignore=ignore)
    for name in ("mkdocs.yml", "README.md", "CHANGELOG.md", "pyproject.toml"):
        shutil.copy2(REPO / name, repo / name)
    (repo / "fixtures").symlink_to(REPO / "fixtures")
    return repo


def _register_toy(repo: Path) -> None:
    """The one module and the one registry entry a new command takes."""
    (repo / "ckpt_cli" / "commands" / "toy.py").write_text(TOY)
    registry = repo / "ckpt_cli" / "commands" / "__init__.py"
    text = registry.read_text()
    assert text.count("    reshard,\n    trend,\n") == 1 and text.count("    pin.UNPIN,\n)") == 1
    text = text.replace("    reshard,\n    trend,\n", "    reshard,\n    toy,\n    trend,\n")
    registry.write_text(text.replace("    pin.UNPIN,\n)", "    pin.UNPIN,\n    toy.COMMAND,\n)"))


def _run(repo: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(repo), "COLUMNS": "200", "NO_COLOR": "1"}
    env.pop("CKPT_DEBUG", None)
    return subprocess.run(
        [sys.executable, *args], cwd=repo, env=env, capture_output=True, text=True, check=check
    )


@pytest.fixture(scope="module")
def toy_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = _copy(tmp_path_factory.mktemp("toy"))
    _register_toy(repo)
    return repo


def test_the_toy_is_in_the_app_help_schemas_and_execute(toy_repo: Path) -> None:
    probe = json.loads(_run(toy_repo, "-c", PROBE).stdout.splitlines()[-1])
    assert probe["package"].startswith(str(toy_repo)), probe["package"]  # the copy's code ran
    assert probe["app"][-1] == "toy" and "ls" in probe["app"]
    assert probe["schema"] == "ckpt toy --json (schema_version 7)"
    assert probe["executed"] == "toyed runs/x"  # execute found the toy's executor
    # Before the generator ran: its page, README's and docs/index.md's lists and json.md's
    # version table are stale, and json.md lacks the section only a person can write.
    assert "docs/reference/toy.md" in probe["stale"]
    assert {"README.md", "docs/index.md", "docs/reference/json.md"} <= set(probe["stale"])
    assert probe["problems"] == [
        'docs/reference/json.md: no section "## `ckpt toy`" (write what its --json prints)'
    ]
    assert "ckpt toy: reference/toy.md" in probe["nav"]

    helped = _run(toy_repo, "-m", "ckpt_cli", "--help")
    assert any(line.strip("│ ").startswith("toy ") for line in helped.stdout.splitlines())
    own = _run(toy_repo, "-m", "ckpt_cli", "toy", "--help").stdout
    assert "Count the toys of a checkpoint" in own and "$ ckpt toy runs/exp7" in own
    done = _run(toy_repo, "-m", "ckpt_cli", "toy", "runs/y", "--json")
    assert json.loads(done.stdout) == {"schema_version": 7, "ok": True, "path": "runs/y"}


def test_the_toy_is_in_every_generated_list(toy_repo: Path) -> None:
    _run(toy_repo, "-c", PROBE)  # runs the generator in the copy (idempotent)
    page = (toy_repo / "docs" / "reference" / "toy.md").read_text()
    assert page.splitlines()[2] == "# ckpt toy" and "$ ckpt toy runs/exp7" in page
    readme = (toy_repo / "README.md").read_text()
    assert "- `ckpt toy PATH` — count the toys of a checkpoint ([reference](docs/reference/toy.md))." in readme  # fmt: skip
    index = (toy_repo / "docs" / "index.md").read_text()
    assert "| [`ckpt toy PATH`](reference/toy.md) | count the toys of a checkpoint |" in index
    assert "| `toy` | 7 |" in (toy_repo / "docs" / "reference" / "json.md").read_text()
    assert "[`ckpt toy`](toy.md)" in (toy_repo / "docs" / "reference" / "index.md").read_text()
    site = toy_repo / "site"
    build = _run(
        toy_repo, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site), check=False
    )
    assert build.returncode == 0, build.stderr
    assert 'href="../toy/">ckpt toy</a>' in (site / "reference" / "ls" / "index.html").read_text()


def test_the_matrices_collect_the_toy_and_say_what_to_add(toy_repo: Path) -> None:
    r = _run(
        toy_repo,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "tests/commands/test_json_errors.py::test_every_error_class_is_covered",
        "tests/commands/test_storage_options.py::test_every_command_is_covered",
        check=False,
    )
    assert r.returncode == 1, r.stdout + r.stderr
    failed = sorted(line for line in r.stdout.splitlines() if line.startswith("FAILED"))
    assert [line.split(" ")[1] for line in failed] == [
        "tests/commands/test_json_errors.py::test_every_error_class_is_covered[toy]",
        "tests/commands/test_storage_options.py::test_every_command_is_covered[toy]",
    ]
    assert "ckpt toy: no case provokes 'not-found' (add a Case to tests/support/error_cases.py" in r.stdout  # fmt: skip
    assert "ckpt toy: no --s3-endpoint case (add to CASES" in r.stdout
    # The registry's own commands still pass: every one has its cases.
    assert f"2 failed, {2 * len(COMMANDS)} passed" in r.stdout, r.stdout


def test_nothing_but_the_toy_module_and_its_registry_entry_was_edited(toy_repo: Path) -> None:
    """The proof's premise: the copy differs from the repository by the toy's module and two
    lines of the registry (its import and its entry), before the generator runs."""
    fresh = _copy(toy_repo.parent / "fresh")
    _register_toy(fresh)
    original = (REPO / "ckpt_cli" / "commands" / "__init__.py").read_text().splitlines()
    registered = (fresh / "ckpt_cli" / "commands" / "__init__.py").read_text().splitlines()
    added = [line for line in registered if line not in original]
    assert added == ["    toy,", "    toy.COMMAND,"]
    assert len(registered) == len(original) + 2
    changed = subprocess.run(
        ["diff", "-rq", "-x", "__pycache__", "-x", "fixtures", str(REPO / "ckpt_cli"), str(fresh / "ckpt_cli")],
        capture_output=True, text=True, check=False,
    ).stdout.splitlines()  # fmt: skip
    assert len(changed) == 2, changed
    assert any(line.endswith("commands/__init__.py differ") for line in changed), changed
    assert any("Only in" in line and line.endswith(": toy.py") for line in changed), changed


def test_execute_dispatches_every_writers_plan_through_the_registry() -> None:
    import ckpt_cli

    writers = ckpt_cli._writers()
    assert set(writers) == {
        ckpt_cli.ReshardPlan,
        ckpt_cli.MigrationPlan,
        ckpt_cli.PrunePlan,
        ckpt_cli.ExportPlan,
        ckpt_cli.ImportPlan,
        ckpt_cli.CopyPlan,
        ckpt_cli.AveragePlan,
    }
    named = [c.name for c in COMMANDS if c.writer is not None]
    assert named == ["prune", "reshard", "migrate", "average", "export", "import", "cp"]
    with pytest.raises(TypeError, match="not a plan ckpt executes: object"):
        ckpt_cli.execute(object())  # type: ignore[arg-type]


def test_each_renderer_is_the_module_its_command_renders_with() -> None:
    import inspect

    rendered = [c for c in COMMANDS if c.renderer is not None]
    assert len(rendered) >= 10
    for c in rendered:
        module = c.renderer()
        source = inspect.getsource(inspect.getmodule(c.function))  # type: ignore[arg-type]
        parent, _, short = module.__name__.rpartition(".")
        imports = (f"import {module.__name__}", f"from {module.__name__} import", f"from {parent} import {short}")  # fmt: skip
        assert any(line in source for line in imports), (c.name, module.__name__)
