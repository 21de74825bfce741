"""Every file of a directory, sizes with symlinks followed, and links that lead outside.

``verify`` compares what is on disk with what the metadata and the OCDBT trees reference; this
module takes the inventory once per item (one ``walk``) and answers size questions from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ckpt_cli.core.format.names import GRAIN_STATE_RE
from ckpt_cli.core.storage import Location
from ckpt_cli.core.verify.problems import Problem, problem
from ckpt_cli.errors import CkptError


@dataclass
class Inventory:
    """Files below a directory: item-relative path -> size (None: a dangling link)."""

    base: Location
    sizes: dict[str, int | None] = field(default_factory=dict)
    links: list[str] = field(default_factory=list)
    #: Links that lead out of the checkpoint: never followed (no size, never parsed).
    outside: set[str] = field(default_factory=set)
    problems: list[Problem] = field(default_factory=list)

    def size(self, rel: str) -> int | None:
        return self.sizes.get(rel)

    def exists(self, rel: str) -> bool:
        return rel in self.sizes and self.sizes[rel] is not None

    @property
    def total_bytes(self) -> int:
        return sum(s or 0 for s in self.sizes.values())


def take_inventory(base: Location, boundary: Location, shown_as: str) -> Inventory:
    """List every file below ``base``; symlinks resolving outside ``boundary`` are problems.

    ``shown_as`` prefixes paths in problems (the base relative to the checked path).
    """
    inv = Inventory(base)
    try:
        entries = list(base.walk())
    except CkptError as e:
        inv.problems.append(
            problem(
                "unreadable", f"{e.message}: check permissions and the file system", file=shown_as
            )
        )
        return inv
    fence = boundary.resolve()
    for rel, entry in entries:
        if not entry.is_symlink:
            inv.sizes[rel] = entry.size
            continue
        inv.links.append(rel)
        loc = base.child(rel)
        # The link's own text first: a link out is never followed, not even to stat its target.
        try:
            target = loc.link_target()
            if target.is_within(fence):
                target = loc.resolve()  # a chain of links inside may still lead out
        except CkptError:
            target = None
        if target is None or not target.is_within(fence):
            inv.outside.add(rel)
            unread = " (not read: nothing in it is checked)" if _is_metadata(rel) else ""
            inv.problems.append(
                problem(
                    "symlink-outside",
                    f"{_join(shown_as, rel)} is a symlink to {target or '?'}, outside the checkpoint: "
                    "copies and uploads of this checkpoint will miss or duplicate it; replace "
                    f"the link with the file{unread}",
                    file=_join(shown_as, rel),
                )
            )
            if _is_metadata(rel):
                inv.sizes[rel] = None  # never followed: verify parses nothing through it
                continue
        try:
            inv.sizes[rel] = None if entry.is_dir else loc.size()
        except CkptError:
            inv.sizes[rel] = None  # dangling: reported as missing where it is needed
    return inv


#: Files verify parses (JSON): through a link out of the checkpoint they are not even stat'ed.
#: Data files (OCDBT ``d/``, zarr chunks) linked out are sized through the link, as TensorStore
#: reads them that way.
_METADATA_NAMES = frozenset(
    {"_METADATA", "_CHECKPOINT_METADATA", "_sharding", "_strings.json", "metrics", "metadata",
     "_CKPT_DIGESTS.json", ".zarray", "zarr.json", "_ROOT_METADATA"}
)  # fmt: skip


def _is_metadata(rel: str) -> bool:
    name = rel.rsplit("/", 1)[-1]
    return (
        name in _METADATA_NAMES
        or rel.startswith("array_metadatas/")
        or GRAIN_STATE_RE.match(name) is not None
    )


def _join(prefix: str, rel: str) -> str:
    return rel if prefix in ("", ".") else f"{prefix}/{rel}"
