"""The hostile-input tests reach the S3 test server of tests/remote (moto on 127.0.0.1)."""

from tests.remote.conftest import s3, s3_prefix

__all__ = ["s3", "s3_prefix"]
