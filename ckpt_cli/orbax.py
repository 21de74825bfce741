"""``ld1`` digests taken while Orbax saves: ``DigestingCheckpointManager``.

Imported only by a training loop that wants it (it imports jax and orbax; nothing of ckpt's
command line imports it). It wraps an ``ocp.CheckpointManager`` and keeps its API::

    mngr = DigestingCheckpointManager(ocp.CheckpointManager(path, options=options))
    mngr.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state)))
    mngr.wait_until_finished()   # the step's digest record is written here

How a step is digested (docs/how-to/verify.md, "Digests taken at save time"):

* In ``save``, once Orbax has accepted the step, every process takes host views of the
  shards it owns: each addressable shard of each ``jax.Array`` with ``replica_id == 0`` (a
  partition of the array across all processes), plus, on the primary process only, copies of
  the numpy, scalar and string leaves. On CPU devices a view is zero-copy and holds the
  device buffer (a train step that donates it gets a new buffer instead: measured with jax
  0.10); on an accelerator it is one device-to-host copy, taken before ``save`` returns.
* A background thread hashes the copies into ``ld1`` partials, one box per shard in global
  coordinates, while Orbax writes.
* When the step is finalized (``wait_until_finished``, the next ``save``, ``close``: calls
  every process makes, as Orbax requires), the processes exchange their partials over JAX's
  distributed runtime (``process_allgather``: no extra file, no shared file system race) and
  the primary process merges them, in any order, into each item's ``_CKPT_DIGESTS.json``:
  the format ``verify --record`` writes, each leaf with its ``ld1`` digest, and no file
  checksums (taking them would read the step again).

Items saved with ``StandardSave`` or ``PyTreeSave`` (alone or in ``ocp.args.Composite``) are
digested. Other items (``JsonSave``, a dataset iterator's state: no ``_METADATA``) are recorded
after the commit as ``verify --record`` records them, by the size and CRC-32 of their files
(read once more by the primary, up to ``SMALL_ITEM_BYTES``; a larger one is left without a
record).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from ckpt_cli._version import __version__
from ckpt_cli.core.digest.ld1 import (
    Partial,
    finish,
    merge,
    partial,
    partial_bytes,
)
from ckpt_cli.core.digest.ld1_fold import Fragments
from ckpt_cli.core.digest.records import (
    DIGEST_FILE,
    FILE_ALGORITHM,
    FORMAT_NAME,
    FORMAT_VERSION,
    LEAF_ALGORITHM_LD1,
)
from ckpt_cli.errors import CkptError

__all__ = ["DigestingCheckpointManager", "leaf_partials"]

#: Threads hashing a step's shards (beside Orbax's own writers).
HASH_THREADS = 2
#: The item name Orbax's manager gives a step saved without ``Composite``.
DEFAULT_ITEM = "default"
#: A box: (item, leaf name, global origin, host copy or string, global shape, dtype name).
Box = tuple[str, str, tuple[int, ...], Any, tuple[int, ...], str]


def _ocp() -> Any:
    import orbax.checkpoint as ocp  # type: ignore[import-untyped]

    return ocp


def _owned_boxes(item: str, tree: Any, primary: bool) -> list[Box]:
    """The host copies this process digests for one item (see the module docstring)."""
    import jax
    import numpy as np

    from ckpt_cli.core.digest.ld1 import dtype_name

    ocp = _ocp()
    names = jax.tree.leaves(ocp.tree.get_param_names(tree, include_empty_nodes=False))
    leaves = jax.tree.leaves(tree)
    if len(names) != len(leaves):
        raise CkptError("the tree's leaves and Orbax's names for them differ in number")
    boxes: list[Box] = []
    for name, leaf in zip(names, leaves, strict=True):
        if isinstance(leaf, jax.Array):
            dtype = dtype_name(leaf)
            for shard in leaf.addressable_shards:
                if shard.replica_id != 0:
                    continue
                origin = tuple(s.start or 0 for s in shard.index)
                # A host view of the shard: on CPU devices zero-copy and read-only, and it
                # pins the buffer (a donating train step cannot reuse it while it is hashed);
                # on an accelerator, the one device-to-host copy.
                host = np.asarray(shard.data)
                boxes.append((item, name, origin, host, tuple(leaf.shape), dtype))
        elif primary and isinstance(leaf, str):
            boxes.append((item, name, (), leaf, (), "string"))
        elif primary and isinstance(leaf, (np.ndarray, np.generic, int, float, bool, complex)):
            host = np.array(leaf, copy=True)
            boxes.append((item, name, (0,) * host.ndim, host, host.shape, dtype_name(host)))
    return boxes


def _box_partial(box: Box) -> Partial:
    _, _, origin, data, shape, dtype = box
    if isinstance(data, str):
        raw = data.encode()
        return partial_bytes(raw, 0, len(raw), dtype, shape)
    return partial(origin, data, shape, dtype)


def leaf_partials(boxes: list[Box], workers: int = 1) -> dict[str, dict[str, Partial]]:
    """Each item's leaves, the boxes of each leaf merged into one partial (``workers``
    threads: numpy releases the GIL on the large steps)."""
    from concurrent.futures import ThreadPoolExecutor

    if workers > 1 and len(boxes) > 1:
        with ThreadPoolExecutor(workers) as pool:
            parts = list(pool.map(_box_partial, boxes))
    else:
        parts = [_box_partial(b) for b in boxes]
    out: dict[str, dict[str, Partial]] = {}
    for (item, name, *_), p in zip(boxes, parts, strict=True):
        leaves = out.setdefault(item, {})
        leaves[name] = merge([leaves[name], p]) if name in leaves else p
    return out


def _partials_to_json(partials: dict[str, dict[str, Partial]]) -> bytes:
    doc = {
        item: {
            name: {
                "dtype": p.dtype,
                "shape": list(p.shape),
                "nbytes": p.nbytes,
                "lanes": [f"{p.lane1:016x}", f"{p.lane2:016x}"],
                "covered": p.covered,
                "fragments": [[int(v) for v in a.tolist()] for a in p.fragments],
            }
            for name, p in leaves.items()
        }
        for item, leaves in partials.items()
    }
    return json.dumps(doc, separators=(",", ":")).encode()


def _partials_from_json(raw: bytes) -> dict[str, dict[str, Partial]]:
    import numpy as np

    out: dict[str, dict[str, Partial]] = {}
    for item, leaves in json.loads(raw).items():
        out[item] = {}
        for name, d in leaves.items():
            u, w, m = (np.array(a, dtype=np.uint64) for a in d["fragments"])
            frags: Fragments = (u, w, m)
            lane1, lane2 = (int(x, 16) for x in d["lanes"])
            shape = tuple(d["shape"])
            p = Partial(d["dtype"], shape, d["nbytes"], lane1, lane2, d["covered"], frags)
            out[item][name] = p
    return out


def merge_processes(per_process: list[dict[str, dict[str, Partial]]]) -> dict[str, Any]:
    """Every process's partials of a step merged: item -> leaf -> (dtype, shape, ld1)."""
    gathered: dict[str, dict[str, list[Partial]]] = {}
    for partials in per_process:
        for item, leaves in partials.items():
            for name, p in leaves.items():
                gathered.setdefault(item, {}).setdefault(name, []).append(p)
    return {
        item: {name: _finished(parts) for name, parts in sorted(leaves.items())}
        for item, leaves in gathered.items()
    }


def _finished(parts: list[Partial]) -> tuple[str, tuple[int, ...], str]:
    whole = merge(parts)
    return whole.dtype, whole.shape, finish(whole)


#: A non-array item (JSON, a grain iterator's state) is recorded by its files' checksums when
#: they total at most this: read once more by the primary process after the commit.
SMALL_ITEM_BYTES = 16 << 20


def record_small_item(item: Any) -> Any:
    """Record an item ckpt does not digest while saving (no ``_METADATA``: a ``JsonSave``
    item, a dataset iterator's state) as ``verify --record`` does: the size and CRC-32 of each
    of its files, no leaves. None (nothing written) for an array item or a large one."""
    from ckpt_cli.core.digest.records import file_checksum, record_of, recorded_file, write_digests
    from ckpt_cli.core.format.names import TREE_METADATA

    rels = [rel for rel, entry in item.walk() if recorded_file(rel) and not entry.is_dir]
    if not rels or TREE_METADATA in rels:
        return None
    sums = {rel: file_checksum(item.child(*rel.split("/"))) for rel in rels}
    if sum(s.size for s in sums.values()) > SMALL_ITEM_BYTES:
        return None
    return write_digests(item, record_of({}, sums, ld1=True))


def record_json(leaves: dict[str, tuple[str, tuple[int, ...], str]]) -> dict[str, Any]:
    """An item's digest record: ``verify --record``'s format, each leaf with its ``ld1``."""
    return {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "tool": f"ckpt {__version__} (ckpt_cli.orbax, at save time)",
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "leaf_algorithm": LEAF_ALGORITHM_LD1,
        "file_algorithm": FILE_ALGORITHM,
        "leaves": {
            name: {"dtype": dtype, "shape": list(shape), "ld1": digest}
            for name, (dtype, shape, digest) in sorted(leaves.items())
        },
        "files": {},
    }


@dataclass
class _Pending:
    """A saved step whose shards are being hashed in the background."""

    step: int
    items: list[str]
    thread: threading.Thread | None = None
    result: dict[str, dict[str, Partial]] = field(default_factory=dict)
    error: BaseException | None = None

    def run(self, boxes: list[Box]) -> None:
        try:
            self.result = leaf_partials(boxes, workers=HASH_THREADS)
        except BaseException as e:  # raised again, in the caller's thread, by finalize
            self.error = e

    def join(self) -> dict[str, dict[str, Partial]]:
        if self.thread is not None:
            self.thread.join()
        if self.error is not None:
            raise self.error
        return self.result


def _saved_items(args: Any) -> list[tuple[str, Any]]:
    """(item name, pytree) of every item of ``args`` that ckpt digests."""
    ocp = _ocp()

    def tree_of(arg: Any) -> Any:
        if isinstance(arg, (ocp.args.StandardSave, ocp.args.PyTreeSave)):
            return arg.item
        return None

    if isinstance(args, ocp.args.Composite):
        found = [(str(name), tree_of(arg)) for name, arg in args.items()]
    else:
        found = [(DEFAULT_ITEM, tree_of(args))]
    return [(name, tree) for name, tree in found if tree is not None]


class DigestingCheckpointManager:
    """An ``ocp.CheckpointManager`` that records every saved step's ``ld1`` digests.

    Same ``save``/``restore``/``wait_until_finished``/``close`` (and every other attribute,
    passed through); use it as a context manager like Orbax's. ``on_record`` is called on
    the primary process with each record file written.
    """

    def __init__(self, manager: Any, on_record: Callable[[str], None] | None = None) -> None:
        self._manager = manager
        self._pending: _Pending | None = None
        self._on_record = on_record
        #: Bytes this process hashed for the latest save (its share of the step).
        self.digested_bytes = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._manager, name)

    def save(self, step: int, *call_args: Any, args: Any = None, **kwargs: Any) -> bool:
        import jax

        self._finalize()
        saved = bool(self._manager.save(step, *call_args, args=args, **kwargs))
        self.digested_bytes = 0
        if not saved or args is None:
            return saved
        primary = jax.process_index() == 0
        items = _saved_items(args)
        boxes = [b for name, tree in items for b in _owned_boxes(name, tree, primary)]
        self.digested_bytes = sum(getattr(b[3], "nbytes", 0) for b in boxes)
        pending = _Pending(step, [name for name, _ in items])
        pending.thread = threading.Thread(target=pending.run, args=(boxes,), daemon=True)
        pending.thread.start()
        self._pending = pending
        return saved

    def wait_until_finished(self) -> None:
        self._manager.wait_until_finished()
        self._finalize()

    def close(self) -> None:
        self.wait_until_finished()
        self._manager.close()

    def __enter__(self) -> DigestingCheckpointManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _finalize(self) -> None:
        """The pending step committed: gather every process's partials, record on primary."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        self._manager.wait_until_finished()
        mine = pending.join()
        per_process = _allgather(_partials_to_json(mine))
        import jax

        if jax.process_index() == 0:
            merged = merge_processes([_partials_from_json(raw) for raw in per_process])
            self._write_records(pending.step, merged)
        if jax.process_count() > 1:
            # Every process returns once the record exists (a `ckpt verify` run next finds it).
            from jax.experimental import multihost_utils

            multihost_utils.sync_global_devices(f"ckpt_ld1_record_{pending.step}")

    def _write_records(self, step: int, merged: dict[str, Any]) -> None:
        from ckpt_cli.core.format.resolve import resolve_items
        from ckpt_cli.core.storage import open_location

        refs = {ref.name: ref for ref in resolve_items(open_location(str(self.directory)), step)}
        for item, leaves in merged.items():
            ref = refs.get(item) or (next(iter(refs.values())) if len(refs) == 1 else None)
            if ref is None:
                continue
            doc = json.dumps(record_json(leaves), indent=1) + "\n"
            loc = ref.location.child(DIGEST_FILE)
            loc.write_bytes(doc.encode(), create_parents=False)
            if self._on_record is not None:
                self._on_record(str(loc))
        small = [record_small_item(ref.location) for n, ref in refs.items() if n not in merged]
        on_record = self._on_record
        for written in small:
            if written is not None and on_record is not None:
                on_record(str(written))


def _allgather(raw: bytes) -> list[bytes]:
    """Every process's bytes, in process order (this process's alone without distribution)."""
    import jax

    if jax.process_count() == 1:
        return [raw]
    import numpy as np
    from jax.experimental import multihost_utils

    sizes = multihost_utils.process_allgather(np.array([len(raw)], np.int64))
    longest = int(np.max(sizes))
    buf = np.zeros(longest, np.uint8)
    buf[: len(raw)] = np.frombuffer(raw, np.uint8)
    everyone = np.asarray(multihost_utils.process_allgather(buf)).reshape(-1, longest)
    counts = np.asarray(sizes).reshape(-1)
    return [everyone[i, : int(counts[i])].tobytes() for i in range(everyone.shape[0])]
