"""Real storage servers on 127.0.0.1 for the remote tests and the bench.

``S3Server`` serves moto's S3 (the ``moto[server]`` package) from a thread of this process,
counting requests by method; ``stop()`` also cuts the keep-alive connections TensorStore holds,
so a stopped server is dead to clients at once (connection refused), and ``start()`` again
brings it back on the same port with the same objects (moto keeps them in this process).
``GcsServer`` is ``gcp-storage-emulator``, reached by TensorStore through
``TENSORSTORE_GCS_HTTP_URL``.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import socket
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

BUCKET = "ckpt-test"
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_REGION": "us-east-1",
}


@contextlib.contextmanager
def dead_endpoint() -> Iterator[str]:
    """``http://127.0.0.1:PORT`` where nothing answers: a port held bound but not listening
    (connections are refused), so no other process can take it while a test uses it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


class S3Server:
    """moto's S3 on 127.0.0.1, with request counts and a hard stop. The first start binds port 0
    (the system picks a free one); a restart takes the same port again."""

    def __init__(self, port: int = 0) -> None:
        self.port = port
        self.counts: collections.Counter[str] = collections.Counter()
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        #: Requests inside the app now (counted before ``before_request``, until moto returns).
        self.in_flight = 0
        #: Called with (method, path) before each request is served (fault injection).
        self.before_request: Callable[[str, str], None] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> S3Server:
        from moto.moto_server.werkzeug_app import (
            DomainDispatcherApplication,
            MotoRequestHandler,
            create_backend_app,
        )
        from werkzeug.serving import ThreadedWSGIServer

        moto_app = DomainDispatcherApplication(create_backend_app)
        outer = self

        def app(environ: dict[str, Any], start_response: Any) -> Any:
            method, path = environ["REQUEST_METHOD"], environ.get("PATH_INFO", "")
            query = environ.get("QUERY_STRING", "")
            kind = "LIST" if method == "GET" and "list-type=2" in query else method
            with outer._lock:
                outer.counts[kind] += 1
                outer.in_flight += 1
            try:
                if outer.before_request is not None:
                    outer.before_request(kind, path)
                return moto_app(environ, start_response)
            finally:
                with outer._lock:
                    outer.in_flight -= 1
                    outer._idle.notify_all()

        class Server(ThreadedWSGIServer):  # type: ignore[misc]
            def get_request(self) -> Any:
                conn, addr = super().get_request()
                with outer._lock:
                    outer._conns.add(conn)
                return conn, addr

            def handle_error(self, request: Any, client_address: Any) -> None:
                # Requests cut off by stop() raise in the handler thread; socketserver would
                # print that to sys.stderr, which the CLI tests capture as ckpt's own output.
                pass

        # werkzeug logs failed requests to stderr by itself: keep the server's noise out of
        # the CLI output the tests read.
        logging.getLogger("werkzeug").setLevel(logging.CRITICAL)
        self._server = Server("127.0.0.1", self.port, app, handler=MotoRequestHandler)
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Close the listening socket and every open connection: clients see it dead at once."""
        if self._server is None:
            return
        server, self._server = self._server, None
        threading.Thread(target=server.shutdown, daemon=True).start()
        server.socket.close()
        with self._lock:
            conns, self._conns = self._conns, set()
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
            c.close()

    def wait_idle(self, timeout: float = 30.0) -> None:
        """Block until no request is inside the app (a killed client's last requests stored)."""
        with self._idle:
            if not self._idle.wait_for(lambda: self.in_flight == 0, timeout):
                raise TimeoutError(f"{self.in_flight} requests still in the S3 server")

    def put_objects(self, objects: Iterable[tuple[str, bytes]]) -> int:
        """Store objects in this (in-process) server's bucket without HTTP: test set-up of
        thousands of objects at 0.4 ms each instead of 9 ms through botocore and the server's
        request handling. What the commands under test read is then served over HTTP as usual."""
        from moto.core import DEFAULT_ACCOUNT_ID
        from moto.s3.models import s3_backends

        backend = s3_backends[DEFAULT_ACCOUNT_ID]["global"]
        n = 0
        for key, data in objects:
            backend.put_object(BUCKET, key, data)
            n += 1
        return n

    def restart(self) -> None:
        self.stop()
        self.start()

    def client(self) -> Any:
        import botocore.session

        return botocore.session.get_session().create_client(
            "s3",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )

    def reset_counts(self) -> None:
        with self._lock:
            self.counts.clear()


def _add_generation_header() -> None:
    """Real GCS sends ``x-goog-generation`` with every media download; gcp-storage-emulator
    (2026.7.19) does not, so TensorStore records generation 0 and its next conditional read
    fails ("Malformed StorageGeneration"). Add the header the way GCS does."""
    from gcp_storage_emulator.handlers import objects

    if getattr(objects.download, "_with_generation", False):
        return
    plain = objects.download

    def download(request: Any, response: Any, storage: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            obj = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
            response["x-goog-generation"] = str(obj["generation"])
            response["x-goog-metageneration"] = str(obj.get("metageneration", "1"))
        except Exception:
            pass  # not found: the handler answers 404
        return plain(request, response, storage, *args, **kwargs)

    download._with_generation = True  # type: ignore[attr-defined]
    objects.download = download


class GcsServer:
    """gcp-storage-emulator on 127.0.0.1 (in memory), one bucket."""

    def __init__(self) -> None:
        from gcp_storage_emulator.server import create_server

        _add_generation_header()

        self.port = 0
        self._server = create_server("127.0.0.1", 0, in_memory=True, default_bucket=BUCKET)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> GcsServer:
        """Bind port 0 and read back the port the system gave (the emulator keeps its HTTP
        server on its API thread: no public accessor)."""
        self._server.start()
        self.port = int(self._server._api._httpd.server_address[1])
        return self

    def stop(self) -> None:
        self._server.stop()


def s3_environment(endpoint: str) -> dict[str, str]:
    return {**CREDENTIALS, "CKPT_S3_ENDPOINT": endpoint}


def gcs_environment(endpoint: str) -> dict[str, str]:
    return {"STORAGE_EMULATOR_HOST": endpoint}


def local_files(src: Path) -> Iterable[tuple[str, Path]]:
    for dirpath, _, files in os.walk(src):
        for f in files:
            p = Path(dirpath) / f
            yield str(p.relative_to(src)), p


def upload(
    client: Any, src: Path, prefix: str, *, skip: Callable[[str], bool] | None = None
) -> int:
    """Copy a local directory into the bucket as plain objects (as `aws s3 cp --recursive`)."""
    n = 0
    for rel, p in local_files(src):
        if skip is not None and skip(rel):
            continue
        client.put_object(Bucket=BUCKET, Key=f"{prefix.rstrip('/')}/{rel}", Body=p.read_bytes())
        n += 1
    return n


def keys(client: Any, prefix: str) -> list[str]:
    out: list[str] = []
    token = None
    while True:
        args: dict[str, Any] = {"Bucket": BUCKET, "Prefix": prefix}
        if token:
            args["ContinuationToken"] = token
        page = client.list_objects_v2(**args)
        out += [o["Key"] for o in page.get("Contents", [])]
        token = page.get("NextContinuationToken")
        if not token:
            return out


def download(client: Any, prefix: str, dst: Path) -> Path:
    """Copy every object below ``prefix`` into ``dst`` (to restore it with Orbax locally)."""
    prefix = prefix.rstrip("/") + "/"
    for key in keys(client, prefix):
        target = dst / key[len(prefix) :]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(client.get_object(Bucket=BUCKET, Key=key)["Body"].read())
    return dst
