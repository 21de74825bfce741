"""A latency harness: an HTTP/1.1 proxy on 127.0.0.1 in front of the S3 and GCS test servers.

A real bucket costs 20-50 ms a request and limits throughput per connection or per machine;
moto and gcp-storage-emulator on 127.0.0.1 answer in 1-3 ms. ``LatencyProxy`` stands in for the
network between: every request waits ``delay`` seconds before it reaches the server (so a client
that keeps N requests in flight sees N overlap, one that waits for each answer sees them add up),
bodies in both directions can be held to a bandwidth cap (per connection, per client process,
or in total), and every request is counted (by method and by kind: ``LIST``, ``GET``, ``HEAD``,
``PUT``, ``DELETE``, ``DELETE_BATCH`` for S3 DeleteObjects, ``BATCH`` for the GCS JSON batch
endpoint, ...), with the largest number in flight at once, the connections opened and a log of
every request (start, end, status, bytes, client pid).

Bodies stream through in pieces of ``CHUNK`` bytes (Content-Length and chunked bodies alike; a
large object is never held whole), keep-alive connections stay open (one upstream connection
per client connection), ``Expect: 100-continue`` is answered by the proxy itself.

It lives in ``tests/`` beside ``remote_servers.py`` because the tests start it in front of their
servers, and ``bench/`` already imports ``tests.support.remote_servers`` from the repository root; it
needs nothing but the standard library. In process::

    with LatencyProxy(server.endpoint, delay=0.025, bandwidth=8 << 20) as proxy:
        env["CKPT_S3_ENDPOINT"] = proxy.endpoint
        ...
        stats = proxy.stats()   # requests, by_kind, max_in_flight, bytes, ...

or as a program, for a shell or a demo (stats at ``GET /__proxy__/stats``, reset with
``POST /__proxy__/reset``)::

    python tests/support/latency_proxy.py --upstream http://127.0.0.1:9000 --delay 25ms --port 0
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import re
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

CHUNK = 64 << 10
STATS_PATH = "/__proxy__/stats"
RESET_PATH = "/__proxy__/reset"
Scope = Literal["connection", "process", "total"]


class _Throttle:
    """A fluid shaper: bytes leave no faster than ``rate`` per second, shared by its users."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self._next = 0.0

    async def take(self, n: int) -> None:
        now = time.monotonic()
        start = max(self._next, now)
        self._next = start + n / self.rate
        wait = self._next - now
        if wait > 0.0005:
            await asyncio.sleep(wait)


@dataclass
class Request:
    """One request the proxy relayed."""

    seq: int
    method: str
    kind: str
    path: str
    query: str
    started: float  # time.monotonic() when its headers arrived
    ended: float = 0.0  # when its response was sent (0: still in flight, or cut off)
    status: int = 0
    bytes_in: int = 0  # request body
    bytes_out: int = 0  # response body
    pid: int | None = None  # the client process, when it could be found
    connection: int = 0


@dataclass(frozen=True)
class Stats:
    """Counts since the proxy started (or since ``reset``)."""

    requests: int
    by_method: dict[str, int]
    by_kind: dict[str, int]
    max_in_flight: int
    in_flight: int
    connections: int
    max_connections: int
    bytes_in: int
    bytes_out: int
    log: tuple[Request, ...] = field(default=(), repr=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "by_method": self.by_method,
            "by_kind": self.by_kind,
            "max_in_flight": self.max_in_flight,
            "in_flight": self.in_flight,
            "connections": self.connections,
            "max_connections": self.max_connections,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
        }


def windows_by_pid(log: tuple[Request, ...]) -> dict[int, int]:
    """Client pid -> the most of its requests that were in flight at once (its deepest request
    window), over the requests whose client process was found."""
    out: dict[int, int] = {}
    for pid in {r.pid for r in log if r.pid}:
        events = sorted(
            (t, d) for r in log if r.pid == pid for t, d in ((r.started, 1), (r.ended, -1)) if t
        )
        now = 0
        for _, d in events:
            now += d
            out[pid] = max(out.get(pid, 0), now)
    return out


def request_kind(method: str, path: str, query: str) -> str:
    """What a request does, in object-store terms (S3 path-style and the GCS JSON API)."""
    if path.startswith("/batch/storage/"):
        return "BATCH"
    if path.startswith("/storage/v1/b/") or path.startswith("/download/storage/v1/b/"):
        rest = path.split("/b/", 1)[1]
        parts = rest.split("/", 2)  # bucket, "o", object
        if method == "GET" and len(parts) == 2 and parts[1] == "o":
            return "LIST"
        if method == "GET":
            return "GET" if "alt=media" in query or path.startswith("/download/") else "HEAD"
        return method
    if path.startswith("/upload/storage/"):
        return "PUT"
    if method == "GET" and re.search(r"(^|&)list-type=2(&|$)", query):
        return "LIST"
    if method == "POST" and re.search(r"(^|&)delete(=|&|$)", query):
        return "DELETE_BATCH"
    return method


def _client_pids(local_port: int) -> dict[int, int]:
    """Client port -> pid of every connection to 127.0.0.1:local_port, from /proc (one scan)."""
    inodes: dict[str, int] = {}
    want = f":{local_port:04X}"
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    cols = line.split()
                    if cols[2].endswith(want) and cols[9] != "0":
                        inodes[f"socket:[{cols[9]}]"] = int(cols[1].rsplit(":", 1)[1], 16)
        except OSError:
            continue
    found: dict[int, int] = {}
    if not inodes:
        return found
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        fd_dir = f"/proc/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                port = inodes.get(os.readlink(f"{fd_dir}/{fd}"))
            except OSError:
                continue
            if port is not None:
                found[port] = int(pid)
    return found


class _PidFinder:
    """Which process holds the client end of a connection; one /proc scan serves every
    connection opened before it (TensorStore opens dozens at once)."""

    def __init__(self) -> None:
        self.known: dict[int, int] = {}
        self._lock: asyncio.Lock | None = None

    async def find(self, local_port: int, peer_port: int) -> int | None:
        if peer_port in self.known:
            return self.known[peer_port]
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if peer_port not in self.known:
                self.known.update(await asyncio.to_thread(_client_pids, local_port))
        return self.known.get(peer_port)


class _Closed(Exception):
    pass


class LatencyProxy:
    """A delaying, counting, optionally throttling HTTP/1.1 proxy to one upstream server.

    ``delay``: seconds added to every request before it is forwarded. ``bandwidth``: bytes per
    second for bodies, each direction, per ``scope`` (``connection``, ``process``: all
    connections of one client process, found through /proc, or ``total``); None: no cap.
    ``keep_log``: record every request (``stats().log``). ``track_pids``: find the client
    process of every connection (always on for a per-process cap); it scans /proc once per
    connection, off the request path.
    """

    def __init__(
        self,
        upstream: str,
        *,
        delay: float = 0.0,
        bandwidth: float | None = None,
        scope: Scope = "process",
        port: int = 0,
        keep_log: bool = True,
        track_pids: bool = False,
    ) -> None:
        parts = urlsplit(upstream)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"upstream must be http://HOST:PORT, got {upstream!r}")
        self.upstream_host = parts.hostname
        self.upstream_port = parts.port or 80
        self.delay = delay
        self.bandwidth = bandwidth
        self.scope: Scope = scope
        self.keep_log = keep_log
        self.track_pids = track_pids or (bandwidth is not None and scope == "process")
        self._port = port
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.AbstractServer | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._throttles: dict[Any, tuple[_Throttle, _Throttle]] = {}
        self._gate: asyncio.Event | None = None
        self._pids = _PidFinder()
        self._conn_ids = 0  # never reset: throttles are keyed by it
        #: Called with each Request before it is forwarded, from the proxy's thread (tests).
        self.before_forward: Callable[[Request], None] | None = None
        self.reset()

    # Life cycle.

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the proxy is not running")
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> LatencyProxy:
        ready = threading.Event()
        failed: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                self._server = loop.run_until_complete(
                    asyncio.start_server(self._serve, "127.0.0.1", self._port, backlog=512)
                )
            except BaseException as e:
                failed.append(e)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            loop.close()

        self._thread = threading.Thread(target=run, name="latency-proxy", daemon=True)
        self._thread.start()
        ready.wait()
        if failed:
            raise failed[0]
        return self

    def stop(self) -> None:
        loop, self._loop = self._loop, None
        if loop is None:
            return

        async def shutdown() -> None:
            if self._server is not None:
                self._server.close()
            for w in list(self._writers):
                w.close()
            me = asyncio.current_task()
            tasks = [t for t in asyncio.all_tasks() if t is not me]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            loop.stop()

        asyncio.run_coroutine_threadsafe(shutdown(), loop)
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._server = None

    def __enter__(self) -> LatencyProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # Counts.

    def reset(self) -> None:
        """Start counting afresh. Requests and connections still open stay counted as open
        (their ends are still to come): the maxima start from them."""
        with self._lock:
            self._seq = 0
            self._by_method: collections.Counter[str] = collections.Counter()
            self._by_kind: collections.Counter[str] = collections.Counter()
            self._in_flight = getattr(self, "_in_flight", 0)
            self._max_in_flight = self._in_flight
            self._connections = 0
            self._open_connections = getattr(self, "_open_connections", 0)
            self._max_connections = self._open_connections
            self._bytes_in = 0
            self._bytes_out = 0
            self._log: list[Request] = []

    def stats(self) -> Stats:
        with self._lock:
            return Stats(
                requests=self._seq,
                by_method=dict(sorted(self._by_method.items())),
                by_kind=dict(sorted(self._by_kind.items())),
                max_in_flight=self._max_in_flight,
                in_flight=self._in_flight,
                connections=self._connections,
                max_connections=self._max_connections,
                bytes_in=self._bytes_in,
                bytes_out=self._bytes_out,
                log=tuple(self._log),
            )

    # Holding requests (tests): requests wait at the gate, counted as in flight.

    def hold(self) -> None:
        """Stop forwarding: requests that arrive wait (in flight) until ``release``."""
        loop = self._require_loop()
        ev = asyncio.Event()
        asyncio.run_coroutine_threadsafe(self._set_gate(ev), loop).result()

    def release(self) -> None:
        loop = self._require_loop()
        asyncio.run_coroutine_threadsafe(self._set_gate(None), loop).result()

    async def _set_gate(self, gate: asyncio.Event | None) -> None:
        old, self._gate = self._gate, gate
        if old is not None:
            old.set()

    def wait_in_flight(self, n: int, timeout: float = 10.0) -> bool:
        """Wait until at least ``n`` requests are in flight; False after ``timeout``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if self._in_flight >= n:
                    return True
            time.sleep(0.005)
        return False

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """Wait until no request is in flight (a client can read the last byte of an answer
        a moment before the proxy counts that request done); False after ``timeout``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if self._in_flight <= 0:
                    return True
            time.sleep(0.002)
        return False

    def _require_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise RuntimeError("the proxy is not running")
        return self._loop

    # Serving.

    def _throttle(self, conn_id: int, pid: int | None) -> tuple[_Throttle, _Throttle] | None:
        if self.bandwidth is None:
            return None
        key: Any
        if self.scope == "total":
            key = "total"
        elif self.scope == "process" and pid is not None:
            key = ("pid", pid)
        else:
            key = ("conn", conn_id)
        pair = self._throttles.get(key)
        if pair is None:
            pair = (_Throttle(self.bandwidth), _Throttle(self.bandwidth))
            self._throttles[key] = pair
        return pair

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        with self._lock:
            self._connections += 1
            self._conn_ids += 1
            self._open_connections += 1
            self._max_connections = max(self._max_connections, self._open_connections)
            conn_id = self._conn_ids
        pid: asyncio.Future[int | None] | None = None
        peer = writer.get_extra_info("peername")
        if self.track_pids:
            pid = asyncio.ensure_future(self._pids.find(self.port, int(peer[1])))
        up: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        try:
            while True:
                head = await _read_head(reader)
                if head is None:
                    return
                method, target, version, headers = _parse_request(head)
                path, _, query = target.partition("?")
                if path in (STATS_PATH, RESET_PATH):
                    await self._answer_control(path, method, writer)
                    continue
                req = self._begin(method, path, query, conn_id)
                try:
                    up = await self._relay(req, pid, headers, head, reader, writer, up)
                finally:
                    self._end(req)
                if _wants_close(version, headers):
                    return
        except (_Closed, ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            return  # a cancelled task would be reported by asyncio's stream callback (3.11)
        finally:
            if pid is not None:
                pid.cancel()
                self._pids.known.pop(int(peer[1]), None)  # the port may serve another process
            if up is not None:
                up[1].close()
            self._writers.discard(writer)
            with self._lock:
                self._open_connections -= 1
            writer.close()

    def _begin(self, method: str, path: str, query: str, conn: int) -> Request:
        with self._lock:
            self._seq += 1
            req = Request(
                self._seq, method, request_kind(method, path, query), path, query,
                time.monotonic(), connection=conn,
            )  # fmt: skip
            self._by_method[method] += 1
            self._by_kind[req.kind] += 1
            self._in_flight += 1
            self._max_in_flight = max(self._max_in_flight, self._in_flight)
            if self.keep_log:
                self._log.append(req)
        return req

    def _end(self, req: Request) -> None:
        with self._lock:
            self._in_flight -= 1
            self._bytes_in += req.bytes_in
            self._bytes_out += req.bytes_out

    async def _relay(
        self,
        req: Request,
        pid: asyncio.Future[int | None] | None,
        headers: list[tuple[str, str]],
        head: bytes,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        up: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None,
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        expect = any(k.lower() == "expect" and "100" in v for k, v in headers)
        out_headers = [(k, v) for k, v in headers if k.lower() != "expect"]
        if self.delay > 0:
            await asyncio.sleep(self.delay)
        if pid is not None:
            req.pid = await pid  # looked up while the request waited
        throttle = self._throttle(req.connection, req.pid)
        while self._gate is not None:
            await self._gate.wait()
        if self.before_forward is not None:
            self.before_forward(req)
        if expect:
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            await writer.drain()
        if up is None or up[0].at_eof():
            if up is not None:
                up[1].close()
            up = await asyncio.open_connection(self.upstream_host, self.upstream_port)
        up_reader, up_writer = up
        first = head.split(b"\r\n", 1)[0]
        up_writer.write(first + b"\r\n" + _format_headers(out_headers) + b"\r\n")
        req.bytes_in = await _relay_body(
            reader, up_writer, headers, throttle[0] if throttle else None, request=True
        )
        await up_writer.drain()
        while True:
            rhead = await _read_head(up_reader)
            if rhead is None:
                raise _Closed
            rversion, status, reason, rheaders = _parse_response(rhead)
            if status >= 200:
                break  # 1xx before the answer: the client already had our own 100
        req.status = status
        if req.method == "HEAD" or status in (204, 304):
            body_headers: list[tuple[str, str]] = [("content-length", "0")]
        else:
            body_headers = rheaders
        delimited = _has_length(body_headers)
        if delimited:
            # The client keeps its connection whatever the server does with ours (real stores
            # keep them alive); we reconnect upstream when the server closes.
            client_headers = [(k, v) for k, v in rheaders if k.lower() != "connection"]
            writer.write(
                f"HTTP/1.1 {status} {reason}\r\n".encode("latin-1")
                + _format_headers(client_headers)
                + b"\r\n"
            )
        else:
            writer.write(rhead)
        req.bytes_out = await _relay_body(
            up_reader, writer, body_headers, throttle[1] if throttle else None, request=False
        )
        await writer.drain()
        req.ended = time.monotonic()
        if not delimited:
            up_writer.close()
            raise _Closed  # the body ended with the server's connection: so does the client's
        if _wants_close(rversion, rheaders):
            up_writer.close()
            up = None
        return up

    async def _answer_control(self, path: str, method: str, writer: asyncio.StreamWriter) -> None:
        if path == RESET_PATH and method == "POST":
            self.reset()
        body = json.dumps(self.stats().to_json()).encode()
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
            + f"content-length: {len(body)}\r\n\r\n".encode()
            + body
        )
        await writer.drain()


async def _read_head(reader: asyncio.StreamReader) -> bytes | None:
    try:
        return await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as e:
        if not e.partial.strip():
            return None
        raise
    except asyncio.LimitOverrunError:
        raise _Closed from None


def _parse_headers(lines: list[bytes]) -> list[tuple[str, str]]:
    out = []
    for line in lines:
        if not line:
            continue
        k, _, v = line.decode("latin-1").partition(":")
        out.append((k.strip(), v.strip()))
    return out


def _parse_request(head: bytes) -> tuple[str, str, str, list[tuple[str, str]]]:
    lines = head[:-4].split(b"\r\n")
    method, target, version = lines[0].decode("latin-1").split(" ", 2)
    return method, target, version, _parse_headers(lines[1:])


def _parse_response(head: bytes) -> tuple[str, int, str, list[tuple[str, str]]]:
    lines = head[:-4].split(b"\r\n")
    parts = lines[0].decode("latin-1").split(" ", 2)
    reason = parts[2] if len(parts) > 2 else ""
    return parts[0], int(parts[1]), reason, _parse_headers(lines[1:])


def _format_headers(headers: list[tuple[str, str]]) -> bytes:
    return b"".join(f"{k}: {v}\r\n".encode("latin-1") for k, v in headers)


def _header(headers: list[tuple[str, str]], name: str) -> str | None:
    return next((v for k, v in headers if k.lower() == name), None)


def _has_length(headers: list[tuple[str, str]]) -> bool:
    te = _header(headers, "transfer-encoding")
    return _header(headers, "content-length") is not None or bool(te and "chunked" in te.lower())


def _wants_close(version: str, headers: list[tuple[str, str]]) -> bool:
    conn = (_header(headers, "connection") or "").lower()
    return "close" in conn or (version == "HTTP/1.0" and "keep-alive" not in conn)


async def _relay_body(
    src: asyncio.StreamReader,
    dst: asyncio.StreamWriter,
    headers: list[tuple[str, str]],
    throttle: _Throttle | None,
    *,
    request: bool,
) -> int:
    """Copy one message body from ``src`` to ``dst`` in pieces; returns its payload bytes."""
    te = (_header(headers, "transfer-encoding") or "").lower()
    length = _header(headers, "content-length")

    async def send(data: bytes) -> None:
        if throttle is not None:
            await throttle.take(len(data))
        dst.write(data)
        await dst.drain()

    total = 0
    if "chunked" in te:
        while True:
            line = await src.readuntil(b"\r\n")
            size = int(line.split(b";", 1)[0].strip(), 16)
            await send(line)
            if size == 0:
                while True:  # trailers, then the empty line
                    trailer = await src.readuntil(b"\r\n")
                    await send(trailer)
                    if trailer == b"\r\n":
                        return total
            left = size
            while left:
                piece = await src.read(min(CHUNK, left))
                if not piece:
                    raise _Closed
                left -= len(piece)
                total += len(piece)
                await send(piece)
            await send(await src.readexactly(2))
    if length is not None:
        left = int(length)
        while left:
            piece = await src.read(min(CHUNK, left))
            if not piece:
                raise _Closed
            left -= len(piece)
            total += len(piece)
            await send(piece)
        return total
    if request:
        return 0  # a request without a length has no body
    while piece := await src.read(CHUNK):  # until the server closes
        total += len(piece)
        await send(piece)
    return total


_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1000, "kib": 1 << 10, "m": 1 << 20, "mb": 10**6,
          "mib": 1 << 20, "g": 1 << 30, "gb": 10**9, "gib": 1 << 30}  # fmt: skip


def parse_delay(text: str) -> float:
    """``25ms``, ``0.025s``, ``0.025`` to seconds."""
    m = re.fullmatch(r"\s*([0-9.]+)\s*(ms|s|us)?\s*", text)
    if not m:
        raise ValueError(f"not a delay: {text!r} (use e.g. 25ms)")
    value = float(m.group(1))
    return value / 1000 if m.group(2) == "ms" else value / 1e6 if m.group(2) == "us" else value


def parse_bandwidth(text: str) -> float:
    """``8MiB/s``, ``100MB``, ``500k`` to bytes per second."""
    m = re.fullmatch(r"\s*([0-9.]+)\s*([a-zA-Z]*)(/s)?\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"not a bandwidth: {text!r} (use e.g. 8MiB/s)")
    return float(m.group(1)) * _UNITS[m.group(2).lower()]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--upstream", required=True, help="http://HOST:PORT of the server")
    parser.add_argument("--delay", default="25ms", type=parse_delay)
    parser.add_argument("--bandwidth", default=None, type=parse_bandwidth)
    parser.add_argument("--scope", default="process", choices=["connection", "process", "total"])
    parser.add_argument("--port", default=0, type=int)
    opts = parser.parse_args(argv)
    proxy = LatencyProxy(
        opts.upstream, delay=opts.delay, bandwidth=opts.bandwidth, scope=opts.scope,
        port=opts.port, keep_log=False,
    )  # fmt: skip
    proxy.start()
    print(f"proxy on {proxy.endpoint} -> {opts.upstream}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        threading.Event().wait()
    proxy.stop()
    sys.exit(0)


if __name__ == "__main__":
    main()
