"""The hostile-input tests reach the S3 test server of tests/remote (moto on 127.0.0.1)."""

from collections.abc import Iterator

import pytest

from tests.hostile.helpers import reap
from tests.remote.conftest import moto_s3, s3, s3_prefix, seaweed_s3

__all__ = ["moto_s3", "s3", "s3_prefix", "seaweed_s3"]


@pytest.fixture(autouse=True)
def _reap_processes() -> Iterator[None]:
    """No ckpt process started by a test outlives it, even a stopped one."""
    yield
    reap()
