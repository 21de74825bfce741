"""``ckpt verify`` of safetensors: a file, an index, or a Hugging Face folder of shards.

Structure (always): every file's header (valid JSON of at most the format's 100 MB, known
dtypes, tensors tiling the byte buffer exactly: offsets inside the file, no hole, no overlap,
each ``dtype size x shape`` bytes, nothing after the last), a Git LFS pointer named as such; the
index against the shards (every file it names exists, every tensor it places is in that file
and only there, every tensor of a shard is listed, no shard left out); ``config.json`` parses;
the ``ckpt.ld1`` map ckpt's ``export`` records in ``__metadata__`` decodes. ``--deep`` reads
every tensor block by block (at most ``options.budget`` bytes at once): NaN and Inf per float
tensor, and each tensor's ``ld1`` against the recorded one when the metadata holds it.

The result is a ``VerifyReport`` of kind ``safetensors``: one ``ItemCheck`` per file, problems
with the codes of ``problems.CODES``, naming the file and the tensor. Damage is a problem (exit
1); only a path that is no safetensors source raises (exit 3).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ckpt_cli.core.digest.ld1 import Partial, finish, merge, partial
from ckpt_cli.core.progress import ByteProgress, ProgressFn
from ckpt_cli.core.safetensors import ld1 as st_ld1
from ckpt_cli.core.safetensors.dtypes import numpy_dtype_name
from ckpt_cli.core.safetensors.header import TensorEntry
from ckpt_cli.core.safetensors.reader import SafetensorsReader
from ckpt_cli.core.safetensors.source import CONFIG, Located, lfs_pointer, locate
from ckpt_cli.core.verify.problems import Problem, escalate, problem
from ckpt_cli.core.verify.types import (
    ItemCheck,
    Level,
    NonFinite,
    VerifyOptions,
    VerifyReport,
)
from ckpt_cli.errors import CkptError, InvalidSafetensorsError, UsageError

_FLOATS = ("F", "BF")  # safetensors dtype names of floating-point types start so


def verify_safetensors(
    path: str, options: VerifyOptions, on_progress: ProgressFn | None = None
) -> VerifyReport:
    """Check a safetensors file, index or folder (see the module); damage is reported."""
    refuse_options(options)
    began = time.monotonic()
    check = _Check(locate(path))
    try:
        check.open_files()
        check.against_index()
        check.recorded_digests()
        if options.deep:
            check.read_tensors(options.budget, on_progress)
    finally:
        for reader in check.readers.values():
            reader.close()
    return check.report(options, time.monotonic() - began)


def refuse_options(options: VerifyOptions) -> None:
    """The options that apply to Orbax checkpoints only, refused by name."""
    given = [
        name
        for name, on in (
            (f"--step {options.step}", options.step is not None),
            ("--latest", options.latest),
            (f"--item {options.item}", options.item is not None),
            ("--record", options.record),
            ("--upgrade", options.upgrade),
            ("--sample", options.sample is not None),
            ("--mark-committed", options.mark_committed),
            ("--max-duration", options.max_duration is not None),
            ("--rotate", options.rotate),
        )
        if on
    ]
    if given:
        raise UsageError(
            f"{', '.join(given)} apply to Orbax checkpoints, not to safetensors files",
            hint="verify safetensors with --deep (and --strict, --fail-on-nonfinite, --json)",
        )


@dataclass
class _FileState:
    """What one file's check found (its problems live in ``_Check.problems``)."""

    tensors: tuple[str, ...] = ()
    digests: str = "none-in-metadata"
    recorded: dict[str, str] = field(default_factory=dict)
    nonfinite: list[NonFinite] = field(default_factory=list)
    bytes_decoded: int = 0
    tensors_read: int = 0


class _Check:
    """The working state of one check: the open files, what each holds, the problems."""

    def __init__(self, located: Located) -> None:
        self.located = located
        self.readers: dict[str, SafetensorsReader] = {}
        self.files: dict[str, _FileState] = {name: _FileState() for name in located.files}
        self.problems: list[Problem] = []

    def add(self, code: str, message: str, file: str | None, leaves: tuple[str, ...] = ()) -> None:
        self.problems.append(problem(code, message, file=file, leaves=leaves))

    def open_files(self) -> None:
        """Every file's header, validated against the file's size; a file that cannot be
        opened is a problem, and is not read further."""
        loc = self.located
        if loc.index_problem:
            self.add(
                "index-invalid", f"{loc.index_problem}: download or export it again", loc.index_name
            )
        if loc.config_problem:
            self.add(
                "json-invalid",
                f"{loc.config_problem}: transformers will not load the folder",
                CONFIG,
            )
        for name in loc.files:
            if name in loc.missing:
                self.files[name].digests = "missing"
                placed = tuple(
                    t for t, f in (loc.index.weight_map if loc.index else {}).items() if f == name
                )
                self.add(
                    "data-file-missing",
                    f"{loc.index_name} names {name}, which is not in {loc.directory}: download "
                    f"every shard the index lists (it holds {len(placed)} of its tensors)",
                    name,
                    placed,
                )
                continue
            self._open(name)
        for name in loc.unlisted:
            self.add(
                "shard-unlisted",
                f"{name} is not named by {loc.index_name}: loaders that follow the index never "
                "read it (left over from another save?)",
                name,
            )

    def _open(self, name: str) -> None:
        full = self.located.file_path(name)
        try:
            reader = SafetensorsReader.open(full)
        except InvalidSafetensorsError as e:
            self.files[name].digests = "unreadable"
            message = f"{e.message}: {e.hint}" if e.hint else e.message
            if lfs_pointer(full):
                message = f"{full} is a Git LFS pointer, not the weights: run `git lfs pull`"
            self.add("safetensors-header-invalid", message, name)
            return
        except CkptError as e:
            self.files[name].digests = "unreadable"
            self.add("unreadable", e.message, name)
            return
        self.readers[name] = reader
        self.files[name].tensors = tuple(t.name for t in reader.header.tensors)

    def against_index(self) -> None:
        """No tensor in two files; the index and the shards' headers agree."""
        where: dict[str, str] = {}
        for name, reader in self.readers.items():
            for t in reader.header.tensors:
                if t.name in where:
                    self.add(
                        "tensor-duplicated",
                        f"tensor {t.name!r} is in both {where[t.name]} and {name}: the shards "
                        "do not belong together; download them again",
                        name,
                        (t.name,),
                    )
                else:
                    where[t.name] = name
        index = self.located.index
        if index is None:
            return
        for tensor, file in index.weight_map.items():
            if file not in self.readers or where.get(tensor) == file:
                continue  # a missing or damaged shard is its own problem
            found = f"it is in {where[tensor]}" if tensor in where else "no file holds it"
            self.add(
                "index-mismatch",
                f"{self.located.index_name} puts tensor {tensor!r} in {file}, but {found}: the "
                "index and its shards do not belong together",
                file,
                (tensor,),
            )
        for tensor, file in where.items():
            if tensor not in index.weight_map:
                self.add(
                    "index-mismatch",
                    f"{file} holds tensor {tensor!r}, which {self.located.index_name} does not "
                    "list: loaders that follow the index never read it",
                    file,
                    (tensor,),
                )

    def recorded_digests(self) -> None:
        """The ``ckpt.ld1`` map of each file's metadata (written by ``ckpt export``)."""
        for name, reader in self.readers.items():
            state = self.files[name]
            try:
                recorded = st_ld1.decode(reader.header.metadata)
            except CkptError as e:
                self.add("digest-file-invalid", f"{name}: {e.message}", name)
                continue
            state.recorded = {k: v for k, v in recorded.items() if k in set(state.tensors)}
            state.digests = "in-metadata" if state.recorded else "none-in-metadata"

    def read_tensors(self, budget: int, on_progress: ProgressFn | None) -> None:
        """Every tensor of every readable file, block by block: NaN/Inf and ``ld1``."""
        total = sum(e.nbytes for r in self.readers.values() for e in r.header.tensors)
        on_bytes = ByteProgress(on_progress, "verify", total)
        for name, reader in self.readers.items():
            state = self.files[name]
            for entry in reader.header.tensors:
                self._read_tensor(name, reader, entry, budget, on_bytes)
            if state.digests == "in-metadata":
                state.digests = "checked"

    def _read_tensor(
        self,
        file: str,
        reader: SafetensorsReader,
        entry: TensorEntry,
        budget: int,
        on_bytes: ByteProgress,
    ) -> None:
        state, leaf = self.files[file], (entry.name,)
        try:
            dtype = numpy_dtype_name(entry.dtype, f"tensor {entry.name!r}")
        except CkptError:
            self.add(
                "dtype-unsupported",
                f"tensor {entry.name!r} in {file} is {entry.dtype}, which ckpt does not decode: "
                "its size was checked, its values were not",
                file,
                leaf,
            )
            return
        acc, nan, inf = Partial(dtype, entry.shape, entry.nbytes), 0, 0
        try:
            for (start, _), block in reader.blocks(entry.name, budget):
                acc = merge([acc, partial(start, block, entry.shape, dtype)])
                if entry.dtype.startswith(_FLOATS):
                    n, i = count_nonfinite(block)
                    nan, inf = nan + n, inf + i
                state.bytes_decoded += int(block.nbytes)
                on_bytes(int(block.nbytes))
        except CkptError as e:
            self.add("decode-error", f"tensor {entry.name!r} in {file}: {e.message}", file, leaf)
            return
        state.tensors_read += 1
        if nan or inf:
            state.nonfinite.append(NonFinite(entry.name, nan, inf))
            self.add(
                "nonfinite",
                f"tensor {entry.name!r} in {file} holds {nan} NaN and {inf} Inf of {entry.size} "
                "values: these weights came from a diverged run",
                file,
                leaf,
            )
        self._compare_digest(file, entry.name, finish(acc))

    def _compare_digest(self, file: str, tensor: str, digest: str) -> None:
        state = self.files[file]
        if not state.recorded:
            return
        want = state.recorded.get(tensor)
        if want is None or want == st_ld1.PENDING:
            self.add(
                "digest-incomplete",
                f"tensor {tensor!r} in {file} has no ld1 digest in the metadata's "
                f"{st_ld1.LD1_KEY}: its values were read but not checked",
                file,
                (tensor,),
            )
        elif want != digest:
            self.add(
                "digest-mismatch",
                f"tensor {tensor!r} in {file}: the values differ from the ld1 digest ckpt export "
                f"recorded ({want}, read {digest}): the file changed after export; export it again",
                file,
                (tensor,),
            )

    def report(self, options: VerifyOptions, elapsed: float) -> VerifyReport:
        problems = tuple(
            escalate(p, options.strict, options.fail_on_nonfinite) for p in self.problems
        )
        items = tuple(
            ItemCheck(
                path=name,
                step=None,
                name=name,
                kind="safetensors",
                leaves=state.tensors,
                arrays=len(state.tensors),
                chunks=0,
                files=1,
                digests=state.digests,
                problems=tuple(p for p in problems if p.file == name),
                nonfinite=tuple(state.nonfinite),
                bytes_decoded=state.bytes_decoded,
                chunks_decoded=state.tensors_read,
            )
            for name, state in self.files.items()
        )
        level: Level = "deep" if options.deep else "structure"
        return VerifyReport(
            self.located.path, "safetensors", level, items, problems, elapsed_s=elapsed
        )


def count_nonfinite(block: object) -> tuple[int, int]:
    """NaN and Inf in a block of floats (float16, bfloat16 and float8 widened to float32)."""
    import numpy as np

    x = np.asarray(block)
    if x.dtype.itemsize < 4:
        x = x.astype(np.float32)
    nan = int(np.isnan(x).sum())
    return nan, int(x.size - np.isfinite(x).sum()) - nan
