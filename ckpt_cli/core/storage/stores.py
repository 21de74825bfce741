"""The store of each bucket in this process: ``open_store`` picks the class by scheme (S3 or
GCS, each in a module of its own over ``objstore.ObjectStore``)."""

from __future__ import annotations

import threading

from ckpt_cli.core.storage.gcs import GcsStore
from ckpt_cli.core.storage.objstore import ObjectStore
from ckpt_cli.core.storage.options import StorageOptions, apply_request_limit
from ckpt_cli.core.storage.s3 import S3Store

_STORES: dict[tuple[str, str, StorageOptions], ObjectStore] = {}
_STORES_LOCK = threading.Lock()


def open_store(scheme: str, bucket: str, options: StorageOptions | None = None) -> ObjectStore:
    """The store of a bucket (one per scheme, bucket and options in this process); options
    default to this process's environment."""
    options = options if options is not None else StorageOptions.from_environment()
    apply_request_limit(options)  # a worker process: before its first TensorStore open
    key = (scheme, bucket, options)
    with _STORES_LOCK:
        if key not in _STORES:
            cls = S3Store if scheme == "s3" else GcsStore
            _STORES[key] = cls(bucket, options)
        return _STORES[key]
