"""Small reads on a bucket (metadata files, zarr headers, OCDBT nodes) without TensorStore.

Damaged items: ``inspect`` reads their metadata directly where it can (``format/headers.py``)
and gives way to TensorStore where the bytes are not what they should be, so that it answers as
it does on disk: the same exit code, the same document when it succeeds. With a proxy in the
environment the reads go through botocore's ``get_object``, which knows how to use it."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.buckets import normalized
from tests.support.paths import FIXTURES
from tests.support.storage_fixtures import S3

DAMAGED = FIXTURES.parent / "damaged"
NAMES = sorted(
    p.name for p in DAMAGED.iterdir() if p.is_dir() and not p.name.startswith(("_", "."))
)


@pytest.mark.parametrize("name", NAMES)
def test_inspect_of_a_damaged_item_answers_as_on_disk(
    cli: Any, s3: S3, s3_prefix: str, name: str
) -> None:
    assert NAMES
    local = str(DAMAGED / name)
    url = s3.put_dir(DAMAGED / name, f"{s3_prefix}/{name}")
    a = cli("inspect", local, "--json")
    b = cli("inspect", url, "--json")
    assert a.code == b.code, (a.stderr, b.stderr)
    if a.code == 0:
        assert normalized(b.json(), "", "") == normalized(a.json(), local, url)
    else:
        assert b.json()["error"]["code"] == a.json()["error"]["code"]


def test_reads_go_through_botocore_when_a_proxy_is_set(
    cli: Any, s3: S3, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ckpt_cli.core.storage.s3 import S3Store

    calls: list[str] = []
    real = S3Store._get_object

    def counted(self: S3Store, key: str, headers: dict[str, str]) -> bytes | None:
        calls.append(key)
        return real(self, key, headers)

    monkeypatch.setattr(S3Store, "_get_object", counted)
    # An HTTPS proxy that the test server's plain-HTTP endpoint never goes through.
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
    local, url = str(FIXTURES / "seed_mlp"), s3.fixture("seed_mlp")
    a, b = cli("inspect", local, "--json"), cli("inspect", url, "--json")
    assert a.code == b.code == 0, b.stderr
    assert normalized(b.json(), "", "") == normalized(a.json(), local, url)
    assert any(k.endswith("/_METADATA") for k in calls), calls


def test_a_redirect_of_the_lean_read_is_followed_by_botocore(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """AWS answers a presigned GET to the wrong region with a redirect (301/307, or 400 naming
    the region): the lean path gives way to botocore's ``get_object``, which knows the rules.
    A real HTTP server on 127.0.0.1 redirects every presigned GET (its query is signed) and
    serves botocore's signed-header GET."""
    import http.server
    import threading

    from ckpt_cli.core.storage.options import StorageOptions
    from ckpt_cli.core.storage.s3 import S3Store

    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            presigned = "X-Amz-Signature" in self.path or "Signature=" in self.path
            seen.append("presigned" if presigned else "signed")
            body = b"" if presigned else b'{"ok": 1}'
            self.send_response(301 if presigned else 200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        endpoint = f"http://127.0.0.1:{server.server_address[1]}"
        store = S3Store("b", StorageOptions(s3_endpoint=endpoint))
        assert store.read_object("k/_CHECKPOINT_METADATA") == b'{"ok": 1}'
    finally:
        server.shutdown()
    assert seen == ["presigned", "signed"], seen
