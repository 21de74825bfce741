"""Object stores (``s3://``, ``gs://``): endpoints, credentials, listing with sizes, TensorStore specs.

Array data and writes go through TensorStore's ``s3`` and ``gcs`` kvstore drivers, the ones
Orbax uses, with their own credential chains (S3: environment, profile files, instance
metadata; GCS: application default credentials). Small reads (metadata files, zarr headers,
OCDBT nodes: ``read_object``) go through the same HTTP client as listings, so that ``ls`` and
``inspect`` of a bucket never import TensorStore. Listing goes there too, because
``KvStore.list`` returns keys without sizes or times (tensorstore 0.1.86), and ``ls`` (sizes),
``verify`` (a data file shorter than the references into it, recorded file sizes) and ``prune``
(freed bytes, the age of unfinished saves) need both. The listing APIs return them with every
key, 1,000 keys a request: S3 ``ListObjectsV2`` through botocore (the same standard credential
chain and ``AWS_ENDPOINT_URL*`` settings as the AWS CLI) and the GCS JSON API ``objects.list``
(a bearer token from google-auth's application default credentials; none for an emulator).

Endpoints, credential sources and these limits come from ``StorageOptions`` (``options.py``).
Faults: TensorStore retries transient errors itself (``*_request_retries``: 4 attempts,
0.25 s doubling to 2 s), botocore in its ``standard`` mode (4 attempts), the GCS lister likewise;
a dead endpoint therefore fails within seconds, as one ``StorageError`` naming the URL, the
endpoint and what failed. Request concurrency is ``StorageOptions.max_requests`` (64 unless
``--max-requests``), set as TensorStore's process-wide default (``options.apply_request_limit``):
a ``*_request_concurrency`` written into the spec makes a new resource per open, so two arrays
of one item no longer share their OCDBT writer and every commit races the other's manifest
(measured: 262 data files instead of 9, 117 failed PUTs).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ckpt_cli.core.storage.options import StorageOptions
from ckpt_cli.errors import CkptError, StorageError, UnreachableError

T = TypeVar("T")


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    mtime: float
    #: What the listing says of the bytes (``etags.py``): ``s3:<etag>``, ``md5:<hex>``, None.
    tag: str | None = None


@dataclass(frozen=True)
class Page:
    """One listing request's answer: objects (key order), child prefixes (with a delimiter),
    and the token of the next page (None: the listing ended)."""

    objects: tuple[ObjectInfo, ...]
    prefixes: tuple[str, ...] = field(default=())
    token: str | None = None


@dataclass(frozen=True)
class OpenUpload:
    """An upload begun and neither completed nor aborted (an S3 multipart upload): its parts
    are stored, and billed, until it is aborted; no listing of objects shows it."""

    key: str
    upload_id: str
    #: When the upload began, in seconds since the epoch, by the server's clock.
    initiated: float


class ObjectStore:
    """One bucket: its TensorStore kvstore spec and a lister that returns sizes and times."""

    scheme = ""

    def __init__(self, bucket: str, options: StorageOptions) -> None:
        self.bucket = bucket
        self.options = options
        self.requests = 0  # listing requests made (the bench reports them)
        self._lock = threading.Lock()

    @property
    def endpoint(self) -> str:
        raise NotImplementedError

    def kvstore_spec(self, prefix: str) -> dict[str, Any]:
        raise NotImplementedError

    #: Keys one batched delete request removes at most (S3 DeleteObjects, GCS JSON batch).
    delete_batch = 1

    def list_page(
        self,
        prefix: str,
        token: str | None = None,
        *,
        start: str | None = None,
        end: str | None = None,
        delimiter: str | None = None,
        limit: int | None = None,
    ) -> Page:
        """One listing request: keys below ``prefix``, after ``start`` (S3 ``StartAfter``; GCS
        ``startOffset``, which also returns a key equal to it) up to ``end`` (exclusive, where
        the store can stop there; callers check), ``limit`` keys at most."""
        raise NotImplementedError

    def list_objects(self, prefix: str, limit: int | None = None) -> Iterator[ObjectInfo]:
        """Every object whose key starts with ``prefix``, in key order, page after page."""
        token: str | None = None
        while True:
            page = self.list_page(prefix, token, limit=limit)
            yield from page.objects[:limit] if limit is not None else page.objects
            token = page.token
            if token is None or limit is not None:
                return

    def read_object(
        self, key: str, start: int | None = None, end: int | None = None
    ) -> bytes | None:
        """One GET of the object's bytes ``[start, end)`` (all of them without ``start``); None
        when the object does not exist. Small files (metadata) go this way, through the same
        HTTP client as the listings: no TensorStore (and no numpy) to import for them."""
        raise NotImplementedError

    def read_objects(
        self, reads: Sequence[tuple[str, int | None, int | None]]
    ) -> list[bytes | Exception | None]:
        """``read_object`` of every ``(key, start, end)``, ``max_requests`` in flight; each
        answer in the order asked, a failure as its exception."""
        out: list[bytes | Exception | None] = [None] * len(reads)
        for i, answer in self.read_each(reads):
            out[i] = answer
        return out

    def read_each(
        self, reads: Sequence[tuple[str, int | None, int | None]]
    ) -> Iterator[tuple[int, bytes | Exception | None]]:
        """``read_objects``, each answer ``(index, answer)`` as soon as it is final (S3: as it
        arrives), every index once; here all at once, in the order asked."""
        yield from enumerate(self._read_threads(reads))

    def _read_threads(
        self, reads: Sequence[tuple[str, int | None, int | None]]
    ) -> list[bytes | Exception | None]:
        """``read_object`` of each on a thread pool, ``max_requests`` in flight."""
        out: list[bytes | Exception | None] = [None] * len(reads)

        def one(i: int) -> None:
            try:
                out[i] = self.read_object(*reads[i])
            except Exception as e:
                out[i] = e

        concurrently(one, range(len(reads)), self.options.max_requests)
        return out

    def upload(self, key: str, parts: Iterable[bytes], size: int) -> None:
        """Put an object of ``size`` bytes from ``parts`` (each at least ``PART_BYTES`` but the
        last), one part at a time: S3 multipart, a GCS resumable upload. The object appears
        only when every part is in; a failure leaves nothing (the upload is aborted)."""
        raise NotImplementedError

    def list_uploads(self, prefix: str) -> list[OpenUpload]:
        """The open uploads whose key starts with ``prefix`` (S3 ``ListMultipartUploads``).
        None on GCS: a resumable upload session cannot be listed, holds no billed object and
        expires by itself a week after it began."""
        return []

    def upload_bytes(self, upload: OpenUpload) -> int:
        """The bytes an open upload holds (the sizes of its parts: S3 ``ListParts``)."""
        return 0

    def abort_upload(self, upload: OpenUpload) -> None:
        """Abort an open upload, dropping its parts (one already gone is no error)."""

    def delete_keys(self, keys: Sequence[str]) -> dict[str, str]:
        """Delete up to ``delete_batch`` keys in one request; what failed, by key (a key that
        was already gone is deleted)."""
        raise NotImplementedError

    def url(self, key: str) -> str:
        return f"{self.scheme}://{self.bucket}" + (f"/{key}" if key else "")

    def describe(self, e: BaseException) -> str:
        """One line for a failed request: what failed and where, without a traceback."""
        return describe_error(e, self.endpoint)

    #: What to check when a request fails: this store's own settings (a class attribute).
    hint = "check the URL and the credentials"

    def error(self, what: str, e: BaseException) -> StorageError:
        """``what`` failed because of ``e``: an ``UnreachableError`` when the endpoint is gone."""
        if isinstance(e, StorageError):
            return type(e)(f"{what}: {e.message}", hint=e.hint or self.hint)
        if isinstance(e, CkptError):
            return StorageError(f"{what}: {e.message}", hint=e.hint)
        cause = self.describe(e)
        cls = UnreachableError if cause.startswith(_UNREACHABLE) else StorageError
        return cls(f"{what}: {cause}", hint=self.hint)

    def identity(self) -> tuple[str, str, str]:
        return (self.scheme, self.bucket, self.endpoint)


#: Objects larger than this are uploaded in parts of this size (S3 wants >= 5 MiB but the last;
#: GCS multiples of 256 KiB): memory holds one part per file being written.
PART_BYTES = 8 << 20

_UNREACHABLE = ("connection refused at", "no answer from")


def describe_error(e: BaseException, endpoint: str) -> str:
    text = str(e)
    first = text.splitlines()[0] if text else type(e).__name__
    lowered = text.lower()
    tries = ""
    if "retry attempts failed" in lowered:
        tries = f" (after {first.split('All ', 1)[-1].split(' ', 1)[0]} attempts)"
    if (
        "could not connect" in lowered
        or "connection refused" in lowered
        or "curl_code='7'" in text
        or type(e).__name__ == "EndpointConnectionError"
    ):
        return f"connection refused at {endpoint}{tries}"
    if "timed out" in lowered or "curl_code='28'" in text or isinstance(e, TimeoutError):
        return f"no answer from {endpoint} in time{tries}"
    if "nosuchbucket" in lowered or "bucket does not exist" in lowered:
        return "the bucket does not exist"
    if any(
        s in lowered
        for s in ("accessdenied", "access denied", "permission_denied", "forbidden", "403")
    ):
        return f"access denied by {endpoint}: check the credentials"
    if type(e).__name__ in ("NoCredentialsError", "PartialCredentialsError"):
        return "no credentials found: set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or a profile"
    return first[:300]


def concurrently(fn: Callable[[T], None], items: Sequence[T], limit: int) -> None:
    """``fn`` over ``items``, up to ``limit`` at a time (inline for a single item)."""
    if len(items) <= 1:
        for item in items:
            fn(item)
        return
    with ThreadPoolExecutor(max(1, min(limit, len(items)))) as pool:
        for f in [pool.submit(fn, item) for item in items]:
            f.result()
