"""An HTTP server on 127.0.0.1 that answers every request with one status and nothing more: a
bare ``301 Moved Permanently`` with no ``Location`` and no ``x-amz-bucket-region`` (a web
server or proxy where an S3 endpoint was expected), or with only the headers a test gives."""

from __future__ import annotations

import contextlib
import http.server
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field


@dataclass
class BareStatusServer:
    endpoint: str
    #: (method, path) of every request answered, in order.
    requests: list[tuple[str, str]] = field(default_factory=list)


@contextlib.contextmanager
def bare_status_server(
    status: int = 301, headers: dict[str, str] | None = None
) -> Iterator[BareStatusServer]:
    """Serve ``status`` (with ``headers`` only, and an empty body) to every request."""
    server_state = BareStatusServer("")

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _answer(self) -> None:
            server_state.requests.append((self.command, self.path))
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            self.send_response_only(status)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _answer

        def log_message(self, format: str, *args: object) -> None:
            pass  # the CLI tests read ckpt's stderr, not the server's

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    server_state.endpoint = f"http://127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield server_state
    finally:
        httpd.shutdown()
        httpd.server_close()
