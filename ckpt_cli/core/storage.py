"""The one storage layer: every listing, stat and read of checkpoint files goes through here.

Local paths use ``os.scandir`` (one system call per directory, sizes and mtimes included, which
TensorStore's kvstore ``list`` does not return). TensorStore reaches the same places through
``kvstore_spec()``, so array and OCDBT access follow a location wherever it lives. Object stores
(``s3://``, ``gs://``) plug in here as further ``Location`` subclasses.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat as stat_mod
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ckpt_cli.errors import InvalidMetadataError, NotFoundError, StorageError, UnsupportedError

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
    requires_commit_marker = False

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

    def kvstore_spec(self) -> dict[str, Any]:
        """A TensorStore kvstore spec for this directory (always ending in ``/``)."""
        raise NotImplementedError

    def size(self) -> int:
        """Bytes of this file, symlinks followed."""
        raise NotImplementedError

    def iter_bytes(self, block_size: int = 4 << 20) -> Iterator[bytes]:
        """This file's content in pieces of at most ``block_size`` bytes (streamed, not loaded)."""
        raise NotImplementedError

    def write_bytes_atomic(self, data: bytes) -> None:
        """Write this file whole or not at all: a temporary sibling, then a rename over it."""
        raise NotImplementedError

    def resolve(self) -> Location:
        """The same file with every symlink on its path resolved."""
        raise NotImplementedError

    def is_within(self, other: Location) -> bool:
        """Whether this location is ``other`` or lies below it (paths compared as given)."""
        raise NotImplementedError

    def __str__(self) -> str:
        raise NotImplementedError

    # Shared helpers built on the primitives above.

    def read_json(self) -> Any:
        """Parse this file as JSON; damage becomes one ``InvalidMetadataError`` naming the file."""
        raw = self.read_bytes()
        try:
            return json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            what = "empty" if not raw.strip() else f"not valid JSON ({_short(e)})"
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


def _short(e: Exception) -> str:
    return str(e).split("\n", 1)[0]


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
                data = f.read(limit + 1)
        except FileNotFoundError:
            raise NotFoundError(f"{self.path} does not exist") from None
        except IsADirectoryError:
            raise InvalidMetadataError(f"{self.path} is a directory, expected a file") from None
        except OSError as e:
            raise StorageError(f"cannot read {self.path}: {e.strerror}") from None
        if len(data) > limit:
            raise InvalidMetadataError(f"{self.path} is larger than {limit} bytes")
        return data

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

    def write_bytes_atomic(self, data: bytes) -> None:
        tmp = f"{self.path}.tmp-{os.getpid()}"
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except OSError as e:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise StorageError(f"cannot write {self.path}: {e.strerror}") from None

    def resolve(self) -> LocalLocation:
        return LocalLocation(os.path.realpath(self.path))

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
    if "://" in target:
        scheme = target.split("://", 1)[0]
        raise UnsupportedError(
            f"{scheme}:// locations are not supported by this version of ckpt",
            hint="copy the checkpoint to a local path, or mount the bucket",
        )
    return LocalLocation(os.path.expanduser(target))
