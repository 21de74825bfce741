"""``gs://``: TensorStore's ``gcs`` driver for data, the JSON API for listings and batched deletes.

``objects.list`` pages hold 1,000 keys with sizes and times (``startOffset``/``endOffset``
bound a page to a key range); the batch endpoint carries up to 100 calls a request. A bearer
token comes from google-auth's application default credentials (none for an emulator).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from ckpt_cli.core.storage.etags import gcs_tag
from ckpt_cli.core.storage.objstore import (
    _UNREACHABLE,
    ObjectInfo,
    ObjectStore,
    Page,
    describe_error,
)
from ckpt_cli.core.storage.options import StorageOptions
from ckpt_cli.errors import StorageError, UnreachableError, UnsupportedError


class GcsStore(ObjectStore):
    scheme = "gs"
    hint = (
        "check the URL and the credentials (gcloud auth application-default login, "
        "GOOGLE_APPLICATION_CREDENTIALS; STORAGE_EMULATOR_HOST for an emulator)"
    )
    delete_batch = 100

    def __init__(self, bucket: str, options: StorageOptions) -> None:
        super().__init__(bucket, options)
        self._endpoint = options.gcs_endpoint
        self._credentials: Any = None
        if self._endpoint and os.environ.get("TENSORSTORE_GCS_HTTP_URL") != self._endpoint:
            # TensorStore's gcs driver takes its endpoint from this variable only (a worker
            # process gets it here, from the options, whatever its environment said).
            os.environ["TENSORSTORE_GCS_HTTP_URL"] = self._endpoint
        if options.gcs_emulator:
            os.environ.setdefault("GOOGLE_AUTH_TOKEN_FOR_TESTING", "emulator")

    @property
    def endpoint(self) -> str:
        return self._endpoint or "https://storage.googleapis.com"

    def kvstore_spec(self, prefix: str) -> dict[str, Any]:
        return {
            "driver": "gcs",
            "bucket": self.bucket,
            "path": prefix,
            "gcs_request_retries": self.options.retries(),
        }

    def _token(self) -> str | None:
        if self._endpoint:
            return os.environ.get("GOOGLE_AUTH_TOKEN_FOR_TESTING")
        with self._lock:
            if self._credentials is None:
                try:
                    import google.auth
                    import google.auth.transport.requests
                except ImportError:
                    raise UnsupportedError(
                        "listing gs:// needs google-auth for application default credentials",
                        hint="pip install google-auth",
                    ) from None
                creds, _ = google.auth.default(
                    scopes=["https://www.googleapis.com/auth/devstorage.read_write"]
                )
                self._credentials = (creds, google.auth.transport.requests.Request())
            creds, request = self._credentials
            if not creds.valid:
                creds.refresh(request)
            return str(creds.token)

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
        import urllib.parse

        fields = "items(name,size,updated,md5Hash),nextPageToken" + (
            ",prefixes" if delimiter else ""
        )
        query = {"prefix": prefix, "fields": fields, "maxResults": str(limit or 1000)}
        if delimiter:
            query["delimiter"] = delimiter
        if start:
            query["startOffset"] = start
        if end:
            query["endOffset"] = end
        if token:
            query["pageToken"] = token
        page = json.loads(
            self._request(f"{self._bucket_url()}/o?" + urllib.parse.urlencode(query))[0]
        )
        items = sorted(page.get("items") or [], key=lambda i: str(i["name"]))
        return Page(
            tuple(
                ObjectInfo(
                    str(i["name"]),
                    int(i.get("size", 0)),
                    _rfc3339(i.get("updated")),
                    gcs_tag(i.get("md5Hash")),
                )
                for i in items
            ),
            tuple(sorted(str(p) for p in page.get("prefixes") or [])),
            page.get("nextPageToken") or None,
        )

    def _bucket_url(self) -> str:
        import urllib.parse

        return f"{self.endpoint}/storage/v1/b/{urllib.parse.quote(self.bucket, safe='')}"

    def read_object(
        self, key: str, start: int | None = None, end: int | None = None
    ) -> bytes | None:
        """The JSON API's media download (``alt=media``), ranged with a ``Range`` header."""
        import urllib.parse

        url = f"{self._bucket_url()}/o/{urllib.parse.quote(key, safe='')}?alt=media"
        headers = {} if start is None else {"Range": f"bytes={start}-{(end or start + 1) - 1}"}
        try:
            return self._request(url, headers=headers)[0]
        except _NotFound:
            return None

    def upload(self, key: str, parts: Iterable[bytes], size: int) -> None:
        """A resumable upload: a session, then each part as ``Content-Range: a-b/size``.

        A process killed mid-upload leaves its session open: GCS keeps no object for it and
        expires it a week after it began, so nothing is listed or aborted here (unlike S3's
        multipart uploads: ``list_uploads`` returns none for GCS)."""
        import urllib.error
        import urllib.parse
        import urllib.request

        start = (
            f"{self.endpoint}/upload/storage/v1/b/{urllib.parse.quote(self.bucket, safe='')}/o?"
            + urllib.parse.urlencode({"uploadType": "resumable", "name": key})
        )
        headers = {"Content-Type": "application/json", "X-Upload-Content-Length": str(size)}
        session = self._request(start, data=b"{}", headers=headers, want="location")[1]
        bearer = self._token()
        offset = 0
        for body in parts:
            end = offset + len(body)
            put = urllib.request.Request(session, data=body, method="PUT")
            put.add_header("Content-Range", f"bytes {offset}-{end - 1}/{size}")
            if bearer:
                put.add_header("Authorization", f"Bearer {bearer}")
            try:
                with urllib.request.urlopen(put, timeout=self.options.list_timeout_s) as r:
                    r.read()
            except urllib.error.HTTPError as e:
                if e.code != 308:  # "resume incomplete": the part is in, send the next
                    raise StorageError(
                        f"HTTP {e.code} from {self.endpoint} uploading {key}"
                    ) from None
            offset = end
        if offset != size:
            raise StorageError(f"{offset} bytes uploaded to {key}, not {size}")

    def delete_keys(self, keys: Sequence[str]) -> dict[str, str]:
        """One request to the JSON API's batch endpoint: a DELETE per key (404: already gone)."""
        import secrets
        import urllib.parse

        boundary = "ckpt" + secrets.token_hex(8)
        bucket = urllib.parse.quote(self.bucket, safe="")
        parts = [
            f"--{boundary}\r\nContent-Type: application/http\r\nContent-ID: <{i}>\r\n\r\n"
            f"DELETE /storage/v1/b/{bucket}/o/{urllib.parse.quote(k, safe='')} HTTP/1.1\r\n\r\n"
            for i, k in enumerate(keys)
        ]
        body = ("".join(parts) + f"--{boundary}--\r\n").encode()
        raw, content_type = self._request(
            f"{self.endpoint}/batch/storage/v1",
            data=body,
            headers={"Content-Type": f"multipart/mixed; boundary={boundary}"},
        )
        statuses = _batch_statuses(raw, content_type)
        if len(statuses) != len(keys):
            return {k: f"the batch answer holds {len(statuses)} answers" for k in keys}
        return {
            k: f"HTTP {s}" for k, s in zip(keys, statuses, strict=True) if s >= 300 and s != 404
        }

    def _request(
        self,
        url: str,
        *,
        data: bytes | None = None,
        headers: dict[str, str] | None = None,
        want: str = "content-type",
    ) -> tuple[bytes, str]:
        """GET (or POST ``data``) with bounded retries; the body and the header ``want``."""
        import urllib.error
        import urllib.request

        headers = dict(headers or {})
        bearer = self._token()
        if bearer:
            headers["Authorization"] = f"Bearer {bearer}"
        delay = 0.25
        attempts = self.options.list_attempts
        for attempt in range(attempts):
            with self._lock:
                self.requests += 1
            try:
                with urllib.request.urlopen(
                    urllib.request.Request(url, data=data, headers=headers),
                    timeout=self.options.list_timeout_s,
                ) as r:
                    return r.read(), r.headers.get(want, "")
            except urllib.error.HTTPError as e:
                if e.code == 404:
                    raise _NotFound("the bucket does not exist") from None
                if e.code in (401, 403):
                    raise StorageError(
                        f"access denied by {self.endpoint}: check the credentials"
                    ) from None
                if e.code < 500 and e.code != 429:
                    raise StorageError(f"HTTP {e.code} from {self.endpoint}") from None
                last: BaseException = e
            except (urllib.error.URLError, OSError) as e:
                last = e
            if attempt + 1 < attempts:
                time.sleep(delay)
                delay *= 2
        reason = getattr(last, "reason", last)
        cause = (
            f"connection refused at {self.endpoint}"
            if isinstance(reason, ConnectionRefusedError)
            else describe_error(last, self.endpoint)
        )
        cls = UnreachableError if cause.startswith(_UNREACHABLE) else StorageError
        raise cls(f"{cause} (after {attempts} attempts)")


class _NotFound(StorageError):
    """HTTP 404: no such bucket (a listing), no such object (a read)."""


def _rfc3339(text: Any) -> float:
    if not isinstance(text, str):
        return 0.0
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _batch_statuses(body: bytes, content_type: str) -> list[int]:
    """The HTTP status of each call in a batch answer (multipart/mixed), in order."""
    m = re.search(r'boundary="?([^";]+)"?', content_type)
    if not m:
        return []
    out = []
    for part in body.decode("latin-1").split("--" + m.group(1)):
        found = re.search(r"HTTP/1\.[01] (\d{3})", part)
        if found:
            out.append(int(found.group(1)))
    return out
