"""Many small GETs to one HTTP(S) origin at once, on one event loop in the calling thread.

Why: ``ls`` of 1,000 steps on a bucket reads 2,000 small files. One thread per request in
flight (64 of them, ``http.client``) cost 0.4-0.5 ms of CPU a read here, mostly threads taking
turns at the GIL: 0.8-1.0 s of ``ls``'s CPU. One asyncio loop keeping as many requests in flight
on kept-alive connections costs a fraction of that, and the window can be deeper (latency, not
CPU, is what a bucket costs).

Deliberately small: one request at a time per connection (no pipelining), ``Content-Length``,
chunked or until-close bodies. Each request gets one attempt, plus one more when a reused
connection turns out closed (a server's idle timeout); what still fails is returned as the
exception, and the caller retries it its own (slower, fully retried) way.
"""

from __future__ import annotations

import asyncio
import ssl
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from ckpt_cli.core.storage.sigv4 import host_header

#: A response header block larger than this is refused (S3 sends under 2 KiB).
HEADER_LIMIT = 64 << 10


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes


class ResponseError(Exception):
    """A response this client does not take (malformed, or larger than it allows)."""


def fetch_all(
    url_base: str,
    requests: Sequence[tuple[str, Mapping[str, str]]],
    *,
    window: int,
    timeout_s: float,
    ssl_context: ssl.SSLContext | None = None,
) -> list[Response | BaseException]:
    """GET every ``(target, headers)`` (target: path and query) from ``url_base``
    (``scheme://host[:port]``), ``window`` at most in flight; answers in the order asked.

    Runs its own event loop in this thread, or in a helper thread when this one already runs
    one (a notebook's)."""
    if not requests:
        return []
    job = _Job(url_base, list(requests), window, timeout_s, ssl_context)
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(job.run())
    out: list[list[Response | BaseException]] = []
    failed: list[BaseException] = []

    def in_thread() -> None:
        try:
            out.append(asyncio.run(job.run()))
        except BaseException as e:
            failed.append(e)

    thread = threading.Thread(target=in_thread, name="ckpt-httpmany", daemon=True)
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
    return out[0]


class _Job:
    def __init__(
        self,
        url_base: str,
        requests: list[tuple[str, Mapping[str, str]]],
        window: int,
        timeout_s: float,
        ssl_context: ssl.SSLContext | None,
    ) -> None:
        scheme, _, netloc = url_base.partition("://")
        self.secure = scheme == "https"
        self.host_header = host_header(scheme, netloc)
        hostport = urlsplit(url_base)
        self.host = hostport.hostname or ""
        self.port = hostport.port or (443 if self.secure else 80)
        self.ssl = (ssl_context or ssl.create_default_context()) if self.secure else None
        self.requests = requests
        self.window = max(1, min(window, len(requests)))
        self.timeout = timeout_s
        self.results: list[Response | BaseException | None] = [None] * len(requests)
        self._next = 0

    async def run(self) -> list[Response | BaseException]:
        await asyncio.gather(*(self._worker() for _ in range(self.window)))
        out: list[Response | BaseException] = []
        for r in self.results:
            assert r is not None
            out.append(r)
        return out

    def _take(self) -> int | None:
        if self._next >= len(self.requests):
            return None
        self._next += 1
        return self._next - 1

    async def _worker(self) -> None:
        conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        try:
            while (i := self._take()) is not None:
                target, headers = self.requests[i]
                reused = conn is not None
                for attempt in range(2):
                    try:
                        if conn is None:
                            conn = await asyncio.wait_for(self._connect(), self.timeout)
                        response, keep = await asyncio.wait_for(
                            self._exchange(conn, target, headers), self.timeout
                        )
                    except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError,
                            asyncio.LimitOverrunError, ResponseError, ValueError) as e:  # fmt: skip
                        _close(conn)
                        conn = None
                        if attempt == 0 and reused and not isinstance(e, asyncio.TimeoutError):
                            continue  # a kept-alive connection the server had closed
                        self.results[i] = e
                        break
                    self.results[i] = response
                    if not keep:
                        _close(conn)
                        conn = None
                    break
        finally:
            _close(conn)

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection(
            self.host,
            self.port,
            ssl=self.ssl,
            server_hostname=self.host if self.ssl else None,
            limit=HEADER_LIMIT,
        )

    async def _exchange(
        self,
        conn: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        target: str,
        headers: Mapping[str, str],
    ) -> tuple[Response, bool]:
        reader, writer = conn
        lines = [f"GET {target} HTTP/1.1", f"Host: {self.host_header}", "Accept-Encoding: identity"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        head = await reader.readuntil(b"\r\n\r\n")
        status_line, *header_lines = head[:-4].decode("latin-1").split("\r\n")
        parts = status_line.split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise ResponseError(f"not an HTTP/1.x status line: {status_line[:80]!r}")
        status = int(parts[1])
        fields: dict[str, str] = {}
        for line in header_lines:
            name, sep, value = line.partition(":")
            if not sep:
                raise ResponseError(f"malformed header line: {line[:80]!r}")
            fields[name.strip().lower()] = value.strip()
        keep = fields.get("connection", "").lower() != "close" and parts[0] == "HTTP/1.1"
        if "chunked" in fields.get("transfer-encoding", "").lower():
            body = await _read_chunked(reader)
        elif "content-length" in fields:
            body = await reader.readexactly(int(fields["content-length"]))
        else:
            body, keep = await reader.read(), False  # delimited by the end of the connection
        return Response(status, body), keep


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    chunks: list[bytes] = []
    while True:
        size_line = await reader.readuntil(b"\r\n")
        size = int(size_line.split(b";", 1)[0].strip() or b"x", 16)
        if size == 0:
            while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers
                pass
            return b"".join(chunks)
        chunks.append(await reader.readexactly(size))
        if await reader.readexactly(2) != b"\r\n":
            raise ResponseError("a chunk not followed by CRLF")


def _close(conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None) -> None:
    if conn is not None:
        conn[1].close()
