"""The restore's topology: a checkpoint saved on more devices than the restore has.

Orbax 0.12 restores any array onto any mesh when the target names its shardings; when it does
not (``jax.eval_shape`` of an init gives none), it takes the shardings recorded in the
checkpoint and, on fewer devices than they name, refuses ("Topology mismatch detected"). The fix
without touching the training code is a reshard to a mesh of the restore's size that keeps
each leaf's partition spec: the recorded shardings then name devices that exist.
"""

from __future__ import annotations

import math
import re

from ckpt_cli.core.doctor.types import Finding
from ckpt_cli.core.format.sharding import MeshSpec
from ckpt_cli.core.inspect import ItemReport


def saved_mesh(report: ItemReport) -> MeshSpec | None:
    """The largest mesh the item's recorded shardings name."""
    meshes = [
        MeshSpec(leaf.sharding.axis_names, leaf.sharding.mesh_shape)
        for leaf in report.leaves
        if leaf.sharding is not None
        and leaf.sharding.mesh_shape is not None
        and leaf.sharding.axis_names is not None
    ]
    return max(meshes, key=lambda m: m.size, default=None)


def fitted_mesh(saved: MeshSpec, devices: int) -> MeshSpec:
    """The saved mesh's axes, each cut to a divisor of its size, using ``devices`` in all: every
    partition spec that divided the saved mesh divides this one."""
    left, shape = devices, []
    for size in saved.shape:
        part = math.gcd(left, size)
        shape.append(part)
        left //= part
    return MeshSpec(saved.axis_names, tuple(shape))


def topology_finding(
    report: ItemReport, restore_mesh: MeshSpec | None, devices: int | None, target_sharded: bool
) -> Finding | None:
    """A finding when the restore (``restore_mesh``, else ``devices``) has fewer devices than the
    checkpoint's shardings name and the target brings no shardings of its own."""
    saved = saved_mesh(report)
    count = restore_mesh.size if restore_mesh is not None else devices
    if target_sharded or saved is None or count is None:
        return None
    if saved.size <= count:
        return _layout_note(saved, restore_mesh)
    mesh = restore_mesh if restore_mesh is not None else fitted_mesh(saved, count)
    text = (
        f"saved on {saved.size} devices (mesh {_mesh(saved)}), restored on {count}: Orbax "
        "refuses a target without shardings there (Topology mismatch); give your abstract state "
        f"shardings, or reshard to mesh {_mesh(mesh)}"
    )
    return Finding("topology", (), (), text, reshard=_mesh(mesh))


def _layout_note(saved: MeshSpec, restore_mesh: MeshSpec | None) -> Finding | None:
    """A restore mesh other than the saved one, with enough devices: Orbax restores a target
    without shardings onto the saved layout (it does not block), not onto ``restore_mesh``."""
    if restore_mesh is None or _mesh(restore_mesh) == _mesh(saved):
        return None
    text = (
        f"saved on mesh {_mesh(saved)}: a target without shardings restores onto that layout, "
        f"not {_mesh(restore_mesh)}; give your abstract state shardings, or reshard to mesh "
        f"{_mesh(restore_mesh)}"
    )
    return Finding("topology", (), (), text, blocks=False, reshard=_mesh(restore_mesh))


def reshard_rules(report: ItemReport, mesh_text: str) -> str:
    """A reshard rules file keeping every leaf's recorded partition spec on the new mesh (axes
    the new mesh lacks are dropped from the spec: those dimensions are replicated)."""
    axes = set(MeshSpec.parse(mesh_text).axis_names)
    lines = [f"# written by ckpt doctor: each leaf keeps its partition spec on mesh {mesh_text}"]
    for leaf in report.leaves:
        spec = leaf.sharding.partition_spec if leaf.sharding is not None else None
        if not spec or not leaf.is_array:
            continue
        kept = [_kept(p, axes) for p in spec]
        pattern = re.escape(leaf.name).replace("'", "''")  # YAML single quotes: no escapes
        lines.append(f"'{pattern}': [{', '.join(kept)}]")
    return "\n".join(lines) + "\n"


def _kept(p: object, axes: set[str]) -> str:
    if isinstance(p, tuple):
        names = [a for a in p if a in axes]
        return "[" + ", ".join(names) + "]" if names else "null"
    return str(p) if isinstance(p, str) and p in axes else "null"


def _mesh(mesh: MeshSpec) -> str:
    return ",".join(f"{n}={s}" for n, s in zip(mesh.axis_names, mesh.shape, strict=True))
