"""The lean S3 path's presigned URLs and listing parser, checked against botocore itself.

Every URL ``sigv4.Presigner`` makes must be the one botocore's ``S3SigV4QueryAuth`` makes for
the same request at the same instant (same signature: a server that checks signatures accepts
both or neither); the base URL ckpt derives for an endpoint must be where botocore sends the
bucket's keys; a listing page parses as botocore parses it."""

from __future__ import annotations

import datetime
from typing import Any

import botocore.auth
import botocore.awsrequest
import botocore.credentials
import botocore.session
import pytest

from ckpt_cli.core.storage.sigv4 import Credentials, Presigner, parse_list_page

NOW = datetime.datetime(2026, 12, 2, 9, 30, 15, tzinfo=datetime.timezone.utc)
KEYS = [
    "root/5/_CHECKPOINT_METADATA",
    "root/a b+c/~x/metrics",
    "root/\u00e9t\u00e9/\u4e2d\u6587/\U0001f600",
    "root/odd!$&'()*,;=:@/%41",
    "",
]
QUERIES: list[dict[str, str]] = [
    {},
    {"list-type": "2", "prefix": "root/ a+b/", "encoding-type": "url"},
    {"list-type": "2", "prefix": "r/", "start-after": "r/7\U0010ffff", "max-keys": "1000"},
    {
        "list-type": "2",
        "prefix": "r/",
        "continuation-token": "1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM=",
        "delimiter": "/",
    },
]


def _botocore_url(base: str, key: str, query: dict[str, str], creds: Credentials, region: str,
                  monkeypatch: pytest.MonkeyPatch) -> str:  # fmt: skip
    from urllib.parse import quote, urlencode

    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda: NOW.replace(tzinfo=None))
    url = base.replace("{key}", quote(key, safe="/~"))
    if query:
        url += "?" + urlencode(query, quote_via=quote)
    request = botocore.awsrequest.AWSRequest("GET", url)
    frozen = botocore.credentials.Credentials(creds.access_key, creds.secret_key, creds.token)
    botocore.auth.S3SigV4QueryAuth(frozen, "s3", region, expires=3600).add_auth(request)
    return str(request.prepare().url)


def _params(url: str) -> tuple[str, dict[str, list[str]]]:
    from urllib.parse import parse_qs, urlsplit

    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}{parts.path}", parse_qs(
        parts.query, keep_blank_values=True
    )


@pytest.mark.parametrize("token", [None, "FQoGZXIvYXdzEJr//////////wEaDO+token/with=odd"])
@pytest.mark.parametrize(
    ("base", "region"),
    [
        ("http://127.0.0.1:9000/ckpt-test/{key}", "us-east-1"),
        ("https://minio.example.com/bucket/{key}", "eu-west-1"),
        ("https://ckpt-test.s3.amazonaws.com/{key}", "us-east-1"),
        ("http://localhost:80/b/{key}", "us-east-1"),
        ("https://s3.eu-west-1.amazonaws.com:443/my.dotted.bucket/{key}", "eu-west-1"),
    ],
)
def test_every_url_is_the_one_botocore_signs(
    base: str, region: str, token: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    creds = Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", token)
    signer = Presigner(base, region)
    checked = 0
    for key in KEYS:
        for query in QUERIES:
            ours = signer.url(key, query, creds, NOW)
            theirs = _botocore_url(base, key, query, creds, region, monkeypatch)
            a, b = _params(ours), _params(theirs)
            # Same resource (a default port is dropped, as http.client's Host header drops it)
            # and the same parameters, signature included.
            assert a[0] == b[0].replace(":443/", "/").replace(":80/", "/"), (ours, theirs)
            assert a[1] == b[1], (ours, theirs)
            assert len(a[1]["X-Amz-Signature"][0]) == 64
            checked += 1
    assert checked == len(KEYS) * len(QUERIES)


def test_a_changed_secret_or_instant_changes_the_signature() -> None:
    signer = Presigner("http://127.0.0.1:9000/b/{key}", "us-east-1")
    base = signer.url("k", {}, Credentials("a", "secret"), NOW)
    assert signer.url("k", {}, Credentials("a", "secret2"), NOW) != base
    later = NOW + datetime.timedelta(days=1)
    assert signer.url("k", {}, Credentials("a", "secret"), later) != base
    assert signer.url("k", {}, Credentials("a", "secret"), NOW) == base


def test_anonymous_urls_carry_no_signature() -> None:
    signer = Presigner("http://127.0.0.1:9000/b/{key}", "us-east-1")
    assert signer.url("a b", {}, None, NOW) == "http://127.0.0.1:9000/b/a%20b"
    url = signer.url("", {"list-type": "2", "prefix": "p/"}, None, NOW)
    assert url == "http://127.0.0.1:9000/b/?list-type=2&prefix=p%2F"


@pytest.mark.parametrize(
    "endpoint",
    [
        "http://127.0.0.1:9000",
        "https://minio.example.com",
        "https://minio.example.com:9000",
        "http://localhost:8333",
    ],
)
@pytest.mark.parametrize("bucket", ["ckpt-test", "my.dotted.bucket", "Upper_Case"])
def test_an_endpoint_is_addressed_where_botocore_addresses_it(endpoint: str, bucket: str) -> None:
    """The lean path builds ``endpoint/bucket/key`` without a botocore client: that is where
    botocore itself sends a key of the bucket (path style) for an endpoint given by URL."""
    client: Any = botocore.session.get_session().create_client(
        "s3", endpoint_url=endpoint, region_name="us-east-1",
        aws_access_key_id="a", aws_secret_access_key="b",
    )  # fmt: skip
    url = client.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "k/x"})
    assert url.split("?")[0] == f"{endpoint}/{bucket}/k/x"


NS = "http://s3.amazonaws.com/doc/2006-03-01/"


def _page(contents: str, extra: str = "", ns: bool = True) -> bytes:
    xmlns = f' xmlns="{NS}"' if ns else ""
    return (
        f'<?xml version="1.0" encoding="UTF-8"?><ListBucketResult{xmlns}><Name>b</Name>'
        f"<Prefix>r/</Prefix>{extra}{contents}</ListBucketResult>"
    ).encode()


ONE = (
    "<Contents><Key>r/a%20b%2Bc/%E4%B8%AD</Key><LastModified>2026-12-01T15:14:46.000Z"
    "</LastModified><ETag>&quot;9b2cf535f27731c974343645a3985328&quot;</ETag><Size>18</Size>"
    "<StorageClass>STANDARD</StorageClass></Contents>"
)


@pytest.mark.parametrize("ns", [True, False])
def test_a_page_parses_as_botocore_reads_it(ns: bool) -> None:
    body = _page(
        ONE + "<CommonPrefixes><Prefix>r/x%2By/</Prefix></CommonPrefixes>",
        "<EncodingType>url</EncodingType><IsTruncated>true</IsTruncated>"
        "<NextContinuationToken>tok+en/=</NextContinuationToken>",
        ns,
    )
    page = parse_list_page(body)
    assert len(page.objects) == 1
    obj = page.objects[0]
    assert obj.key == "r/a b+c/\u4e2d"
    assert (obj.size, obj.last_modified) == (18, "2026-12-01T15:14:46.000Z")
    assert obj.etag == '"9b2cf535f27731c974343645a3985328"'
    assert page.prefixes == ("r/x+y/",)
    assert page.token == "tok+en/="  # a token is never decoded


def test_keys_are_taken_as_they_are_without_url_encoding() -> None:
    page = parse_list_page(_page(ONE, "<IsTruncated>false</IsTruncated>"))
    assert [o.key for o in page.objects] == ["r/a%20b%2Bc/%E4%B8%AD"]
    assert page.token is None


def test_a_truncated_page_without_a_token_is_refused() -> None:
    with pytest.raises(ValueError, match="NextContinuationToken"):
        parse_list_page(_page(ONE, "<IsTruncated>true</IsTruncated>"))


@pytest.mark.parametrize("body", [b"<Error><Code>NoSuchBucket</Code></Error>", b"not xml", b""])
def test_anything_but_a_listing_is_refused(body: bytes) -> None:
    with pytest.raises(ValueError):
        parse_list_page(body)


def test_the_host_header_drops_only_a_default_port() -> None:
    from ckpt_cli.core.storage.sigv4 import host_header

    assert host_header("https", "s3.amazonaws.com:443") == "s3.amazonaws.com"
    assert host_header("http", "[::1]:80") == "[::1]"
    assert host_header("http", "127.0.0.1:9000") == "127.0.0.1:9000"
    assert host_header("https", "minio:80") == "minio:80"
