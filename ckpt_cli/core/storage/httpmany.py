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
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
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
    (``scheme://host[:port]``), ``window`` at most in flight; answers in the order asked."""
    out: list[Response | BaseException | None] = [None] * len(requests)
    for i, answer in fetch_each(
        url_base, requests, window=window, timeout_s=timeout_s, ssl_context=ssl_context
    ):
        out[i] = answer
    return [a for a in out if a is not None]


def fetch_each(
    url_base: str,
    requests: Sequence[tuple[str, Mapping[str, str]]],
    *,
    window: int,
    timeout_s: float,
    ssl_context: ssl.SSLContext | None = None,
) -> Iterator[tuple[int, Response | BaseException]]:
    """As ``fetch_all``, each answer as it arrives: ``(index, answer)``, every index once.

    The event loop runs in this thread between the answers it yields, not while the caller
    works on one: what the caller does with an answer (decoding it) overlaps the requests
    still in flight, whose answers wait in the sockets' buffers meanwhile. Where this thread
    already runs a loop (a notebook's), the requests run in a helper thread and the answers
    come once all are in. Closing the iterator early closes every connection."""
    if not requests:
        return
    job = _Job(url_base, list(requests), window, timeout_s, ssl_context)
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        yield from _each(job)
        return
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
    yield from enumerate(out[0])


def _each(job: _Job) -> Iterator[tuple[int, Response | BaseException]]:
    """``job`` on a loop of its own, run until an answer is in, then paused while the caller
    takes every answer in so far."""
    loop = asyncio.new_event_loop()
    try:
        runner = loop.create_task(job.run())
        given = 0
        while given < len(job.requests):
            if not job.finished:
                loop.run_until_complete(job.some_finished(runner))
            while job.finished:
                i = job.finished.popleft()
                given += 1
                answer = job.results[i]
                assert answer is not None
                yield i, answer
        loop.run_until_complete(runner)
    finally:
        _shut(loop)


def _shut(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel what still runs on ``loop`` (its workers close their connections), close it."""
    try:
        tasks = asyncio.all_tasks(loop)
        for t in tasks:
            t.cancel()
        if tasks:
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
    finally:
        loop.close()


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
        #: Indexes answered and not yet taken (``fetch_each``), in the order they finished.
        self.finished: deque[int] = deque()
        self._answered: asyncio.Event | None = None
        self._next = 0

    async def run(self) -> list[Response | BaseException]:
        await asyncio.gather(*(self._worker() for _ in range(self.window)))
        out: list[Response | BaseException] = []
        for r in self.results:
            assert r is not None
            out.append(r)
        return out

    async def some_finished(self, runner: asyncio.Task[object]) -> None:
        """Return once an answer is in (or the workers are done, or one raised)."""
        if self._answered is None:
            self._answered = asyncio.Event()
        waiter = asyncio.ensure_future(self._answered.wait())
        try:
            await asyncio.wait({waiter, runner}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
        self._answered.clear()
        if runner.done():
            runner.result()  # a worker's unexpected error, raised here

    def _answer(self, i: int, answer: Response | BaseException) -> None:
        self.results[i] = answer
        self.finished.append(i)
        if self._answered is not None:
            self._answered.set()

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
                        self._answer(i, e)
                        break
                    self._answer(i, response)
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
