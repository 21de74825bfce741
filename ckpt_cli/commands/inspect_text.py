"""Text of ``ckpt inspect``: the tree or a table of leaves, totals, the training-state summary,
stats, and the device grid of one leaf."""

from __future__ import annotations

from rich.table import Table

from ckpt_cli.commands._output import stdout_console
from ckpt_cli.commands._text import (
    Paint,
    emit,
    human_bytes,
    human_count,
    painter,
    plural,
    say,
    shape_str,
    table_lines,
    text_width,
    tree_lines,
    use_color,
)
from ckpt_cli.core.format.sharding import ShardLayout
from ckpt_cli.core.inspect import InspectResult, ItemReport, Leaf, StepInspection
from ckpt_cli.core.safetensors.contents import SafetensorsInspection
from ckpt_cli.core.state import StatePart
from ckpt_cli.core.stats import LeafStats
from ckpt_cli.core.step_state import TrainingState


def print_result(result: InspectResult | StepInspection, flat: bool) -> None:
    if isinstance(result, StepInspection):
        for i, one in enumerate(result.items):
            if i:
                stdout_console().print()
            print_report(one.report, flat=flat, stats=one.stats, state=False)
        color = use_color()
        _print_state(result.training_state, painter(color), color)
        return
    if result.layout is not None:
        print_layout(result.layout, result.report)
        return
    print_report(result.report, flat=flat, stats=result.stats)
    if result.others:
        described = ", ".join(f"{r.ref.name} ({_kind_str(r)})" for r in result.others)
        stdout_console().print(
            f"other items of this step: {described}; inspect one with --item NAME"
        )


def _kind_str(report: ItemReport) -> str:
    if report.kind == "array" and report.leaves and report.leaves[0].is_array:
        leaf = report.leaves[0]
        return f"array {leaf.dtype}{shape_str(leaf.shape)}"
    if report.kind == "json":
        return f"json, {len(report.leaves)} values"
    if report.kind in ("empty", "unknown"):
        return report.kind + (f", {report.handler}" if report.handler else "")
    return f"{report.kind}, {len(report.leaves)} leaves, {human_bytes(report.total_bytes)}"


def warnings(result: InspectResult | StepInspection) -> list[str]:
    reports = (
        [r.report for r in result.items] if isinstance(result, StepInspection) else [result.report]
    )
    return [
        f"{leaf.name}: {leaf.problem} (run `ckpt verify` on this checkpoint)"
        for report in reports
        for leaf in report.problems
    ]


def _leaf_facts(leaf: Leaf, paint: Paint) -> str:
    if leaf.value_type == "string":
        return paint("string", "magenta") + " " + paint(repr(leaf.value), "")
    if leaf.value_type == "json":
        return paint("json", "magenta") + " " + paint(leaf.value or "", "")
    if not leaf.is_array:
        if leaf.problem is not None:
            return paint(leaf.problem, "red")
        return paint(f"{leaf.value_type} (empty)", "dim")
    if leaf.key_dtype is not None:
        typed = f"{leaf.key_dtype}{shape_str(leaf.key_shape)}"
        parts = [paint(typed, "cyan"), f"data {leaf.dtype}{shape_str(leaf.shape)}"]
        parts.append(human_bytes(leaf.size_bytes))
        return "  ".join(parts)
    parts = [paint(f"{leaf.dtype}{shape_str(leaf.shape)}", "cyan"), human_bytes(leaf.size_bytes)]
    if leaf.chunk_shape is not None and leaf.chunk_shape != leaf.shape:
        parts.append(f"chunk {shape_str(leaf.chunk_shape)}")
    if leaf.sharding is not None and leaf.sharding.mesh_shape is not None:
        parts.append(paint(leaf.sharding.short(), "blue"))
    return "  ".join(parts)


def _stats_str(s: LeafStats | None, paint: Paint) -> str:
    if s is None:
        return ""
    if s.count == 0:
        return paint(f"no finite values (nan={s.nan}, inf={s.inf})", "red")
    out = f"min={s.min:.4g} max={s.max:.4g} mean={s.mean:.4g} std={s.std:.4g}"
    if s.nan or s.inf:
        out += " " + paint(f"nan={s.nan} inf={s.inf}", "red")
    return out


def _title(report: ItemReport) -> str:
    ref = report.ref
    where = f"step {ref.step} of {ref.root}" if ref.root else str(ref.location)
    fmt = report.storage + (f", zarr{report.zarr_format}" if report.zarr_format else "")
    if report.kind in ("empty", "unknown"):
        fmt = "empty" if report.kind == "empty" else "unknown handler"
    what = "  one array (ArraySave)" if report.kind == "array" else ""
    return f"[bold]item {ref.name!r}[/] — {where}  ({fmt}){what}"


def print_report(
    report: ItemReport, flat: bool, stats: dict[str, LeafStats] | None, state: bool = True
) -> None:
    console = stdout_console()
    console.print(_title(report))
    if report.note is not None:
        # An item ckpt carries without reading (empty, or of an unknown handler): no tree.
        say(report.note, use_color())
        if state:
            _print_state(report.training_state, painter(use_color()), use_color())
        return
    meshes = sorted({m for lf in report.leaves if lf.sharding and (m := lf.sharding.mesh_str())})
    color = use_color()
    paint = painter(color)
    if meshes:
        say("mesh: " + "; ".join(meshes), color)
    if flat:
        headers = ["leaf", "type", "dtype", "shape", "elements", "bytes", "chunk", "sharding"]
        if stats is not None:
            headers.append("stats")
        with_values = any(leaf.value is not None for leaf in report.leaves)
        if with_values:
            headers.append("value")
        rows = []
        for leaf in report.leaves:
            row = [
                (leaf.name, ""),
                (leaf.value_type, "dim"),
                (leaf.dtype or "", "cyan"),
                (shape_str(leaf.shape), "cyan"),
                (str(leaf.elements) if leaf.is_array else "", ""),
                (human_bytes(leaf.size_bytes), ""),
                (shape_str(leaf.chunk_shape), ""),
                (leaf.sharding.short() if leaf.sharding else "", "blue"),
            ]
            if stats is not None:
                row.append((_stats_str(stats.get(leaf.name), painter(False)), ""))
            if with_values:
                row.append((leaf.value if leaf.value is not None else "", "magenta"))
            rows.append(row)
        wrap_last = stats is not None or with_values  # free text: stats, values
        emit(table_lines(headers, rows, paint, right=frozenset({4, 5}), wrap_last=wrap_last), color)
    else:
        entries = []
        for leaf in report.leaves:
            label = _leaf_facts(leaf, paint)
            if stats is not None and leaf.name in stats:
                label += "  " + _stats_str(stats[leaf.name], paint)
            entries.append((leaf.keypath or (leaf.name,), label))
        emit(tree_lines(report.ref.name, entries, paint), color)
    _print_totals(report, paint, color)
    if state:
        _print_state(report.training_state, paint, color)
    history = (report.step_custom_metadata or {}).get("ckpt_history")
    if isinstance(history, list) and history:
        ops = ", ".join(str(h.get("operation", "?")) for h in history if isinstance(h, dict))
        say(f"written by ckpt: {ops} (see step_custom_metadata.ckpt_history in --json)", color)


def _print_totals(report: ItemReport, paint: Paint, color: bool) -> None:
    rows = [
        [
            (t.name, ""),
            (str(t.leaves), ""),
            (human_count(t.elements), ""),
            (human_bytes(t.size_bytes), ""),
        ]
        for t in report.subtrees
    ]
    rows.append(
        [
            ("all", "bold"),
            (str(len(report.leaves)), ""),
            (human_count(report.total_elements), ""),
            (human_bytes(report.total_bytes), ""),
        ]
    )
    headers = ["subtree", "leaves", "parameters", "bytes"]
    emit([paint("totals", "bold")], color)
    emit(table_lines(headers, rows, paint, right=frozenset({1, 2, 3})), color)


def _print_state(training: TrainingState, paint: Paint, color: bool) -> None:
    """One line per part: where it is (item: subtrees), else what resuming loses; a missing
    optional part (RNG state, data order) reads as a note, not as a failure."""
    if not training.parts:
        return
    verdict = paint("complete", "green") if training.complete else paint("incomplete", "yellow")
    head = paint("training state", "bold")
    if training.scope == "step" and len(training.items) > 1:
        head += f" of the step, across items {', '.join(training.items)}"
    emit([head + ": " + verdict], color)
    rows = []
    for p in training.parts:
        missing = ("  ✗", "red") if p.required else ("  -", "dim")
        mark = ("  ✓", "green") if p.present else missing
        note = p.note if p.present or p.required else "note: " + p.note
        rows.append([mark, (p.description, ""), (_where(p, training), ""), (note, "dim")])
    emit(
        table_lines(["", "part", "where", "note"], rows, paint, wrap_last=True, show_header=False),
        color,
    )


def _where(part: StatePart, training: TrainingState) -> str:
    """Which item holds a part, and where in it: ``optimizer: opt_state``, ``data_iter``, the
    directory name; only the subtrees when the verdict covers one item."""
    if part.source == "directory":
        return "directory name"
    subtrees = ", ".join(part.subtrees[:3]) + (" ..." if len(part.subtrees) > 3 else "")
    items = ", ".join(part.items) if len(training.items) > 1 else ""
    return f"{items}: {subtrees}" if items and subtrees else items or subtrees


def print_layout(layout: ShardLayout, report: ItemReport) -> None:
    name = layout.leaf
    console = stdout_console()
    leaf = next(lf for lf in report.leaves if lf.name == name)
    console.print(
        f"[bold]layout of {name}[/] {leaf.dtype}{shape_str(layout.shape)}: {layout.description}"
    )
    console.print(
        f"  {' x '.join(map(str, layout.grid)) or '1'} blocks of {shape_str(layout.block_shape)}, "
        f"each on {layout.replicas} device(s)"
    )
    if leaf.chunk_shape is not None and layout.block_shape:
        per_block = 1
        for b, c in zip(layout.block_shape, leaf.chunk_shape, strict=True):
            per_block *= -(-b // c) if c else 1
        console.print(
            f"  stored chunk {shape_str(leaf.chunk_shape)}: "
            + (
                "one chunk per block"
                if per_block == 1 and leaf.chunk_shape == layout.block_shape
                else f"{per_block} chunk(s) per block"
            )
        )
    split = [d for d, g in enumerate(layout.grid) if g > 1]
    if len(split) <= 2 and len(layout.shape) >= 1:
        console.print(_block_grid(layout, split))
    else:
        console.print(_block_list(layout))


def _block_grid(layout: ShardLayout, split: list[int]) -> Table:
    """The blocks as a grid over the (at most two) split dimensions, devices in each cell."""
    rank = len(layout.shape)
    # Rows follow the first split dimension, columns the second; a lone split of the last
    # dimension of a matrix reads as columns, as the matrix itself would.
    if len(split) == 2:
        rows_dim, cols_dim = split
    elif split and split[0] == rank - 1 and rank >= 2:
        rows_dim, cols_dim = rank - 2, split[0]
    else:
        rows_dim, cols_dim = (split[0] if split else 0), None
    n_rows = layout.grid[rows_dim]
    n_cols = layout.grid[cols_dim] if cols_dim is not None else 1
    grid = Table(show_lines=True)
    grid.add_column(
        f"dim {rows_dim} \\ dim {cols_dim}" if cols_dim is not None else f"dim {rows_dim}"
    )
    cells: dict[tuple[int, int], str] = {}
    for blk in layout.blocks:
        r = blk.index[rows_dim]
        c = blk.index[cols_dim] if cols_dim is not None else 0
        cells[(r, c)] = "dev " + ",".join(map(str, blk.devices))
    for c in range(n_cols):
        grid.add_column("" if cols_dim is None else "{}:{}".format(*_bounds(layout, cols_dim, c)))
    for r in range(n_rows):
        lo, hi = _bounds(layout, rows_dim, r)
        grid.add_row(f"{lo}:{hi}", *(cells.get((r, c), "") for c in range(n_cols)))
    return grid


def _block_list(layout: ShardLayout) -> Table:
    """The blocks one per row (more than two split dimensions): index, slice, devices."""
    table = Table(box=None)
    table.add_column("block")
    table.add_column("slice")
    table.add_column("devices")
    for blk in layout.blocks:
        table.add_row(
            str(list(blk.index)),
            ", ".join(f"{lo}:{hi}" for lo, hi in blk.bounds),
            ",".join(map(str, blk.devices)),
        )
    return table


def _bounds(layout: ShardLayout, dim: int, i: int) -> tuple[int, int]:
    size = layout.block_shape[dim]
    return i * size, min((i + 1) * size, layout.shape[dim])


def print_safetensors(result: SafetensorsInspection) -> None:
    """A safetensors source: what it is, its files and their metadata, then one row per tensor
    (the file as its number in the list of files when there are several)."""
    color = use_color()
    paint = painter(color)
    loc = result.located
    shown = (
        f"{len(result.tensors)} of {result.all_tensors}"
        if result.all_tensors != len(result.tensors)
        else str(result.all_tensors)
    )
    where = f"; index {loc.index_name}" if loc.index_name else ""
    say(
        f"safetensors {result.path}: {shown} tensors in {plural(len(result.files), 'file')}, "
        f"{human_bytes(result.total_bytes)}{where}",
        color,
        "bold",
    )
    if result.config:
        facts = ", ".join(f"{k} {_config_value(v)}" for k, v in result.config.items())
        say(f"config.json: {facts}", color)
    several = len(result.files) > 1
    for n, f in enumerate(result.files, 1):
        number = f"{n}. " if several else ""
        say(
            f"{number}{f.name}: {human_bytes(f.size)}, {plural(f.tensors, 'tensor')}, "
            f"header {human_bytes(f.header_bytes)}",
            color,
            indent="  " if several else "",
        )
    _print_metadata(result, paint, color)
    headers = ["tensor", "dtype", "shape", "bytes", *(["file"] if several else []), "offsets"]
    stats = any(t.stats is not None for t in result.tensors)
    if stats:
        headers.append("stats")
    numbers = {f.name: str(n) for n, f in enumerate(result.files, 1)}
    rows = []
    for t in result.tensors:
        e = t.entry
        row = [(e.name, ""), (e.dtype, "cyan"), (shape_str(e.shape), "cyan")]
        row.append((human_bytes(e.nbytes), ""))
        if several:
            row.append((numbers[t.file], "dim"))
        row.append((f"{e.begin}-{e.end}", "dim"))
        if stats:
            row.append((_stats_str(t.stats, painter(False)), ""))
        rows.append(row)
    emit(table_lines(headers, rows, paint, right=frozenset({3}), wrap_last=stats), color)


def _print_metadata(result: SafetensorsInspection, paint: Paint, color: bool) -> None:
    """Each file's ``__metadata__`` (once when every file has the same), values cut to a line."""
    metas = {f.name: f.metadata for f in result.files if f.metadata}
    if not metas:
        return
    same = len(set(map(repr, metas.values()))) == 1
    groups = (
        [("metadata", next(iter(metas.values())))]
        if same
        else [(f"metadata of {name}", meta) for name, meta in metas.items()]
    )
    width = text_width() or 100
    for title, meta in groups:
        say(title + ":", color, "dim")
        for key, value in sorted(meta.items()):
            line = f"  {key} = {value}"
            if len(line) > width:
                line = line[: max(20, width - 13)] + f"… ({len(value):,} chars)"
            emit([paint(line, "")], color)


def _config_value(value: object) -> str:
    if isinstance(value, list):
        return ", ".join(str(v) for v in value)
    return str(value)
