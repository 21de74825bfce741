"""Moving one file: streamed into place (appearing whole or not at all), and the recorded
sizes and CRC-32s (``_CKPT_DIGESTS.json``) a step's files are checked against."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable

from ckpt_cli.core.copy.plan import CopyObject
from ckpt_cli.core.format.digests import DIGEST_FILE, FileSum, read_digests
from ckpt_cli.core.storage import LocalLocation, Location
from ckpt_cli.errors import InvalidMetadataError, StorageError

#: Bytes read and written at a time: memory is about this per copy in flight (and a multipart
#: part where the store uploads in parts).
PIECE = 4 << 20


class Stopped(Exception):
    """Raised inside a copy when the run is being stopped (an interrupt, a failed store)."""


class Mismatch(Exception):
    """A file whose bytes are not those its item's record says."""


def write_stream(dst: Location, pieces: Iterable[bytes], size: int) -> None:
    """``dst.write_stream`` where the storage layer has it; until then a local tmp name
    renamed into place, and on buckets one put of the joined pieces."""
    method: Callable[[Iterable[bytes], int], None] | None = getattr(dst, "write_stream", None)
    if method is not None:
        method(pieces, size)
    elif isinstance(dst, LocalLocation):
        _local_stream(dst, pieces, size)
    else:
        data = b"".join(pieces)
        if len(data) != size:
            raise StorageError(f"cannot write {dst}: {len(data)} bytes, not {size}")
        dst.write_bytes(data)


def _local_stream(dst: LocalLocation, pieces: Iterable[bytes], size: int) -> None:
    parent = os.path.dirname(dst.path)
    tmp = os.path.join(parent, f".{os.path.basename(dst.path)}.tmp-{os.getpid()}")
    try:
        os.makedirs(parent, exist_ok=True)
        written = 0
        with open(tmp, "wb") as f:
            for piece in pieces:
                f.write(piece)
                written += len(piece)
            if written != size:
                raise StorageError(f"cannot write {dst}: {written} bytes, not {size}")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, dst.path)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise StorageError(f"cannot write {dst}: {e.strerror}") from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def recorded_sums(
    step: Location, objects: tuple[CopyObject, ...], strict: bool
) -> tuple[dict[str, FileSum], list[str], list[str]]:
    """The recorded size and CRC-32 of each file below the step (step-relative paths), the
    item prefixes that have a record, and the items that have none."""
    sums: dict[str, FileSum] = {}
    prefixes = []
    for o in objects:
        if o.rel.rsplit("/", 1)[-1] != DIGEST_FILE:
            continue
        prefix = o.rel[: -len(DIGEST_FILE)]
        item = step.child(*prefix.strip("/").split("/")) if prefix else step
        try:
            record = read_digests(item)
        except InvalidMetadataError:
            if strict:
                raise
            continue  # copied as it is; the resume check reads the source file instead
        if record is None:
            continue
        prefixes.append(prefix)
        sums.update({prefix + rel: s for rel, s in record.files.items()})
    tops = sorted({o.rel.split("/", 1)[0] for o in objects if "/" in o.rel})
    unrecorded = [t for t in tops if not any(p == t + "/" for p in prefixes)]
    if "" in prefixes:
        unrecorded = []
    return sums, prefixes, unrecorded


def item_rel(rel: str, prefixes: list[str]) -> str | None:
    """``rel`` relative to the recorded item holding it (None: in no recorded item)."""
    for p in sorted(prefixes, key=len, reverse=True):
        if rel.startswith(p):
            return rel[len(p) :]
    return None
