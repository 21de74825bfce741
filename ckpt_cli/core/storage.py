"""The one storage layer: every listing, stat and read of checkpoint files goes through here.

Local paths use ``os.scandir`` (one system call per directory, sizes and mtimes included, which
TensorStore's kvstore ``list`` does not return). TensorStore reaches the same places through
``kvstore_spec()``, so array and OCDBT access follow a location wherever it lives. Object stores
(``s3://``, ``gs://``) are ``RemoteLocation`` (``remote.py``); what differs between the two
kinds is a property of the location, not an ``if`` in each caller: ``requires_commit_marker``
(no rename: a step is finished when ``commit_success.txt`` is there), ``hide`` (how a step
stops looking valid before deletion), ``refresh`` (drop cached listings), ``parallel_reads``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat as stat_mod
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ckpt_cli.errors import (
    InvalidMetadataError,
    NotFoundError,
    StorageError,
    UnsupportedError,
    first_line,
)

# A metadata file bigger than this is damage, not metadata: refuse before allocating for it.
MAX_METADATA_BYTES = 1 << 30


@dataclass(frozen=True)
class Entry:
    """One child of a directory, as one listing call sees it."""

    name: str
    is_dir: bool
    size: int
    mtime: float
    is_symlink: bool = False


class Location:
    """A file or directory in some store, addressed by path; cheap to create, lazy to touch."""

    #: Whether a finished step must carry ``commit_success.txt`` (object stores have no rename).
    #: Writers then write a step in place and put the marker last.
    requires_commit_marker = False
    #: How many independent small reads are worth running at once (1: serial is fastest).
    parallel_reads = 1

    @property
    def name(self) -> str:
        raise NotImplementedError

    @property
    def parent(self) -> Location:
        raise NotImplementedError

    def child(self, *parts: str) -> Location:
        raise NotImplementedError

    def exists(self) -> bool:
        raise NotImplementedError

    def is_dir(self) -> bool:
        raise NotImplementedError

    def is_file(self) -> bool:
        raise NotImplementedError

    def list(self) -> list[Entry]:
        """The immediate children, sorted by name."""
        raise NotImplementedError

    def read_bytes(self, limit: int = MAX_METADATA_BYTES) -> bytes:
        raise NotImplementedError

    def read_tail(self, size: int) -> bytes:
        """The last ``size`` bytes of this file (all of it when shorter)."""
        raise NotImplementedError

    def mtime(self) -> float:
        raise NotImplementedError

    def walk(self) -> Iterator[tuple[str, Entry]]:
        """Every file below this directory as (relative path, entry), symlinks not followed."""
        raise NotImplementedError

    def is_symlink(self) -> bool:
        raise NotImplementedError

    def resolve(self) -> Location:
        """This location with every symlink on its path resolved."""
        raise NotImplementedError

    # Writes, used only by commands that change a root (prune) or write a new step.

    def rename(self, new_name: str) -> Location:
        """Rename this entry inside its parent directory, atomically; returns the new location."""
        raise NotImplementedError

    def delete_tree(self) -> None:
        """Remove this directory and everything below it; refuses a symlink (never follows one)."""
        raise NotImplementedError

    def delete_file(self) -> None:
        """Remove this one file."""
        raise NotImplementedError

    def hide(self, trash_name: str) -> Location:
        """Make this step directory stop looking like a step, atomically where the store can;
        returns where it now is (``delete_tree`` it next). Locally: a rename to ``trash_name``."""
        return self.rename(trash_name)

    def refresh(self) -> None:
        """Forget cached listings (after writes made by TensorStore, before a re-check)."""

    def try_lock(self, owner: str) -> Lock | None:
        """Take an exclusive lock on this file (created if absent) and write ``owner`` into it.

        None when another process holds it.
        """
        raise NotImplementedError

    def kvstore_spec(self) -> dict[str, Any]:
        """A TensorStore kvstore spec for this directory (always ending in ``/``)."""
        raise NotImplementedError

    # Writing (writers only ever write inside a tmp step directory they created).

    def write_bytes(self, data: bytes) -> None:
        """Write a whole file atomically: a temporary name in the same directory, then rename."""
        raise NotImplementedError

    def make_dirs(self) -> None:
        raise NotImplementedError

    def copy_tree(self, target: Location) -> None:
        """Copy every file below this directory into ``target`` (created), file by file."""
        for rel, _ in self.walk():
            parts = rel.split("/")
            target.child(*parts).write_bytes(self.child(*parts).read_bytes())

    def size(self) -> int:
        """Bytes of this file, symlinks followed."""
        raise NotImplementedError

    def iter_bytes(self, block_size: int = 4 << 20) -> Iterator[bytes]:
        """This file's content in pieces of at most ``block_size`` bytes (streamed, not loaded)."""
        raise NotImplementedError

    def is_within(self, other: Location) -> bool:
        """Whether this location is ``other`` or lies below it (paths compared as given)."""
        raise NotImplementedError

    def describe_error(self, e: BaseException) -> str:
        """One line for a TensorStore error met here (object stores: endpoint and cause)."""
        return first_line(e)

    def __str__(self) -> str:
        raise NotImplementedError

    # Shared helpers built on the primitives above.

    def read_json(self) -> Any:
        """Parse this file as JSON; damage becomes one ``InvalidMetadataError`` naming the file."""
        raw = self.read_bytes()
        try:
            return json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            what = "empty" if not raw.strip() else f"not valid JSON ({first_line(e)})"
            raise InvalidMetadataError(
                f"{self} is {what}",
                hint="the checkpoint is damaged; run `ckpt verify` on it",
            ) from None

    def read_json_if_exists(self) -> Any | None:
        if not self.is_file():
            return None
        return self.read_json()

    def du(self) -> int:
        """Bytes used by all files below this directory (symlinks counted as links)."""
        return sum(entry.size for _, entry in self.walk())


class LocalLocation(Location):
    """A path on a local (or locally mounted) file system."""

    def __init__(self, path: str) -> None:
        self.path = os.path.abspath(path)

    @property
    def name(self) -> str:
        return os.path.basename(self.path)

    @property
    def parent(self) -> LocalLocation:
        return LocalLocation(os.path.dirname(self.path))

    def child(self, *parts: str) -> LocalLocation:
        return LocalLocation(os.path.join(self.path, *parts))

    def exists(self) -> bool:
        return os.path.lexists(self.path)

    def is_dir(self) -> bool:
        return os.path.isdir(self.path)

    def is_file(self) -> bool:
        return os.path.isfile(self.path)

    def is_symlink(self) -> bool:
        return os.path.islink(self.path)

    def list(self) -> list[Entry]:
        try:
            with os.scandir(self.path) as it:
                entries = [_entry(d) for d in it]
        except FileNotFoundError:
            raise NotFoundError(f"{self.path} does not exist") from None
        except NotADirectoryError:
            raise NotACheckpointDirError(f"{self.path} is a file, not a directory") from None
        except OSError as e:
            raise StorageError(f"cannot list {self.path}: {e.strerror}") from None
        entries.sort(key=lambda x: x.name)
        return entries

    def read_bytes(self, limit: int = MAX_METADATA_BYTES) -> bytes:
        try:
            with open(self.path, "rb") as f:
                # Check the size first: f.read(limit) would reserve `limit` bytes up front.
                size = os.fstat(f.fileno()).st_size
                if size > limit:
                    raise InvalidMetadataError(f"{self.path} is larger than {limit} bytes")
                return f.read()
        except FileNotFoundError:
            raise NotFoundError(f"{self.path} does not exist") from None
        except IsADirectoryError:
            raise InvalidMetadataError(f"{self.path} is a directory, expected a file") from None
        except OSError as e:
            raise StorageError(f"cannot read {self.path}: {e.strerror}") from None

    def read_tail(self, size: int) -> bytes:
        try:
            with open(self.path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - size))
                return f.read(size)
        except FileNotFoundError:
            raise NotFoundError(f"{self.path} does not exist") from None
        except OSError as e:
            raise StorageError(f"cannot read {self.path}: {e.strerror}") from None

    def mtime(self) -> float:
        try:
            return os.stat(self.path).st_mtime
        except OSError as e:
            raise StorageError(f"cannot stat {self.path}: {e.strerror}") from None

    def walk(self) -> Iterator[tuple[str, Entry]]:
        stack = [""]
        while stack:
            rel = stack.pop()
            try:
                with os.scandir(os.path.join(self.path, rel)) as it:
                    children = [_entry(d) for d in it]
            except OSError as e:
                raise StorageError(f"cannot list {os.path.join(self.path, rel)}: {e}") from None
            for entry in children:
                sub = f"{rel}/{entry.name}" if rel else entry.name
                if entry.is_dir and not entry.is_symlink:
                    stack.append(sub)
                else:
                    yield sub, entry

    def resolve(self) -> LocalLocation:
        return LocalLocation(os.path.realpath(self.path))

    def rename(self, new_name: str) -> LocalLocation:
        if not new_name or "/" in new_name or new_name in (".", ".."):
            raise ValueError(f"not a plain directory entry name: {new_name!r}")
        target = os.path.join(os.path.dirname(self.path), new_name)
        # os.rename would silently replace an empty directory of that name.
        if os.path.lexists(target):
            raise StorageError(f"cannot rename {self.path}: {target} exists")
        try:
            os.rename(self.path, target)
        except FileNotFoundError:
            raise NotFoundError(f"{self.path} does not exist") from None
        except OSError as e:
            raise StorageError(f"cannot rename {self.path} to {new_name}: {e.strerror}") from None
        return LocalLocation(target)

    def delete_tree(self) -> None:
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            raise NotFoundError(f"{self.path} does not exist") from None
        except OSError as e:
            raise StorageError(f"cannot stat {self.path}: {e.strerror}") from None
        if not stat_mod.S_ISDIR(st.st_mode):
            raise StorageError(f"refusing to delete {self.path}: not a directory (or a symlink)")
        # On Linux rmtree works through directory file descriptors and never follows a symlink
        # met inside the tree (shutil.rmtree.avoids_symlink_attacks).
        try:
            shutil.rmtree(self.path)
        except OSError as e:
            raise StorageError(f"cannot delete {self.path}: {e.strerror or e}") from None

    def delete_file(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            raise NotFoundError(f"{self.path} does not exist") from None
        except OSError as e:
            raise StorageError(f"cannot delete {self.path}: {e.strerror}") from None

    def try_lock(self, owner: str) -> FileLock | None:
        import fcntl

        for _ in range(10):
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
            except OSError as e:
                raise StorageError(f"cannot open lock file {self.path}: {e.strerror}") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return None
            except OSError as e:
                os.close(fd)
                raise StorageError(
                    f"cannot lock {self.path}: {e.strerror}",
                    hint="the file system must support flock (local disks and NFSv4 do)",
                ) from None
            # The previous holder unlinks the file on release: if it did so after our open, we
            # hold a lock on a dead inode and must start again on the new file.
            try:
                current = os.stat(self.path, follow_symlinks=False)
            except FileNotFoundError:
                os.close(fd)
                continue
            mine = os.fstat(fd)
            if (current.st_dev, current.st_ino) != (mine.st_dev, mine.st_ino):
                os.close(fd)
                continue
            os.ftruncate(fd, 0)
            os.write(fd, owner.encode())
            return FileLock(self.path, fd)
        raise StorageError(f"cannot lock {self.path}: the lock file keeps being replaced")

    def kvstore_spec(self) -> dict[str, Any]:
        return {"driver": "file", "path": self.path.rstrip("/") + "/"}

    def size(self) -> int:
        try:
            return os.stat(self.path).st_size
        except FileNotFoundError:
            raise NotFoundError(f"{self.path} does not exist") from None
        except OSError as e:
            raise StorageError(f"cannot stat {self.path}: {e.strerror}") from None

    def iter_bytes(self, block_size: int = 4 << 20) -> Iterator[bytes]:
        try:
            with open(self.path, "rb") as f:
                while block := f.read(block_size):
                    yield block
        except FileNotFoundError:
            raise NotFoundError(f"{self.path} does not exist") from None
        except OSError as e:
            raise StorageError(f"cannot read {self.path}: {e.strerror}") from None

    def write_bytes(self, data: bytes) -> None:
        parent = os.path.dirname(self.path)
        tmp = os.path.join(parent, f".{os.path.basename(self.path)}.tmp-{os.getpid()}")
        try:
            os.makedirs(parent, exist_ok=True)
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except OSError as e:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise StorageError(f"cannot write {self.path}: {e.strerror}") from None

    def make_dirs(self) -> None:
        try:
            os.makedirs(self.path, exist_ok=True)
        except OSError as e:
            raise StorageError(f"cannot create {self.path}: {e.strerror}") from None

    def copy_tree(self, target: Location) -> None:
        if not isinstance(target, LocalLocation):
            super().copy_tree(target)
            return
        try:
            shutil.copytree(self.path, target.path, symlinks=True, dirs_exist_ok=True)
        except (OSError, shutil.Error) as e:
            raise StorageError(f"cannot copy {self.path} to {target.path}: {e}") from None

    def is_within(self, other: Location) -> bool:
        if not isinstance(other, LocalLocation):
            return False
        return self.path == other.path or self.path.startswith(other.path.rstrip("/") + "/")

    def __str__(self) -> str:
        return self.path

    def __repr__(self) -> str:
        return f"LocalLocation({self.path!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LocalLocation) and other.path == self.path

    def __hash__(self) -> int:
        return hash(self.path)


class Lock:
    """A held lock; ``release`` (or leaving the ``with`` block) gives it up."""

    def release(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Lock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class FileLock(Lock):
    """An exclusive ``flock`` held on an open file: the OS drops it when the process dies, so a
    killed holder leaves no stale lock (at most the file, which the next holder reuses)."""

    def __init__(self, path: str, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is None:
            return
        # Unlink while still holding the lock; a waiter that opened the old file notices the
        # changed inode and retries (see LocalLocation.try_lock).
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        os.close(self._fd)
        self._fd = None


class NotACheckpointDirError(NotFoundError):
    """A file where a directory was expected."""


def _entry(d: os.DirEntry[str]) -> Entry:
    try:
        st = d.stat(follow_symlinks=False)
    except OSError:
        return Entry(d.name, False, 0, 0.0, False)
    is_link = stat_mod.S_ISLNK(st.st_mode)
    is_dir = d.is_dir(follow_symlinks=True) if is_link else stat_mod.S_ISDIR(st.st_mode)
    return Entry(d.name, is_dir, 0 if is_dir and not is_link else st.st_size, st.st_mtime, is_link)


def open_location(target: str) -> Location:
    """Turn a command-line path or URL into a Location."""
    if target.startswith("file://"):
        return LocalLocation(target[len("file://") :] or "/")
    if target.startswith(("s3://", "gs://")):
        from ckpt_cli.core.remote import open_remote

        return open_remote(target)
    if "://" in target:
        scheme = target.split("://", 1)[0]
        raise UnsupportedError(
            f"{scheme}:// locations are not supported",
            hint="use a local path, file://, s3:// or gs://",
        )
    return LocalLocation(os.path.expanduser(target))
