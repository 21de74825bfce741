"""Moving one file: streamed into place (appearing whole or not at all), and the recorded
sizes and CRC-32s (``_CKPT_DIGESTS.json``) a step's files are checked against."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from ckpt_cli.core.copy.destination import CopyObject
from ckpt_cli.core.digest.records import DIGEST_FILE, FileSum, read_digests
from ckpt_cli.core.storage import Location
from ckpt_cli.errors import InvalidMetadataError, NotFoundError, StorageError

#: Bytes read and written at a time: memory is about this per copy in flight (and a multipart
#: part where the store uploads in parts).
PIECE = 4 << 20


class Stopped(Exception):
    """Raised inside a copy when the run is being stopped (an interrupt, a failed store)."""


class Mismatch(Exception):
    """A file whose bytes are not those its item's record says."""


def write_stream(dst: Location, pieces: Iterable[bytes], size: int, src: Location) -> None:
    """``dst.write_stream``: a local tmp name renamed into place, an S3 multipart or GCS
    resumable upload; the file appears whole or not at all, never held whole in memory.

    ``pieces`` are read from ``src``: what fails there is the source's fault, reported as such
    (a store may wrap it into a failed write of ``dst`` with no cause of its own)."""
    failed: list[BaseException] = []

    def watched() -> Iterator[bytes]:
        try:
            yield from pieces
        except BaseException as e:
            failed.append(e)
            raise

    try:
        dst.write_stream(watched(), size)
    except BaseException:
        if not failed:
            raise
        cause = failed[0]
        if isinstance(cause, NotFoundError):
            raise StorageError(
                f"{src} vanished while it was copied to {dst} (deleted at the source)",
                hint="nothing of it was written; rerun the cp once the source is stable: "
                "it copies what is missing",
            ) from None
        raise cause from None


def recorded_sums(
    step: Location, objects: tuple[CopyObject, ...], strict: bool
) -> tuple[dict[str, FileSum], list[str], list[str]]:
    """The recorded size and CRC-32 of each file below the step (step-relative paths), the
    item prefixes that have a record of their files, and the items that have none (a record of
    values only, as ``ckpt_cli.orbax`` writes at save time, makes no claim about the files)."""
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
        if record is None or not record.files:
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
