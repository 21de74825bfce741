"""Text of ``ckpt doctor``: the verdict, one line per difference, and where the spec went."""

from __future__ import annotations

from pathlib import Path

from ckpt_cli.commands._output import stdout_console
from ckpt_cli.core.doctor import Diagnosis
from ckpt_cli.core.doctor.types import Memory
from ckpt_cli.core.storage.local import LocalLocation
from ckpt_cli.core.units import human_bytes

_VERDICT = {
    "restores": "restores as is",
    "restores-after-migrate": "restores after `ckpt migrate` with the spec below",
    "restores-after-reshard": "restores after `ckpt reshard`",
    "cannot": "cannot restore",
}


def print_diagnosis(d: Diagnosis, spec_path: str | None, target: str | None = None) -> None:
    console = stdout_console()
    where = f"{d.checkpoint}" + (f" (step {d.step})" if d.step is not None else "")
    console.print(f"{where} -> {d.target}: [bold]{_VERDICT[d.verdict]}[/bold]", highlight=False)
    if d.reason:
        console.print(f"  why: {d.reason}", highlight=False, markup=False)
    blocking = [f for f in d.findings if f.blocks]
    notes = [f for f in d.findings if not f.blocks]
    for title, group in (("differences", blocking), ("notes", notes)):
        if group:
            console.print(f"{title} ({len(group)}):", highlight=False)
        for f in group:
            console.print(f"  {f.kind:<10} {f.message}", highlight=False, markup=False)
    for line in preflight_lines(d.memory):
        console.print(line, highlight=False, markup=False)
    if d.verdict == "restores-after-migrate":
        spec = spec_path or "fix.yaml"
        hint = "" if spec_path else f" (add --write-spec {spec})"
        # With --like the spec was checked against OTHER's leaves: migrate needs no target.
        tail = f" --target {target}" if target else ""
        console.print(
            f"next: ckpt migrate {d.checkpoint} NEW_ROOT --spec {spec}{tail}{hint}",
            highlight=False,
            markup=False,
        )
    elif d.reshard is not None and d.verdict in ("restores-after-reshard", "restores"):
        rules = f" --rules {spec_path}" if spec_path else " (add --write-spec RULES.yaml)"
        console.print(
            f"next: ckpt reshard {d.checkpoint} NEW_ROOT --mesh {d.reshard}{rules}",
            highlight=False,
            markup=False,
        )
    elif spec_path is not None:
        console.print(f"spec written to {spec_path}", highlight=False, markup=False)


def preflight_lines(m: Memory) -> list[str]:
    """The short Preflight block: totals, then one line per host (the first and the worst
    when there are many), ckpt reshard's peak, and the advice."""
    if m.largest_array is None:
        return []
    on = f" on mesh {m.mesh}" if m.mesh else ""
    lines = [
        f"preflight{on}, {len(m.hosts)} host(s): {human_bytes(m.total_bytes)} in {m.arrays} "
        f"arrays; largest {m.largest_array} {human_bytes(m.largest_array_bytes)}; "
        f"at most {human_bytes(m.max_device_bytes)} per device"
    ]
    shown = list(m.hosts)
    if len(shown) > 2:
        worst = max(shown, key=lambda h: h.orbax_restore_peak_bytes)
        shown = [shown[0]] if worst is shown[0] else [shown[0], worst]
    for h in shown:
        lines.append(
            f"  host {h.host}: devices keep {human_bytes(h.device_bytes)}, reads "
            f"{human_bytes(h.read_bytes)} ({h.read_amplification:.1f}x), Orbax restore peak "
            f"~{human_bytes(h.orbax_restore_peak_bytes)}"
        )
    lines.append(f"  ckpt reshard to this layout: peak RAM ~{human_bytes(m.reshard_peak_bytes)}")
    if m.advice:
        lines.append(f"  advice: {m.advice}")
    return lines


def write_spec(text: str, path: str) -> None:
    """The spec under a temporary name, renamed: no half-written spec for migrate to read."""
    LocalLocation(str(Path(path))).write_bytes(text.encode(), create_parents=False)
