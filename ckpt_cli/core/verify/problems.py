"""What ``verify`` finds: problems with stable codes, per-item results and the whole report.

Codes never change meaning once released: CI jobs match on them. Each code has a default
severity; ``--strict`` turns warnings into errors and ``--fail-on-nonfinite`` does the same for
``nonfinite`` alone. Messages say what is wrong and what to do next.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal, TypedDict

Severity = Literal["error", "warning"]

#: code -> (default severity, one-line meaning). docs/verify.md documents the same table.
CODES: dict[str, tuple[Severity, str]] = {
    "json-invalid": ("error", "a JSON file is empty or does not parse"),
    "metadata-missing": ("error", "an item has no _METADATA (nor a JSON item file)"),
    "metadata-invalid": ("error", "a metadata file parses but lacks what Orbax writes"),
    "zarr-header-invalid": ("error", "an array's .zarray / zarr.json is invalid"),
    "array-size-implausible": (
        "error",
        "a zarr header claims a chunk larger than memory, or more chunks than bytes stored",
    ),
    "leaf-without-array": ("error", "a leaf of _METADATA has no array"),
    "array-without-leaf": ("error", "an array is stored that no leaf of _METADATA names"),
    "string-missing": ("error", "a string leaf has no value in _strings.json"),
    "shape-mismatch": ("error", "an array's shape disagrees with write_shape, sharding or digests"),
    "dtype-mismatch": ("error", "an array's dtype disagrees with the recorded digests"),
    "chunk-shape-mismatch": ("error", "zarr chunking disagrees with array_metadatas"),
    "chunk-missing": ("error", "a chunk of an array is not stored"),
    "chunk-unexpected": ("warning", "a chunk key lies outside the array's chunk grid"),
    "manifest-missing": ("error", "an OCDBT database has no manifest.ocdbt"),
    "ocdbt-crc": ("error", "an OCDBT manifest or tree node fails its CRC-32C or does not decode"),
    "ref-out-of-bounds": ("error", "an OCDBT reference points outside the checkpoint"),
    "data-file-missing": ("error", "a data file that is referenced or recorded does not exist"),
    "data-file-truncated": ("error", "a data file is shorter than its references or record"),
    "datafile-checksum-mismatch": ("error", "a file's size or checksum differs from the record"),
    "digest-mismatch": ("error", "a leaf's values differ from its recorded digest"),
    "digest-file-invalid": ("error", "the digest file is not in a format this ckpt reads"),
    "leaf-missing": ("error", "a leaf recorded in the digest file is gone"),
    "digest-incomplete": ("warning", "a leaf or file has no recorded digest"),
    "unknown-file": ("warning", "a file Orbax does not write"),
    "unreferenced-file": ("warning", "an OCDBT data file that no version references"),
    "symlink-outside": ("warning", "a symlink leads outside the checkpoint"),
    "tmp-dir": ("error", "an unfinished save (a *.orbax-checkpoint-tmp* directory)"),
    "uncommitted": (
        "error",
        "a step no reader configured like its writer restores (no commit marker, a null commit "
        "timestamp, a partial save, a deletion's leftover or an invalid deletion record)",
    ),
    "step-metadata-missing": ("warning", "a step has no _CHECKPOINT_METADATA"),
    "item-missing": ("error", "an item named in _CHECKPOINT_METADATA has no directory"),
    "nonfinite": ("warning", "a floating-point leaf holds NaN or Inf"),
    "decode-error": ("error", "a chunk cannot be read or decoded"),
    "unreadable": ("error", "a file or directory cannot be listed or read"),
    "safetensors-header-invalid": (
        "error",
        "a safetensors header is damaged, or its tensors do not tile the file (truncated?)",
    ),
    "index-invalid": ("error", "a *.safetensors.index.json does not parse or lists no tensor"),
    "index-mismatch": ("error", "a safetensors index and its shards disagree on a tensor"),
    "tensor-duplicated": ("error", "a tensor is in two safetensors files"),
    "shard-unlisted": ("warning", "a .safetensors file beside an index that the index omits"),
    "dtype-unsupported": ("warning", "a tensor's dtype is not decoded: its values were not read"),
}


class ProblemJSON(TypedDict):
    severity: Literal["error", "warning"]
    code: str
    leaf: str | None
    #: Every leaf the problem hurts (a data file holds chunks of many); ``leaf`` is the first.
    leaves: list[str]
    file: str | None
    message: str
    #: schema 8: the step of the checked root the problem is in (null: the root itself, or
    #: a path that is no step)
    step: int | None


@dataclass(frozen=True)
class Problem:
    """One finding: where it is (leaf and/or file, relative to the checked path) and what to do."""

    severity: Severity
    code: str
    message: str
    leaf: str | None = None
    file: str | None = None
    #: Every leaf it hurts when there are several (a data file holds chunks of many); ``leaf``
    #: is then the first of them.
    leaves: tuple[str, ...] = ()
    step: int | None = None  # the step it is in (``run`` sets it)

    def to_json(self) -> ProblemJSON:
        return {
            "severity": self.severity,
            "code": self.code,
            "leaf": self.leaf,
            "leaves": list(self.leaves) if self.leaves else ([self.leaf] if self.leaf else []),
            "file": self.file,
            "message": self.message,
            "step": self.step,
        }


def problem(
    code: str,
    message: str,
    *,
    leaf: str | None = None,
    file: str | None = None,
    leaves: tuple[str, ...] = (),
) -> Problem:
    """A problem with its code's default severity (``leaf``: the first of ``leaves``)."""
    return Problem(
        CODES[code][0], code, message, leaf or (leaves[0] if leaves else None), file, leaves
    )


def escalate(p: Problem, strict: bool, fail_on_nonfinite: bool) -> Problem:
    if p.severity == "warning" and (strict or (fail_on_nonfinite and p.code == "nonfinite")):
        return replace(p, severity="error")
    return p
