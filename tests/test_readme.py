"""The README stays true to the code: every verify problem code and every command is documented."""

from __future__ import annotations

import re

from ckpt_cli.app import app
from ckpt_cli.core.verify.problems import CODES
from tests.conftest import REPO

README = (REPO / "README.md").read_text()


def test_every_problem_code_is_documented_with_its_severity() -> None:
    assert CODES
    for code, (severity, _) in CODES.items():
        rows = [line for line in README.splitlines() if re.search(rf"`{re.escape(code)}`", line)]
        assert rows, f"problem code {code} is not in the README"
        assert any(severity in row for row in rows), f"{code}: severity {severity} not documented"


def test_every_command_has_a_readme_section() -> None:
    names = [c.name for c in app.registered_commands]
    assert names == ["ls", "inspect", "verify", "diff", "prune", "reshard", "migrate"]
    for name in names:
        assert re.search(rf"^## `ckpt {name}\b", README, re.M), f"no README section for {name}"


def test_readme_starts_with_the_two_commands() -> None:
    head = README.split("```", 2)[1]
    assert "make demo" in head and "make test" in head
