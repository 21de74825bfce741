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


def test_text_is_sorted_with_bars_and_fits_80_columns(
    cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Paths as typed (relative here), leaf names and the title cut to the columns."""
    root = tmp_path / "a-run-with-a-rather-long-directory-name-to-overflow-the-column"
    shutil.copytree(FIXTURES / "with_tmp", root)
    monkeypatch.chdir(root.parent)
    r = cli("du", root.name, "--by", "leaf", "--top", "0")
    assert r.code == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines and all(len(line) <= 80 for line in lines), [x for x in lines if len(x) > 80]
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
