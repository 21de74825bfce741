"""The names Orbax (and ckpt) give things on disk: marker files, step directories, chunk keys,
and the patterns users write to pick leaves by name.

Orbax names a step ``N``, ``000N`` (``step_format_fixed_length``) or ``PREFIX_N``; an unfinished
save lives in ``<name>.orbax-checkpoint-tmp`` (>= 0.11.20), ``...-tmp-<counter>`` or, oldest,
``...-tmp-<timestamp>``. A leaf's storage name is its keypath joined with dots.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass

from ckpt_cli.core.regex import PatternError, Regex, glob_regex

TMP_MARKER = ".orbax-checkpoint-tmp"
COMMIT_MARKER = "commit_success.txt"
#: The suffix of a v1 partial save until ``ocp.partial.finalize`` renames it (``3.partial_save``).
PARTIAL_SUFFIX = ".partial_save"
#: Orbax 0.12's record of a checkpointable being deleted (v1 ``delete(..., checkpointable_name)``):
#: readers skip the item it names; loading that item raises ``DeletionInProgressError``.
DELETION_RECORD = "_CHECKPOINT_DELETION"
#: Object stores: put into a step before prune removes its marker; the step is trash from then on.
TOMBSTONE = ".ckpt-deleting"
#: Object stores: put into a step a ckpt writer writes in place; removed right before the marker.
WRITING_MARKER = ".ckpt-writing"


def is_plain_name(name: str) -> bool:
    """Whether a name read from a checkpoint (an item of ``item_handlers``...) can be one
    directory entry: never empty, ``.``, ``..``, absolute or holding a separator."""
    return (
        isinstance(name, str)
        and name not in ("", ".", "..")
        and not any(c in name for c in "/\\\x00")
    )


def check_plain_name(name: str, what: str, where: object) -> str:
    """``name`` itself, or one ``InvalidMetadataError`` saying it is not a plain name."""
    if not is_plain_name(name):
        from ckpt_cli.errors import InvalidMetadataError

        raise InvalidMetadataError(
            f"{what} {name!r} in {where} is not a plain directory name: ckpt never uses it "
            "as a path",
            hint="the checkpoint is damaged or hostile; run `ckpt verify` on it",
        )
    return name


#: The root's lock shared by prune and ``verify --record``: one of them changes a root at a time.
PRUNE_LOCK = ".ckpt-prune.lock"
#: The root's write claim: one ckpt writer of a root at a time (``core/write/claim.py``).
WRITE_LOCK = ".ckpt-write.lock"
#: ckpt's own files in a root beside the steps (its locks): never reported as unknown files.
CKPT_ROOT_FILES = frozenset({PRUNE_LOCK, WRITE_LOCK})
#: A ckpt writer's owner record inside its local tmp step (``core/write/claim.py``).
OWNER_FILE = ".ckpt-owner"
#: ckpt's bookkeeping in a step it is writing or deleting (its writer's record, prune's
#: tombstone): never reported as unknown files.
CKPT_STEP_FILES = frozenset({WRITING_MARKER, TOMBSTONE, OWNER_FILE})
STEP_METADATA = "_CHECKPOINT_METADATA"
#: The empty file the v1 API (``orbax.checkpoint.experimental.v1``) writes into a checkpoint.
V1_MARKER = "orbax.checkpoint"
TREE_METADATA = "_METADATA"
ROOT_METADATA_DIR = "metadata"
ROOT_METADATA = "_ROOT_METADATA"
METRICS_ITEM = "metrics"
MANIFEST = "manifest.ocdbt"
#: A per-process OCDBT database directory: Orbax's own pattern (0.12.8
#: ``serialization/ocdbt_process_spec.py``), ``ocdbt.process_<id>`` or, for replica-separate
#: folders, ``ocdbt.process_replica_<id>``, the id alphanumeric: a process index, a custom id
#: (``override_ocdbt_process_id``: a single controller such as Pathways), a v1 partial save's
#: renamed database (``ocdbt.process_0<uuid hex>``), ckpt's own workers' (``ocdbt.process_w<hex>``).
PROCESS_DB_RE = re.compile(r"ocdbt\.process_(?:replica_)?[A-Za-z0-9]+")


def is_process_db(name: str) -> bool:
    """Whether a directory name is a per-process OCDBT database's (``PROCESS_DB_RE``)."""
    return PROCESS_DB_RE.fullmatch(name) is not None


#: Where ``ArrayCheckpointHandler`` (``ArraySave``) keeps its one array: ``<item>/checkpoint/``.
ARRAY_ITEM_DIR = "checkpoint"
LEGACY_MSGPACK_RE = re.compile(r"^checkpoint(_\d+)?$")
#: Files Orbax writes directly inside a PyTree item directory.
ITEM_MARKERS = frozenset({TREE_METADATA, MANIFEST, "_sharding", "_strings.json"})
#: The one file of a JsonSave item (``metadata``) or of the ``metrics`` item.
JSON_ITEM_FILES = frozenset({"metadata", "metrics"})
#: The files of grain's checkpoint handler (``grain.checkpoint.CheckpointSave``,
#: ``PyGrainCheckpointHandler``): one JSON iterator state per process, no ``_METADATA``.
GRAIN_STATE_RE = re.compile(r"^process_\d+-of-\d+\.json$")

_PLAIN_STEP_RE = re.compile(r"^(\d+)$")
_PREFIXED_STEP_RE = re.compile(r"^(.+)_(\d+)$")
# Same shape as Orbax's TMP_DIR_STEP_PATTERN, anchored on the marker, any era's suffix after it.
_TMP_STEP_RE = re.compile(r"^(?:(.*?)_)?(\d+)\.orbax-checkpoint-tmp(?:-(\d+))?$")


@dataclass(frozen=True)
class StepName:
    """A directory name parsed as a step (or an unfinished save of one)."""

    step: int
    prefix: str | None
    tmp: bool
    tmp_suffix: str | None = None  # the counter/timestamp of the older tmp naming eras
    #: A v1 partial save not yet finalized (``<name>.partial_save``): never a restorable step.
    partial: bool = False


def parse_step_name(name: str) -> StepName | None:
    """Parse a step directory name in any Orbax naming scheme; None when it is not one.

    ``N.partial_save`` is a v1 partial save of step N (``partial``); a tmp dir of one
    (``N.partial_save.orbax-checkpoint-tmp``) is an unfinished save like any tmp dir."""
    if TMP_MARKER in name:
        m = _TMP_STEP_RE.match(name.replace(PARTIAL_SUFFIX + TMP_MARKER, TMP_MARKER, 1))
        if not m:
            return None
        return StepName(int(m.group(2)), m.group(1), True, m.group(3))
    if name.endswith(PARTIAL_SUFFIX):
        inner = parse_step_name(name[: -len(PARTIAL_SUFFIX)])
        if inner is None or inner.tmp or inner.partial:
            return None
        return StepName(inner.step, inner.prefix, False, partial=True)
    if m := _PLAIN_STEP_RE.match(name):
        return StepName(int(m.group(1)), None, False)
    if m := _PREFIXED_STEP_RE.match(name):
        return StepName(int(m.group(2)), m.group(1), False)
    return None


def step_dir_name(step: int, like: str | None = None) -> str:
    """The directory name of step ``step`` in the naming form of the step directory ``like``
    (its prefix and its zero padding, Orbax's ``step_prefix`` and ``step_format_fixed_length``:
    ``checkpoint_6`` -> ``checkpoint_7``, ``0006`` -> ``0007``); plain ``N`` without ``like``
    or when ``like`` is no step name. A step name shows its padding only by a leading zero
    (``1234`` with a fixed length of 4 reads as unpadded), so only such names give a width."""
    parsed = parse_step_name(like) if like is not None else None
    if parsed is None or parsed.tmp or parsed.partial:
        return str(step)
    assert like is not None
    digits = like[len(parsed.prefix) + 1 :] if parsed.prefix is not None else like
    width = len(digits) if len(digits) > 1 and digits.startswith("0") else 0
    number = f"{step:0{width}d}" if width else str(step)
    return f"{parsed.prefix}_{number}" if parsed.prefix is not None else number


def json_item_files(names: Collection[str]) -> list[str]:
    """The JSON files among ``names`` that make a directory a JSON item: a JsonSave item's
    ``metadata``, the ``metrics`` item's file, or grain's per-process iterator states (sorted)."""
    return sorted(n for n in names if n in JSON_ITEM_FILES or GRAIN_STATE_RE.match(n))


def is_grain_handler(handler: str | None) -> bool:
    """Whether a step's recorded handler is grain's (``grain._src.python.checkpoint.handler.
    CheckpointHandler``, ``PyGrainCheckpointHandler`` of older grain releases)."""
    return handler is not None and (handler.split(".")[0] == "grain" or "PyGrain" in handler)


def looks_like_item(names: Collection[str], *, json_items: bool = False) -> bool:
    """Whether a directory holding ``names`` is an Orbax item: a PyTree item's files or
    per-process databases, or (``json_items``) the file(s) of a JsonSave, metrics or grain item."""
    if json_items and json_item_files(names):
        return True
    return any(n in ITEM_MARKERS or n.startswith("ocdbt.process_") for n in names)


#: Where every pattern option and spec field sends the reader (docs/reference/layouts.md).
LEAF_PATTERNS_DOC = "docs/reference/layouts.md#leaf-patterns"


def leaf_pattern_source(pattern: str) -> str:
    """The RE2 source of a leaf pattern: ``re:REGEX`` is a regular expression; otherwise a glob
    when it holds ``*``, ``?`` or ``[`` and no regex-only syntax (``( ) | ^ $ + \\ {``), else a
    regex. A glob matches the whole dotted name, ``*`` crossing dots (``params.*kernel``); a
    pattern starting with ``.`` is a regex (``.*``: every leaf): no leaf name starts with a dot,
    so as a glob it could match nothing."""
    if pattern.startswith("re:"):
        return pattern[3:]
    if (
        re.search(r"[*?\[]", pattern)
        and not re.search(r"[()|^$+\\{]", pattern)
        and not pattern.startswith(".")
    ):
        return glob_regex(pattern)
    return pattern


def compile_leaf_pattern(pattern: str, place: str) -> Regex:
    """``pattern`` (see ``leaf_pattern_source``) compiled by RE2 (``core/regex``: linear time).
    One that RE2 cannot take is a usage error of ``place`` (an option, a spec's rule and field):
    one line naming the pattern, the place and RE2's reason. How it is matched (searched, or
    the whole name) is the caller's."""
    try:
        return Regex(leaf_pattern_source(pattern))
    except PatternError as e:
        from ckpt_cli.errors import UsageError

        raise UsageError(
            f"{place} {pattern!r} is not a valid pattern (RE2: {e})",
            hint="a leaf pattern is a glob or an RE2 regular expression, without "
            f"backreferences or lookaround: {LEAF_PATTERNS_DOC}",
        ) from None


#: A plain name: components joined by single dots, none holding a glob or regex operator.
_PLAIN = r"[^.*?\[\]()|^$+\\{}]+"
PLAIN_NAME_RE = re.compile(rf"{_PLAIN}(?:\.{_PLAIN})*")


def is_plain_pattern(pattern: str) -> bool:
    """Whether a pattern is a plain name (``PLAIN_NAME_RE``; ``re:...`` never is)."""
    return not pattern.startswith("re:") and PLAIN_NAME_RE.fullmatch(pattern) is not None


def filter_source(pattern: str) -> str:
    """The RE2 source of a selection pattern (``--filter``), searched in a name: a plain name
    (``PLAIN_NAME_RE``: ``params``, ``Dense_0.kernel``) matches where it stands as whole
    components, bounded by the start or end of the name, a ``.`` or a ``/`` (Haiku's
    ``mlp/~/linear_0``, file paths): ``params`` finds ``params.w`` and ``opt_state.mu.params.w``,
    never ``opt_state.hyperparams.lr``. Globs and regexes are ``leaf_pattern_source``'s."""
    if is_plain_pattern(pattern):
        import re2

        return f"(?:^|[./]){re2.escape(pattern)}(?:[./]|\\z)"
    return leaf_pattern_source(pattern)


def compile_filter(pattern: str | None, option: str = "--filter") -> Regex | None:
    """A selection pattern (None: every leaf) to search in a name (``filter_source``): every
    ``--filter`` (and ``--match``, its old name) compiles here."""
    if pattern is None:
        return None
    if is_plain_pattern(pattern):
        return Regex(filter_source(pattern))
    return compile_leaf_pattern(pattern, option)


def literal_name(pattern: str) -> str | None:
    """The one leaf name a regular expression matches when it holds no operator (``.`` taken as
    the dot of a dotted name, ``\\.`` too), else None: how a rule names a leaf exactly."""
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern) and not pattern[i + 1].isalnum():
            out.append(pattern[i + 1])
            i += 2
            continue
        if c in "*+?[](){}|^$\\":
            return None
        out.append(c)
        i += 1
    return "".join(out)


def chunk_key(index: tuple[int, ...], zarr3: bool) -> str:
    """A chunk's key below its array: ``0.1`` (zarr2, ``.`` as Orbax writes), ``c/0/1`` (zarr3)."""
    if zarr3:
        return "c" + "".join(f"/{i}" for i in index)
    return ".".join(str(i) for i in index) if index else "0"


def chunk_index_from_key(key: bytes, zarr3: bool) -> tuple[int, ...]:
    """``0.1`` (zarr2, ``.`` separator as Orbax writes) or ``c/0/1`` (zarr3) to (0, 1)."""
    text = key.decode()
    if zarr3:
        text = text[1:].lstrip("/") if text.startswith("c") else text
        return tuple(int(p) for p in text.split("/") if p != "")
    return tuple(int(p) for p in text.split("."))


def array_prefix(name: str) -> str:
    """The key prefix of a leaf's array: its param name as TensorStore makes it a directory.

    Orbax hands the param name (keypath joined with dots) to TensorStore as the array's path,
    which appends ``/`` unless the path is empty or already ends in one: the dict key ``''``
    stores ``.zarray`` at the item's top, ``'trailing/'`` stores ``trailing/.zarray``. Never
    add the ``/`` by hand: ``'/.zarray'`` and ``'trailing//.zarray'`` are not there.
    """
    return name if not name or name.endswith("/") else name + "/"


def storage_dir(name: str) -> str:
    """The directory part of a leaf's keys (``array_prefix`` without its final ``/``): what
    ``split_key`` returns for the keys of that leaf."""
    return array_prefix(name)[:-1] if name else ""


#: The longest directory entry the usual file systems take, in bytes (``NAME_MAX``).
NAME_MAX = 255


def unsafe_as_path(name: str) -> str | None:
    """Why a param name cannot be a relative file path inside an item (plain zarr, no OCDBT),
    or None. Orbax and TensorStore refuse such names there (``..``, ``.``, empty segments, a
    leading ``/``), file systems refuse a NUL byte and entries over ``NAME_MAX`` bytes; inside
    OCDBT they are plain database keys."""
    if not name:
        return None
    if why := unencodable(name):
        return why
    if "\x00" in name:
        return "it holds a NUL byte, which no file system takes in a name"
    parts = storage_dir(name).split("/")
    if parts[0] == "":
        return "it starts with /"
    for p in parts:
        if p in ("", ".", ".."):
            return f"it has a path segment {p!r}" if p else "it has an empty path segment"
        if len(p.encode()) > NAME_MAX:
            return f"a path segment is {len(p.encode())} bytes, over the {NAME_MAX} of a file name"
    return None


def unencodable(name: str) -> str | None:
    """Why ``name`` cannot be written as UTF-8 (a lone surrogate, from a JSON ``\\udcff``
    escape), or None: no key, file name or JSON document of a checkpoint can hold it."""
    try:
        name.encode()
    except UnicodeEncodeError as e:
        return f"it holds {name[e.start]!r}, which is not a Unicode character (UTF-8 has no form for it)"
    return None


def leaf_name_problem(name: str, *, ocdbt: bool) -> str | None:
    """Why a writer (import, migrate) cannot give a leaf this name, or None: never a name UTF-8
    cannot hold; without OCDBT, also never one that cannot be a relative path (reshard, which
    keeps its source's names, checks ``unsafe_as_path`` alone)."""
    return unencodable(name) if ocdbt else unsafe_as_path(name)


def tree_conflict(keypaths: Collection[tuple[str, ...]]) -> tuple[str, str] | None:
    """A name that would be both a leaf and a subtree (``a`` and ``a.b``: Orbax restores only
    ``{a: {b}}`` and loses ``a``), as (the leaf, a leaf below it), or None."""
    leaves = set(keypaths)
    for path in keypaths:
        for i in range(1, len(path)):
            if path[:i] in leaves:
                return ".".join(path[:i]), ".".join(path)
    return None


def split_key(key: bytes, zarr3: bool) -> tuple[str, str]:
    """(array directory, part after it) of a database key such as ``params.w/0.1`` or
    ``x/c/0/1``; the directory is ``storage_dir`` of the leaf (``''`` for the dict key ``''``,
    whose keys are ``.zarray``, ``0`` or ``zarr.json``, ``c/0``)."""
    text = key.decode(errors="replace")
    if zarr3:
        for sep in ("/c/",):
            if sep in text:
                name, rest = text.rsplit(sep, 1)
                return name, "c/" + rest
        if text.endswith("/c"):
            return text[:-2], "c"
        if text == "c" or (text.startswith("c/") and _CHUNK_DIGITS.fullmatch(text[2:])):
            return "", text
    name, _, rest = text.rpartition("/")
    return name, rest


_CHUNK_DIGITS = re.compile(r"\d+(/\d+)*")


def parse_chunk_part(part: str, zarr3: bool, rank: int) -> tuple[int, ...] | None:
    """A chunk key's part after the array name as an index; None when it is not one."""
    if rank == 0:
        return () if part == ("c" if zarr3 else "0") else None
    if zarr3 and not part.startswith("c/"):
        return None
    try:
        index = chunk_index_from_key(part.encode(), zarr3)
    except ValueError:
        return None
    return index if len(index) == rank and all(i >= 0 for i in index) else None
