"""Every install line of the README and the docs installs this project.

A `pip install` or `pipx install` anywhere in README.md, CONTRIBUTING.md or docs/ (in a code
block or in running text) names `ckpt-orbax` with documented extras, a checkout (`.`), a wheel
built from it, or a package `tests/support/wheel.py` allows by name (`ALLOWED`). docs/how-to/ci.md once told CI to
`pip install ckpt-cli`: an unrelated project of the package index, which installs a `ckpt` too.
"""

from __future__ import annotations

import pytest

from ckpt_cli._version import __version__
from tests.support.docs_examples import pages
from tests.support.paths import REPO
from tests.support.wheel import DIST_NAME, INSTALL, foreign


def install_lines() -> list[tuple[str, str]]:
    """(where, arguments) of every install line."""
    found = []
    for page in [*pages(), REPO / "CONTRIBUTING.md"]:
        for number, line in enumerate(page.read_text().splitlines(), 1):
            for m in INSTALL.finditer(line):
                found.append((f"{page.relative_to(REPO)}:{number}", m.group(1).strip()))
    return found


def test_every_install_line_installs_this_project() -> None:
    lines = install_lines()
    assert len(lines) >= 10
    bad = [f"{where}: {', '.join(found)}" for where, args in lines if (found := foreign(args))]
    assert not bad, "install lines naming another package:\n" + "\n".join(bad)


@pytest.mark.parametrize(
    ("arguments", "wrong"),
    [
        ("ckpt-cli", ["ckpt-cli"]),
        ("'ckpt[dask]'", ["ckpt[dask]"]),
        ("'ckpt-orbax[gpu]'", ["ckpt-orbax[gpu] (no such extra: gpu)"]),
        (
            "dist/ckpt_orbax-0.0.1-py3-none-any.whl",
            ["dist/ckpt_orbax-0.0.1-py3-none-any.whl (the wheel of this version is 0.1.0)"],
        ),
        ("--quiet -e '.[dev]' ckpt-orbax 'ckpt-orbax[orbax,dask]'", []),
    ],
)
def test_a_foreign_package_is_caught(arguments: str, wrong: list[str]) -> None:
    assert foreign(arguments) == [w.replace("0.1.0", __version__) for w in wrong]


def test_the_readme_installs_by_name_first() -> None:
    section = (REPO / "README.md").read_text().split("## Install\n", 1)[1].split("\n## ", 1)[0]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    first = [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]
    assert first[0] == f"pip install {DIST_NAME}"
    assert f"pipx install {DIST_NAME}" in first
    assert "pip install ." in section  # the checkout, until the first release


def test_the_ci_recipes_install_this_project() -> None:
    page = (REPO / "docs" / "how-to" / "ci.md").read_text()
    assert page.count(f"pip install {DIST_NAME}\n") == 2
