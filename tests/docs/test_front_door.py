"""What a newcomer meets first holds together: the docs site's first page shows the README's
quick start, word for word; the README and troubleshooting say where to report a problem and
what to attach, at the tracker the exit-70 message names; troubleshooting covers installing;
the changelog is linked from the README and is a page of the site."""

from __future__ import annotations

import re

import yaml

from ckpt_cli._version import ISSUES
from tests.support.docs_examples import console_commands
from tests.support.paths import REPO
from tests.support.wheel import DIST_NAME

README = REPO / "README.md"
INDEX = REPO / "docs" / "index.md"
TROUBLESHOOTING = REPO / "docs" / "how-to" / "troubleshooting.md"


def _section(text: str, title: str) -> str:
    m = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert m, f"no section {title!r}"
    return m.group(1)


def test_the_docs_first_page_shows_the_readmes_quick_start() -> None:
    readme = console_commands(README, section="Quick start")
    index = console_commands(INDEX, section="Quick start")
    assert len(readme) >= 10
    assert [(c.text, c.output) for c in index] == [(c.text, c.output) for c in readme]


def test_report_a_problem_names_the_tracker_and_what_to_attach() -> None:
    for page in (README, TROUBLESHOOTING):
        section = _section(page.read_text(), "Report a problem")
        for needed in (ISSUES, "ckpt --version", "CKPT_DEBUG=1", "exit code"):
            assert needed in section, f"{page.name}'s Report a problem does not say {needed}"


def test_the_exit_70_row_shows_the_tracker() -> None:
    row = next(
        line for line in TROUBLESHOOTING.read_text().splitlines() if line.startswith("| 70 |")
    )
    assert f"report it at {ISSUES})`" in row and "#report-a-problem" in row


def test_troubleshooting_covers_installing() -> None:
    section = _section(TROUBLESHOOTING.read_text(), "Installing")
    for needed in (
        "command not found",
        "PATH",
        "pipx",
        "pip show ckpt-cli",
        "pip uninstall ckpt-cli",
        f"pip install {DIST_NAME}",
        "ckpt --version",
        "typing_extensions",
    ):
        assert needed in section, f"troubleshooting's Installing section does not say {needed}"


def test_the_changelog_is_linked_and_on_the_site() -> None:
    assert "](CHANGELOG.md)" in README.read_text()
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    assert {"Changelog": "changelog.md"} in config["nav"]
    assert "docs/hooks.py" in config["hooks"]  # makes changelog.md from CHANGELOG.md
    assert not (REPO / "docs" / "changelog.md").exists()  # one text, not a copy to keep equal
    assert "](changelog.md)" in INDEX.read_text()
