"""``ckpt du`` through the entry point: JSON shape, text at 80 columns, options, bad input."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.support.paths import FIXTURES


def walked(path: Path) -> int:
    return sum(os.lstat(Path(d) / f).st_size for d, _, fs in os.walk(path) for f in fs)


def test_json_totals_equal_the_files(cli: Any) -> None:
    r = cli("du", FIXTURES / "seed_mlp", "--json")
    assert r.code == 0, r.stderr
    doc = r.json()
    assert doc["schema_version"] == 2 and doc["ok"] is True and doc["kind"] == "root"
    assert doc["deep"] is False and doc["uncompared_leaves"] == 3 * 15  # no records
    assert doc["total_bytes"] == walked(FIXTURES / "seed_mlp")
    assert [s["step"] for s in doc["steps"]] == [300, 400, 500]
    for s in doc["steps"]:
        assert s["bytes"] == walked(Path(s["path"]))
        (item,) = s["items"]
        assert item["leaves"]
        assert item["bytes"] == item["leaf_bytes"] + item["metadata_bytes"] + item["garbage_bytes"]
        assert item["logical_bytes"] == sum(leaf["logical_bytes"] for leaf in item["leaves"])
    assert doc["garbage"] == []


def test_text_is_sorted_with_bars_and_keeps_the_title_whole(
    cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Paths in hints as typed (relative here); the title, longer than 80 columns, whole."""
    root = tmp_path / "a-run-with-a-rather-long-directory-name-to-overflow-the-column"
    shutil.copytree(FIXTURES / "with_tmp", root)
    monkeypatch.chdir(root.parent)
    r = cli("du", root.name, "--by", "leaf", "--top", "0")
    assert r.code == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == str(root) and "…" not in r.stdout
    table = lines[2 : lines.index(next(x for x in lines if x.startswith("total ")))]
    assert len(table) == 6  # 2 steps x 3 leaves
    assert set(table[0]) & set("█▉▊▋▌▍▎▏")  # a bar
    assert [row.split()[1] for row in table[:2]] == ["params.Dense_0.kernel"] * 2  # largest first
    assert [row.split()[1] for row in table[-2:]] == ["step"] * 2
    assert cli("du", root, "--json").json()["total_bytes"] == walked(root)
    garbage = lines[lines.index(next(x for x in lines if x.startswith("garbage: "))) :]
    assert garbage[0].startswith("garbage: 17.6 KiB in 4 places")
    assert "  4.4 KiB tmp-save, 12 files: 3.orbax-checkpoint-tmp" in garbage
    assert "--clean-tmp" in " ".join(garbage)


def _leaf_labels(doc: Any) -> list[str]:
    """``du --by leaf`` labels of a root of several steps: ``STEP LEAF``."""
    return [
        f"{s['step']} {leaf['name']}"
        for s in doc["steps"]
        for item in s["items"]
        for leaf in item["leaves"]
    ]


def test_piped_text_never_cuts_a_leaf_name(cli: Any) -> None:
    """Through a pipe (no width to fit) every ``STEP LEAF`` label is whole, longer ones than the
    default column (31) included, and the figures stay aligned after the longest."""
    root = FIXTURES / "seed_mlp"
    labels = _leaf_labels(cli("du", root, "--json").json())
    assert max(len(label) for label in labels) > 31
    r = cli("du", root, "--by", "leaf", "--top", "0")
    assert r.code == 0, r.stderr
    assert "…" not in r.stdout
    rows = r.stdout.splitlines()[2 : 2 + len(labels)]
    assert sorted(" ".join(row.split()[:2]) for row in rows) == sorted(labels)
    assert len({len(row) for row in rows}) == 1, rows  # one name column, as wide as the longest


def test_on_an_80_column_terminal_names_stay_whole_and_lines_fit(tmp_path: Path) -> None:
    """A name longer than the room the figures leave stands on its own line, its figures on
    the next: every line fits, no name is cut."""
    from tests.support.terminal import run_on_terminal

    root = FIXTURES / "seed_mlp"
    screen = run_on_terminal(["du", root, "--by", "leaf", "--top", "0"], 80)
    assert screen.code == 0, screen.text + screen.stderr
    assert not screen.too_wide(), screen.too_wide()
    assert "…" not in screen.text
    narrow = run_on_terminal(["du", root, "--by", "leaf", "--top", "0"], 60)
    assert narrow.code == 0 and not narrow.too_wide(), narrow.text
    for leaf in ("500 opt_state.0.mu.Dense_0.kernel", "300 params.Dense_1.bias"):
        assert leaf in narrow.lines, narrow.text


def test_steps_are_listed_in_step_order_and_leaves_by_size(cli: Any, tmp_path: Path) -> None:
    """A run is a timeline: steps by number whatever their sizes (--top keeps the largest, in
    that order); items and leaves, where size is the question, largest first."""
    root = tmp_path / "run"
    shutil.copytree(FIXTURES / "seed_mlp", root)
    (root / "400" / "notes.bin").write_bytes(os.urandom(100_000))  # 400: the largest step
    sizes = {s["step"]: s["bytes"] for s in cli("du", root, "--json").json()["steps"]}
    assert max(sizes, key=lambda k: sizes[k]) == 400 and sizes[300] > sizes[500]
    r = cli("du", root)
    assert r.code == 0, r.stderr
    lines = r.stdout.splitlines()
    assert [line.split()[0] for line in lines[2:5]] == ["300", "400", "500"], r.stdout
    top = cli("du", root, "--top", "2").stdout.splitlines()
    assert [line.split()[0] for line in top[2:4]] == ["300", "400"], top
    assert top[4] == "... 1 more row (--top 0 shows all)"
    leaves = cli("du", root / "500" / "default", "--top", "0").stdout.splitlines()[2:17]
    sizes_shown = [line.split()[1:3] for line in leaves]
    in_bytes = [float(n) * {"B": 1, "KiB": 1024}[unit] for n, unit in sizes_shown]
    assert in_bytes == sorted(in_bytes, reverse=True), leaves


def test_top_limits_the_rows_and_says_how_many_are_left(cli: Any) -> None:
    r = cli("du", FIXTURES / "seed_mlp" / "500" / "default", "--top", "3")
    assert r.code == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[1].startswith("leaf ")
    assert lines[2].startswith(("opt_state.0.mu.Dense_0.kernel", "params.Dense_0.kernel"))
    assert lines[5] == "... 12 more rows (--top 0 shows all)"


def test_duplicates_are_listed_after_the_garbage(cli: Any, tmp_path: Path) -> None:
    root = tmp_path / "run"
    shutil.copytree(FIXTURES / "seed_mlp", root)
    assert cli("verify", root, "--deep", "--record").code == 0
    shutil.copytree(root / "500", root / "600")  # step 600: the values of 500 again
    doc = cli("du", root, "--json").json()
    assert doc["duplicates"] and all(d["steps"] == [500, 600] for d in doc["duplicates"])
    assert doc["duplicate_bytes"] == sum(d["saved_bytes"] for d in doc["duplicates"])
    leaves = doc["steps"][2]["items"][0]["leaves"]
    assert {d["leaf"] for d in doc["duplicates"]} == {leaf["name"] for leaf in leaves}
    assert all(re.fullmatch(r"ld1:[0-9a-f]{32}", d["digest"]) for d in doc["duplicates"])
    lines = cli("du", root).stdout.splitlines()
    at = next(i for i, x in enumerate(lines) if x.startswith("duplicates: "))
    assert at > next(i for i, x in enumerate(lines) if x.startswith("garbage: "))
    assert "15 leaves stored again in several steps" in lines[at]


def test_without_records_du_says_how_to_compare_and_deep_does(cli: Any, tmp_path: Path) -> None:
    """Steps 500 and 600 hold the same values and no record: du says they were not compared
    and how to; with --deep it reads them and lists every leaf, with the digests
    ``ckpt digest`` prints; every line fits 80 columns."""
    root = tmp_path / "run"
    root.mkdir()
    for step in ("400", "500"):
        shutil.copytree(FIXTURES / "seed_mlp" / step, root / step)
    shutil.copytree(FIXTURES / "seed_mlp" / "500", root / "600")
    plain = cli("du", root, "--json").json()
    assert plain["duplicates"] == [] and plain["uncompared_leaves"] == 3 * 15
    text = cli("du", root).stdout
    assert "45 leaves in several steps without a recorded digest: not compared" in text
    assert f"`ckpt du {root} --deep`" in " ".join(text.split())
    r = cli("du", root, "--deep", "--threads", "2", "--memory-limit", "64MiB", "--json")
    assert r.code == 0, r.stderr
    deep = r.json()
    assert deep["deep"] is True and deep["uncompared_leaves"] == 0
    assert deep["duplicates"] and all(d["steps"] == [500, 600] for d in deep["duplicates"])
    digests = {
        line.split()[2]: line.split()[0]
        for line in cli("digest", root / "500" / "default").stdout.splitlines()
    }
    assert len(digests) == 15
    assert {d["leaf"]: d["digest"] for d in deep["duplicates"]} == digests
    lines = cli("du", root, "--deep").stdout.splitlines()
    assert lines and all(len(line) <= 80 for line in lines), [x for x in lines if len(x) > 80]
    assert any(x.startswith("duplicates: 15 leaves stored again") for x in lines)
    assert not any("not compared" in x for x in lines)


def test_missing_path_is_one_line_and_exit_3(cli: Any, tmp_path: Path) -> None:
    r = cli("du", tmp_path / "nope")
    assert r.code == 3
    assert r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1 and "does not exist" in r.stderr


def test_bad_by_is_a_usage_error(cli: Any) -> None:
    r = cli("du", FIXTURES / "seed_mlp", "--by", "file")
    assert r.code == 2
