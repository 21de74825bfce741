"""What a safetensors path holds, found without refusing damage: a ``.safetensors`` file, a
``*.safetensors.index.json``, or a Hugging Face model folder (shards, their index, config.json).

``locate`` lists the files and reads the index and config.json, but keeps what is wrong with
them as messages (an index that does not parse, a shard it names that is not there) instead of
raising: ``verify`` reports each as a problem, ``inspect`` refuses on the first. Only what makes
the path no safetensors source at all raises (not there, a folder of none, two indexes).
Header checks and reads are ``reader.SafetensorsReader``'s. Local paths only: the reader reads
files with positioned reads; a bucket's objects must be copied first.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ckpt_cli.core.format.names import (
    COMMIT_MARKER,
    STEP_METADATA,
    looks_like_item,
    parse_step_name,
)
from ckpt_cli.core.safetensors.header import LENGTH_BYTES, MAX_HEADER_BYTES
from ckpt_cli.core.safetensors.plan import INDEX_SUFFIX, ShardIndex, parse_index
from ckpt_cli.errors import (
    InvalidSafetensorsError,
    NotFoundError,
    StorageError,
    UnsupportedError,
)

CONFIG = "config.json"
#: What a Git LFS pointer file starts with: a clone made without ``git lfs pull``.
LFS_POINTER = b"version https://git-lfs"
_REMOTE_HINT = (
    "copy the files to local disk first (e.g. `aws s3 cp --recursive`, `gcloud storage cp -r`)"
)


@dataclass(frozen=True)
class Located:
    """The files of a safetensors source, and what is wrong with its index and config."""

    path: str  # as given
    directory: str
    #: File names in ``directory``, sorted: the index's files (present or not), else every
    #: ``.safetensors`` file of the folder (or the one file named).
    files: tuple[str, ...]
    index_name: str | None = None
    index: ShardIndex | None = None
    index_problem: str | None = None  # the index does not parse: its message
    missing: tuple[str, ...] = ()  # files the index names that are not in the folder
    unlisted: tuple[str, ...] = ()  # .safetensors files of the folder the index does not name
    config: Mapping[str, Any] | None = None
    config_problem: str | None = None

    def file_path(self, name: str) -> str:
        return os.path.join(self.directory, name)

    @property
    def present(self) -> tuple[str, ...]:
        return tuple(f for f in self.files if f not in self.missing)


def is_safetensors_source(path: str) -> bool:
    """Whether ``path`` names safetensors: a ``.safetensors`` or index file, a local folder
    holding them, or a local file that starts with a safetensors header. A bucket path named
    like safetensors raises ``UnsupportedError`` (local files only)."""
    local = path.removeprefix("file://")
    if "://" in local:
        if local.rstrip("/").endswith((".safetensors", INDEX_SUFFIX)):
            raise UnsupportedError(
                f"{path}: safetensors files are read from local disk only", hint=_REMOTE_HINT
            )
        return False
    if local.endswith((".safetensors", INDEX_SUFFIX)):
        return True
    try:
        if os.path.isdir(local):
            names = os.listdir(local)
            weights = any(n.endswith((".safetensors", INDEX_SUFFIX)) for n in names)
            return weights and not _orbax_names(local, names)
        return os.path.isfile(local) and _starts_like_safetensors(local)
    except OSError:
        return False


def _orbax_names(directory: str, names: list[str]) -> bool:
    """Whether a folder is (also) an Orbax root, step or item: a ``model.safetensors`` exported
    into a run's directory must not turn ``ckpt verify runs/exp7`` into a check of that file."""
    if looks_like_item(names) or STEP_METADATA in names or COMMIT_MARKER in names:
        return True
    return any(
        parse_step_name(n) is not None and os.path.isdir(os.path.join(directory, n)) for n in names
    )


def _starts_like_safetensors(path: str) -> bool:
    """A plausible header length, then ``{``: a safetensors file under another name."""
    with open(path, "rb") as f:
        head = f.read(LENGTH_BYTES + 1)
    if len(head) <= LENGTH_BYTES:
        return False
    n = int.from_bytes(head[:LENGTH_BYTES], "little")
    size = os.path.getsize(path)
    return 2 <= n <= MAX_HEADER_BYTES and LENGTH_BYTES + n <= size and head[LENGTH_BYTES:] == b"{"


def locate(path: str) -> Located:
    """The files of ``path`` (see the module): raises only when it is no safetensors source."""
    local = path.removeprefix("file://")
    if "://" in local:
        raise UnsupportedError(
            f"{path}: safetensors files are read from local disk only", hint=_REMOTE_HINT
        )
    if os.path.isfile(local):
        directory = os.path.dirname(local) or "."
        name = os.path.basename(local)
        if name.endswith(INDEX_SUFFIX):
            return _from_index(path, directory, name)
        return Located(path, directory, (name,), **_config(directory))
    if not os.path.isdir(local):
        raise NotFoundError(f"{path} does not exist", hint="check the path")
    names = _listdir(local)
    indexes = [n for n in names if n.endswith(INDEX_SUFFIX)]
    if "model" + INDEX_SUFFIX in indexes:
        indexes = ["model" + INDEX_SUFFIX]
    if len(indexes) > 1:
        raise InvalidSafetensorsError(
            f"{path} holds {len(indexes)} safetensors indexes ({', '.join(indexes[:3])})",
            hint="name the index file to read",
        )
    if indexes:
        return _from_index(path, local, indexes[0])
    files = tuple(n for n in names if n.endswith(".safetensors"))
    if not files:
        raise InvalidSafetensorsError(
            f"{path} holds no .safetensors file and no index",
            hint="point ckpt at a .safetensors file, an index, or a folder holding them",
        )
    return Located(path, local, files, **_config(local))


def _listdir(directory: str) -> list[str]:
    try:
        return sorted(os.listdir(directory))
    except OSError as e:
        raise StorageError.from_error(f"cannot list {directory}", e) from None


def _from_index(path: str, directory: str, index_name: str) -> Located:
    """The index's files, or, when it does not parse, every ``.safetensors`` file beside it."""
    index_path = os.path.join(directory, index_name)
    try:
        with open(index_path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise StorageError.from_error(f"cannot read {index_path}", e) from None
    names = _listdir(directory)
    shards = tuple(n for n in names if n.endswith(".safetensors"))
    try:
        index = parse_index(raw, index_name)
    except InvalidSafetensorsError as e:
        return Located(path, directory, shards, index_name, None, e.message, **_config(directory))
    present = set(names)
    return Located(
        path,
        directory,
        tuple(sorted(index.files)),
        index_name,
        index,
        None if index.weight_map else f"{index_name}: 'weight_map' lists no tensor",
        missing=tuple(f for f in index.files if f not in present),
        unlisted=tuple(f for f in shards if f not in set(index.files)),
        **_config(directory),
    )


def _config(directory: str) -> dict[str, Any]:
    """``config.json`` beside the weights (a Hugging Face folder), parsed, or its problem."""
    path = os.path.join(directory, CONFIG)
    if not os.path.isfile(path):
        return {}
    try:
        with open(path, "rb") as f:
            doc = json.loads(f.read().decode("utf-8"))
    except (OSError, ValueError, RecursionError) as e:
        return {"config_problem": f"{CONFIG} does not parse: {e}"}
    if not isinstance(doc, dict):
        return {"config_problem": f"{CONFIG} is not a JSON object"}
    return {"config": doc}


def lfs_pointer(path: str) -> bool:
    """Whether ``path`` is a Git LFS pointer (the weights were never downloaded)."""
    try:
        with open(path, "rb") as f:
            return f.read(len(LFS_POINTER)) == LFS_POINTER
    except OSError:
        return False


def strict(located: Located) -> Located:
    """``located`` when nothing is wrong with its index and files list, else the first problem
    raised (what a command that does not report problems, ``inspect``, needs)."""
    if located.index_problem:
        raise InvalidSafetensorsError(
            located.index_problem, hint="the index is damaged: download or export it again"
        )
    if located.missing:
        raise InvalidSafetensorsError(
            f"{located.index_name}: names {located.missing[0]!r}, which is not in {located.directory}",
            hint="download every shard the index lists",
        )
    return located
