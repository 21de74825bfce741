"""How a command's array work scales: one parameter object for the flags every command that
scales out takes (``--executor``, ``--workers``, ``--scheduler``, ``--force-split``,
``--unit-bytes``) and ``--threads``.

``ScaleOptions`` is built once from the command line (``from_flags``) and passed whole: the
command's run holds it (``commands/_context.Run.scale``), a writer's ``WriteOptions`` is built
from it (its ``executor`` and ``unit_bytes``, the fields the public API has always taken), and
verify's deep pass and trend take its executor and unit size (how such a read-only pass ran
is its report's ``Scale``). The memory limit is not part of it: every array command bounds its
memory (diff, digest, export and import too, which never scale out), and a writer checks it
against its chunk size (``WriteOptions``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TypedDict, cast

from ckpt_cli.core.executor import ExecutorSpec

#: ``--unit-bytes``: array bytes per unit of work when the work is split across workers.
DEFAULT_UNIT_BYTES = 256 << 20


@dataclass(frozen=True)
class ScaleOptions:
    """Where the work runs (``executor``: kind, workers, scheduler, whether to split even when
    it does not pay), how it is cut (``unit_bytes`` per unit of work) and how many threads this
    process decodes, hashes and encodes with (``threads``; None: as configured, see
    ``core/threads.py``)."""

    executor: ExecutorSpec = field(default_factory=ExecutorSpec)
    unit_bytes: int = DEFAULT_UNIT_BYTES
    threads: int | None = None

    @classmethod
    def from_flags(
        cls,
        executor: str = "local",
        workers: int = 1,
        scheduler: str | None = None,
        force_split: bool = False,
        unit_bytes: int = DEFAULT_UNIT_BYTES,
        threads: int | None = None,
    ) -> ScaleOptions:
        """The options of the command line's flags; a bad combination (``--scheduler`` without
        ``--executor dask``, ``--workers 0``) is a usage error."""
        return cls(ExecutorSpec(executor, workers, scheduler, force_split), unit_bytes, threads)

    @property
    def scaled(self) -> bool:
        """Whether the work is split into units run by workers (else: this process)."""
        return self.executor.scaled


class ReadScaleJSON(TypedDict):
    """How a read-only pass asked to scale out ran (``verify --deep``, ``trend``): split into
    units on the workers, or kept in one process (``split`` false, ``reason`` says why; no
    unit ran)."""

    executor: str
    workers: int
    units: int
    worker_seconds: float  # summed time inside units
    split: bool
    reason: str | None


@dataclass(frozen=True)
class Scale:
    """How a read-only pass asked to scale out ran (``ReadScaleJSON``)."""

    executor: str
    workers: int
    units: int = 0
    worker_seconds: float = 0.0
    split: bool = True
    reason: str | None = None

    def to_json(self) -> ReadScaleJSON:
        out = cast("ReadScaleJSON", asdict(self))  # the fields are the document's
        out["worker_seconds"] = round(self.worker_seconds, 3)
        return out
