"""``ckpt du`` through the entry point: JSON shape, text at 80 columns, options, bad input."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.support.buckets import normalized
from tests.support.paths import FIXTURES
from tests.support.storage_fixtures import S3


def walked(path: Path) -> int:
    return sum(os.lstat(Path(d) / f).st_size for d, _, fs in os.walk(path) for f in fs)


def test_json_totals_equal_the_files(cli: Any) -> None:
    r = cli("du", FIXTURES / "seed_mlp", "--json")
    assert r.code == 0, r.stderr
    doc = r.json()
    assert doc["schema_version"] == 1 and doc["ok"] is True and doc["kind"] == "root"
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
    lines = cli("du", root).stdout.splitlines()
    at = next(i for i, x in enumerate(lines) if x.startswith("duplicates: "))
    assert at > next(i for i, x in enumerate(lines) if x.startswith("garbage: "))
    assert "15 leaves stored again in several steps" in lines[at]


def test_missing_path_is_one_line_and_exit_3(cli: Any, tmp_path: Path) -> None:
    r = cli("du", tmp_path / "nope")
    assert r.code == 3
    assert r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1 and "does not exist" in r.stderr


def test_bad_by_is_a_usage_error(cli: Any) -> None:
    r = cli("du", FIXTURES / "seed_mlp", "--by", "file")
    assert r.code == 2


def test_a_bucket_gives_the_local_answer(cli: Any, s3: S3) -> None:
    for name in ("seed_mlp", "with_tmp", "no_ocdbt_zarr3"):
        local, url = str(FIXTURES / name), s3.fixture(name)
        a = cli("du", local, "--json")
        b = cli("du", url, "--json")
        assert a.code == b.code == 0, (a.stderr, b.stderr)
        assert b.json()["total_bytes"] == walked(FIXTURES / name)
        assert normalized(a.json(), local, url) == b.json()
