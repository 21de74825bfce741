"""``StorageOptions.from_environment``: the attempts of a failed request (``CKPT_REQUEST_ATTEMPTS``)."""

from __future__ import annotations

import pytest

from ckpt_cli.core.storage.options import StorageOptions


@pytest.mark.parametrize(("raw", "attempts"), [("1", 1), ("7", 7), ("10", 10)])
def test_request_attempts_from_the_environment(raw: str, attempts: int) -> None:
    opts = StorageOptions.from_environment(environ={"CKPT_REQUEST_ATTEMPTS": raw})
    assert opts.request_retries == attempts and opts.list_attempts == attempts
    assert opts.retries()["max_retries"] == attempts


@pytest.mark.parametrize("raw", ["", "0", "11", "-1", "two", "1.5"])
def test_a_value_out_of_range_keeps_the_default(raw: str) -> None:
    opts = StorageOptions.from_environment(environ={"CKPT_REQUEST_ATTEMPTS": raw})
    default = StorageOptions()
    assert (opts.request_retries, opts.list_attempts) == (4, 4)
    assert (default.request_retries, default.list_attempts) == (4, 4)
