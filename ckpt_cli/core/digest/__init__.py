"""``digest``: one home for ckpt's digests.

- ``ld1`` (``ld1.py``, docs/reference/digest-spec.md): a digest of a leaf's values that depends
  on the values only, so a leaf resharded, rechunked, moved between zarr2 and zarr3 or in and out
  of OCDBT, or exported to safetensors keeps its digest; ``ld1_fold.py`` its fast word folding,
  ``ld1_threads.py`` one large block hashed in parts on the threads.
- ``records.py``: the digests ``verify --record`` and every writer record in an item
  (``_CKPT_DIGESTS.json``), checked later; ``carried.py`` the recorded ones a writer carries to
  its output; ``filesums.py`` file CRC-32s in byte ranges over workers, joined.
- This module: what ``ckpt digest`` reports (``DigestReport``, its JSON document); ``items.py``
  computes it for an Orbax item or step (a read operation), ``safetensors.py`` for safetensors
  files and ``digest_any`` for either (above the safetensors format).

The modules of this package sit at the layers of what they import (tests/test_architecture.py):
the digests themselves beside ``format``, the reading operations above the readers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal, TypedDict

from ckpt_cli.core.digest.ld1 import ALGORITHM

Source = Literal["orbax", "safetensors"]
DIGEST_BLOCK_BYTES = 32 << 20


class DigestLeafJSON(TypedDict):
    name: str
    dtype: str
    shape: list[int]
    digest: str | None
    problem: str | None


class DigestItemJSON(TypedDict):
    item: str
    path: str
    leaves: list[DigestLeafJSON]


class DigestJSON(TypedDict):
    """``ckpt digest --json``: every leaf's ``ld1`` digest, item by item."""

    schema_version: int
    ok: bool
    source: Source
    path: str
    step: int | None
    algorithm: str
    items: list[DigestItemJSON]


@dataclass(frozen=True)
class LeafDigest:
    """One leaf: its digest, or why there is none (a chunk that does not decode)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    digest: str | None
    problem: str | None = None

    def to_json(self) -> DigestLeafJSON:
        return {
            "name": self.name,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "digest": self.digest,
            "problem": self.problem,
        }


@dataclass(frozen=True)
class ItemDigests:
    name: str
    path: str
    leaves: tuple[LeafDigest, ...]

    def to_json(self) -> DigestItemJSON:
        return {"item": self.name, "path": self.path, "leaves": [x.to_json() for x in self.leaves]}


@dataclass(frozen=True)
class DigestReport:
    """What ``ckpt digest`` found: every leaf of every item it read."""

    SCHEMA_VERSION: ClassVar[int] = 1

    source: Source
    path: str
    step: int | None
    items: tuple[ItemDigests, ...]

    @property
    def problems(self) -> list[LeafDigest]:
        return [leaf for item in self.items for leaf in item.leaves if leaf.problem]

    def digests(self, item: str | None = None) -> dict[str, str | None]:
        """Leaf name -> ``ld1`` (None: unreadable) of ``item``, or of the only item (a step of
        several items names one)."""
        names = [i.name for i in self.items]
        if item is None and len(names) == 1:
            item = names[0]
        found = [i for i in self.items if i.name == item]
        if not found:
            raise KeyError(f"name one item of {self.path}: {', '.join(names) or 'none'}")
        return {leaf.name: leaf.digest for leaf in found[0].leaves}

    def to_json(self) -> DigestJSON:
        return {
            "schema_version": self.SCHEMA_VERSION,
            "ok": not self.problems,
            "source": self.source,
            "path": self.path,
            "step": self.step,
            "algorithm": ALGORITHM,
            "items": [item.to_json() for item in self.items],
        }


def block_budget(memory_limit: int) -> int:
    """Bytes per block read: a 16th of ``memory_limit``, between 1 and 32 MiB."""
    return max(1 << 20, min(DIGEST_BLOCK_BYTES, memory_limit // 16))


def sorted_leaves(leaves: dict[str, LeafDigest]) -> tuple[LeafDigest, ...]:
    return tuple(leaves[name] for name in sorted(leaves))
