"""The safetensors header: its model, its exact encoding, and a strict parser.

A file is an 8-byte little-endian header length ``N``, ``N`` bytes of UTF-8 JSON starting with
``{`` (padded with spaces so the byte buffer starts at a multiple of 8), then the byte buffer.
The JSON maps each tensor name to ``{"dtype", "shape", "data_offsets": [begin, end]}``, offsets
relative to the byte buffer, plus an optional ``__metadata__`` map of strings to strings. The
buffer must be covered exactly: tensors back to back from 0, no hole, no overlap, nothing after.

The encoder writes what the reference writer (huggingface/safetensors ``prepare``) writes:
compact JSON, ``__metadata__`` first, tensors in offset order, laid out by decreasing dtype
alignment then by name. The parser accepts what the reference reader accepts, and also refuses
duplicate names (the format forbids them; serde keeps the last one silently).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ckpt_cli.core.format.sizes import shape_problem
from ckpt_cli.core.safetensors.dtypes import BITS, RANK
from ckpt_cli.core.units import short_repr
from ckpt_cli.errors import InvalidSafetensorsError, RefusedError

LENGTH_BYTES = 8
#: The reference implementation refuses larger headers (``MAX_HEADER_SIZE``).
MAX_HEADER_BYTES = 100_000_000
METADATA_KEY = "__metadata__"
_HINT = "the file is damaged or not a safetensors file: export or download it again"


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of a file: where its bytes are, relative to the byte buffer."""

    name: str
    dtype: str  # safetensors name: F32, BF16, ...
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin

    @property
    def size(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class Header:
    """A parsed (or planned) header: tensors in offset order, and where the buffer starts."""

    tensors: tuple[TensorEntry, ...]
    metadata: Mapping[str, str] | None
    length: int  # N: the JSON bytes, padding included

    @property
    def data_start(self) -> int:
        return LENGTH_BYTES + self.length

    @property
    def data_size(self) -> int:
        return self.tensors[-1].end if self.tensors else 0

    @property
    def file_size(self) -> int:
        return self.data_start + self.data_size

    def entry(self, name: str) -> TensorEntry:
        for t in self.tensors:
            if t.name == name:
                return t
        raise KeyError(name)

    def by_name(self) -> dict[str, TensorEntry]:
        return {t.name: t for t in self.tensors}


def tensor_bytes(dtype: str, shape: Sequence[int]) -> int:
    bits = math.prod(shape) * BITS[dtype]
    return bits // 8


def layout(tensors: Iterable[tuple[str, str, tuple[int, ...]]]) -> tuple[TensorEntry, ...]:
    """Offsets for ``(name, dtype, shape)`` triples, in the reference writer's order."""
    ordered = sorted(tensors, key=lambda t: (-RANK[t[1]], t[0]))
    out, offset = [], 0
    for name, dtype, shape in ordered:
        n = tensor_bytes(dtype, shape)
        out.append(TensorEntry(name, dtype, tuple(shape), offset, offset + n))
        offset += n
    return tuple(out)


def encode_header(
    tensors: Sequence[TensorEntry], metadata: Mapping[str, str] | None = None
) -> bytes:
    """The length prefix and the padded JSON of a header, exactly as the reference writes it."""
    doc: dict[str, Any] = {}
    if metadata is not None:
        for k, v in metadata.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise RefusedError(
                    f"safetensors metadata must map strings to strings, got {k!r}: {v!r}"
                )
        doc[METADATA_KEY] = dict(sorted(metadata.items()))
    for t in tensors:
        if t.name == METADATA_KEY:
            raise RefusedError(
                f"a tensor may not be named {METADATA_KEY!r} (the format reserves it)"
            )
        if t.name in doc:
            raise RefusedError(f"two tensors are named {t.name!r}")
        doc[t.name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [t.begin, t.end]}
    try:
        raw = json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as e:
        raise RefusedError(f"a tensor name or metadata string is not valid Unicode: {e}") from None
    raw += b" " * (-len(raw) % LENGTH_BYTES)
    if len(raw) > MAX_HEADER_BYTES:
        raise RefusedError(
            f"the safetensors header would take {len(raw):,} bytes, over the format's limit of {MAX_HEADER_BYTES:,}",
            hint="export fewer tensors per file (--max-shard-size)",
        )
    return len(raw).to_bytes(LENGTH_BYTES, "little") + raw


def plan_header(
    tensors: Sequence[TensorEntry], metadata: Mapping[str, str] | None = None
) -> tuple[Header, bytes]:
    encoded = encode_header(tensors, metadata)
    return Header(tuple(tensors), metadata, len(encoded) - LENGTH_BYTES), encoded


def header_length(prefix: bytes, file_size: int, where: str) -> int:
    """``N`` from the first 8 bytes, checked against the limit and the file's size."""
    if file_size < LENGTH_BYTES or len(prefix) < LENGTH_BYTES:
        raise InvalidSafetensorsError(
            f"{where}: {file_size} bytes, too short for a safetensors header", hint=_HINT
        )
    n = int.from_bytes(prefix[:LENGTH_BYTES], "little")
    if n > MAX_HEADER_BYTES:
        raise InvalidSafetensorsError(
            f"{where}: header length {n:,} is over the format's limit of {MAX_HEADER_BYTES:,} bytes",
            hint=_HINT,
        )
    if LENGTH_BYTES + n > file_size:
        raise InvalidSafetensorsError(
            f"{where}: header length {n:,} runs past the end of the file ({file_size:,} bytes)",
            hint=_HINT,
        )
    return n


_Bad = Callable[[str], InvalidSafetensorsError]  # an error naming the file


def parse_header(raw: bytes, file_size: int, where: str) -> Header:
    """Parse and validate the JSON header ``raw`` (the ``N`` bytes after the length prefix)
    of a file of ``file_size`` bytes. Every defect is one ``InvalidSafetensorsError``."""

    def bad(message: str) -> InvalidSafetensorsError:
        return InvalidSafetensorsError(f"{where}: {message}", hint=_HINT)

    doc = _header_object(raw, bad)
    metadata = _metadata(doc, bad)
    entries = [_entry(name, info, bad) for name, info in doc.items()]
    entries.sort(key=lambda t: (t.begin, t.end))
    expected = _check_tensor_bytes(entries, bad)
    data_start = LENGTH_BYTES + len(raw)
    if data_start + expected > file_size:
        last = entries[-1].name if entries else "?"
        raise bad(
            f"offsets run past the end of the file: tensor {last!r} ends at byte {data_start + expected:,}, "
            f"the file has {file_size:,} (truncated?)"
        )
    if data_start + expected < file_size:
        raise bad(
            f"{file_size - data_start - expected:,} bytes after the last tensor belong to no tensor"
        )
    return Header(tuple(entries), metadata, len(raw))


def _header_object(raw: bytes, bad: _Bad) -> dict[str, Any]:
    """The header as a JSON object: UTF-8, valid JSON, no key twice."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise bad(f"header is not UTF-8 (byte {e.start})") from None
    if not text.startswith("{"):
        raise bad("header does not start with '{'")
    try:
        doc = json.loads(text, object_pairs_hook=_no_duplicates, parse_int=parse_json_int)
    except _DuplicateKey as e:
        raise bad(f"header names {e.key!r} twice") from None
    except (ValueError, RecursionError) as e:
        raise bad(
            f"header is not valid JSON: {getattr(e, 'msg', e)} at byte {getattr(e, 'pos', '?')}"
        ) from None
    if not isinstance(doc, dict):
        raise bad("header is not a JSON object")
    return doc


def _metadata(doc: dict[str, Any], bad: _Bad) -> dict[str, str] | None:
    """The ``__metadata__`` map, taken out of ``doc``: strings only."""
    metadata: dict[str, str] | None = doc.pop(METADATA_KEY, None)
    if metadata is not None:
        if not isinstance(metadata, dict):
            raise bad(f"{METADATA_KEY} is not a map of strings")
        for k, v in metadata.items():
            if not isinstance(v, str):
                raise bad(f"{METADATA_KEY} value of {k!r} is {_kind(v)}, not a string")
    return metadata


def _check_tensor_bytes(entries: list[TensorEntry], bad: _Bad) -> int:
    """The tensors (in offset order) tile the buffer, each exactly its dtype and shape's bytes;
    returns where the last one ends."""
    expected = 0
    for t in entries:
        if t.end < t.begin:
            raise bad(f"tensor {t.name!r} ends (offset {t.end}) before it begins ({t.begin})")
        if t.begin < expected:
            raise bad(
                f"tensor {t.name!r} overlaps the tensor before it (offset {t.begin} < {expected})"
            )
        if t.begin > expected:
            raise bad(
                f"bytes {expected}..{t.begin} of the buffer belong to no tensor (before {t.name!r})"
            )
        want_bits = t.size * BITS[t.dtype]
        if want_bits % 8:
            raise bad(
                f"tensor {t.name!r}: {t.dtype}{list(t.shape)} does not end on a byte boundary"
            )
        if t.nbytes != want_bits // 8:
            raise bad(
                f"tensor {t.name!r} holds {t.nbytes} bytes, but {t.dtype}{list(t.shape)} needs {want_bits // 8}"
            )
        expected = t.end
    return expected


def _entry(name: str, info: Any, bad: Any) -> TensorEntry:
    if not isinstance(info, dict):
        raise bad(f"entry {name!r} is {_kind(info)}, not a tensor description")
    for key in ("dtype", "shape", "data_offsets"):
        if key not in info:
            raise bad(f"tensor {name!r} has no {key!r}")
    dtype = info["dtype"]
    if not isinstance(dtype, str) or dtype not in BITS:
        raise bad(f"tensor {name!r} has unknown dtype {dtype!r}")
    shape, offsets = info["shape"], info["data_offsets"]
    if not isinstance(shape, list):
        raise bad(f"tensor {name!r}: shape is {_kind(shape)}, not a list of non-negative integers")
    if problem := shape_problem(shape):
        unopenable = bad(f"tensor {name!r}: shape: {problem}")
        if problem.startswith("rank") or "largest" in problem:
            # Possibly valid safetensors, but no Orbax checkpoint can hold such an array.
            unopenable.hint = (
                "the file may be valid safetensors, but no Orbax checkpoint can hold this tensor"
            )
        raise unopenable
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_natural(o) for o in offsets)):
        raise bad(f"tensor {name!r}: data_offsets {short_repr(offsets, 80)} is not [begin, end]")
    return TensorEntry(name, dtype, tuple(shape), offsets[0], offsets[1])


class LongNumber:
    """A JSON integer of more digits than any size can have, kept as its length: ``int()`` of
    over 4,300 digits raises inside ``json.loads``, and the message should name the field."""

    def __init__(self, digits: int) -> None:
        self.digits = digits

    def __repr__(self) -> str:
        return f"<a {self.digits}-digit number>"


def parse_json_int(text: str) -> int | LongNumber:
    """``json.loads``'s ``parse_int`` for outside input: 40 digits hold every u64 and more."""
    return int(text) if len(text) <= 40 else LongNumber(len(text.lstrip("-")))


def _natural(v: Any) -> bool:
    # The reference reads usize: bools, floats and negatives are refused; so is past u64.
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 64


def _kind(v: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(v), "null" if v is None else "a number"
    )


class _DuplicateKey(Exception):
    def __init__(self, key: str) -> None:
        self.key = key


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _DuplicateKey(k)
        out[k] = v
    return out
