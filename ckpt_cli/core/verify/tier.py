"""``verify`` on one host's local tier of Orbax's emergency checkpointing (``format/emergency``):
the chunks other hosts hold are missing by design, the host's own are still checked.

The structure level hands every array with its stored chunks to ``settle_chunks``: a whole
array is readable; an array missing chunks is, in a step recognised as a local tier, partial
by design (other hosts' shards: readable on its stored chunks, which ``--deep`` decodes) or
damaged (a chunk of this host's own shards: ``chunk-missing``, an error as anywhere). A step
that only looks like the p2p manager's local tier (no marker) gets one warning per item: if it
is not one, the chunks are lost.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ckpt_cli.core.format.arrays import ArrayInfo
from ckpt_cli.core.format.emergency import HostChunks, LeafChunks, TierVerdict, assess_local_tier
from ckpt_cli.core.format.sharding import ShardingInfo
from ckpt_cli.core.verify.problems import Problem, problem
from ckpt_cli.core.verify.types import ItemFacts, TierCheck

Index = tuple[int, ...]
#: An array whose header was read: (name, header, database label, chunks stored, sound: no
#: other structure problem keeps it from being read).
Stored = tuple[str, ArrayInfo, str, frozenset[Index], bool]
#: The usual ``chunk-missing`` of a leaf: (facts, name, header, chunks stored).
Missing = Callable[[ItemFacts, str, ArrayInfo, frozenset[Index]], None]


def settle_chunks(
    facts: ItemFacts, stored: Sequence[Stored], shardings: dict[str, ShardingInfo], missing: Missing
) -> None:
    """Put the readable arrays into ``facts.arrays`` (a local tier's partial ones also into
    ``facts.partial``) and report the chunks missing that are damage (``missing``)."""
    gaps = [s for s in stored if len(s[3]) < s[1].num_chunks]
    verdict = _verdict(facts, stored, shardings) if gaps and facts.tier else None
    certain = facts.tier is not None and facts.tier.marker == "process-metadata"
    lost = {h.name: h for h in verdict.lost} if verdict and verdict.devices else {}
    by_design = verdict is not None and (verdict.devices is not None or certain)
    for name, info, label, present, sound in stored:
        if len(present) < info.num_chunks and (name in lost or not by_design):
            if name in lost:
                facts.problems.append(_lost(facts, name, info, lost[name]))
            else:
                missing(facts, name, info, present)
            continue
        if sound:
            facts.arrays[name] = (info, label)
            if len(present) < info.num_chunks:
                facts.partial[name] = present
    if verdict is not None:
        facts.tier_devices = verdict.devices
    if by_design and facts.partial and (verdict is None or verdict.devices is None or not certain):
        facts.problems.append(_unsure(facts, stored))


def _verdict(
    facts: ItemFacts, stored: Sequence[Stored], shardings: dict[str, ShardingInfo]
) -> TierVerdict | None:
    leaves = [
        LeafChunks(name, info.shape, info.chunk_shape, shardings.get(name), present)
        for name, info, _, present, _ in stored
    ]
    return assess_local_tier(facts.tier, leaves)


def _shape_str(index: Index) -> str:
    return "[" + ",".join(str(i) for i in index) + "]"


def _lost(facts: ItemFacts, name: str, info: ArrayInfo, host: HostChunks) -> Problem:
    """A chunk of this host's own shards is not stored: damage, in a local tier too."""
    assert facts.tier is not None
    first = ", ".join(_shape_str(i) for i in sorted(host.lost)[:5])
    return problem(
        "chunk-missing",
        f"{name}: {len(host.lost)} of the {len(host.expected)} chunks of this host's own "
        f"shards are not stored (first: {first}). This step is the {facts.tier.short()}: "
        "the other hosts' chunks are missing by design, this host's are not, so this is lost "
        "data (a reader that fills missing chunks would silently return zeros); read the "
        "step from the persistent tier, or restore this host's copy of it",
        leaf=name,
    )


def _unsure(facts: ItemFacts, stored: Sequence[Stored]) -> Problem:
    """Chunks missing in a pattern of one host's shards, with no marker saying it is a local
    tier (the p2p manager writes none), or a marker and no mesh telling whose they are."""
    assert facts.tier is not None
    names = sorted(facts.partial)
    held = sum(len(facts.partial[n]) for n in names)
    of = sum(info.num_chunks for n, info, *_ in stored if n in facts.partial)
    what = f"{len(names)} leaves ({', '.join(names[:3])}{'...' if len(names) > 3 else ''})"
    if facts.tier.marker == "single-writer":
        why = f"this item {facts.tier.short()} (the other hosts hold the rest)"
    else:
        why = (
            f"this step is the {facts.tier.short()}, but which chunks this host's devices "
            "hold cannot be told (no device ids or no mesh recorded)"
        )
    return Problem(
        "warning",
        "chunk-missing",
        f"{what} store only {held} of their {of} chunks: {why}. If it is not one, those chunks "
        "are lost data; restore it from a copy of this step",
        leaf=names[0],
        leaves=tuple(names),
    )


def tier_check(facts: ItemFacts, level: str, recorded: bool) -> TierCheck | None:
    """What the report says of an item of a local tier (None: the item is none)."""
    tier = facts.tier
    if tier is None or not facts.arrays_seen:
        return None
    if tier.marker == "single-writer" and not facts.partial:
        return None  # a one-process save whose arrays are whole: no local tier at all
    names = tuple(sorted(facts.partial))
    held = sum(len(facts.partial[n]) for n in names)
    of = sum(facts.arrays[n][0].num_chunks for n in names)
    devices = tuple(sorted(facts.tier_devices)) if facts.tier_devices else tier.devices
    note = ("looks like the " if tier.marker == "single-writer" else "") + tier.describe()
    if names:
        note += (
            f"; {len(names)} of {len(facts.arrays_seen)} arrays are partial by design "
            f"({held} of their {of} chunks stored here, the rest on other hosts)"
        )
        if level == "deep":
            note += "; their stored chunks are the ones decoded"
        elif level == "sample":
            note += "; the sample is drawn from their stored chunks"
        if recorded:
            note += "; no digest is recorded for them (no whole leaf here)"
    return TierCheck(tier.marker, tier.process, devices, names, held, of, note)
