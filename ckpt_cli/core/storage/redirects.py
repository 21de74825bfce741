"""S3 redirects that name no region: stopped at the first answer, said in one line.

botocore's region redirector answers a 301/302/307 by looking for the bucket's region (the
``x-amz-bucket-region`` header, the error's ``Region``), else by a HEAD of the bucket. An
endpoint that answers that HEAD with the same bare redirect (a web server, proxy or load
balancer where the S3 API was expected, ``http`` for ``https``, a wrong ``--s3-endpoint``) sends
it round and round until Python's recursion limit: "maximum recursion depth exceeded" after
hundreds of requests. A redirect that names its region (AWS's do) is left to botocore.
"""

from __future__ import annotations

from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from ckpt_cli.errors import StorageError

#: The redirects botocore's region redirector acts on.
REDIRECTS = (301, 302, 307)


def install_redirect_guard(client: Any, endpoint: str) -> None:
    """Register ``redirect_guard`` on a botocore S3 client, before its region redirector."""
    client.meta.events.register_first("needs-retry.s3", redirect_guard(endpoint))


def redirect_guard(endpoint: str) -> Callable[..., None]:
    """A botocore ``needs-retry`` handler: a redirect naming no region raises a
    ``StorageError`` saying what ``endpoint`` answered (and where it pointed, if it did)."""

    def check(response: Any = None, **_: Any) -> None:
        if response is None:  # no answer at all: a connection error, botocore's to retry
            return
        answer, parsed = response
        status = getattr(answer, "status_code", None)
        if status not in REDIRECTS:
            return
        metadata = parsed.get("ResponseMetadata", {})
        headers = {k.lower(): v for k, v in metadata.get("HTTPHeaders", {}).items()}
        if headers.get("x-amz-bucket-region") or parsed.get("Error", {}).get("Region"):
            return  # botocore knows where to go
        to = headers.get("location")
        said = f"the endpoint {endpoint} answered {status} {HTTPStatus(status).phrase}"
        raise StorageError(
            f"{said} to {to} without a region header"
            if to
            else f"{said} without a Location or region header",
            hint="check --s3-endpoint (CKPT_S3_ENDPOINT) and the bucket's region (AWS_REGION)",
        )

    return check
