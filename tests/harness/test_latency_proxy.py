"""The latency harness itself (``tests/support/latency_proxy.py``): delay, counts, requests in flight,
bandwidth cap, streaming, keep-alive; against moto's S3, the GCS emulator and a tiny server.

Times are asserted only as lower bounds the proxy guarantees by construction (a request cannot
finish before its delay; bytes cannot leave faster than the cap), with loose upper bounds on the
measured rate; never ckpt's speed.
"""

from __future__ import annotations

import http.client
import http.server
import json
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tests.support.latency_proxy import LatencyProxy, parse_bandwidth, parse_delay, request_kind
from tests.support.remote_servers import BUCKET, GcsServer
from tests.support.storage_fixtures import S3

# Request counts and in-flight figures come from moto's in-process server (its hooks).
pytestmark = pytest.mark.moto_only


def _client(endpoint: str, pool: int = 10) -> Any:
    import botocore.session
    from botocore.config import Config

    return botocore.session.get_session().create_client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=Config(max_pool_connections=pool, retries={"max_attempts": 1}),
    )


@pytest.fixture
def s3_proxy(s3: S3) -> Iterator[LatencyProxy]:
    with LatencyProxy(s3.server.endpoint, track_pids=True) as proxy:
        yield proxy


def test_counts_by_kind(s3: S3, s3_prefix: str, s3_proxy: LatencyProxy) -> None:
    c = _client(s3_proxy.endpoint)
    for i in range(3):
        c.put_object(Bucket=BUCKET, Key=f"{s3_prefix}/k{i}", Body=b"x" * (i + 1))
    c.list_objects_v2(Bucket=BUCKET, Prefix=s3_prefix)
    assert c.get_object(Bucket=BUCKET, Key=f"{s3_prefix}/k2")["Body"].read() == b"xxx"
    c.head_object(Bucket=BUCKET, Key=f"{s3_prefix}/k1")
    c.delete_objects(
        Bucket=BUCKET, Delete={"Objects": [{"Key": f"{s3_prefix}/k{i}"} for i in (0, 1)]}
    )
    c.delete_object(Bucket=BUCKET, Key=f"{s3_prefix}/k2")
    assert s3_proxy.wait_idle()
    stats = s3_proxy.stats()
    assert stats.by_kind == {
        "DELETE": 1,
        "DELETE_BATCH": 1,
        "GET": 1,
        "HEAD": 1,
        "LIST": 1,
        "PUT": 3,
    }
    assert stats.by_method == {"DELETE": 1, "GET": 2, "HEAD": 1, "POST": 1, "PUT": 3}
    assert stats.requests == 8 == len(stats.log)
    assert [r.status for r in stats.log][:3] == [200, 200, 200]
    assert stats.bytes_in >= 1 + 2 + 3 and stats.bytes_out >= 3
    assert stats.max_in_flight == 1
    # botocore keeps one connection alive for the whole serial run
    assert stats.connections == 1
    assert {r.pid for r in stats.log} == {__import__("os").getpid()}
    assert not c.list_objects_v2(Bucket=BUCKET, Prefix=s3_prefix).get("Contents")


def test_delay_is_added_to_every_request(s3: S3, s3_prefix: str) -> None:
    s3.client.put_object(Bucket=BUCKET, Key=f"{s3_prefix}/k", Body=b"v")
    with LatencyProxy(s3.server.endpoint, delay=0.1) as proxy:
        c = _client(proxy.endpoint)
        started = time.monotonic()
        for _ in range(4):
            c.get_object(Bucket=BUCKET, Key=f"{s3_prefix}/k")["Body"].read()
        serial = time.monotonic() - started
        assert proxy.wait_idle()
        log = proxy.stats().log
    assert len(log) == 4
    assert all(r.ended - r.started >= 0.1 for r in log)
    assert serial >= 0.4  # four requests one after the other: four delays


def test_requests_in_flight(s3: S3, s3_prefix: str, s3_proxy: LatencyProxy) -> None:
    s3.client.put_object(Bucket=BUCKET, Key=f"{s3_prefix}/k", Body=b"v")
    c = _client(s3_proxy.endpoint, pool=16)
    c.get_object(Bucket=BUCKET, Key=f"{s3_prefix}/k")["Body"].read()
    assert s3_proxy.wait_idle()
    assert s3_proxy.stats().max_in_flight == 1
    s3_proxy.reset()
    s3_proxy.hold()
    with ThreadPoolExecutor(8) as pool:
        futures = [
            pool.submit(lambda: c.get_object(Bucket=BUCKET, Key=f"{s3_prefix}/k")["Body"].read())
            for _ in range(8)
        ]
        assert s3_proxy.wait_in_flight(8)
        assert s3_proxy.stats().in_flight == 8
        s3_proxy.release()
        assert [f.result() for f in futures] == [b"v"] * 8
    assert s3_proxy.wait_idle()
    stats = s3_proxy.stats()
    assert stats.max_in_flight == 8
    assert stats.in_flight == 0
    assert stats.requests == 8
    assert stats.max_connections >= 8


def test_bandwidth_cap_per_connection(s3: S3, s3_prefix: str) -> None:
    size, cap = 2 << 20, 4 << 20
    s3.client.put_object(Bucket=BUCKET, Key=f"{s3_prefix}/big", Body=b"b" * size)
    with LatencyProxy(s3.server.endpoint, bandwidth=cap, scope="connection") as proxy:
        c = _client(proxy.endpoint)
        assert len(c.get_object(Bucket=BUCKET, Key=f"{s3_prefix}/big")["Body"].read()) == size
        c.put_object(Bucket=BUCKET, Key=f"{s3_prefix}/up", Body=b"u" * size)
        assert proxy.wait_idle()
        get, put = proxy.stats().log
    assert get.bytes_out == size and put.bytes_in == size
    for r in (get, put):
        rate = size / (r.ended - r.started)
        # never faster than the cap (one 64 KiB piece of slack), not far below it either
        assert rate <= cap * 1.05
        assert rate >= cap / 4


def test_bandwidth_cap_is_shared_by_one_process(s3: S3, s3_prefix: str) -> None:
    """scope="process": two connections of one process share one cap; two processes do not."""
    size, cap = 1 << 20, 4 << 20
    s3.client.put_object(Bucket=BUCKET, Key=f"{s3_prefix}/big", Body=b"b" * size)
    with LatencyProxy(s3.server.endpoint, bandwidth=cap, scope="process") as proxy:
        c = _client(proxy.endpoint, pool=4)
        started = time.monotonic()
        with ThreadPoolExecutor(2) as pool:
            bodies = list(
                pool.map(
                    lambda _: c.get_object(Bucket=BUCKET, Key=f"{s3_prefix}/big")["Body"].read(),
                    range(2),
                )
            )
        both = time.monotonic() - started
        assert [len(b) for b in bodies] == [size, size]
        assert both >= 2 * size / cap * 0.95
        assert proxy.wait_idle()
        log = proxy.stats().log
        assert len({r.connection for r in log}) == 2 and len({r.pid for r in log}) == 1
        # two client processes at once: each gets the whole cap
        proxy.reset()
        script = "import sys, urllib.request; urllib.request.urlopen(sys.argv[1]).read()"
        url = c.generate_presigned_url(
            "get_object", Params={"Bucket": BUCKET, "Key": f"{s3_prefix}/big"}
        )
        procs = [subprocess.Popen([sys.executable, "-c", script, url]) for _ in range(2)]
        assert [p.wait(timeout=60) for p in procs] == [0, 0]
        assert proxy.wait_idle()
        log = proxy.stats().log
    assert len(log) == 2 and all(r.status == 200 and r.bytes_out == size for r in log)
    assert {r.pid for r in log} == {p.pid for p in procs}
    for r in log:
        assert size / (r.ended - r.started) <= cap * 1.05


def test_tensorstore_reads_and_writes_through_it(s3: S3, s3_prefix: str) -> None:
    """TensorStore's own HTTP client (curl: keep-alive, Expect: 100-continue on big puts)."""
    import tensorstore as ts

    with LatencyProxy(s3.server.endpoint, delay=0.01) as proxy:
        kv = ts.KvStore.open(
            {
                "driver": "s3",
                "bucket": BUCKET,
                "path": f"{s3_prefix}/",
                "endpoint": proxy.endpoint,
                "aws_region": "us-east-1",
                "aws_credentials": {"type": "environment"},
            }
        ).result()
        big = bytes(range(256)) * (12 << 12)  # 3 MiB
        futures = [kv.write(f"obj{i}", big if i == 0 else b"small") for i in range(20)]
        for f in futures:
            f.result()
        assert kv.read("obj0").result().value == big
        assert proxy.wait_idle()
        stats = proxy.stats()
    assert stats.by_kind["PUT"] == 20
    assert stats.by_kind["GET"] >= 1
    assert stats.max_in_flight > 1  # TensorStore overlaps its 20 writes
    assert stats.bytes_in >= len(big)


def test_gcs_json_api_kinds(gcs: GcsServer) -> None:
    with LatencyProxy(gcs.endpoint) as proxy:
        base = proxy.endpoint
        upload = urllib.request.Request(
            f"{base}/upload/storage/v1/b/{BUCKET}/o?uploadType=media&name=px/a",
            data=b"hello",
            method="POST",
            headers={"Content-Type": "application/octet-stream"},
        )
        urllib.request.urlopen(upload).read()
        listed = json.loads(
            urllib.request.urlopen(f"{base}/storage/v1/b/{BUCKET}/o?prefix=px/").read()
        )
        media = urllib.request.urlopen(f"{base}/storage/v1/b/{BUCKET}/o/px%2Fa?alt=media").read()
        meta = json.loads(urllib.request.urlopen(f"{base}/storage/v1/b/{BUCKET}/o/px%2Fa").read())
        urllib.request.urlopen(
            urllib.request.Request(f"{base}/storage/v1/b/{BUCKET}/o/px%2Fa", method="DELETE")
        ).read()
        assert proxy.wait_idle()
        stats = proxy.stats()
    assert [i["name"] for i in listed["items"]] == ["px/a"]
    assert media == b"hello" and meta["size"] == "5"
    assert stats.by_kind == {"DELETE": 1, "GET": 1, "HEAD": 1, "LIST": 1, "PUT": 1}


def test_request_kinds() -> None:
    assert request_kind("GET", "/b", "list-type=2&prefix=x") == "LIST"
    assert request_kind("GET", "/b/k", "") == "GET"
    assert request_kind("POST", "/b", "delete") == "DELETE_BATCH"
    assert request_kind("POST", "/b", "delete=") == "DELETE_BATCH"
    assert request_kind("POST", "/batch/storage/v1", "") == "BATCH"
    assert request_kind("GET", "/storage/v1/b/bk/o", "prefix=a") == "LIST"
    assert request_kind("GET", "/download/storage/v1/b/bk/o/k", "alt=media") == "GET"
    assert parse_delay("25ms") == pytest.approx(0.025)
    assert parse_delay("0.5") == 0.5
    assert parse_bandwidth("8MiB/s") == 8 << 20
    assert parse_bandwidth("100MB") == 100e6
    with pytest.raises(ValueError):
        parse_delay("fast")


class _Upstream(http.server.BaseHTTPRequestHandler):
    """A tiny server: /slow sends half a body, waits for ``gate``, sends the rest; /chunked
    answers in chunked encoding; PUT echoes the length of the body it got."""

    protocol_version = "HTTP/1.1"
    gate = threading.Event()
    half = b"a" * (256 << 10)

    def do_GET(self) -> None:
        if self.path == "/slow":
            self.send_response(200)
            self.send_header("Content-Length", str(2 * len(self.half)))
            self.end_headers()
            self.wfile.write(self.half)
            self.wfile.flush()
            self.gate.wait(10)
            self.wfile.write(self.half)
        else:
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for piece in (b"one", b"two" * 50000, b""):
                self.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")

    def do_PUT(self) -> None:
        if "chunked" in (self.headers.get("Transfer-Encoding") or ""):
            got = 0
            while size := int(self.rfile.readline().strip(), 16):
                got += len(self.rfile.read(size))
                self.rfile.readline()
            self.rfile.readline()
        else:
            got = len(self.rfile.read(int(self.headers["Content-Length"])))
        body = str(got).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def upstream() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Upstream)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    _Upstream.gate.set()
    server.shutdown()
    server.server_close()


def test_bodies_stream_through(upstream: str) -> None:
    """The first half of a body reaches the client while the server still holds the second."""
    _Upstream.gate.clear()
    with LatencyProxy(upstream) as proxy:
        conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
        conn.request("GET", "/slow")
        resp = conn.getresponse()
        first = resp.read(len(_Upstream.half))
        assert first == _Upstream.half and not _Upstream.gate.is_set()
        _Upstream.gate.set()
        assert resp.read() == _Upstream.half
        # chunked both ways, on the same kept-alive connection
        conn.request("GET", "/chunked")
        assert conn.getresponse().read() == b"one" + b"two" * 50000
        conn.request("PUT", "/up", body=iter([b"x" * 70000, b"y" * 5]), encode_chunked=True)
        assert conn.getresponse().read() == b"70005"
        conn.request("PUT", "/up", body=b"z" * 100, headers={"Expect": "100-continue"})
        assert conn.getresponse().read() == b"100"
        conn.close()
        assert proxy.wait_idle()
        stats = proxy.stats()
    assert stats.requests == 4 and stats.connections == 1
    assert stats.bytes_out == 2 * len(_Upstream.half) + 3 + 150000 + 5 + 3
    assert stats.bytes_in == 70005 + 100


def test_stats_endpoint(upstream: str) -> None:
    with LatencyProxy(upstream) as proxy:
        urllib.request.urlopen(f"{proxy.endpoint}/chunked").read()
        doc = json.loads(urllib.request.urlopen(f"{proxy.endpoint}/__proxy__/stats").read())
        assert doc["requests"] == 1 and doc["by_kind"] == {"GET": 1}
        reset = urllib.request.Request(f"{proxy.endpoint}/__proxy__/reset", method="POST")
        assert json.loads(urllib.request.urlopen(reset).read())["requests"] == 0
        assert proxy.stats().requests == 0
