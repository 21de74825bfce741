"""moto's S3 server, with ranged GETs that read only their range: ``python -m tests.support.moto_server``.

moto (5.x) answers ``GET`` with ``Range: bytes=A-B`` by reading the whole object and slicing it,
and keeps objects above ``MOTO_S3_DEFAULT_KEY_BUFFER_SIZE`` (5 MiB) in temporary files: a
TensorStore read of one 512 KiB chunk out of a 44 MiB OCDBT data file costs moto a 44 MiB read.
Real object stores serve a range at the cost of the range, and a benchmark that measures
bandwidth and scale-out must not measure moto instead. Here a plain ``bytes=A-B`` (or ``A-``)
range reads those bytes from moto's buffer; everything else (suffix and multi-part ranges,
invalid ranges, conditional requests) goes through moto's own code unchanged, and objects stay in
memory. Used by ``bench/``; the tests' in-process server (``remote_servers.S3Server``) does not
need it for its small objects.

    python -m tests.support.moto_server      # binds 127.0.0.1:0, prints "listening on http://..."

``spawn()`` starts it in a process of its own and returns the process and its endpoint.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import IO, Any

_SIMPLE_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")


class _Ranged:
    """Stands for a key's value in moto's range handling: its length, and slices read lazily."""

    def __init__(self, key: Any) -> None:
        self.key = key

    def __len__(self) -> int:
        return int(self.key.size)

    def __getitem__(self, sl: slice) -> bytes:
        start, stop, _ = sl.indices(len(self))
        with self.key.lock:
            buf = self.key._value_buffer
            buf.seek(start)
            return bytes(buf.read(max(0, stop - start)))

    def whole(self) -> bytes:
        return bytes(self.key.value)


class _RangedKey:
    """A moto key whose ``value`` is read lazily (attributes otherwise the key's own)."""

    def __init__(self, key: Any) -> None:
        object.__setattr__(self, "_key", key)

    def __getattr__(self, name: str) -> Any:
        if name == "value":
            return _Ranged(self._key)
        return getattr(self._key, name)


def patch() -> None:
    from moto.s3.responses import S3Response

    if getattr(S3Response, "_ckpt_ranged", False):
        return
    plain_get = S3Response.get_object
    plain_range = S3Response._handle_range_header

    def get_object(self: Any) -> Any:
        rng = self.headers.get("range") or ""
        if not _SIMPLE_RANGE.match(rng.strip()) or self._get_int_param("partNumber"):
            return plain_get(self)
        plain_key = self._get_key

        def lazy_key(*args: Any, **kwargs: Any) -> Any:
            key, not_modified = plain_key(*args, **kwargs)
            return _RangedKey(key), not_modified

        self._get_key = lazy_key
        try:
            return plain_get(self)
        finally:
            del self._get_key

    def handle_range(self: Any, request: Any, headers: Any, content: Any) -> Any:
        status, out_headers, body = plain_range(self, request, headers, content)
        if isinstance(body, _Ranged):  # moto decided to answer the whole object after all
            body = body.whole()
        return status, out_headers, body

    S3Response.get_object = get_object
    S3Response._handle_range_header = handle_range
    S3Response._ckpt_ranged = True


def main() -> None:
    os.environ.setdefault("MOTO_S3_DEFAULT_KEY_BUFFER_SIZE", str(8 << 30))
    patch()
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import ThreadedWSGIServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    app = DomainDispatcherApplication(create_backend_app)
    server = ThreadedWSGIServer("127.0.0.1", 0, app, handler=MotoRequestHandler)
    print(f"listening on http://127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever()


def spawn(log: IO[str] | None = None) -> tuple[subprocess.Popen[str], str]:
    """This server in a new process (its own session, so it can be stopped as a group):
    (the process, its endpoint) once it listens."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.moto_server"],
        cwd=Path(__file__).resolve().parents[2],
        stdout=subprocess.PIPE,
        stderr=log if log is not None else subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("listening on "):
        proc.kill()
        raise RuntimeError(f"tests.support.moto_server did not start: {line!r}")
    return proc, line.split()[-1]


if __name__ == "__main__":
    main()
