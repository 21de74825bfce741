"""``httpmany.fetch_all`` and ``fetch_each``: many GETs on one event loop, against a real HTTP server on 127.0.0.1
that answers each path its own way (lengths, chunks, a body ended by closing, a kept-alive
connection the server drops, a status line that is not HTTP), counting connections and the
requests it holds at once."""

from __future__ import annotations

import asyncio
import socket
import socketserver
import threading
import time
from collections.abc import Iterator

import pytest

from ckpt_cli.core.storage.httpmany import Response, ResponseError, fetch_all, fetch_each


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.lock = threading.Lock()
        self.connections = 0
        self.open = 0  # connections not closed yet
        self.in_flight = 0
        self.max_in_flight = 0
        #: Hold every request until this many are in flight at once (then let all go).
        self.hold_until = 0
        self.released = threading.Event()
        self.paths: list[str] = []
        #: ``/held`` paths wait for this (10 s at most: then they are noted in ``gave_up``).
        self.let_held_go = threading.Event()
        self.gave_up: list[str] = []


class _Handler(socketserver.StreamRequestHandler):
    server: _Server

    def handle(self) -> None:
        with self.server.lock:
            self.server.connections += 1
            self.server.open += 1
        try:
            self._serve()
        finally:
            with self.server.lock:
                self.server.open -= 1

    def _serve(self) -> None:
        served = 0
        while True:
            line = self.rfile.readline()
            if not line:
                return
            headers = {}
            while (h := self.rfile.readline()) not in (b"\r\n", b""):
                name, _, value = h.decode().partition(":")
                headers[name.strip().lower()] = value.strip()
            path = line.split()[1].decode()
            with self.server.lock:
                self.server.paths.append(path)
                self.server.in_flight += 1
                self.server.max_in_flight = max(self.server.max_in_flight, self.server.in_flight)
            if self.server.hold_until and self.server.in_flight >= self.server.hold_until:
                self.server.released.set()
            if self.server.hold_until:
                self.server.released.wait(10)
            if path.startswith("/held") and not self.server.let_held_go.wait(10):
                self.server.gave_up.append(path)
            with self.server.lock:
                self.server.in_flight -= 1
            if path.startswith("/drop") and served > 0:
                return  # a kept-alive connection the server closed before answering
            served += 1
            if not self._answer(path, headers):
                return

    def _answer(self, path: str, headers: dict[str, str]) -> bool:
        w = self.wfile
        if path.startswith("/chunked"):
            w.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            w.write(b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nX-Trailer: 1\r\n\r\n")
        elif path.startswith("/close"):
            w.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil the end")
            return False
        elif path.startswith("/missing"):
            w.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\n\r\nnot found")
        elif path.startswith("/garbage"):
            w.write(b"SPDY/9 what\r\n\r\n")
            return False
        else:
            body = (path + "|" + headers.get("range", "") + "|" + headers.get("host", "")).encode()
            w.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        return True


@pytest.fixture
def server() -> Iterator[_Server]:
    s = _Server()
    threading.Thread(target=s.serve_forever, daemon=True).start()
    try:
        yield s
    finally:
        s.shutdown()
        s.server_close()


def _base(s: _Server) -> str:
    return f"http://127.0.0.1:{s.server_address[1]}"


def test_answers_come_in_the_order_asked_within_the_window(server: _Server) -> None:
    server.hold_until = 16  # answers wait until 16 requests are held at once
    asks = [(f"/k/{i}", {"Range": f"bytes={i}-{i + 9}"} if i % 3 == 0 else {}) for i in range(200)]
    got = fetch_all(_base(server), asks, window=16, timeout_s=10)
    assert len(got) == 200
    port = server.server_address[1]
    for i, r in enumerate(got):
        assert isinstance(r, Response) and r.status == 200, r
        want_range = f"bytes={i}-{i + 9}" if i % 3 == 0 else ""
        assert r.body.decode() == f"/k/{i}|{want_range}|127.0.0.1:{port}"
    assert server.released.is_set()  # 16 were in flight together
    assert server.max_in_flight == 16
    assert server.connections == 16  # kept alive: one connection per slot of the window


def test_each_answer_is_given_as_it_arrives_while_others_are_in_flight(server: _Server) -> None:
    """The server holds ``/held`` until the caller has taken every other answer: a fetch that
    gave its answers only once all were in would never get them (the hold gives up after
    10 s, noted). Each index comes once; the held one last, in the window all the while."""
    asks = [("/held", {})] + [(f"/k/{i}", {}) for i in range(40)]
    order: list[int] = []
    for i, answer in fetch_each(_base(server), asks, window=8, timeout_s=30):
        assert isinstance(answer, Response) and answer.status == 200, answer
        assert answer.body.decode().startswith(asks[i][0] + "|")
        order.append(i)
        if len(order) == len(asks) - 1:
            server.let_held_go.set()
    assert not server.gave_up
    assert sorted(order) == list(range(len(asks))) and order[-1] == 0  # asked first


def test_closing_the_answers_early_closes_every_connection(server: _Server) -> None:
    answers = fetch_each(
        _base(server), [(f"/k/{i}", {}) for i in range(20)], window=4, timeout_s=10
    )
    first = next(answers)
    assert isinstance(first[1], Response) and server.connections >= 1
    answers.close()
    deadline = time.monotonic() + 10
    while server.open and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.open == 0


def test_chunked_until_close_and_404_bodies(server: _Server) -> None:
    got = fetch_all(
        _base(server), [("/chunked", {}), ("/close", {}), ("/missing", {}), ("/k", {})],
        window=1, timeout_s=10,
    )  # fmt: skip
    assert [(r.status, r.body) for r in got if isinstance(r, Response)] == [
        (200, b"hello world"),
        (200, b"until the end"),
        (404, b"not found"),
        (200, f"/k||127.0.0.1:{server.server_address[1]}".encode()),
    ]
    assert server.connections == 2  # the connection closed after /close was replaced once


def test_a_dropped_kept_alive_connection_is_retried_on_a_new_one(server: _Server) -> None:
    got = fetch_all(_base(server), [(f"/drop/{i}", {}) for i in range(4)], window=1, timeout_s=10)
    assert all(isinstance(r, Response) and r.status == 200 for r in got), got
    assert server.connections == 4  # each reuse found the connection closed: a new one each


def test_a_response_that_is_not_http_is_returned_as_its_error(server: _Server) -> None:
    got = fetch_all(_base(server), [("/garbage", {}), ("/k", {})], window=1, timeout_s=10)
    assert isinstance(got[0], ResponseError)
    assert isinstance(got[1], Response) and got[1].status == 200


def test_an_unreachable_origin_is_an_error_per_request() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    got = fetch_all(f"http://127.0.0.1:{port}", [("/a", {}), ("/b", {})], window=2, timeout_s=5)
    assert len(got) == 2 and all(isinstance(r, OSError) for r in got), got


def test_it_runs_inside_a_running_event_loop(server: _Server) -> None:
    """A notebook calls the library from inside its own loop: the fetch runs in a thread."""

    async def inside() -> list[Response | BaseException]:
        return fetch_all(_base(server), [("/k/1", {}), ("/k/2", {})], window=2, timeout_s=10)

    got = asyncio.run(inside())
    assert [r.status for r in got if isinstance(r, Response)] == [200, 200]


def test_the_small_read_window_is_four_times_max_requests_up_to_512() -> None:
    from ckpt_cli.core.storage import StorageOptions

    assert [StorageOptions(max_requests=n).metadata_requests for n in (1, 16, 64, 128, 129, 1000)] == [
        4, 64, 256, 512, 512, 512,
    ]  # fmt: skip
