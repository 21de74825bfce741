"""pyproject.toml says what the distribution is, each fact in one place: the version is read
from ``ckpt_cli/_version.py``, the issue tracker the exit-70 message names is the ``Issues`` URL,
and the ``dev`` extra installs this distribution's own extras."""

from __future__ import annotations

import sys

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from ckpt_cli._version import ISSUES
from tests.support.paths import REPO
from tests.support.wheel import DIST_NAME

PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
META = PROJECT["project"]


def test_the_name_is_the_one_on_the_index_and_the_command_stays_ckpt() -> None:
    assert META["name"] == DIST_NAME
    assert META["scripts"] == {"ckpt": "ckpt_cli.app:main"}


def test_the_version_is_read_from_the_package() -> None:
    assert "version" not in META and "version" in META["dynamic"]
    dynamic = PROJECT["tool"]["setuptools"]["dynamic"]["version"]
    assert dynamic == {"attr": "ckpt_cli._version.__version__"}


def test_the_urls_name_one_repository_and_its_tracker() -> None:
    urls = META["urls"]
    assert set(urls) == {"Homepage", "Documentation", "Issues", "Changelog"}
    assert urls["Issues"] == ISSUES
    assert all(url.startswith(urls["Homepage"]) for url in urls.values()), urls
    assert urls["Changelog"].endswith("/CHANGELOG.md")


def test_the_dev_extra_installs_this_distributions_extras() -> None:
    extras = META["optional-dependencies"]
    own = [r for r in extras["dev"] if r.startswith(f"{DIST_NAME}[")]
    assert own == [f"{DIST_NAME}[orbax,dask,docs]"]
    assert not any(r.startswith("ckpt-cli") for deps in extras.values() for r in deps)
