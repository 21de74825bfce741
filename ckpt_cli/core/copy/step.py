"""One step of a copy: where it is written, its files copied or checked, then its markers."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from ckpt_cli.core.copy.destination import COMMIT_TEXT, CopyObject, StepCopy
from ckpt_cli.core.copy.objects import (
    PIECE,
    Mismatch,
    Stopped,
    item_rel,
    recorded_sums,
    write_stream,
)
from ckpt_cli.core.copy.plan import CpStepOutcomeJSON, StepStatus
from ckpt_cli.core.digest.crc import crc32
from ckpt_cli.core.digest.records import DIGEST_FILE, FileSum, file_checksum, recorded_file
from ckpt_cli.core.format.items import is_noop_handler
from ckpt_cli.core.format.metadata import read_step_metadata
from ckpt_cli.core.format.names import COMMIT_MARKER, TMP_MARKER, WRITING_MARKER, is_plain_name
from ckpt_cli.core.progress import ByteProgress
from ckpt_cli.core.storage import Location
from ckpt_cli.core.storage.etags import TagHasher
from ckpt_cli.core.storage.objstore import PART_BYTES
from ckpt_cli.core.write.claim import OWNER_FILE
from ckpt_cli.errors import CkptError, NotFoundError, RefusedError, StorageError


@dataclass
class StepTally:
    name: str
    copied_objects: int = 0
    copied_bytes: int = 0
    skipped_objects: int = 0
    skipped_bytes: int = 0
    verified: int = 0
    problem: str | None = None
    refused: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, copied: bool, size: int, verified: bool) -> None:
        with self.lock:
            if copied:
                self.copied_objects += 1
                self.copied_bytes += size
            else:
                self.skipped_objects += 1
                self.skipped_bytes += size
            self.verified += int(verified)

    def to_json(self, status: StepStatus) -> CpStepOutcomeJSON:
        return {
            "name": self.name,
            "status": status,
            "copied_objects": self.copied_objects,
            "copied_bytes": self.copied_bytes,
            "skipped_objects": self.skipped_objects,
            "skipped_bytes": self.skipped_bytes,
            "problem": self.problem,
        }


class StepJob:
    """One step's copy: its data objects as separate tasks, then its commit."""

    def __init__(self, step: StepCopy, verify: bool) -> None:
        self.step = step
        self.verify = verify
        self.tally = StepTally(step.name)
        self.write_to = step.write_to
        sums, prefixes, unrecorded = recorded_sums(step.source, step.objects, verify)
        self.sums, self.prefixes = sums, prefixes
        self.unrecorded = [f"{step.name}/{u}" for u in unrecorded] if verify else []
        if verify:
            listed = {o.rel for o in step.objects}
            gone = [r for r in sums if r not in listed and recorded_file(r.rsplit("/", 1)[-1])]
            if gone:
                self.fail(f"{step.source}/{gone[0]} is recorded in {DIGEST_FILE} but missing")
            for o in step.objects:
                inner = item_rel(o.rel, prefixes)
                if inner is not None and recorded_file(inner) and o.rel not in sums:
                    self.fail(f"{step.source}/{o.rel} is not in its item's {DIGEST_FILE}")
                elif o.rel in sums and sums[o.rel].size != o.size:
                    self.fail(
                        f"{step.source}/{o.rel} holds {o.size} bytes, its record says "
                        f"{sums[o.rel].size}"
                    )

    def fail(self, problem: str) -> None:
        if self.tally.problem is None:
            self.tally.problem = problem

    # -- before the data: the place to write to --

    def begin(self, owner: bytes) -> None:
        s = self.step
        for leftover in s.leftovers:
            leftover.delete_tree()
        if s.state == "present":
            return
        if s.target.requires_commit_marker:
            s.target.child(WRITING_MARKER).write_bytes(owner)
            return
        if s.state != "new":  # resumed: its tmp dir holds an owner record already
            self.write_to.child(OWNER_FILE).write_bytes(owner)
            return
        self.write_to = s.target.parent.child(f"{s.name}{TMP_MARKER}-{time.time_ns() // 1000}")
        undo_dirs = self.write_to.make_dirs_undoable()
        try:
            self.write_to.child(OWNER_FILE).write_bytes(owner)
        except BaseException:
            undo_dirs()  # a tmp dir without ckpt's owner record would never be cleaned up
            raise

    def data(self) -> list[CopyObject]:
        return [o for o in self.step.objects if o.marker is None]

    def markers(self) -> list[CopyObject]:
        return sorted(
            (o for o in self.step.objects if o.marker is not None), key=lambda o: (o.marker, o.rel)
        )

    # -- one object --

    def copy(self, o: CopyObject, stop: threading.Event, progress: ByteProgress) -> None:
        src = self.step.source.child(*o.rel.split("/"))
        dst = self.write_to.child(*o.rel.split("/"))
        recorded = self.sums.get(o.rel)
        check = self.verify and recorded is not None
        if o.dest_size == o.size:
            if self._tag_says_same(src, dst, recorded if check else None, stop):
                self.tally.add(False, o.size, check)
                progress(o.size)
                return
            want = recorded.crc32 if recorded is not None and recorded.size == o.size else None
            if want is None:
                want = file_checksum(src).crc32
            if file_checksum(dst).crc32 == want:
                self.tally.add(False, o.size, check)
                progress(o.size)
                return
            if self.step.state == "present":
                raise RefusedError(
                    f"{dst} already exists with other bytes than {src}",
                    hint="choose another destination; ckpt never overwrites a step",
                )
        elif self.step.state == "present":
            raise RefusedError(f"{dst} already exists and differs from {src}")
        pieces = self._pieces(src, o, recorded if check else None, stop, progress)
        write_stream(dst, pieces, o.size, src)
        self.tally.add(True, o.size, check)

    def _tag_says_same(
        self, src: Location, dst: Location, recorded: FileSum | None, stop: threading.Event
    ) -> bool:
        """Whether the bucket's listing proves ``dst`` holds ``src``'s bytes: its content tag
        (ETag, md5Hash) is the source's tag or the one the source's bytes give, read from the
        source (local disk, mostly) instead of reading the object back. With a record to check
        (``--verify``) the source's bytes are checked against it on the same pass. False proves
        nothing: the caller compares CRC-32s the slow way."""
        tag = dst.content_tag()
        if tag is None:
            return False
        if recorded is None and src.content_tag() == tag:
            return True  # both in buckets, the same tag: nothing to read
        hasher = TagHasher(PART_BYTES)
        crc, n = 0, 0
        for piece in src.iter_bytes(PIECE):
            if stop.is_set():
                raise Stopped
            hasher.update(piece)
            crc = crc32(piece, crc)
            n += len(piece)
        if recorded is not None and (f"{crc:08x}" != recorded.crc32 or n != recorded.size):
            return False
        return hasher.matches(tag)

    def _pieces(
        self,
        src: Location,
        o: CopyObject,
        recorded: FileSum | None,
        stop: threading.Event,
        progress: ByteProgress,
    ) -> Iterator[bytes]:
        crc, n = 0, 0
        held: bytes | None = None
        for piece in src.iter_bytes(PIECE):
            if stop.is_set():
                raise Stopped
            crc = crc32(piece, crc)
            n += len(piece)
            if held is not None:
                yield held
                progress(len(held))
            held = piece
        if n != o.size:
            raise StorageError(f"{src} changed while it was copied ({n} bytes, listed {o.size})")
        if recorded is not None and (f"{crc:08x}" != recorded.crc32 or n != recorded.size):
            # Noted first: a store may wrap the exception into one of its own.
            problem = (
                f"{src} does not match its recorded digest (crc32 {crc:08x}, recorded "
                f"{recorded.crc32})"
            )
            self.fail(problem)
            raise Mismatch(problem)
        if held is not None:
            yield held
            progress(len(held))

    # -- after the data: markers, then the name --

    def commit(self, stop: threading.Event, progress: ByteProgress) -> None:
        s = self.step
        for rel in s.extra:
            with contextlib.suppress(CkptError):
                self.write_to.child(*rel.split("/")).delete_file()
        if s.state != "present":
            self._check_written()
            self._empty_items()
        for o in self.markers():  # a present step's are checked as its data was
            if stop.is_set():
                raise Stopped
            self.copy(o, stop, progress)
        if s.state == "present":
            stale = s.target.child(WRITING_MARKER)
            if s.target.requires_commit_marker and stale.is_file():
                stale.delete_file()  # left by a writer killed after its last marker
            return
        if s.add_marker:
            self.write_to.child(COMMIT_MARKER).write_bytes(
                COMMIT_TEXT.format(path=s.target).encode()
            )
        if s.target.requires_commit_marker:
            s.target.child(WRITING_MARKER).delete_file()
        else:
            self.write_to.child(OWNER_FILE).delete_file()
            self.write_to.rename(s.name)

    def _empty_items(self) -> None:
        """Item directories of the source step that hold no file (Kauldron's ``ds_iter``, which
        its no-op handler leaves empty): made at a destination that has directories, since a
        restore of the step looks for every item's directory. An object store keeps none."""
        if self.step.target.requires_commit_marker:
            return
        tops = {o.rel.split("/", 1)[0] for o in self.step.objects}
        empty = {
            e.name
            for e in self.step.source.list()
            if e.is_dir and not e.is_symlink and e.name not in tops and TMP_MARKER not in e.name
        }
        # From a bucket, which keeps no empty directory: the no-op items its metadata names.
        with contextlib.suppress(CkptError):
            handlers = read_step_metadata(self.step.source).item_handlers
            if isinstance(handlers, dict):
                empty |= {
                    n
                    for n, h in handlers.items()
                    if is_noop_handler(h) and is_plain_name(n) and n not in tops
                }
        for name in sorted(empty):
            self.write_to.child(name).make_dirs()

    def _check_written(self) -> None:
        """Just before the markers, one fresh listing of the step: every data file is there in
        its size. A file deleted meanwhile (by something that did not see this writer's claim)
        must fail the step, not leave a committed step without it."""
        self.write_to.refresh()
        try:
            have = {rel: e.size for rel, e in self.write_to.walk()}
        except NotFoundError:
            have = {}
        for o in self.data():
            if have.get(o.rel) != o.size:
                now = "is gone" if o.rel not in have else f"holds {have[o.rel]} bytes, not {o.size}"
                raise StorageError(
                    f"{self.write_to.child(*o.rel.split('/'))} {now} just before step "
                    f"{self.step.name} was committed (deleted or changed by another process): "
                    "the step is not committed",
                    hint="rerun the cp: it copies what is missing",
                )

    def discard(self) -> None:
        """A step that failed its check: nothing of it stays at the destination."""
        s = self.step
        if s.state == "present":
            return
        with contextlib.suppress(CkptError):
            self.write_to.refresh()
            if self.write_to.exists():
                self.write_to.delete_tree(first=(COMMIT_MARKER,))
