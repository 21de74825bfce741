"""An S3 endpoint that answers a redirect naming no region (no ``x-amz-bucket-region``, no
``Region`` in an error body) ends in one clear line, exit 3: botocore's region redirector, left
to itself, asks the bucket's region with a HEAD that gets the same answer, round and round to
"maximum recursion depth exceeded"."""

from __future__ import annotations

from typing import Any

import pytest

from ckpt_cli.core.storage import StorageOptions
from ckpt_cli.core.storage.s3 import S3Store
from ckpt_cli.core.storage.stores import open_store
from ckpt_cli.errors import StorageError
from tests.support.bare_status_server import bare_status_server
from tests.support.remote_servers import CREDENTIALS

PHRASES = {301: "301 Moved Permanently", 302: "302 Found", 307: "307 Temporary Redirect"}


@pytest.fixture(autouse=True)
def _credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)


def _store(endpoint: str) -> S3Store:
    store = open_store("s3", "b", StorageOptions(s3_endpoint=endpoint))
    assert isinstance(store, S3Store)
    return store


@pytest.mark.parametrize("status", sorted(PHRASES))
def test_a_redirect_without_a_region_stops_at_the_first_answer(status: int) -> None:
    with bare_status_server(status) as server:
        store = _store(server.endpoint)
        with pytest.raises(StorageError) as listed:
            store.list_page("x/")
        with pytest.raises(StorageError) as read:
            store.read_object("x/_CHECKPOINT_METADATA")
    for e in (listed.value, read.value):
        assert e.message == (
            f"the endpoint {server.endpoint} answered {PHRASES[status]} without a Location or "
            "region header"
        )
        assert e.hint is not None and "--s3-endpoint" in e.hint and "region" in e.hint
    # Each call: ckpt's own GET, then botocore's one request; no HEAD of the bucket, no loop.
    assert len(server.requests) <= 4, server.requests
    assert not [r for r in server.requests if r[0] == "HEAD"], server.requests


def test_a_redirect_elsewhere_without_a_region_names_where(cli: Any) -> None:
    with bare_status_server(301, {"Location": "http://elsewhere.invalid/b/"}) as server:
        r = cli("--s3-endpoint", server.endpoint, "ls", "s3://b/x")
    assert r.code == 3, r.stderr
    assert r.stderr.splitlines() == [
        f"ckpt: error: cannot list s3://b/x/: the endpoint {server.endpoint} answered 301 Moved "
        "Permanently to http://elsewhere.invalid/b/ without a region header (check "
        "--s3-endpoint (CKPT_S3_ENDPOINT) and the bucket's region (AWS_REGION))"
    ]


@pytest.mark.parametrize("json_out", [False, True], ids=["text", "json"])
def test_ls_of_a_bare_301_is_one_line_and_exit_3(cli: Any, json_out: bool) -> None:
    with bare_status_server(301) as server:
        r = cli(
            "--s3-endpoint", server.endpoint, "ls", "s3://b/x", *(["--json"] if json_out else [])
        )
    assert r.code == 3, r.stderr
    assert "recursion" not in r.stdout + r.stderr
    (line,) = r.stderr.splitlines()
    assert line.startswith("ckpt: error: cannot list s3://b/x/: ")
    assert "answered 301 Moved Permanently without a Location or region header" in line
    if json_out:
        error = r.json()["error"]
        assert error["code"] == "storage-error"
        assert "301 Moved Permanently" in error["message"] and "--s3-endpoint" in error["hint"]
