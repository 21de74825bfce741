"""Write Orbax-restorable items, streaming block by block with bounded memory.

The output is what Orbax 0.12 itself writes for a single-process save, except that the arrays go
straight into one OCDBT database at the item root (no ``ocdbt.process_N/`` to merge): Orbax reads
an item through ``ocdbt`` over the item directory either way. Metadata files (``_METADATA``,
``_sharding``, ``array_metadatas/process_0``, ``_strings.json``) follow FORMAT.md. Steps are
written by ``step.StepWriter``; what a leaf is made of is in ``types.py``.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ckpt_cli.core.digest.records import BlockDigests
from ckpt_cli.core.format.names import COMMIT_MARKER, TREE_METADATA, array_prefix, unsafe_as_path
from ckpt_cli.core.format.sharding import sharding_json
from ckpt_cli.core.storage import Location
from ckpt_cli.core.write.pipeline import Pipeline, block_budget, leaf_regions
from ckpt_cli.core.write.types import ArrayOut, LeafOut, Region
from ckpt_cli.errors import RefusedError

if TYPE_CHECKING:
    from ckpt_cli.core.storage.writeback import Writeback

STANDARD_HANDLER = (
    "orbax.checkpoint._src.handlers.standard_checkpoint_handler.StandardCheckpointHandler"
)
JSON_HANDLER = "orbax.checkpoint._src.handlers.json_checkpoint_handler.JsonCheckpointHandler"
ARRAY_HANDLER = "orbax.checkpoint._src.handlers.array_checkpoint_handler.ArrayCheckpointHandler"
#: The handler Orbax records for an item of each kind ``inspect`` tells (``ItemReport.kind``).
HANDLERS = {"pytree": STANDARD_HANDLER, "array": ARRAY_HANDLER, "json": JSON_HANDLER}
# Orbax's own OCDBT settings for checkpoints (tensorstore_utils._add_ocdbt_write_options).
OCDBT_CONFIG = {
    "max_inline_value_bytes": 1024,
    "max_decoded_node_bytes": 100000000,
    "manifest_kind": "single",
}

#: Bytes of chunks an OCDBT data file collects before TensorStore writes it (the ocdbt
#: kvstore's ``target_data_file_size``; Orbax's ``ocdbt_target_data_file_size``). Without one,
#: TensorStore keeps one data file write in flight per database and queues every chunk encoded
#: meanwhile behind it; with one, a file that reaches it is written while the one before still
#: is. TensorStore alone writing 6 GiB of zstd chunks on the 13-core host: 0.61 GiB/s with
#: none, 0.71 with 64 MiB, 0.61 with 16 MiB (more, smaller files); 2 cores: 0.20-0.32 -> 0.42-0.45.
DATA_FILE_BYTES = 64 << 20


def writer_context(*, sync_each_write: bool = False) -> Any:
    """Encoding on this process's threads; no cache: the writer's blocks are written once.
    No ``fsync`` after each of TensorStore's writes (``file_io_sync``): each OCDBT commit would
    wait for the disk, hundreds of times for a large model, one at a time. ``StepWriter.commit``
    syncs the step's files and directories once (``Location.sync_tree``), before its marker.
    TensorStore alone writing 1 GiB of zstd chunks on 2 cores: 0.37-0.45 GiB/s with a sync per
    write, 1.07-1.09 without. ``sync_each_write``: a worker process that may run on another
    host (``distributed``), whose unsynced writes the driver's sync would not reach."""
    from ckpt_cli.core.threads import WRITE_FILE_IO, ts_context

    return ts_context(
        file_io=WRITE_FILE_IO, file_io_sync=sync_each_write, cache_pool={"total_bytes_limit": 0}
    )


class ItemWriter:
    """Writes one item directory: arrays streamed under a memory budget, then its metadata."""

    def __init__(
        self,
        dest: Location,
        *,
        use_ocdbt: bool,
        use_zarr3: bool,
        memory_limit: int,
        in_flight: int = 8,
        database: str | None = None,
        assume_metadata: bool = False,
        sync_each_write: bool = False,
        slab_reads: bool = True,
        finite_label: str | None = None,
    ) -> None:
        self.dest = dest
        #: Refuse NaN/Inf in a floating-point leaf's values (``NonFiniteError``), naming the
        #: source as this says (``step 5 of ROOT``); None: write whatever the values are.
        self.finite_label = finite_label
        #: A sub-database (``ocdbt.process_<id>``) to write chunks into, merged later; its
        #: arrays are opened with the metadata the driver already stored (``assume_metadata``).
        self.database = database
        self.assume_metadata = assume_metadata
        self.use_ocdbt = use_ocdbt
        self.use_zarr3 = use_zarr3
        self.memory_limit = memory_limit
        self.in_flight = in_flight
        #: Blocks larger than a slab read from their source slab by slab (``pipeline.py``).
        self.slab_reads = slab_reads
        #: TensorStore syncs each write (``writer_context``): a worker process whose writes
        #: the driver's sync at the commit does not reach; no write-back hints then.
        self.sync_each_write = sync_each_write
        self.context = writer_context(sync_each_write=sync_each_write)

    def _kvstore(self, name: str) -> dict[str, Any]:
        base = (self.dest.child(self.database) if self.database else self.dest).kvstore_spec()
        # The leaf's key prefix as Orbax's TensorStore makes it (``''`` at the top, ``a/``);
        # plans refuse names that cannot be directories before any plain item is written.
        path = array_prefix(name)
        if self.use_ocdbt:
            return {
                "driver": "ocdbt",
                "base": base,
                "config": OCDBT_CONFIG,
                "path": path,
                "target_data_file_size": DATA_FILE_BYTES,
            }
        if why := unsafe_as_path(name):
            raise RefusedError(f"leaf {name!r} cannot be stored without OCDBT: {why}")
        return {**base, "path": base["path"] + path}

    def open_array(self, leaf: LeafOut) -> Any:
        import tensorstore as ts

        assert leaf.array is not None
        spec = {
            "driver": "zarr3" if leaf.array.zarr3 else "zarr",
            "kvstore": self._kvstore(leaf.name),
            "metadata": leaf.array.metadata(),
            # As Orbax: every chunk is stored, so a missing chunk always means damage.
            "store_data_equal_to_fill_value": True,
        }
        if self.assume_metadata:
            return ts.open(spec, open=True, assume_metadata=True, context=self.context)
        return ts.open(spec, create=True, open=False, context=self.context)

    def write_arrays(
        self,
        leaves: Sequence[LeafOut],
        on_bytes: Callable[[int], None] | None = None,
        expect: Mapping[str, str] | BlockDigests | None = None,
    ) -> BlockDigests:
        """Create every array leaf and fill it from its source, all leaves in one pipeline.

        Blocks are chunk-aligned in the output (whole chunks, several when small). Reads of
        upcoming blocks and writes of finished ones overlap as TensorStore futures; the bytes of
        blocks held at once stay under half the memory limit (TensorStore's cache gets a quarter).
        ``expect``: leaf name -> ``ld1`` the written values must have (``SourceDigestError``),
        or the ``BlockDigests`` to take; returns the digests taken.
        """
        arrays = [leaf for leaf in leaves if leaf.array is not None and leaf.source is not None]
        budget = block_budget(self.memory_limit, self.in_flight)
        jobs = [(leaf, leaf_regions(leaf, budget)) for leaf in arrays]
        return self.write_regions(jobs, on_bytes, expect)

    def write_regions(
        self,
        jobs: Sequence[tuple[LeafOut, Iterable[Region]]],
        on_bytes: Callable[[int], None] | None = None,
        expect: Mapping[str, str] | BlockDigests | None = None,
    ) -> BlockDigests:
        """Fill the given chunk-aligned regions of each leaf from its source (the arrays exist,
        or are created here unless ``assume_metadata``), all in one pipeline."""
        from ckpt_cli.core.storage.writeback import writeback_for

        # The kernel writes the finished files back as the write goes: the step's one sync
        # before its marker (``writer_context``) then has little left to wait for.
        writeback = None if self.sync_each_write else writeback_for(self.dest)
        pipe = Pipeline(self, list(jobs), _feeding(writeback, on_bytes), expect)
        try:
            pipe.run()
            return pipe.digests
        except BaseException:
            pipe.drain_quietly()
            raise
        finally:
            if writeback is not None:
                writeback.close()
            self.dest.refresh()  # TensorStore wrote objects that a cached listing does not know

    def write_metadata(self, leaves: Sequence[LeafOut], custom_metadata: Any = None) -> None:
        tree: dict[str, Any] = {}
        shardings: dict[str, str] = {}
        array_metas = []
        strings: dict[str, str] = {}
        for leaf in leaves:
            tree[str(tuple(leaf.keypath))] = _tree_entry(leaf)
            if leaf.string_value is not None:
                strings[leaf.name] = leaf.string_value
            if leaf.value_type == "jax.Array" and leaf.array is not None:
                if leaf.sharding is not None:
                    key = base64.urlsafe_b64encode(leaf.name.encode()).decode()
                    shardings[key] = json.dumps(sharding_json(leaf.sharding))
                array_metas.append({"array_metadata": _array_metadata(leaf, leaf.array)})
        files = [
            (
                self.dest.child(TREE_METADATA),
                json.dumps(
                    {
                        "tree_metadata": tree,
                        "use_ocdbt": self.use_ocdbt,
                        "use_zarr3": self.use_zarr3,
                        "store_array_data_equal_to_fill_value": True,
                        "custom_metadata": custom_metadata,
                    }
                ).encode(),
            )
        ]
        if shardings:
            files.append((self.dest.child("_sharding"), json.dumps(shardings).encode()))
        if array_metas:
            files.append(
                (
                    self.dest.child("array_metadatas", "process_0"),
                    json.dumps({"array_metadatas": array_metas}).encode(),
                )
            )
        if strings:
            files.append((self.dest.child("_strings.json"), json.dumps(strings).encode()))
        # Together (object stores: one round of requests), then the marker, after all of them.
        self.dest.write_many(files)
        self.dest.child(COMMIT_MARKER).write_bytes(
            f"Checkpoint commit was successful to {self.dest}".encode()
        )


def _feeding(
    writeback: Writeback | None, on_bytes: Callable[[int], None] | None
) -> Callable[[int], None] | None:
    """``on_bytes`` that also tells ``writeback`` of the bytes written."""
    if writeback is None:
        return on_bytes

    def fed(nbytes: int) -> None:
        writeback.wrote(nbytes)
        if on_bytes is not None:
            on_bytes(nbytes)

    return fed


def _tree_entry(leaf: LeafOut) -> dict[str, Any]:
    """The leaf's entry in ``_METADATA``: its keypath and what its value is."""
    value: dict[str, Any] = {
        "value_type": leaf.value_type,
        "skip_deserialize": leaf.array is None and leaf.string_value is None,
    }
    if leaf.value_type == "jax.Array" and leaf.write_shape is not None:
        value["write_shape"] = list(leaf.write_shape)
    return {
        "key_metadata": [
            {"key": k, "key_type": t} for k, t in zip(leaf.keypath, leaf.key_types, strict=True)
        ],
        "value_metadata": value,
    }


def _array_metadata(leaf: LeafOut, array: ArrayOut) -> dict[str, Any]:
    """The leaf's entry in ``array_metadatas``: how it was written."""
    return {
        "param_name": leaf.name,
        "write_shape": list(leaf.write_shape or array.chunk_shape),
        "chunk_shape": list(array.chunk_shape),
        "ext_metadata": leaf.ext_metadata,
    }
