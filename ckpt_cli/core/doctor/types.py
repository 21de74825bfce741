"""What ``ckpt doctor`` finds: one ``Finding`` per difference between a checkpoint and the state
it is to be restored into, and the ``Diagnosis`` that sums them up in a verdict.

A finding *blocks* when Orbax's restore into the target fails or returns arrays that do not match
the target (Orbax 0.12 raises on a structure mismatch and on a shape mismatch of a sharded
target, and silently returns the stored shape to an unsharded one); it does not block when Orbax
handles it on read (a dtype: Orbax casts while it restores). ``rules`` are the migrate rules that
close it, or empty when nothing closes it without guessing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, TypedDict

from ckpt_cli.core.schema import JSONValue

Verdict = Literal["restores", "restores-after-migrate", "restores-after-reshard", "cannot"]
Kind = Literal[
    "missing",
    "unexpected",
    "rename",
    "dtype",
    "transposed",
    "padded",
    "truncated",
    "reshaped",
    "stacked",
    "unstacked",
    "shape",
    "ambiguous",
    "key",
    "container",
    "topology",
]
Spec = tuple[tuple[int, ...] | None, str]
#: Leaves by name (Orbax's dotted names): (shape, dtype); dtype "string" for string leaves.
Leaves = dict[str, Spec]


class FindingJSON(TypedDict):
    kind: Kind
    stored: list[str]
    expected: list[str]
    message: str
    blocks: bool
    score: float | None
    rules: list[JSONValue]  # migrate rules, as a spec file holds them
    reshard: str | None  # the mesh to reshard to (a topology finding)


class HostMemoryJSON(TypedDict):
    host: int  # JAX's process_index: device i is on host i // (devices / hosts)
    devices: list[int]
    device_bytes: int  # sum over its devices of the shards each keeps (replicas counted)
    max_device_bytes: int
    kept_bytes: int  # the distinct shards it keeps (replicas on the host once)
    read_bytes: int  # what it reads given the stored chunking (boxes widened to chunks)
    read_amplification: float  # read_bytes / kept_bytes
    orbax_restore_peak_bytes: int  # predicted peak host RAM Orbax's restore adds on this host


class MemoryJSON(TypedDict):
    total_bytes: int
    arrays: int
    largest_array: str | None
    largest_array_bytes: int
    mesh: str | None  # the restore's mesh (--mesh), or None: the target's / the saved shardings
    max_device_bytes: int
    hosts: list[HostMemoryJSON]
    reshard_peak_bytes: int  # ckpt reshard to that mesh: predicted peak RSS of the process
    advice: str | None


class DiagnosisJSON(TypedDict):
    schema_version: int
    checkpoint: str
    step: int | None
    item: str
    target: str
    verdict: Verdict
    reason: str | None
    differences: list[FindingJSON]
    memory: MemoryJSON
    spec_checked: bool


@dataclass(frozen=True)
class Finding:
    """One difference: which stored and expected leaves, in words, and the rules that close it.
    ``score`` (0..1) says how sure a pairing is (renames, stacks); None where nothing is paired."""

    kind: Kind
    stored: tuple[str, ...]
    expected: tuple[str, ...]
    message: str
    blocks: bool = True
    score: float | None = None
    rules: tuple[dict[str, Any], ...] = ()
    reshard: str | None = None

    @property
    def fixable(self) -> bool:
        return bool(self.rules) or self.reshard is not None

    def to_json(self) -> FindingJSON:
        return {
            "kind": self.kind,
            "stored": list(self.stored),
            "expected": list(self.expected),
            "message": self.message,
            "blocks": self.blocks,
            "score": None if self.score is None else round(self.score, 3),
            "rules": [dict(r) for r in self.rules],
            "reshard": self.reshard,
        }


@dataclass(frozen=True)
class HostMemory:
    """One host of the restore: its devices, what they keep, what it reads, its predicted peak."""

    host: int
    devices: tuple[int, ...]
    device_bytes: int
    max_device_bytes: int
    kept_bytes: int
    read_bytes: int
    orbax_restore_peak_bytes: int

    @property
    def read_amplification(self) -> float:
        return self.read_bytes / self.kept_bytes if self.kept_bytes else 1.0

    def to_json(self) -> HostMemoryJSON:
        return {
            "host": self.host,
            "devices": list(self.devices),
            "device_bytes": self.device_bytes,
            "max_device_bytes": self.max_device_bytes,
            "kept_bytes": self.kept_bytes,
            "read_bytes": self.read_bytes,
            "read_amplification": round(self.read_amplification, 3),
            "orbax_restore_peak_bytes": self.orbax_restore_peak_bytes,
        }


#: Read amplification above which the preflight advises a reshard first.
AMPLIFICATION_ADVICE = 2.0


@dataclass(frozen=True)
class Memory:
    """The restore's preflight: every array's bytes, the largest single array, and per host
    (``hosts``, in JAX's device order) what its devices keep, what it reads given the stored
    chunking, and the predicted peak host RAM of Orbax's restore; ``reshard_peak_bytes`` is the
    predicted peak RSS of ``ckpt reshard`` to that mesh (the whole process, at its default
    ``--memory-limit``)."""

    total_bytes: int
    arrays: int
    largest_array: str | None
    largest_array_bytes: int
    mesh: str | None = None
    hosts: tuple[HostMemory, ...] = ()
    reshard_peak_bytes: int = 0

    @property
    def max_device_bytes(self) -> int:
        return max((h.max_device_bytes for h in self.hosts), default=0)

    @property
    def advice(self) -> str | None:
        worst = max(self.hosts, key=lambda h: h.read_amplification, default=None)
        if worst is None or worst.read_amplification <= AMPLIFICATION_ADVICE:
            return None
        return (
            f"reshard first: host {worst.host} reads {worst.read_amplification:.1f}x the bytes "
            "it keeps (stored chunks straddle its shards)"
        )

    def to_json(self) -> MemoryJSON:
        return {
            "total_bytes": self.total_bytes,
            "arrays": self.arrays,
            "largest_array": self.largest_array,
            "largest_array_bytes": self.largest_array_bytes,
            "mesh": self.mesh,
            "max_device_bytes": self.max_device_bytes,
            "hosts": [h.to_json() for h in self.hosts],
            "reshard_peak_bytes": self.reshard_peak_bytes,
            "advice": self.advice,
        }


@dataclass(frozen=True)
class Diagnosis:
    """The verdict on restoring ``checkpoint`` into ``target``, the findings behind it, and the
    spec (migrate rules) that closes every blocking finding it can; ``spec_checked`` says the
    rules were planned against the checkpoint and the result matched the target."""

    SCHEMA_VERSION = 2

    checkpoint: str
    step: int | None
    item: str
    target: str
    findings: tuple[Finding, ...]
    memory: Memory
    spec_checked: bool = False
    unresolved: tuple[str, ...] = field(default=())
    reshard_rules: str | None = field(default=None, compare=False)  # --write-spec's reshard file

    @property
    def verdict(self) -> Verdict:
        if self.reason is not None:
            return "cannot"
        if any(f.blocks and f.rules for f in self.findings):
            return "restores-after-migrate"
        if any(f.blocks and f.reshard for f in self.findings):
            return "restores-after-reshard"
        return "restores"

    @property
    def reason(self) -> str | None:
        """Why no spec makes the checkpoint restore into the target, or None."""
        stuck = [f for f in self.findings if f.blocks and not f.fixable]
        if stuck:
            more = f" (and {len(stuck) - 1} more)" if len(stuck) > 1 else ""
            return stuck[0].message + more
        if self.unresolved:
            return "the spec leaves a difference: " + self.unresolved[0]
        return None

    @property
    def reshard(self) -> str | None:
        """The mesh to reshard to before the restore, if the topology asks for one."""
        return next((f.reshard for f in self.findings if f.reshard), None)

    @property
    def rules(self) -> list[dict[str, Any]]:
        """The fix: every finding's rules, in the order migrate must apply them."""
        return [dict(r) for f in sorted(self.findings, key=order) for r in f.rules]

    def to_json(self) -> DiagnosisJSON:
        return {
            "schema_version": self.SCHEMA_VERSION,
            "checkpoint": self.checkpoint,
            "step": self.step,
            "item": self.item,
            "target": self.target,
            "verdict": self.verdict,
            "reason": self.reason,
            "differences": [f.to_json() for f in self.findings],
            "memory": self.memory.to_json(),
            "spec_checked": self.spec_checked,
        }


#: Renames first (later rules name leaves by their new names), then what reshapes, then adds,
#: drops and casts.
_ORDER = ("rename", "stacked", "unstacked", "transposed", "reshaped", "padded", "truncated")


def order(f: Finding) -> int:
    if f.kind in _ORDER:
        return _ORDER.index(f.kind)
    return {"missing": 10, "unexpected": 11, "dtype": 12}.get(f.kind, 20)
