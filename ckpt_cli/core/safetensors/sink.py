"""All the files of a plan as one sink: blocks by tensor name, routed to the file that holds it.

Files are written into ``directory`` (for an export, a temporary directory renamed when every
file is complete), each under its own temporary name until its last byte is written. The index,
when the plan has one, is written last.
"""

from __future__ import annotations

import os
from types import TracebackType
from typing import Any

from ckpt_cli.core.safetensors.plan import FilesPlan
from ckpt_cli.core.safetensors.writer import SafetensorsWriter
from ckpt_cli.errors import StorageError


class SafetensorsSink:
    def __init__(self, directory: str, plan: FilesPlan) -> None:
        self.directory = directory
        self.plan = plan
        self._writers: dict[str, SafetensorsWriter] = {}
        self._file_of = plan.weight_map
        self._done: set[str] = set()

    def __enter__(self) -> SafetensorsSink:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.abort()

    def write(self, name: str, start: tuple[int, ...], block: Any) -> None:
        self._writer(name).write_block(name, start, block)

    def share(self, name: str) -> None:
        """Several threads will write into the file holding ``name`` (``writer.share``); its
        writer is opened here, on the caller's thread, so the threads only write."""
        self._writer(name).share()

    def _writer(self, name: str) -> SafetensorsWriter:
        file = self._file_of[name]
        writer = self._writers.get(file)
        if writer is None:
            if file in self._done:
                raise ValueError(f"{file} is already complete; tensor {name!r} written again")
            shard = next(f for f in self.plan.files if f.name == file)
            writer = SafetensorsWriter(os.path.join(self.directory, file), shard)
            writer.open()
            self._writers[file] = writer
        return writer

    def finish_file(self, file: str) -> None:
        """Commit one file as soon as its tensors are written (frees its descriptor)."""
        writer = self._writers.pop(file, None)
        if writer is None:
            shard = next(f for f in self.plan.files if f.name == file)
            writer = SafetensorsWriter(os.path.join(self.directory, file), shard)
            writer.open()  # a file of empty tensors only
        writer.commit()
        self._done.add(file)

    def commit(self) -> None:
        for f in self.plan.files:
            if f.name not in self._done:
                self.finish_file(f.name)
        if self.plan.index_name is not None:
            path = os.path.join(self.directory, self.plan.index_name)
            tmp = path + ".ckpt-tmp"
            try:
                with open(tmp, "wb") as out:
                    out.write(self.plan.index_json())
                    out.flush()
                    os.fsync(out.fileno())
                os.replace(tmp, path)
            except OSError as e:
                raise StorageError.from_error(f"cannot write {path}", e) from None

    def abort(self) -> None:
        for writer in self._writers.values():
            writer.abort()
        self._writers.clear()
