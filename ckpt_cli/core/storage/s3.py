"""``s3://``: TensorStore's ``s3`` driver for data, botocore for listings, small reads and
batched deletes.

Listing pages are ``ListObjectsV2`` (1,000 keys, sizes and times); small reads ``GetObject``
(ranged where asked); ``DeleteObjects`` removes up to 1,000 keys a request. Objects over
``PART_BYTES`` are multipart uploads; those a killed process left open are listed
(``ListMultipartUploads``) and aborted by ``storage/uploads.py``'s callers. botocore follows the
standard credential chain and the
``AWS_ENDPOINT_URL*`` settings of the AWS CLI; its connection pool holds ``max_requests``.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from ckpt_cli.core.storage.etags import s3_tag
from ckpt_cli.core.storage.objstore import ObjectInfo, ObjectStore, OpenUpload, Page
from ckpt_cli.core.storage.options import StorageOptions
from ckpt_cli.core.storage.redirects import install_redirect_guard
from ckpt_cli.core.storage.sigv4 import Credentials, Presigner, parse_list_page
from ckpt_cli.errors import StorageError, UnsupportedError

#: The key of the one URL botocore presigns for a store: it shows where keys of the bucket live.
_PROBE = "ckpt-address-probe"


def _utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


class S3Store(ObjectStore):
    scheme = "s3"
    hint = "check the URL, the endpoint (--s3-endpoint, CKPT_S3_ENDPOINT) and the credentials"
    delete_batch = 1000

    def __init__(self, bucket: str, options: StorageOptions) -> None:
        super().__init__(bucket, options)
        self._endpoint = options.s3_endpoint
        self.region = options.s3_region or "us-east-1"
        self._client: Any = None
        self._client_lock = threading.Lock()
        self._session: Any = None
        self._signer: Presigner | None = None
        #: Kept-alive connections of small reads (``read_object``) by (scheme, host:port).
        self._idle: dict[tuple[str, str], list[Any]] = {}

    @property
    def endpoint(self) -> str:
        return self._endpoint or "AWS S3"

    def kvstore_spec(self, prefix: str) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "driver": "s3",
            "bucket": self.bucket,
            "path": prefix,
            "s3_request_retries": self.options.retries(),
        }
        if self._endpoint:
            spec["endpoint"] = self._endpoint
            spec["aws_region"] = self.region
        elif self.options.s3_region:
            spec["aws_region"] = self.region
        spec["aws_credentials"] = {"type": self._credentials_type()}
        return spec

    def _credentials_type(self) -> str:
        kind = self.options.s3_credentials
        if kind != "auto":
            return kind
        # Keys in this process's environment: say so, which spares the default chain's noisy
        # probing of profile files that do not exist; otherwise the whole standard chain.
        if os.environ.get("AWS_ACCESS_KEY_ID") and os.environ.get("AWS_SECRET_ACCESS_KEY"):
            return "environment"
        return "default"

    def _s3(self) -> Any:
        with self._client_lock:  # not _lock, which small reads take while a client is built
            if self._client is None:
                try:
                    import botocore.session
                    from botocore import UNSIGNED
                    from botocore.config import Config
                except ImportError:  # pragma: no cover - a dependency
                    raise UnsupportedError(
                        "listing s3:// needs botocore", hint="pip install botocore"
                    ) from None
                anonymous = self.options.s3_credentials == "anonymous"
                session = self._session = botocore.session.get_session()
                # A listing page of 1,000 keys carries 1,000 ``LastModified`` times: botocore's
                # default parser (dateutil) spent more CPU on them than everything else in
                # `ckpt ls` of a bucket (35 % of 5.7 s for 1,000 steps).
                session.get_component("response_parser_factory").set_parser_defaults(
                    timestamp_parser=_parse_timestamp
                )
                self._client = session.create_client(
                    "s3",
                    endpoint_url=self._endpoint,
                    region_name=self.region,
                    config=Config(
                        connect_timeout=5,
                        read_timeout=self.options.list_timeout_s,
                        retries={"max_attempts": self.options.list_attempts, "mode": "standard"},
                        max_pool_connections=self.options.max_requests,
                        **({"signature_version": UNSIGNED} if anonymous else {}),
                    ),
                )
                install_redirect_guard(self._client, self.endpoint)
            return self._client

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
        args: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix}
        if limit is not None:
            args["MaxKeys"] = limit
        if delimiter:
            args["Delimiter"] = delimiter
        if token:
            args["ContinuationToken"] = token
        elif start:
            # Taken as it is: a shortened key ("…/231" for "…/231/") is read by SeaweedFS as
            # "after the directory 231", every key below it skipped (bulk.py: AFTER).
            args["StartAfter"] = start
        lean = self._lean_list(args)
        if lean is not None:
            return lean
        with self._lock:
            self.requests += 1
        page = self._s3().list_objects_v2(**args)
        return Page(
            tuple(
                ObjectInfo(
                    o["Key"], int(o["Size"]), o["LastModified"].timestamp(), s3_tag(o.get("ETag"))
                )
                for o in page.get("Contents", [])
            ),
            tuple(p["Prefix"] for p in page.get("CommonPrefixes", [])),
            page.get("NextContinuationToken") if page.get("IsTruncated") else None,
        )

    def read_object(
        self, key: str, start: int | None = None, end: int | None = None
    ) -> bytes | None:
        """A GET of a URL botocore presigns (its endpoint rules and credentials: 0.15 ms) sent
        on a kept-alive ``http.client`` connection: about 0.5 ms of CPU a small read here,
        against 1.8 ms for botocore's ``get_object`` (parameter validation, event hooks,
        response parsing), which for the 2,000 small files of ``ls`` of 1,000 steps cost more
        than everything else."""
        headers = {} if start is None else {"Range": f"bytes={start}-{(end or start + 1) - 1}"}
        if self._proxied():
            return self._get_object(key, headers)
        return self._get(self._url(key, {}), headers, key)

    def read_each(
        self, reads: Sequence[tuple[str, int | None, int | None]]
    ) -> Iterator[tuple[int, bytes | Exception | None]]:
        """Every read on one event loop (``httpmany.fetch_each``), ``metadata_requests`` in
        flight, each answer as it arrives: 0.4-0.5 ms of CPU a small read with a thread each, a
        fraction of it here. An answer that is not a plain 200/206/404 (and a read that
        failed) is read again by ``read_object`` after the others, with its retries and
        botocore's error handling."""
        if len(reads) < 2 or self._proxied():  # no read, no look at the environment
            yield from enumerate(self._read_threads(reads))
            return
        from ckpt_cli.core.storage.httpmany import Response, fetch_each

        urls = [self._url(key, {}) for key, _, _ in reads]
        assert self._signer is not None  # made by the first _url
        origin = self._signer.origin
        requests = [
            (u[len(origin) :], {} if s is None else {"Range": f"bytes={s}-{(e or s + 1) - 1}"})
            for u, (_, s, e) in zip(urls, reads, strict=True)
        ]
        with self._lock:
            self.requests += len(reads)
        again: list[int] = []
        for i, answer in fetch_each(
            origin,
            requests,
            window=self.options.metadata_requests,
            timeout_s=self.options.list_timeout_s,
            ssl_context=self._ssl_context() if origin.startswith("https") else None,
        ):
            if isinstance(answer, Response) and answer.status in (200, 206):
                yield i, answer.body
            elif isinstance(answer, Response) and answer.status == 404:
                yield i, None
            else:
                again.append(i)
        if again:
            again.sort()
            yield from zip(again, self._read_threads([reads[i] for i in again]), strict=True)

    def _ssl_context(self) -> Any:
        import ssl

        # The CA bundle botocore would use (AWS_CA_BUNDLE), else the system's.
        return ssl.create_default_context(cafile=os.environ.get("AWS_CA_BUNDLE") or None)

    def _environment_credentials(self) -> Credentials | None:
        """The keys of this process's environment, where botocore's chain would take them
        (it looks there first): AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and the session token
        (AWS_SESSION_TOKEN, or the older AWS_SECURITY_TOKEN)."""
        if self.options.s3_credentials not in ("auto", "environment"):
            return None
        access = os.environ.get("AWS_ACCESS_KEY_ID")
        secret = os.environ.get("AWS_SECRET_ACCESS_KEY")
        if not access or not secret:
            return None
        token = os.environ.get("AWS_SESSION_TOKEN") or os.environ.get("AWS_SECURITY_TOKEN")
        return Credentials(access, secret, token or None)

    def _lean_list(self, args: dict[str, Any]) -> Page | None:
        """One listing page by a presigned GET parsed with ``xml.etree`` (``sigv4.py``: 64 ms
        of botocore's CPU a page of 1,000 keys, a few here). None when anything is not a plain
        200 with a ``ListObjectsV2`` body: the caller asks botocore, whose errors, redirects and
        retries then apply as they always did."""
        if self._proxied():
            return None
        query = {"list-type": "2", "prefix": args["Prefix"], "encoding-type": "url"}
        for name, arg in (
            ("max-keys", "MaxKeys"),
            ("delimiter", "Delimiter"),
            ("continuation-token", "ContinuationToken"),
            ("start-after", "StartAfter"),
        ):
            if arg in args:
                query[name] = str(args[arg])
        import http.client

        try:
            status, body = self._fetch(self._url("", query), {})
            answer = parse_list_page(body) if status == 200 else None
        except (OSError, http.client.HTTPException, StorageError, ValueError):
            answer = None
        if answer is None:
            return None
        return Page(
            tuple(
                ObjectInfo(
                    o.key, o.size, _parse_timestamp(o.last_modified).timestamp(), s3_tag(o.etag)
                )
                for o in answer.objects
            ),
            answer.prefixes,
            answer.token,
        )

    def _url(self, key: str, query: dict[str, str]) -> str:
        """A presigned GET of ``key`` in the bucket (``sigv4.py``)."""
        if self._signer is None and self._endpoint and self._environment_credentials():
            # An S3-compatible server named by URL: botocore addresses it path-style
            # (``endpoint/bucket/key``, checked against botocore by the tests); with the keys in
            # the environment, the lean path needs nothing of botocore (0.2 s of CPU to import
            # and build a client).
            self._signer = Presigner(f"{self._endpoint}/{self.bucket}/{{key}}", self.region)
        if self._signer is None:
            client = self._s3()
            # botocore's endpoint rules say where the bucket's objects live (path or
            # virtual-hosted style, the region's host): one URL of its own shows it.
            probe = client.generate_presigned_url(
                "get_object", Params={"Bucket": self.bucket, "Key": _PROBE}, ExpiresIn=60
            )
            base = probe.split("?", 1)[0]
            if not base.endswith("/" + _PROBE):  # pragma: no cover - botocore's addressing
                raise StorageError(f"cannot tell where {self.bucket} lives at {self.endpoint}")
            self._signer = Presigner(base[: -len(_PROBE)] + "{key}", self.region)
        return self._signer.url(key, query, self._credentials(), _utcnow())

    def _credentials(self) -> Credentials | None:
        """The credentials botocore's chain found (refreshed when they expire), None when
        anonymous."""
        if self.options.s3_credentials == "anonymous":
            return None
        found_here = self._environment_credentials()
        if found_here is not None:
            return found_here
        self._s3()
        found = self._session.get_credentials() if self._session is not None else None
        if found is None:
            raise StorageError(
                f"no AWS credentials found for {self.endpoint}",
                hint="set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or a profile, "
                "or --s3-credentials anonymous for a public bucket",
            )
        frozen = found.get_frozen_credentials()
        return Credentials(frozen.access_key, frozen.secret_key, frozen.token)

    def _proxied(self) -> bool:
        """An HTTP(S) proxy is configured (``HTTPS_PROXY``...): botocore knows how to use it.
        Asked at each read (a store outlives one command in a library user's process)."""
        import urllib.request

        return any(k in ("http", "https") for k in urllib.request.getproxies())

    def _get_object(self, key: str, headers: dict[str, str]) -> bytes | None:
        from botocore.exceptions import ClientError

        with self._lock:
            self.requests += 1
        args: dict[str, Any] = {"Bucket": self.bucket, "Key": key}
        if "Range" in headers:
            args["Range"] = headers["Range"]
        try:
            out = self._s3().get_object(**args)
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                return None
            raise
        with contextlib.closing(out["Body"]) as body:
            return bytes(body.read())

    def _get(self, url: str, headers: dict[str, str], key: str) -> bytes | None:
        """A small read: the body of a 200/206, None for 404. Anything else the lean path does
        not interpret goes to botocore's ``get_object`` (its errors and redirect rules: a bucket
        in another region answers 301/400 naming the right one; a 403 is checked there too, so
        a refusal of this path's URL is never reported as the credentials' fault)."""
        status, body = self._fetch(url, headers)
        if status in (200, 206):
            return body
        if status == 404:
            return None
        if status == 403 or 300 <= status < 400 or status == 400:
            return self._get_object(key, headers)
        raise StorageError(f"HTTP {status} from {self.endpoint} reading {key}")

    def _fetch(self, url: str, headers: dict[str, str]) -> tuple[int, bytes]:
        """GET on a kept-alive connection with bounded retries (5xx, 429, connection errors:
        ``list_attempts``, 0.25 s doubling): the status and body of the first answer that is
        not worth retrying; the last error when every attempt failed."""
        import http.client
        import time
        import urllib.parse

        parts = urllib.parse.urlsplit(url)
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        origin = (parts.scheme, parts.netloc)
        delay = 0.25
        last: BaseException | None = None
        for attempt in range(self.options.list_attempts):
            with self._lock:
                self.requests += 1
            conn = None
            try:
                conn = self._checkout(origin)
                conn.request("GET", target, headers=headers)
                r = conn.getresponse()
                body, status = r.read(), r.status
            except (OSError, http.client.HTTPException) as e:
                if conn is not None:
                    conn.close()
                last = e
            else:
                self._checkin(origin, conn)
                if status < 500 and status != 429:
                    return status, bytes(body)
                last = StorageError(f"HTTP {status} from {self.endpoint}")
            if attempt + 1 < self.options.list_attempts:
                time.sleep(delay)
                delay *= 2
        assert last is not None
        raise last

    def _checkout(self, origin: tuple[str, str]) -> Any:
        """An idle kept-alive connection to ``origin`` (scheme, host:port), or a new one (5 s to
        connect, then ``list_timeout_s`` per read)."""
        import http.client

        with self._lock:
            idle = self._idle.get(origin)
            if idle:
                return idle.pop()
        if origin[0] == "https":
            context = self._ssl_context()
            conn: Any = http.client.HTTPSConnection(origin[1], timeout=5, context=context)
        else:
            conn = http.client.HTTPConnection(origin[1], timeout=5)
        conn.connect()
        conn.sock.settimeout(self.options.list_timeout_s)
        return conn

    def _checkin(self, origin: tuple[str, str], conn: Any) -> None:
        with self._lock:
            self._idle.setdefault(origin, []).append(conn)

    def upload(self, key: str, parts: Iterable[bytes], size: int) -> None:
        client = self._s3()
        upload_id = client.create_multipart_upload(Bucket=self.bucket, Key=key)["UploadId"]
        done: list[dict[str, Any]] = []
        sent = 0
        try:
            for number, body in enumerate(parts, 1):
                got = client.upload_part(
                    Bucket=self.bucket, Key=key, PartNumber=number, UploadId=upload_id, Body=body
                )
                done.append({"ETag": got["ETag"], "PartNumber": number})
                sent += len(body)
            if sent != size:
                raise StorageError(f"{sent} bytes to upload, not {size}")
            client.complete_multipart_upload(
                Bucket=self.bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": done}
            )
        except BaseException:
            with contextlib.suppress(Exception):
                client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)
            raise

    #: Open uploads a ``ListMultipartUploads`` page holds (the most S3 returns).
    uploads_page = 1000

    def list_uploads(self, prefix: str) -> list[OpenUpload]:
        args: dict[str, Any] = {
            "Bucket": self.bucket, "Prefix": prefix, "MaxUploads": self.uploads_page
        }  # fmt: skip
        out: list[OpenUpload] = []
        while True:
            with self._lock:
                self.requests += 1
            page = self._s3().list_multipart_uploads(**args)
            got = [
                OpenUpload(u["Key"], u["UploadId"], u["Initiated"].timestamp())
                for u in page.get("Uploads", [])
            ]
            out += got
            if not page.get("IsTruncated") or not got:
                return out
            # S3 pages by key then upload id (both markers); SeaweedFS by upload id alone: its
            # truncated pages carry no NextKeyMarker, and a KeyMarker would end its listing.
            marker = {
                "KeyMarker": page.get("NextKeyMarker"),
                "UploadIdMarker": page.get("NextUploadIdMarker") or got[-1].upload_id,
            }
            if marker["KeyMarker"] is None:
                del marker["KeyMarker"]
            if all(args.get(k) == v for k, v in marker.items()):
                return out  # a server that does not move on: what it gave is all there is
            args.update(marker)

    def upload_bytes(self, upload: OpenUpload) -> int:
        args: dict[str, Any] = {
            "Bucket": self.bucket, "Key": upload.key, "UploadId": upload.upload_id
        }  # fmt: skip
        total = 0
        while True:
            page = self._s3().list_parts(**args)
            total += sum(int(p["Size"]) for p in page.get("Parts", []))
            if not page.get("IsTruncated") or not page.get("NextPartNumberMarker"):
                return total
            args["PartNumberMarker"] = page["NextPartNumberMarker"]

    def abort_upload(self, upload: OpenUpload) -> None:
        try:
            self._s3().abort_multipart_upload(
                Bucket=self.bucket, Key=upload.key, UploadId=upload.upload_id
            )
        except Exception as e:
            if "NoSuchUpload" not in str(e):  # completed or aborted meanwhile
                raise

    def delete_keys(self, keys: Sequence[str]) -> dict[str, str]:
        with self._lock:
            self.requests += 1
        if len(keys) == 1:
            # One key: a plain DeleteObject (same one request; an absent key is no error).
            self._s3().delete_object(Bucket=self.bucket, Key=keys[0])
            return {}
        out = self._s3().delete_objects(
            Bucket=self.bucket, Delete={"Objects": [{"Key": k} for k in keys], "Quiet": True}
        )
        return {
            str(e["Key"]): f"{e.get('Code', 'error')}: {e.get('Message', '')}".strip()
            for e in out.get("Errors", [])
            if e.get("Code") != "NoSuchKey"
        }


def _parse_timestamp(value: str) -> Any:
    """An S3 time as a timezone-aware datetime: ISO 8601 (listings: ``2026-12-01T15:14:46.000Z``)
    by ``datetime.fromisoformat``; anything else (HTTP dates in headers) by botocore's parser."""
    try:
        parsed = datetime.datetime.fromisoformat(value)
    except (TypeError, ValueError):
        parsed = None
    if parsed is not None and parsed.tzinfo is not None:
        return parsed
    from botocore.utils import parse_timestamp

    return parse_timestamp(value)
