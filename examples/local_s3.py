"""A throwaway S3-compatible server for the demo: moto's, on 127.0.0.1, with one bucket.

    python examples/local_s3.py start PORT BUCKET PIDFILE   # returns once the bucket exists
    python examples/local_s3.py stop PIDFILE

Credentials are anything (moto accepts them all); point ckpt at it with
``--s3-endpoint http://127.0.0.1:PORT`` or ``CKPT_S3_ENDPOINT``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def start(port: int, bucket: str, pidfile: Path) -> None:
    import botocore.session

    server = Path(sys.executable).with_name("moto_server")
    log = open(pidfile.with_suffix(".log"), "w")  # noqa: SIM115 - the server keeps it open
    proc = subprocess.Popen(
        [str(server), "-H", "127.0.0.1", "-p", str(port)],
        stdout=log,
        stderr=log,
        start_new_session=True,
    )
    pidfile.write_text(str(proc.pid))
    client = botocore.session.get_session().create_client(
        "s3",
        endpoint_url=f"http://127.0.0.1:{port}",
        region_name="us-east-1",
        aws_access_key_id="demo",
        aws_secret_access_key="demo",
    )
    for _ in range(100):
        try:
            client.create_bucket(Bucket=bucket)
            print(f"S3 server on http://127.0.0.1:{port} (pid {proc.pid}), bucket {bucket}")
            return
        except Exception:
            if proc.poll() is not None:
                sys.exit(f"moto_server exited; see {pidfile.with_suffix('.log')}")
            time.sleep(0.1)
    sys.exit("moto_server did not answer within 10 s")


def stop(pidfile: Path) -> None:
    if pidfile.exists():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pidfile.read_text()), signal.SIGTERM)
        pidfile.unlink()


if __name__ == "__main__":
    if sys.argv[1:2] == ["start"]:
        start(int(sys.argv[2]), sys.argv[3], Path(sys.argv[4]))
    elif sys.argv[1:2] == ["stop"]:
        stop(Path(sys.argv[2]))
    else:
        sys.exit(__doc__)
