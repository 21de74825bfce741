"""Rendering for ``verify``: a summary, each problem as a block, and the JUnit XML report for CI."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

from ckpt_cli.commands._text import (
    Paint,
    emit,
    human_bytes,
    painter,
    plural,
    say,
    text_width,
    use_color,
    wrap,
)
from ckpt_cli.core.format.names import TMP_MARKER
from ckpt_cli.core.storage.local import LocalLocation
from ckpt_cli.core.verify.problems import Problem
from ckpt_cli.core.verify.types import ItemCheck, VerifyReport

_DIGESTS = {
    "absent": "no digests recorded",
    "sizes-checked": "recorded digests: sizes checked (values need --deep)",
    "checked": "values checked against recorded digests",
    "sampled": "recorded digests: sampled files checked",
    "recorded": "digests recorded",
    "not-recorded": "digests NOT recorded (errors)",
    "not-read": "not read (see the note)",
    # safetensors: the ld1 digests `ckpt export` records in each file's __metadata__
    "in-metadata": "ld1 digests in the metadata (values need --deep)",
    "none-in-metadata": "no ld1 digests in the metadata (not written by ckpt export)",
    "missing": "missing",
    "unreadable": "not read (its header is damaged)",
}


def summary_line(report: VerifyReport) -> str:
    c = report.checked_json()
    if report.kind == "safetensors":
        size = sum(i.bytes_decoded for i in report.items)
        read = f", {human_bytes(size)} read" if report.level != "structure" else ""
        what = f"{plural(c['files'], 'file')}, {plural(c['arrays'], 'tensor')}{read}"
        return f"safetensors {report.path}: {what}; level {report.level}"
    parts = [plural(c["items"], "item"), plural(c["arrays"], "array"), plural(c["chunks"], "chunk")]
    if c["steps"]:
        parts.insert(0, plural(len(c["steps"]), "step"))
    if report.level != "structure":
        decoded = plural(c["chunks_decoded"], "chunk")
        parts.append(f"{decoded} decoded ({human_bytes(c['bytes_decoded'])})")
    return f"{report.kind} {report.path}: {', '.join(parts)}; level {report.level}"


def item_lines(report: VerifyReport) -> list[str]:
    """The digest state of the items, grouped: a Composite run of 5 steps x 3 items gets one
    line per step (or one line in all when every item has no record), not 15."""
    # An item not read (empty, unknown handler) has its note instead.
    items = [i for i in report.items if i.digests != "not-read" or i.problems]
    errors = {id(i): sum(1 for p in i.problems if p.severity == "error") for i in items}
    if len(items) > 1 and all(i.digests == "absent" and not errors[id(i)] for i in items):
        return [
            f"no digests recorded in any of the {len(items)} items "
            f"(`ckpt verify {report.path} --record` records them)"
        ]
    if report.kind == "safetensors":
        return _file_lines(items, errors)
    by_step: dict[int | None, list[ItemCheck]] = {}
    for i in items:
        by_step.setdefault(i.step, []).append(i)
    lines = []
    for step, group in by_step.items():
        states = {i.digests for i in group}
        if (
            step is not None
            and len(group) > 1
            and len(states) == 1
            and not any(errors[id(i)] for i in group)
        ):
            names = ", ".join(i.name for i in group)
            lines.append(f"step {step}: {len(group)} items ({names}): {_digests(group[0])}")
            continue
        for i in group:
            found = f"; {plural(errors[id(i)], 'error')}" if errors[id(i)] else ""
            lines.append(f"{i.path}: {_digests(i)}{found}")
    return lines


def _file_lines(items: list[ItemCheck], errors: dict[int, int]) -> list[str]:
    """Safetensors: a file with errors on its own line, the others grouped by digest state
    (30 clean shards are one line, not 30)."""
    lines: list[str] = []
    states: dict[str, list[ItemCheck]] = {}
    for i in items:
        if errors[id(i)]:
            lines.append(f"{i.path}: {_digests(i)}; {plural(errors[id(i)], 'error')}")
        else:
            states.setdefault(i.digests, []).append(i)
    for group in states.values():
        if len(group) == 1:
            lines.append(f"{group[0].path}: {_digests(group[0])}")
        else:
            which = "all " if len(group) == len(items) else "the other " if len(states) == 1 else ""
            lines.append(f"{which}{len(group)} files: {_digests(group[0])}")
    return lines


def _digests(item: ItemCheck) -> str:
    return _DIGESTS.get(item.digests, item.digests)


def _say_unfinished(report: VerifyReport, color: bool) -> None:
    """The unfinished saves a root's check skipped, and why each (a tmp dir needs no word)."""
    if not report.unfinished:
        return
    say(
        f"{plural(len(report.unfinished), 'unfinished save')} skipped: "
        f"{', '.join(report.unfinished)} (not checkpoints until committed)",
        color,
        indent="  ",
    )
    for name in report.unfinished:
        why = report.unfinished_why.get(name, "")
        if why and TMP_MARKER not in name:
            say(f"{name}: {why}", color, "dim", indent="    ")


def _say_divergence(report: VerifyReport, color: bool) -> None:
    """The run's verdict on NaN/Inf: its first step with any, the last without."""
    d = report.divergence
    if d is None:
        return
    resume = (
        f"last step without: {d.last_finite_step} (resume from it)"
        if d.last_finite_step is not None
        else "no checked step before it is finite"
    )
    leaves = plural(len(d.leaves), "leaf", "leaves")
    say(
        f"diverged: NaN/Inf from step {d.first_step} on ({leaves} there); {resume}", color, "yellow"
    )


def print_report(report: VerifyReport) -> None:
    color = use_color()
    paint = painter(color)
    say(summary_line(report), color)
    for line in item_lines(report):
        say(line, color, indent="  ")
    for item in report.items:
        if item.note is not None:
            say(f"note: {item.path}: {item.note}", color, "dim", indent="  ")
        # One host's local tier (a p2p one without a marker is a warning, said below).
        if item.tier is not None and item.tier.marker == "process-metadata":
            say(f"note: {item.path}: {item.tier.note}", color, "dim", indent="  ")
    _say_unfinished(report, color)
    c = report.coverage
    if c is not None and c.budget_s is not None:
        share = 100 * c.bytes / max(1, c.of_bytes)
        why = "budget reached" if c.stopped else "everything read"
        line = (
            f"coverage: {share:.0f}% of {human_bytes(c.of_bytes)} ({c.leaves} of {c.of_leaves} "
            f"leaves whole) in {c.elapsed_s:.1f} s of {c.budget_s:g} s: {why}"
        )
        if report.rotation is not None:
            r = report.rotation
            state = "cycle complete" if r.cycle_complete else "--rotate continues next run"
            line += f"; rotation {100 * r.covered_bytes / max(1, r.of_bytes):.0f}%: {state}"
        elif c.stopped:
            line += "; without --rotate every run reads the same first part"
        say(line, color, indent="  ")
    if report.sample is not None:
        s = report.sample
        say(
            f"sample: {s.chunks} of {plural(s.of_chunks, 'chunk')}, {human_bytes(s.bytes)} of "
            f"{human_bytes(s.of_bytes)}, "
            + (
                f"subset {s.subset}"
                if s.subset
                else f"seed {s.seed} (pass --seed {s.seed} to repeat it)"
            ),
            color,
            indent="  ",
        )
    if report.problems:
        emit(problem_lines(grouped(report.problems), paint, text_width()), color)
    _say_divergence(report, color)
    verdict = paint("OK", "green") if report.ok else paint("FAILED", "red")
    emit([verdict + paint(_verdict_rest(report), "")], color)


def _verdict_rest(report: VerifyReport) -> str:
    """What follows OK or FAILED: the counts, and what a clean deep pass could not see."""
    counts = f"{plural(report.errors, 'error')}, {plural(report.warnings, 'warning')}"
    if report.ok and not report.warnings:
        rest = ": no problems found"
        if report.level == "deep" and any(i.digests == "absent" for i in report.items):
            # A deep pass without a record decodes every chunk, but a flipped byte that only
            # changes values decodes fine: say what it could not see.
            rest = (
                " (no digests recorded: value changes are not detectable; run --record): "
                "no problems found"
            )
    else:
        rest = f": {counts}"
    if report.ok and report.divergence is not None:
        # The bytes are intact and the values are not: say both (--fail-on-nonfinite fails).
        rest = f" (bytes intact; values NaN/Inf from step {report.divergence.first_step}){rest}"
    return rest


def messages(report: VerifyReport, json_out: bool, mark_committed: bool) -> list[tuple[str, str]]:
    """What verify says on stderr, in order, as (``warning`` or ``note``, text)."""
    out = [
        ("warning", f"digests of {item.path} were not recorded: fix its errors first")
        for item in report.items
        if item.digests == "not-recorded"
    ]
    if report.recorded and not json_out:
        out.append(
            (
                "note",
                f"recorded digests in {plural(len(report.recorded), 'item')}; later `ckpt verify` "
                "runs check them (file sizes always, values with --deep)",
            )
        )
    if report.rotation is not None:
        out += [("warning", w) for w in report.rotation.warnings]
    out += [("note", f"marked {m} committed (commit_success.txt)") for m in report.marked_committed]
    scale = report.scale
    if scale is not None and not json_out:
        out.append(
            ("note", f"not split: {scale.reason}")
            if not scale.split
            else ("note", f"{scale.units} units on {scale.workers} {scale.executor} workers")
        )
    if mark_committed and report.kind == "root":
        if report.errors:
            out.append(("warning", "steps with errors were not marked committed"))
        elif not report.marked_committed:
            out.append(("note", "every checked step already has its commit_success.txt"))
    elif mark_committed and not report.marked_committed:
        out.append(("warning", "not marked committed: the check found errors; nothing was written"))
    return out


def write_junit(report: VerifyReport, path: str) -> None:
    """One testsuite per item, one testcase per leaf plus one for the item's files and layout;
    errors are failures, warnings go to system-out. Root- and step-level problems form their
    own suite."""
    suites = ET.Element("testsuites", name="ckpt verify")
    item_problems = {id(p) for i in report.items for p in i.problems}
    top = [p for p in report.problems if id(p) not in item_problems]
    _suite(suites, "checkpoint", {"layout": top})
    for item in report.items:
        cases: dict[str, list[Problem]] = {"structure": []}
        cases.update({leaf: [] for leaf in item.leaves})
        for p in item.problems:
            cases.setdefault(p.leaf or "structure", []).append(p)
        _suite(suites, item.path, cases, item)
    suites.set("tests", str(sum(int(s.get("tests", "0")) for s in suites)))
    suites.set("failures", str(sum(int(s.get("failures", "0")) for s in suites)))
    suites.set("time", f"{report.elapsed_s:.3f}")
    ET.indent(suites)
    data = ET.tostring(suites, encoding="utf-8", xml_declaration=True)
    # A temporary name renamed: a full disk leaves no half report for CI to parse.
    LocalLocation(str(Path(path))).write_bytes(data, create_parents=False)


def _suite(
    parent: ET.Element,
    name: str,
    cases: dict[str, list[Problem]],
    item: ItemCheck | None = None,
) -> None:
    suite = ET.SubElement(parent, "testsuite", name=name)
    failures = 0
    for case, problems in cases.items():
        tc = ET.SubElement(suite, "testcase", classname=f"ckpt.verify.{name}", name=case)
        errors = [p for p in problems if p.severity == "error"]
        if errors:
            failures += 1
            fail = ET.SubElement(
                tc, "failure", message=errors[0].message, type=",".join(p.code for p in errors)
            )
            fail.text = "\n".join(f"[{p.code}] {p.file or ''} {p.message}" for p in errors)
        warnings = [p for p in problems if p.severity == "warning"]
        if warnings:
            out = ET.SubElement(tc, "system-out")
            out.text = "\n".join(f"warning [{p.code}] {p.file or ''} {p.message}" for p in warnings)
    suite.set("tests", str(len(cases)))
    suite.set("failures", str(failures))
    suite.set("errors", "0")
    if item is not None:
        props = ET.Element("properties")  # the JUnit schema wants it before the testcases
        ET.SubElement(props, "property", name="digests", value=item.digests)
        suite.insert(0, props)


INDENT = "  "


def grouped(problems: Iterable[Problem]) -> list[Problem]:
    """The problems as a person reads them: a leaf's ``nonfinite`` warnings of several steps
    are one, naming the steps (a diverged run of 12 leaves over 4 steps: 12 blocks, not 48)."""
    out: list[Problem] = []
    seen: dict[tuple[str, str | None], int] = {}
    steps: dict[int, list[int]] = {}
    for p in problems:
        key = (p.code, p.leaf)
        if p.code != "nonfinite" or p.step is None or key not in seen:
            if p.code == "nonfinite" and p.step is not None:
                seen[key] = len(out)
                steps[len(out)] = [p.step]
            out.append(p)
        else:
            steps[seen[key]].append(p.step)
    for i, at in steps.items():
        if len(at) > 1:
            first = out[i]
            rest = first.message.removeprefix(f"{first.leaf} ")
            steps_at = ", ".join(map(str, at))
            message = f"{first.leaf}: NaN/Inf at steps {steps_at}; at step {at[0]} it {rest}"
            out[i] = replace(first, message=message)
    return out


def problem_lines(problems: Iterable[Problem], paint: Paint, width: int | None) -> list[str]:
    """verify's problems as blocks: ``severity  code``, then the leaf and file whole, then the
    message wrapped at spaces to the terminal (one line through a pipe). A table folded each
    column inside its own width and cut words out of the messages at 80 columns."""
    out: list[str] = []
    for p in problems:
        colour = "red" if p.severity == "error" else "yellow"
        out.append(f"{paint(p.severity, colour)}  {paint(p.code, 'bold')}")
        for label, value in (("leaf", p.leaf), ("file", p.file)):
            if value:
                out.append(f"{INDENT}{paint(label + ':', 'dim')} {paint(value, '')}")
        out += [paint(line, "") for line in wrap(p.message, width, first=INDENT, indent=INDENT)]
    return out
