"""Every ``ckpt`` command line of the docs and every example of every command's ``--help`` runs.

The lines come from every page of docs/ and the README (the ``$ `` lines of ``console`` blocks,
the ``ckpt`` lines of ``sh``/``bash`` blocks) and from the ``examples`` of each ``Command``
record (what ``--help`` ends with). They run in groups, a page or one command's examples, in
order, in a fresh directory made by tests/support/docs_world.py (the one table that says what
``runs/exp7``, ``s3://bucket/...`` or ``model:abstract_state`` stand for), through bash, as
written. Each must exit 0, or the code its trailing comment states (``# exit 1: they differ``):
the one way a page or an example says that a command is meant to fail (tests/README.md).

A line this test does not run is in :data:`RUN_ELSEWHERE` (another test runs it, with its
output) or :data:`NOT_RUN` (why it cannot run here), and both are counted. Not collected at all:
docs/how-to/ci.md's recipes (``yaml`` and ``cron`` blocks: tests/docs/test_ci_recipes.py runs
them), and the ``pip install`` lines of ``sh`` blocks, which the install tests run against the
built wheel (never the public index).
"""

from __future__ import annotations

import inspect as pyinspect
from collections.abc import Iterator
from pathlib import Path

import pytest

from ckpt_cli.commands import COMMANDS
from tests.support.docs_examples import (
    EXIT,
    REPO,
    Command,
    console_commands,
    first_mismatch,
    pages,
    prepare_workdir,
    shell_commands,
)
from tests.support.docs_world import (
    NEEDS,
    THINGS,
    Ctx,
    ckpt_words,
    forget_imports,
    make_world,
    run_line,
    substituted,
    uses_buckets,
)

TUTORIAL = "docs/tutorials/first-checkpoint.md"

#: Pages (or a section of one) whose commands another test runs, comparing their output too.
RUN_ELSEWHERE: dict[tuple[str, str | None], str] = {
    (TUTORIAL, None): "tests/docs/test_tutorial.py runs the tutorial on its own script's run",
    ("README.md", "Quick start"): "tests/docs/test_readme.py runs the quick start likewise",
    ("docs/index.md", "Quick start"): "the README's quick start (tests/docs/test_front_door.py)",
    ("docs/how-to/frameworks.md", None): "tests/docs/test_frameworks_page*.py and "
    "tests/e2e/test_frameworks_keras.py run each section on the frameworks' own fixtures",
    **{
        (f"docs/reference/{c.name}.md", None): "the --help examples, run here as such (generated)"
        for c in COMMANDS
    },
}

#: Lines that are not run, each with the reason: (page, the line as written) -> why.
NOT_RUN: dict[tuple[str, str], str] = {
    (
        "docs/explanation/scale-out.md",
        "ckpt reshard run/ run-4x2/ --mesh data=4,model=2 --rules rules.yaml \\\n"
        "      --executor dask --scheduler tcp://10.0.0.5:8786          # or DASK_SCHEDULER_ADDRESS",
    ): "needs the Dask cluster at 10.0.0.5; tests/e2e/test_scale_out.py runs reshard on a local one",
    (
        "docs/explanation/scale-out.md",
        "ckpt migrate run/ run-wide/ --spec widen.yaml --executor dask --unit-bytes 512MiB",
    ): "starts a Dask cluster (seconds); tests/e2e/test_scale_out.py runs migrate on one",
    (
        "docs/explanation/scale-out.md",
        "ckpt verify run/ --deep --executor dask",
    ): "starts a Dask cluster (seconds); tests/e2e/test_scale_out.py runs verify on one",
    (
        "docs/how-to/trend.md",
        "ckpt trend s3://bucket/exp7 --executor dask --scheduler tcp://10.0.0.5:8786",
    ): "needs the Dask cluster at 10.0.0.5; tests/commands/test_trend_workers.py runs trend on one",
    (
        "docs/how-to/doctor.md",
        "ckpt doctor runs/big --target model:sharded_state --hosts 2",
    ): "a 1 GiB checkpoint (make_big.py); tests/core/doctor/test_preflight.py checks --hosts",
}


def _page_name(page: Path) -> str:
    return str(page.relative_to(REPO))


def _section_of(page: Path, line: int) -> str | None:
    heading = None
    for text in page.read_text().splitlines()[: line - 1]:
        if text.startswith("## "):
            heading = text[3:].strip()
    return heading


def _elsewhere(command: Command) -> str | None:
    name = _page_name(command.page)
    return RUN_ELSEWHERE.get((name, None)) or RUN_ELSEWHERE.get(
        (name, _section_of(command.page, command.line))
    )


def help_examples() -> Iterator[tuple[str, Command]]:
    """Each example of each command's --help, as the command line it shows."""
    for record in COMMANDS:
        module = Path(pyinspect.getfile(record.function))
        for n, example in enumerate(record.examples, 1):
            text = f"ckpt {record.name} {example}"
            m = EXIT.search(text)
            yield record.name, Command(module, n, text, int(m.group("code")) if m else 0, ())


def page_commands() -> Iterator[tuple[str, Command]]:
    for page in pages():
        found = sorted([*console_commands(page), *shell_commands(page)], key=lambda c: c.line)
        for command in found:
            yield _page_name(page), command


def collect() -> tuple[dict[str, list[Command]], list[tuple[Command, str]]]:
    """The groups to run (name -> commands in order) and the lines left out, with the reason."""
    groups: dict[str, list[Command]] = {}
    left_out: list[tuple[Command, str]] = []
    for group, command in [*help_examples(), *page_commands()]:
        reason = _elsewhere(command) or NOT_RUN.get((group, command.text))
        if reason:
            left_out.append((command, reason))
        else:
            groups.setdefault(group, []).append(command)
    return groups, left_out


GROUPS, LEFT_OUT = collect()
#: Pages whose world is the page's own (the same steps, the same model): their commands run
#: through bash and the output they show is compared too, and regenerated with
#: ``CKPT_UPDATE_DOCS=1``, as the tutorial's. On the other pages the output is an illustration
#: from another run (step numbers, sizes), and only the exit code is checked.
SHOWN_OUTPUT = {
    "docs/how-to/doctor.md",
    "docs/how-to/migrate.md",
    "docs/how-to/reshard.md",
    "docs/how-to/diff.md",
    "docs/how-to/export.md",
    "docs/how-to/huggingface.md",
    "docs/how-to/inspecting.md",
    "docs/how-to/retention.md",
}
#: Where the pages say the reader's directory is.
READER_DIR = "/home/you/ckpt"
#: Groups whose setup or commands import JAX (a model module, the Llama example): slow.
SLOW = {
    *("doctor", "migrate", "export", "import"),
    *("docs/how-to/doctor.md", "docs/how-to/migrate.md", "docs/how-to/reshard.md"),
}


def test_every_command_line_is_run_or_left_out_for_a_stated_reason() -> None:
    """Counts, so that a parser that stops finding lines fails; ``pytest -s`` lists the lines
    not run here."""
    ran = sum(len(commands) for commands in GROUPS.values())
    examples = sum(len(c.examples) for c in COMMANDS)
    assert examples >= 30 and all(c.examples for c in COMMANDS)
    assert ran >= 80, f"only {ran} command lines found to run"
    not_run = [(c, why) for c, why in LEFT_OUT if why in NOT_RUN.values()]
    elsewhere = [(c, why) for c, why in LEFT_OUT if why not in NOT_RUN.values()]
    assert len(not_run) == len(NOT_RUN), "a NOT_RUN line is no longer on its page"
    assert len(elsewhere) >= examples + 15  # the reference pages, the tutorial, the quick start
    assert set(GROUPS) == set(NEEDS), "every group says what it needs in docs_world.NEEDS"
    needed = {path for paths in NEEDS.values() for path in paths}
    assert needed == set(THINGS), f"THINGS no group needs: {set(THINGS) - needed}"
    print(f"\n{ran} command lines run here, {len(elsewhere)} by other tests, not run:")
    for command, why in not_run:
        print(f"  {command.where}: {command.text.splitlines()[0]}\n    {why}")


def test_the_reference_pages_show_exactly_the_help_examples() -> None:
    """Their examples are left to the --help examples: the same lines, as generated."""
    for record in COMMANDS:
        page = REPO / "docs" / "reference" / f"{record.name}.md"
        shown = [c.text for c in console_commands(page)]
        assert shown == [f"ckpt {record.name} {e}" for e in record.examples], record.name


def _group_param(name: str) -> object:
    marks = [pytest.mark.slow] if name in SLOW else []
    return pytest.param(name, id=name, marks=marks)


def _start_buckets(group: str, request: pytest.FixtureRequest) -> None:
    """The S3 and GCS test servers (session-wide), started only for a group that names a
    bucket; they set the environment the commands inherit (endpoint, keys)."""
    s3, gcs = uses_buckets(group, [c.text for c in GROUPS[group]])
    if s3:
        request.getfixturevalue("moto_s3")
    if gcs:
        request.getfixturevalue("gcs")


@pytest.mark.parametrize("group", [_group_param(g) for g in sorted(GROUPS)])
def test_the_command_lines_run_with_the_exit_code_they_state(
    group: str, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Plain ``ckpt`` lines run through ``main()`` in this process, the others through bash."""
    _start_buckets(group, request)
    try:
        ctx = make_world(group, tmp_path, capsys)
        if group in SHOWN_OUTPUT:
            commands = [substituted(c, ctx) for c in GROUPS[group]]
            mismatch = first_mismatch(commands, tmp_path, READER_DIR)
            failed = [mismatch] if mismatch else []
        else:
            failed = _failures(GROUPS[group], ctx)
    finally:
        forget_imports(tmp_path)
    assert not failed, "\n".join(failed)


def _failures(commands: list[Command], ctx: Ctx) -> list[str]:
    failed = []
    for command in commands:
        code, stderr = run_line(command, ctx)
        if code != command.exit_code:
            failed.append(
                f"{command.where}: `{command.text}` exited {code}, "
                f"expected {command.exit_code}\n    {stderr.strip()[-600:]}"
            )
    return failed


def test_a_broken_line_or_a_wrong_stated_exit_code_fails(tmp_path: Path) -> None:
    """The check can fail: the --help example that lacked --mode, and a stated exit code that is
    not the real one, are reported with their lines; a pip line is not ckpt's."""
    page = tmp_path / "page.md"
    page.write_text(
        "```sh\npip install '.[orbax]'\n"
        "CKPT_DEBUG=0 ckpt ls fixtures/ckpts/seed_mlp \\\n    --json\n"
        "ckpt prune fixtures/ckpts/composite_best --keep-best 2 --metric loss --dry-run\n"
        "ckpt verify /no/such/run    # exit 1\n```\n"
    )
    found = shell_commands(page)
    assert [(c.line, c.exit_code) for c in found] == [(3, 0), (5, 0), (6, 1)]
    workdir = tmp_path / "work"
    workdir.mkdir()
    prepare_workdir(workdir)
    assert [ckpt_words(c.text) is None for c in found] == [True, False, False]
    failed = _failures(found, Ctx(workdir, "unused"))  # no capsys: each one through bash
    assert [f.split(":", 2)[1] for f in failed] == ["5", "6"], failed
    assert "--keep-best needs --mode" in failed[0] and "exited 3, expected 1" in failed[1]
