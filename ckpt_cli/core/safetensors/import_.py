"""Plan and run ``ckpt import``: safetensors files into a new Orbax step that Orbax restores.

``plan_import`` reads only headers: every file is validated (a damaged one is refused before
anything is written), tensor names become tree paths (``model.layers.0.weight`` ->
``model/layers/0/weight``), a migrate spec maps names and shapes (the rule language,
``core/spec/``), and ``--mesh``/``--rules`` give each array the partition spec, chunking and recorded sharding
``reshard`` would. ``execute`` streams: the step writer asks for chunk-aligned regions, each read
from its file with one positioned read per contiguous run, under the memory limit.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypedDict

from ckpt_cli.core.format.dtypes import dtype_itemsize
from ckpt_cli.core.format.sharding import (
    MeshSpec,
    Shape,
    ShardingInfo,
    ShardingJSON,
)
from ckpt_cli.core.reshard.rules import Rule
from ckpt_cli.core.safetensors.dtypes import TO_NUMPY
from ckpt_cli.core.safetensors.placement import place
from ckpt_cli.core.safetensors.reader import SafetensorsReader, check_against_index, find_files
from ckpt_cli.core.safetensors.tensor_source import TensorSource
from ckpt_cli.core.safetensors.tree import (
    ITEM_KEY,
    STEP_KEY,
    TREE_KEY,
    Containers,
    Node,
    parse_tree,
)
from ckpt_cli.core.spec import ops
from ckpt_cli.core.spec.language import MigrationSpec
from ckpt_cli.core.spec.tree import (
    OperationJSON,
    Step,
    Work,
    check_written_leaves,
    fill_key_types,
    key_types,
)
from ckpt_cli.core.storage.options import StorageOptions
from ckpt_cli.core.write.types import WriteOptions
from ckpt_cli.errors import RefusedError, UsageError

#: How import writes unless told: a file streams at disk speed, so smaller chunks and fewer bytes
#: in flight than a rewrite's (``ckpt import``'s defaults, --max-chunk-bytes and --memory-limit).
IMPORT_WRITE = WriteOptions(max_chunk_bytes=16 << 20, memory_limit=256 << 20)


class ImportSourceJSON(TypedDict):
    path: str
    files: list[str]
    index: str | None
    metadata: dict[str, str]


class ImportOutputJSON(TypedDict):
    root: str
    step: int
    item: str


# "from" is a keyword: the functional form.
ImportLeafJSON = TypedDict(
    "ImportLeafJSON",
    {
        "name": str,
        "value_type": str,
        "dtype": str,
        "shape": Shape,
        "bytes": int,
        "from": list[str],
        "operations": list[OperationJSON],
        "chunk_shape": Shape,
        "sharding": ShardingJSON,
        "mesh_rule": str | None,
    },
)


class EmptyNodeJSON(TypedDict):
    name: str
    value_type: str


class ImportTreeJSON(TypedDict):
    """Where the container kinds of the written tree come from (``target``: --target;
    ``ckpt.tree``: the files' metadata, written by ``ckpt export``; ``names``: the tensor names
    alone, every container a dict), and the empty nodes written (None, optax.EmptyState(), {})."""

    containers: str
    empty: list[EmptyNodeJSON]


class ImportPlanJSON(TypedDict):
    """The plan alone, as ``--dry-run`` prints it; ``ImportJSON`` adds what was written."""

    schema_version: int
    ok: bool
    source: ImportSourceJSON
    output: ImportOutputJSON
    spec: str | None
    mesh: dict[str, int] | None
    total_bytes: int
    leaves: list[ImportLeafJSON]
    tree: ImportTreeJSON
    dropped: list[str]
    unused_rules: list[str]


@dataclass(frozen=True)
class ImportLeaf:
    name: str
    keypath: tuple[str, ...]
    key_types: tuple[int, ...]
    value_type: str
    expr: ops.Node
    sources: tuple[str, ...]
    steps: tuple[Step, ...]
    partition: tuple[Any, ...] | None
    sharding: ShardingInfo
    chunk_shape: tuple[int, ...]
    write_shape: tuple[int, ...]
    rule: str | None

    @property
    def nbytes(self) -> int:
        return math.prod(self.expr.shape) * dtype_itemsize(self.expr.dtype)

    def to_json(self) -> ImportLeafJSON:
        return {
            "name": self.name,
            "value_type": self.value_type,
            "dtype": self.expr.dtype,
            "shape": list(self.expr.shape),
            "bytes": self.nbytes,
            "from": list(self.sources),
            "operations": [s.to_json() for s in self.steps],
            "chunk_shape": list(self.chunk_shape),
            "sharding": self.sharding.to_json(),
            "mesh_rule": self.rule,
        }


@dataclass(frozen=True)
class ImportPlan:
    source: str
    files: tuple[str, ...]
    index: str | None
    source_metadata: dict[str, str]
    dst: str
    step: int
    leaves: tuple[ImportLeaf, ...]
    dropped: tuple[str, ...]
    spec: MigrationSpec | None
    unused_rules: tuple[str, ...]
    mesh: MeshSpec | None
    write: WriteOptions = IMPORT_WRITE
    #: How to reach ``dst`` on an object store (None: this process's environment).
    storage: StorageOptions | None = None
    #: The empty nodes written (no data), and where the container kinds come from.
    empties: tuple[Node, ...] = ()
    containers: str = "names"
    #: The item written: ``--item``, else the one ``ckpt export`` recorded, else ``default``.
    item: str = "default"

    kind = "import"
    SCHEMA_VERSION: ClassVar[int] = 2  # 2: leaves' value_type, tree

    @property
    def total_bytes(self) -> int:
        return sum(leaf.nbytes for leaf in self.leaves)

    def to_json(self) -> ImportPlanJSON:
        return {
            "schema_version": self.SCHEMA_VERSION,
            "ok": True,
            "source": {
                "path": self.source,
                "files": list(self.files),
                "index": self.index,
                "metadata": self.source_metadata,
            },
            "output": {"root": self.dst, "step": self.step, "item": self.item},
            "spec": self.spec.path if self.spec else None,
            "mesh": dict(zip(self.mesh.axis_names, self.mesh.shape, strict=True))
            if self.mesh
            else None,
            "total_bytes": self.total_bytes,
            "leaves": [leaf.to_json() for leaf in self.leaves],
            "tree": {
                "containers": self.containers,
                "empty": [{"name": n.name, "value_type": n.value_type} for n in self.empties],
            },
            "dropped": list(self.dropped),
            "unused_rules": list(self.unused_rules),
        }


def source_work(src: str) -> tuple[Any, list[Work], dict[str, str], Containers | None]:
    """The validated files of ``src``, one leaf per tensor (``None`` expression for dtypes
    ckpt does not convert: a spec may still drop them), the files' metadata and the containers
    ``ckpt.tree`` records (None: not written by ``ckpt export``)."""
    files = find_files(src)
    headers = {}
    metadata: dict[str, str] = {}
    for name in files.files:
        with SafetensorsReader.open(os.path.join(files.directory, name)) as r:
            headers[name] = r.header
            metadata = dict(metadata or r.header.metadata or {})
    where = check_against_index(files, headers)
    text = metadata.pop(TREE_KEY, None)
    containers = parse_tree(text) if text is not None else None
    recorded = containers.tensors if containers else {}
    work = []
    for tensor in sorted(where):
        entry = headers[where[tensor]].entry(tensor)
        keypath = tuple(tensor.split("."))
        if any(not part for part in keypath):
            raise RefusedError(
                f"tensor {tensor!r} has an empty name part: it cannot be a tree path",
                hint="rename it with a spec rule (`op: rename`)",
            )
        dtype = TO_NUMPY.get(entry.dtype)
        path = os.path.join(files.directory, where[tensor])
        expr = (
            TensorSource(shape=entry.shape, dtype=dtype, path=path, tensor=tensor)
            if dtype
            else None
        )
        value_type = "jax.Array" if dtype else f"safetensors {entry.dtype}"
        types: tuple[int | None, ...] = (None,) * len(keypath)
        if (node := recorded.get(tensor)) is not None:
            keypath, types = node.keypath, node.key_types
            value_type = node.value_type if dtype else value_type
        work.append(Work(keypath, types, value_type, expr, (tensor,), None, tensor))
    return files, work, metadata, containers


def plan_import(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    spec: str | MigrationSpec | None = None,
    mesh: str | MeshSpec | None = None,
    rules: str | Mapping[str, Any] | Sequence[Rule] | None = None,
    step: int | None = None,
    target: str | None = None,
    allow_unused: bool = False,
    write: WriteOptions | None = None,
    storage: StorageOptions | None = None,
    item: str | None = None,
) -> ImportPlan:
    """Plan importing ``src`` (a .safetensors file, an index, or a directory holding either)
    as step ``step`` of the root ``dst`` (default: the step ``ckpt export`` recorded,
    ``ckpt.step``, else 0), into the item ``item`` (default: the item name
    ``ckpt export`` recorded in the files, ``ckpt.item``, else ``default``). ``spec`` (a file or a parsed migrate spec) maps the
    tensors first; ``mesh`` (``data=4,model=2``) with ``rules`` (a YAML/JSON file or a mapping
    of leaf patterns to partition specs) lays them out as ``reshard`` does; ``target``
    (MODULE:FUNCTION, imports jax) checks the result; ``storage`` says how to reach ``dst`` on
    an object store (``--s3-endpoint``; default: the environment). Reads the headers only."""
    from ckpt_cli.core.reshard.rules import load_rules, parse_rules
    from ckpt_cli.core.spec.language import load_spec

    write = write or IMPORT_WRITE
    parsed = load_spec(spec) if isinstance(spec, str) else spec
    target_mesh = MeshSpec.parse(mesh) if isinstance(mesh, str) else mesh
    rule_list: Sequence[Rule] = ()
    if rules is not None and not (isinstance(rules, Sequence) and not isinstance(rules, str)):
        if target_mesh is None:
            raise UsageError("--rules needs --mesh: the mesh its partition specs name")
        doc = load_rules(rules) if isinstance(rules, str) else rules
        rule_list = parse_rules(doc, target_mesh, rules if isinstance(rules, str) else "rules")
    elif rules is not None:
        rule_list = rules
    plan = _plan(
        os.fspath(src), os.fspath(dst), parsed, target_mesh, rule_list, step or 0,
        write, allow_unused,
    )  # fmt: skip
    if step is None:
        plan = dataclasses.replace(plan, step=_recorded_step(plan.source_metadata))
    name = item if item is not None else plan.source_metadata.get(ITEM_KEY) or "default"
    what = "--item" if item is not None else f"the item name {ITEM_KEY} of {src}"
    check_item_name(name, what, usage=item is not None)
    plan = dataclasses.replace(plan, write=write, storage=storage, item=name)
    if target:
        plan = apply_target(plan, target)
    return plan


def _recorded_step(metadata: Mapping[str, str]) -> int:
    """The step ``ckpt export`` recorded (``ckpt.step``), so that a round trip lands on the
    step it came from; 0 for files from elsewhere (or a value that is no step number)."""
    recorded = metadata.get(STEP_KEY, "")
    return int(recorded) if recorded.isdigit() else 0


def _named(names: Sequence[str], what: str = "leaves") -> str:
    """What the leaves are called, for a hint about patterns that matched none (a dry run
    refuses too, so it cannot list them)."""
    shown = ", ".join(repr(n) for n in names[:3])
    more = f" and {len(names) - 3} more" if len(names) > 3 else ""
    return f"the {what} are named {shown}{more}" if names else f"there are no {what}"


def _plan(
    src: str,
    dst: str,
    spec: MigrationSpec | None,
    mesh: MeshSpec | None,
    rules: Sequence[Rule],
    step: int,
    write: WriteOptions,
    allow_unused: bool,
) -> ImportPlan:
    files, work, metadata, containers = source_work(src)
    names = [w.name for w in work]
    unused: tuple[str, ...] = ()
    if spec is not None:
        from ckpt_cli.core.spec.apply import apply_rules

        work, unused = apply_rules(work, spec)
        if unused and not allow_unused:
            raise RefusedError(
                f"{', '.join(unused)} matched no tensor; nothing written",
                hint=f"{_named(names, 'tensors')}; --allow-unused goes on without them",
            )
    for w in work:
        if w.expr is None:
            raise RefusedError(
                f"tensor {w.origin!r} is {w.value_type.split()[-1]}: ckpt does not convert this safetensors dtype; nothing written",
                hint="drop it with a spec rule (`op: drop`)",
            )
    check_written_leaves(work, ocdbt=write.ocdbt)
    kinds = fill_key_types(work)
    used_rules: set[str] = set()
    leaves = [
        _layout(w, key_types(w, kinds), mesh, rules, write.max_chunk_bytes, used_rules)
        for w in work
    ]
    reached = {s for leaf in leaves for s in leaf.sources}
    unused_partition = [r.pattern for r in rules if r.pattern not in used_rules]
    if unused_partition and not allow_unused:
        raise RefusedError(
            f"--rules pattern {unused_partition[0]!r} matches no leaf; nothing written",
            hint=f"{_named([w.name for w in work])}; --allow-unused goes on without it",
        )
    return ImportPlan(
        empties=_empties(containers, leaves) if containers else (),
        containers=containers.origin if containers else "names",
        source=src,
        files=files.files,
        index=None if files.index is None else src,
        source_metadata=metadata,
        dst=dst,
        step=step,
        leaves=tuple(leaves),
        dropped=tuple(n for n in names if n not in reached),
        spec=spec,
        unused_rules=unused,
        mesh=mesh,
    )


def _layout(
    w: Work,
    types: tuple[int, ...],
    mesh: MeshSpec | None,
    rules: Sequence[Rule],
    max_chunk_bytes: int,
    used: set[str],
) -> ImportLeaf:
    assert w.expr is not None
    where = place(w.name, w.expr.shape, w.expr.dtype, mesh, rules, max_chunk_bytes, used)
    return ImportLeaf(
        w.name,
        w.keypath,
        types,
        w.value_type,
        w.expr,
        w.sources,
        w.steps,
        where.partition,
        where.sharding,
        where.chunk,
        where.shard,
        where.rule,
    )


def _empties(containers: Containers, leaves: Sequence[ImportLeaf]) -> tuple[Node, ...]:
    """The recorded empty nodes that do not clash with a written leaf (a spec may have moved
    one to, or under, an empty node's path)."""
    names = {leaf.keypath for leaf in leaves}
    prefixes = {leaf.keypath[:i] for leaf in leaves for i in range(len(leaf.keypath))}
    return tuple(
        n
        for n in containers.empties
        if n.keypath not in prefixes
        and not any(n.keypath[:i] in names for i in range(1, len(n.keypath) + 1))
    )


def apply_target(plan: ImportPlan, target: str) -> ImportPlan:
    """The plan with the containers of the abstract state ``target`` returns (tuples, optax's
    NamedTuples, empty nodes: what StandardRestore compares); refused when its leaves differ
    (names, shapes, dtypes), as ``migrate --target`` is."""
    from ckpt_cli.core.safetensors.tree import target_containers
    from ckpt_cli.core.spec.target import abstract_leaves, call_target, compare_target

    tree = call_target(target)
    expected = abstract_leaves(target, tree)
    planned: dict[str, tuple[tuple[int, ...] | None, str]] = {
        leaf.name: (leaf.expr.shape, _planned_dtype(leaf, expected)) for leaf in plan.leaves
    }
    diffs = compare_target(planned, expected)
    if diffs:
        raise RefusedError(
            f"the result differs from --target {target} in {len(diffs)} leaves, nothing written; "
            f"{diffs[0].text()}",
            hint="--dry-run without --target lists the leaves the import would write",
        )
    containers = target_containers(tree)
    nodes = containers.tensors
    leaves = tuple(
        dataclasses.replace(leaf, keypath=n.keypath, key_types=n.key_types)
        if (n := nodes.get(leaf.name)) is not None
        else leaf
        for leaf in plan.leaves
    )
    return dataclasses.replace(
        plan, leaves=leaves, empties=containers.empties, containers=containers.origin
    )


def _planned_dtype(
    leaf: ImportLeaf, expected: dict[str, tuple[tuple[int, ...] | None, str]]
) -> str:
    """A leaf Orbax saved from a Python number (``scalar``: ``step``) is restored in the
    dtype the target asks for: any integer or floating dtype fits it."""
    want = expected.get(leaf.name)
    if leaf.value_type == "scalar" and want is not None and want[0] == leaf.expr.shape:
        return want[1]
    return leaf.expr.dtype


def check_item_name(name: str, what: str, *, usage: bool = True) -> str:
    """``name`` itself when an item may be called so: a plain directory name, not ``metrics``
    (the manager's own item); else a usage error (``usage``) or a refusal naming ``what``
    gave it."""
    from ckpt_cli.core.format.names import METRICS_ITEM, is_plain_name

    if not is_plain_name(name) or name == METRICS_ITEM:
        error = UsageError if usage else RefusedError
        raise error(
            f"{what} {name!r} cannot name an item: "
            + ("metrics is the manager's own item" if name == METRICS_ITEM else "not a plain name"),
            hint="give another name with --item NAME",
        )
    return name
