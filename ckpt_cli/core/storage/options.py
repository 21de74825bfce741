"""``StorageOptions``: where the object stores are and how ckpt talks to them, as data.

One frozen, picklable object: the endpoints (``--s3-endpoint``), where credentials come from,
the region, and the request limits (retries, listing attempts and timeout, ``--max-requests``:
how many requests one process keeps in flight). Every ``Location``
opened from it keeps it, and every unit of scaled-out work carries it to its worker process or
Dask worker, so workers reach the same endpoint as the process that planned the work, whatever
their environment says. Credentials themselves never travel: ``s3_credentials`` only names
where each process finds them.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

#: Requests one process keeps in flight by default on object stores: a request costs 20-50 ms
#: of latency there, so throughput is requests in flight / latency (TensorStore's own default
#: is 32).
DEFAULT_MAX_REQUESTS = 64
#: Connections (sockets) the small-file reads of one S3 store may hold open at once.
MAX_METADATA_REQUESTS = 512

#: ``auto``: the environment's keys when AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY are set in
#: the process that opens the store, else the standard chain (profiles, instance metadata);
#: ``environment`` or ``default`` force one of the two; ``anonymous`` signs nothing.
S3Credentials = Literal["auto", "environment", "default", "anonymous"]


@dataclass(frozen=True)
class StorageOptions:
    """How to reach ``s3://`` and ``gs://`` locations (local paths need none of it)."""

    s3_endpoint: str | None = None  # None: AWS itself
    s3_region: str | None = None  # None: us-east-1, not written into specs for AWS
    s3_credentials: S3Credentials = "auto"
    gcs_endpoint: str | None = None  # None: storage.googleapis.com
    #: The GCS endpoint is an emulator (STORAGE_EMULATOR_HOST): it takes any bearer token.
    gcs_emulator: bool = False
    #: TensorStore's retries of a failed request (both drivers): bounded, so a dead endpoint
    #: fails in seconds (0.25 s doubling to 2 s by default).
    request_retries: int = 4
    retry_initial_delay_s: float = 0.25
    retry_max_delay_s: float = 2.0
    #: Attempts and per-request timeout of a listing request (botocore, GCS JSON API).
    list_attempts: int = 4
    list_timeout_s: float = 20.0
    #: Requests in flight at once in one process (``--max-requests``, ``CKPT_MAX_REQUESTS``):
    #: TensorStore's reads and writes, listing pages, batched deletes and small reads alike.
    max_requests: int = DEFAULT_MAX_REQUESTS

    @classmethod
    def from_environment(
        cls,
        *,
        s3_endpoint: str | None = None,
        max_requests: int | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> StorageOptions:
        """The options of this process: ``s3_endpoint`` (``--s3-endpoint``) else
        ``CKPT_S3_ENDPOINT``, ``AWS_ENDPOINT_URL_S3``, ``AWS_ENDPOINT_URL``; the region from
        ``AWS_REGION`` or ``AWS_DEFAULT_REGION``; the GCS endpoint from
        ``TENSORSTORE_GCS_HTTP_URL`` (TensorStore's own), else ``STORAGE_EMULATOR_HOST``;
        ``max_requests`` (``--max-requests``) else ``CKPT_MAX_REQUESTS``, else 64; the
        attempts of a failed request and of a listing from ``CKPT_REQUEST_ATTEMPTS`` (1-10, else
        4: a CI job that would rather fail at once on a dead endpoint sets 1)."""
        env = os.environ if environ is None else environ
        endpoint = next(
            (
                v
                for v in (
                    s3_endpoint,
                    env.get("CKPT_S3_ENDPOINT"),
                    env.get("AWS_ENDPOINT_URL_S3"),
                    env.get("AWS_ENDPOINT_URL"),
                )
                if v
            ),
            None,
        )
        gcs = env.get("TENSORSTORE_GCS_HTTP_URL")
        emulator = False
        if not gcs and env.get("STORAGE_EMULATOR_HOST"):
            gcs = env["STORAGE_EMULATOR_HOST"]
            gcs = gcs if "://" in gcs else "http://" + gcs
            emulator = True
        if max_requests is None:
            raw = env.get("CKPT_MAX_REQUESTS", "")
            max_requests = int(raw) if raw.isdigit() and int(raw) > 0 else DEFAULT_MAX_REQUESTS
        raw = env.get("CKPT_REQUEST_ATTEMPTS", "")
        attempts = int(raw) if raw.isdigit() and 1 <= int(raw) <= 10 else 4
        return cls(
            request_retries=attempts,
            list_attempts=attempts,
            max_requests=max(1, max_requests),
            s3_endpoint=endpoint.rstrip("/") if endpoint else None,
            s3_region=env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or None,
            gcs_endpoint=gcs.rstrip("/") if gcs else None,
            gcs_emulator=emulator,
        )

    @property
    def metadata_requests(self) -> int:
        """Small-file reads (metadata, metrics: kilobytes each) in flight at once on S3: four
        times ``max_requests``, at most ``MAX_METADATA_REQUESTS``. They cost one event loop and
        no threads (``httpmany.py``), and a bucket answers each in one round trip: ``ls`` of
        1,000 steps makes 2,000 of them, and behind 25 ms a window 64 deep waits 0.78 s, 128
        deep 0.39 s, 256 deep 0.2 s."""
        return min(4 * self.max_requests, MAX_METADATA_REQUESTS)

    def retries(self) -> dict[str, Any]:
        """TensorStore's ``*_request_retries`` spec for both drivers."""
        return {
            "max_retries": self.request_retries,
            "initial_delay": f"{self.retry_initial_delay_s:g}s",
            "max_delay": f"{self.retry_max_delay_s:g}s",
        }


def apply_request_limit(options: StorageOptions) -> bool:
    """Make ``options.max_requests`` TensorStore's S3 and GCS request concurrency in this
    process. TensorStore reads ``TENSORSTORE_{S3,GCS}_REQUEST_CONCURRENCY`` once, when it is
    imported: set before that (the CLI does it first thing; a worker process before its first
    open) they take effect; False when TensorStore was already imported with other values.
    (A ``*_request_concurrency`` in each spec would make a resource per open and break the
    sharing of one OCDBT writer by the arrays of an item.)"""
    value = str(options.max_requests)
    names = ("TENSORSTORE_S3_REQUEST_CONCURRENCY", "TENSORSTORE_GCS_REQUEST_CONCURRENCY")
    if all(os.environ.get(n) == value for n in names):
        return True
    if "tensorstore" in sys.modules:
        return False
    for n in names:
        os.environ[n] = value
    return True
