"""``ckpt verify`` through the real entry point: clean layouts, every damaged fixture, outputs."""

from __future__ import annotations

import json
import os
import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from tests.support.paths import FIXTURES, REPO
from tests.support.world import World, one_json_document

DAMAGED = REPO / "fixtures" / "damaged"
STATE_FILE = "_CKPT_VERIFY_STATE.json"
CLEAN = sorted(p.name for p in FIXTURES.iterdir() if p.is_dir() and p.name != "msgpack_legacy")

# defect -> (code, level that finds it, exit code without --strict)
DEFECTS = {
    "flipped-byte": ("digest-mismatch", "--deep", 1),
    "truncated-data-file": ("data-file-truncated", None, 1),
    "deleted-data-file": ("data-file-missing", None, 1),
    "deleted-manifest": ("manifest-missing", None, 1),
    "damaged-metadata-json": ("json-invalid", None, 1),
    "leaf-removed-from-metadata": ("array-without-leaf", None, 1),
    "zarray-shape-changed": ("shape-mismatch", None, 1),
    "zarray-dtype-changed": ("dtype-mismatch", None, 1),
    "missing-chunk": ("chunk-missing", None, 1),
    "empty-checkpoint-metadata": ("json-invalid", None, 1),
    "stray-file": ("unknown-file", None, 0),
    "symlink-outside": ("symlink-outside", None, 0),
}


def codes(doc: dict[str, Any]) -> set[str]:
    return {p["code"] for p in doc["problems"]}


@pytest.mark.parametrize("level", [[], ["--deep"]], ids=["structure", "deep"])
@pytest.mark.parametrize("name", CLEAN)
def test_clean_fixtures_verify_clean(cli, name: str, level: list[str]) -> None:  # type: ignore[no-untyped-def]
    r = cli("verify", FIXTURES / name, "--json", *level)
    assert r.code == 0, r.stdout + r.stderr
    doc = r.json()
    assert doc["ok"] is True
    assert doc["problems"] == []
    assert doc["checked"]["items"] >= 1
    if level:
        assert doc["checked"]["chunks_decoded"] == doc["checked"]["chunks"]
    assert "warning" not in r.stderr


def test_every_damaged_fixture_has_a_test() -> None:
    on_disk = {p.name for p in DAMAGED.iterdir() if p.is_dir() and not p.name.startswith("_")}
    assert on_disk == set(DEFECTS)


@pytest.mark.parametrize("name", sorted(DEFECTS))
def test_damaged_fixture_is_detected_with_its_code(cli, name: str) -> None:  # type: ignore[no-untyped-def]
    code, level, exit_code = DEFECTS[name]
    r = cli("verify", DAMAGED / name, "--json", *([level] if level else []))
    doc = r.json()
    assert code in codes(doc), doc["problems"]
    assert r.code == exit_code
    assert doc["ok"] is (exit_code == 0)
    for p in doc["problems"]:
        assert p["message"] and (p["leaf"] or p["file"])


@pytest.mark.parametrize("name", ["stray-file", "symlink-outside"])
def test_warnings_fail_under_strict(cli, name: str) -> None:  # type: ignore[no-untyped-def]
    r = cli("verify", DAMAGED / name, "--strict", "--json")
    assert r.code == 1
    assert {p["severity"] for p in r.json()["problems"]} == {"error"}


def test_flipped_byte_is_invisible_without_the_deep_digest_check(cli) -> None:  # type: ignore[no-untyped-def]
    # Sizes, CRCs of the tree and every reference are intact: only recorded digests tell.
    assert cli("verify", DAMAGED / "flipped-byte").code == 0
    r = cli("verify", DAMAGED / "flipped-byte", "--deep", "--json")
    doc = r.json()
    mismatch = [p for p in doc["problems"] if p["code"] == "digest-mismatch"]
    assert [p["leaf"] for p in mismatch] == ["opt_state.0.nu.Dense_0.kernel"]
    assert "datafile-checksum-mismatch" in codes(doc)
    assert doc["checked"]["digests"] == {"500/default": "checked"}


def test_flipped_byte_caught_by_a_full_sample(cli) -> None:  # type: ignore[no-untyped-def]
    r = cli("verify", DAMAGED / "flipped-byte", "--sample", "100%", "--json")
    assert r.code == 1
    assert "datafile-checksum-mismatch" in codes(r.json())


def test_json_document_shape(cli) -> None:  # type: ignore[no-untyped-def]
    doc = cli("verify", DAMAGED / "truncated-data-file", "--json").json()
    assert (
        doc["schema_version"] == 8
    )  # 2: problems carry leaves; 3: rotation.warnings; 4: scale; 5: notes; 6: safetensors;
    # 7: unfinished_why; 8: local_tiers
    assert doc["local_tiers"] == []
    assert isinstance(doc["ok"], bool) and isinstance(doc["checked"], dict)
    assert doc["problems"]
    for p in doc["problems"]:
        assert set(p) == {"severity", "code", "leaf", "leaves", "file", "message", "step"}
        assert p["severity"] in ("error", "warning")
    truncated = next(p for p in doc["problems"] if p["code"] == "data-file-truncated")
    assert truncated["file"].startswith("500/default/ocdbt.process_0/d/")
    assert "restore" in truncated["message"]


def test_human_output_has_summary_and_table(cli) -> None:  # type: ignore[no-untyped-def]
    r = cli("verify", DAMAGED / "deleted-data-file")
    assert r.code == 1
    assert "data-file-missing" in r.stdout
    assert "FAILED" in r.stdout
    ok = cli("verify", FIXTURES / "seed_mlp")
    assert ok.code == 0 and "OK" in ok.stdout and "3 steps, 3 items" in ok.stdout


def test_junit_report(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "report.xml"
    r = cli("verify", DAMAGED / "missing-chunk", "--junit", out)
    assert r.code == 1
    root = ET.parse(out).getroot()
    assert root.tag == "testsuites"
    failed = [tc for tc in root.iter("testcase") if tc.find("failure") is not None]
    assert [tc.get("name") for tc in failed] == ["params.w"]
    assert "chunk-missing" in (failed[0].find("failure").get("type") or "")  # type: ignore[union-attr]
    assert int(root.get("tests", "0")) >= 5


def test_step_and_latest_select_steps(cli) -> None:  # type: ignore[no-untyped-def]
    assert cli("verify", FIXTURES / "seed_mlp", "--json").json()["checked"]["steps"] == [
        300,
        400,
        500,
    ]
    one = cli("verify", FIXTURES / "seed_mlp", "--step", "400", "--json").json()
    assert one["checked"]["steps"] == [400]
    assert cli("verify", FIXTURES / "seed_mlp", "--latest", "--json").json()["checked"][
        "steps"
    ] == [500]
    assert cli("verify", FIXTURES / "seed_mlp", "--step", "7").code == 3


def test_unfinished_saves_are_listed_not_checked(cli) -> None:  # type: ignore[no-untyped-def]
    doc = cli("verify", FIXTURES / "with_tmp", "--json").json()
    assert len(doc["checked"]["unfinished_saves"]) == 4
    tmp = FIXTURES / "with_tmp" / "3.orbax-checkpoint-tmp"
    r = cli("verify", tmp, "--json")
    assert r.code == 1 and "tmp-dir" in codes(r.json())


def test_not_a_checkpoint_exits_3(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    assert cli("verify", tmp_path).code == 3
    assert cli("verify", tmp_path / "nope").code == 3
    assert cli("verify", FIXTURES / "msgpack_legacy").code == 3


def test_usage_errors_exit_2(cli) -> None:  # type: ignore[no-untyped-def]
    assert cli("verify", FIXTURES / "seed_mlp", "--record", "--sample", "5%").code == 2
    assert cli("verify", FIXTURES / "seed_mlp", "--sample", "lots").code == 2
    assert cli("verify", FIXTURES / "seed_mlp" / "500", "--step", "500").code == 2


def test_record_then_catch_a_flip(cli, fixture_copy) -> None:  # type: ignore[no-untyped-def]
    root = fixture_copy("seed_mlp")
    r = cli("verify", root, "--record", "--json")
    assert r.code == 0
    assert sorted(r.json()["recorded"]) == ["300/default", "400/default", "500/default"]
    digest = json.loads((root / "500" / "default" / "_CKPT_DIGESTS.json").read_text())
    assert digest["format"] == "ckpt-digests" and digest["version"] == 2
    assert digest["leaves"]["params.Dense_0.kernel"]["shape"] == [16, 64]
    assert not list(root.rglob("*.tmp-*"))
    assert cli("verify", root, "--deep").code == 0
    data = max((root / "400" / "default").glob("ocdbt.process_0/d/*"), key=os.path.getsize)
    blob = bytearray(data.read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    data.write_bytes(bytes(blob))
    doc = cli("verify", root, "--deep", "--json").json()
    assert doc["ok"] is False
    assert {p["file"] for p in doc["problems"] if p["code"] == "datafile-checksum-mismatch"} == {
        f"400/default/{data.relative_to(root / '400' / 'default')}"
    }
    # A damaged item is never re-baselined.
    again = cli("verify", root, "--step", "400", "--record", "--json")
    assert again.code == 1 and again.json()["recorded"] == []
    assert "not recorded" in again.stderr


def test_sample_is_reproducible_with_a_seed(cli) -> None:  # type: ignore[no-untyped-def]
    a = cli("verify", FIXTURES / "seed_mlp", "--sample", "30%", "--seed", "7", "--json").json()
    b = cli("verify", FIXTURES / "seed_mlp", "--sample", "30%", "--seed", "7", "--json").json()
    assert a["checked"]["sample"] == b["checked"]["sample"]
    assert a["checked"]["sample"]["seed"] == 7
    assert 0 < a["checked"]["sample"]["chunks"] < a["checked"]["sample"]["of_chunks"]
    small = cli("verify", FIXTURES / "seed_mlp", "--sample", "1KiB", "--seed", "1", "--json").json()
    assert small["checked"]["sample"]["chunks"] >= 1


def test_nonfinite_is_a_warning_unless_asked(cli, fixture_copy) -> None:  # type: ignore[no-untyped-def]
    import numpy as np
    import tensorstore as ts

    root = fixture_copy("no_ocdbt")
    arr = ts.open(
        {"driver": "zarr", "kvstore": f"file://{root}/0/default/params.Dense_0.kernel/"}
    ).result()
    arr[0, :3] = np.array([np.nan, np.inf, -np.inf], np.float32)
    r = cli("verify", root, "--deep", "--json")
    assert r.code == 0
    doc = r.json()
    assert doc["nonfinite"] == [
        {"item": "0/default", "leaf": "params.Dense_0.kernel", "nan": 1, "inf": 2, "step": 0}
    ]
    assert [p["severity"] for p in doc["problems"] if p["code"] == "nonfinite"] == ["warning"]
    assert cli("verify", root, "--deep", "--fail-on-nonfinite").code == 1


@pytest.mark.parametrize("name", CLEAN)
def test_record_and_verify_every_layout(cli, fixture_copy, name: str) -> None:  # type: ignore[no-untyped-def]
    root = fixture_copy(name)
    recorded = cli("verify", root, "--record", "--json").json()
    assert recorded["ok"] and recorded["recorded"], recorded["problems"]
    r = cli("verify", root, "--deep", "--json")
    assert r.code == 0 and r.json()["problems"] == []
    assert set(r.json()["checked"]["digests"].values()) == {"checked"}


def test_json_and_metrics_items_verify_on_their_own(cli) -> None:  # type: ignore[no-untyped-def]
    for item in ("composite_best/4/extra", "composite_best/4/metrics", "v1_zarr3/1/metrics"):
        r = cli("verify", FIXTURES / item, "--json")
        assert r.code == 0 and r.json()["problems"] == [], r.stdout
        assert r.json()["kind"] == "item"


def test_commit_markers_are_not_part_of_the_record(cli, fixture_copy) -> None:  # type: ignore[no-untyped-def]
    """A copy without its commit markers (Orbax #394) keeps matching its recorded digests."""
    root = fixture_copy("seed_mlp")
    assert cli("verify", root, "--step", "500", "--record").code == 0
    record = json.loads((root / "500" / "default" / "_CKPT_DIGESTS.json").read_text())
    assert "commit_success.txt" not in record["files"]
    (root / "500" / "default" / "commit_success.txt").unlink()
    r = cli("verify", root, "--step", "500", "--deep", "--json")
    assert r.code == 0, r.stdout
    assert r.json()["problems"] == []


def test_ocdbt_crc_message_reads_as_english_in_text_json_and_junit(  # type: ignore[no-untyped-def]
    cli, fixture_copy, tmp_path: Path
) -> None:
    root = fixture_copy("seed_mlp")
    node = next((root / "500" / "default" / "d").iterdir())
    blob = bytearray(node.read_bytes())
    blob[len(blob) // 2] ^= 0x01
    node.write_bytes(bytes(blob))
    junit = tmp_path / "report.xml"
    text = cli("verify", root, "--step", "500", "--junit", junit)
    doc = cli("verify", root, "--step", "500", "--json")
    assert text.code == doc.code == 1
    (message,) = [p["message"] for p in doc.json()["problems"] if p["code"] == "ocdbt-crc"]
    assert " fails its CRC-32C check or does not decode" in message and " is fails" not in message
    flat = " ".join(text.stdout.split())
    assert "fails its CRC-32C check" in flat and " is fails" not in flat
    report = junit.read_text()
    assert "fails its CRC-32C check" in report and " is fails" not in report


def test_composite_verify_prints_one_digest_line_per_step(world: World, cli) -> None:  # type: ignore[no-untyped-def]
    r = cli("verify", world.composite)
    assert r.code == 0
    lines = [line for line in r.stdout.splitlines() if "no digests recorded" in line]
    assert 1 <= len(lines) <= 2, r.stdout  # 2 steps x 3 items printed 6 lines before


def test_sample_partitions_cover_every_chunk_once(world: World, cli) -> None:  # type: ignore[no-untyped-def]
    t = 3
    runs = []
    for n in range(1, t + 1):
        r = cli("verify", FIXTURES / "sharded_4x2", "--sample", f"{n}/{t}", "--json")
        assert r.code == 0, r.stderr
        runs.append(one_json_document(r.stdout)["checked"]["sample"])
    assert all(s["subset"] == f"{i + 1}/{t}" for i, s in enumerate(runs))
    total = runs[0]["of_chunks"]
    assert total > t and all(s["of_chunks"] == total for s in runs)
    assert sum(s["chunks"] for s in runs) == total
    assert sum(s["bytes"] for s in runs) == runs[0]["of_bytes"]
    again = one_json_document(
        cli("verify", FIXTURES / "sharded_4x2", "--sample", f"2/{t}", "--json").stdout
    )
    assert again["checked"]["sample"] == runs[1]


@pytest.mark.parametrize("bad", ["0/4", "5/4", "1/0", "a/b", "2/"])
def test_sample_subset_must_make_sense(world: World, cli, bad: str) -> None:  # type: ignore[no-untyped-def]
    r = cli("verify", world.good, "--sample", bad)
    assert r.code == 2 and "--sample" in r.stderr
    assert "N/T" in r.stderr, r.stderr  # the message names the form that was meant


def test_a_damaged_chunk_is_in_exactly_one_subset(world: World, cli, fixture_copy) -> None:  # type: ignore[no-untyped-def]
    root = fixture_copy("no_ocdbt")
    chunk = root / "0" / "default" / "params.Dense_0.kernel" / "0.0"
    chunk.write_bytes(b"not zstd" * 8)
    t = 4
    found = []
    for n in range(1, t + 1):
        r = cli("verify", root, "--sample", f"{n}/{t}", "--json")
        codes = {p["code"] for p in one_json_document(r.stdout)["problems"]}
        found.append("decode-error" in codes)
        assert r.code == (1 if found[-1] else 0), r.stdout
    assert found.count(True) == 1, found


def test_max_duration_reports_coverage(world: World, cli) -> None:  # type: ignore[no-untyped-def]
    r = cli("verify", world.good, "--deep", "--max-duration", "10m", "--json")
    assert r.code == 0, r.stderr
    cov = one_json_document(r.stdout)["checked"]["coverage"]
    assert cov["complete"] is True and cov["stopped"] is None
    assert cov["bytes"] == cov["of_bytes"] > 0
    assert cov["leaves"] == cov["of_leaves"] > 0
    assert cov["budget_s"] == 600


@pytest.mark.parametrize(
    ("args", "phrase"),
    [
        (["--max-duration", "10m"], "--deep or --sample"),
        (["--deep", "--max-duration", "10"], "duration"),  # a duration needs its unit
        (["--deep", "--rotate"], "--rotate needs --max-duration"),
        (["--record", "--max-duration", "10m"], "--record"),  # a record needs every chunk
    ],
)
def test_budget_flags_are_checked(world: World, cli, args: list[str], phrase: str) -> None:  # type: ignore[no-untyped-def]
    r = cli("verify", world.good, *args)
    assert r.code == 2, r.stderr
    assert phrase in r.stderr and "No such option" not in r.stderr, r.stderr


def test_rotate_keeps_its_state_next_to_the_digests(world: World, cli) -> None:  # type: ignore[no-untyped-def]
    assert cli("verify", world.good, "--record").code == 0
    r = cli(
        "verify", world.good, "--latest", "--deep", "--max-duration", "10m", "--rotate", "--json"
    )
    assert r.code == 0, r.stderr
    rotation = one_json_document(r.stdout)["checked"]["rotation"]
    assert rotation["cycle_complete"] is True
    state = world.good / "500" / "default" / STATE_FILE
    assert state.is_file() and json.loads(state.read_text())["format"] == "ckpt-verify-state"
    # Neither the state file nor the digests make verify complain, even under --strict.
    again = one_json_document(cli("verify", world.good, "--strict", "--json").stdout)
    assert again["ok"] is True, again["problems"]


def test_verify_refuses_latest_with_step(cli) -> None:  # type: ignore[no-untyped-def]
    r = cli("verify", FIXTURES / "seed_mlp", "--latest", "--step", "500")
    assert r.code == 2, r.stdout + r.stderr
    assert "--latest" in r.stderr and "--step" in r.stderr
    assert r.stdout == ""


def test_truncated_file_names_its_leaves_in_json(cli) -> None:  # type: ignore[no-untyped-def]
    doc = cli("verify", DAMAGED / "truncated-data-file", "--json").json()
    problems = [p for p in doc["problems"] if p["code"] == "data-file-truncated"]
    assert problems
    for p in problems:
        named = re.findall(r"(?:params|opt_state)\.[\w.]+\w", p["message"])
        assert named
        assert p["leaf"] in named
        assert sorted(p["leaves"]) == sorted(named)


def test_deep_ok_without_digests_says_what_it_cannot_see(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    one_step_root = tmp_path / "run"
    shutil.copytree(FIXTURES / "seed_mlp" / "500", one_step_root / "500")
    r = cli("verify", one_step_root, "--deep")
    assert r.code == 0
    last = r.stdout.strip().splitlines()[-1]
    assert last.startswith("OK")
    assert "no digests recorded: value changes are not detectable; run --record" in last, last
    assert cli("verify", one_step_root, "--record").code == 0
    recorded = cli("verify", one_step_root, "--deep").stdout.strip().splitlines()[-1]
    assert recorded.startswith("OK") and "no digests" not in recorded
