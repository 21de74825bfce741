"""``ckpt reshard`` through the real entry point: the plan (``--dry-run``, text and JSON), what
is written (``--like``, ``--compression``, digests carried over), and every refusal: one line,
exit 2 for a request that makes no sense, 3 for a source or target that cannot be, nothing
written. The planner itself is tested in ``tests/core/reshard/``; Orbax restoring the output
(sharded, on 8 devices) in ``tests/e2e/test_reshard_orbax.py``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ckpt_cli.commands import command
from tests.support.matrix import fixture
from tests.support.paths import FIXTURES
from tests.support.sharded import assert_same_values, read_values

SHARDED = FIXTURES / "sharded_4x2"
#: What ``ckpt reshard --dry-run --json`` prints (``ReshardPlanJSON``) and each of its leaves.
PLAN_KEYS = {"schema_version", "ok", "mesh", "total_bytes", "unused_rules", "leaves", "items"}
LEAF_KEYS = {
    "name", "dtype", "shape", "old_chunk_shape", "new_chunk_shape", "partition_spec", "rule",
    "follows", "size_bytes", "problem",
}  # fmt: skip


def test_dry_run_json_is_the_plan_and_writes_nothing(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    dst = tmp_path / "out"
    r = cli(
        "reshard", SHARDED, dst, "--mesh", "data=2,model=4", "--rule", "params.w=[data, model]",
        "--dry-run", "--json",
    )  # fmt: skip
    assert r.code == 0, r.stderr
    doc = r.json()
    assert set(doc) == PLAN_KEYS and doc["ok"] is True
    assert doc["schema_version"] == command("reshard").schema_version()
    assert doc["mesh"] == {"data": 2, "model": 4} and doc["unused_rules"] == []
    assert doc["leaves"] and all(set(leaf) == LEAF_KEYS for leaf in doc["leaves"])
    leaves = {leaf["name"]: leaf for leaf in doc["leaves"]}
    w = leaves["params.w"]
    assert (w["shape"], w["old_chunk_shape"], w["new_chunk_shape"]) == ([8, 4], [2, 2], [4, 1])
    assert (w["partition_spec"], w["rule"]) == (["data", "model"], ["params.w", "[data, model]"][0])
    assert leaves["params.b"]["partition_spec"] == []  # no rule: replicated
    assert leaves["scalar"]["partition_spec"] is None  # a host value has no sharding
    assert doc["total_bytes"] == sum(leaf["size_bytes"] for leaf in doc["leaves"]) == 252
    assert [i["item"] for i in doc["items"]] == ["default"]
    assert doc["items"][0]["leaves"] == doc["leaves"]
    assert not dst.exists()


def test_dry_run_text_is_a_table_of_every_leaf(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    r = cli(
        "reshard", SHARDED, tmp_path / "out", "--mesh", "data=2,model=4",
        "--rule", "params.w=[data, model]", "--dry-run",
    )  # fmt: skip
    assert r.code == 0, r.stderr
    rows = {line.split()[0]: line.split() for line in r.stdout.splitlines() if line.strip()}
    assert rows["leaf"][:5] == ["leaf", "array", "old", "chunk", "new"]
    assert rows["params.w"][1:5] == ["float32[8,4]", "[2,2]", "[4,1]", "P(data,model)"]
    assert "replicated" in rows["params.b"] and "host value" in " ".join(rows["scalar"])
    assert "target mesh data=2,model=4 (8 devices); 252 B to write" in r.stdout
    assert "dry run: nothing was changed" in r.stderr
    assert not (tmp_path / "out").exists()


def test_a_rule_that_matches_nothing_is_a_warning(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    dst = tmp_path / "out"
    r = cli("reshard", SHARDED, dst, "--mesh", "data=2", "--rule", "nomatch=[data]", "--json")
    assert r.code == 0, r.stderr
    assert "ckpt: warning: rule 'nomatch' matched no leaf" in r.stderr
    assert r.json()["unused_rules"] == ["nomatch"] and r.json()["output"] == str(dst / "7")
    assert_same_values(read_values(SHARDED), read_values(dst))


@pytest.mark.parametrize(
    ("args", "code", "phrase"),
    [
        (["--mesh", "data=2", "--like", "elsewhere"], 2, "do not combine it with --mesh"),
        (["--mesh", "data=2", "--rule", "params.w"], 2, "expected PATTERN=SPEC"),
        (["--mesh", "data=2", "--rule", "params.w=[data, data]"], 2, "used twice"),
        (["--mesh", "data=2", "--rules", "no-such-rules.yaml"], 3, "does not exist"),
        (
            ["--mesh", "data=2", "--max-chunk-bytes", "1GiB", "--memory-limit", "1GiB"],
            2,
            "must be at most a quarter of --memory-limit",
        ),
        (["--mesh", "data=2", "--step", "3"], 3, "step 3 not found"),
    ],
)
def test_bad_requests_are_one_line_and_write_nothing(  # type: ignore[no-untyped-def]
    cli, tmp_path: Path, args: list[str], code: int, phrase: str
) -> None:
    dst = tmp_path / "out"
    r = cli("reshard", SHARDED, dst, *args)
    assert r.code == code, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert lines and lines[0].startswith("ckpt: error:") and phrase in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""
    assert not dst.exists()


def test_dotdot_key_is_refused_without_ocdbt(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A key ``..`` cannot be a directory of a plain zarr item: refused, nothing written (Orbax
    0.12.8's ``odd_keys``)."""
    src = fixture("0.12.8", "odd_keys").path
    r = cli("reshard", src, tmp_path / "r", "--mesh", "x=1", "--no-ocdbt")
    assert r.code == 3, r.stderr
    assert "'..'" in r.stderr and "without OCDBT" in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_non_divisible_is_refused_before_writing(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    dst = tmp_path / "out"
    r = cli(
        "reshard", FIXTURES / "sharded_4x2", dst, "--mesh", "data=4", "--rule", "params.b=[data]"
    )
    assert r.code == 3
    assert "params.b: dimension 0 of size 6 is not divisible by 4" in r.stderr
    assert not dst.exists()
    dry = cli(
        "reshard",
        FIXTURES / "sharded_4x2",
        dst,
        "--mesh",
        "data=4",
        "--rule",
        "params.b=[data]",
        "--dry-run",
        "--json",
    )
    assert dry.code == 3
    problems = [leaf for leaf in dry.json()["leaves"] if leaf["problem"]]
    assert [p["name"] for p in problems] == ["params.b"]


def test_bad_requests(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    src = FIXTURES / "sharded_4x2"
    assert cli("reshard", src, tmp_path / "o").code == 2  # neither --mesh nor --like
    r = cli("reshard", src, tmp_path / "o", "--mesh", "data=2", "--rule", "params.w=[nope]")
    assert r.code == 2 and "unknown mesh axis 'nope'" in r.stderr
    r = cli("reshard", src, tmp_path / "o", "--mesh", "data=x")
    assert r.code == 2 and "NAME=SIZE" in r.stderr
    r = cli("reshard", src, src / "inside", "--mesh", "data=2")
    assert r.code == 2 and "inside the source" in r.stderr
    assert cli("reshard", src, tmp_path / "o", "--mesh", "data=2").code == 0
    again = cli("reshard", src, tmp_path / "o", "--mesh", "data=2")
    assert again.code == 3 and "already exists" in again.stderr


def test_an_existing_destination_step_is_refused_before_any_plan(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The destination is checked first: one line on stderr, exit 3, no plan on stdout (text,
    --json and --dry-run alike), nothing written."""
    src, out = FIXTURES / "seed_mlp", tmp_path / "out"
    assert cli("reshard", src, out, "--mesh", "data=2").code == 0
    before = sorted(str(p.relative_to(out)) for p in out.rglob("*"))
    for extra in ([], ["--dry-run"]):
        again = cli("reshard", src, out, "--mesh", "data=2", *extra)
        assert again.code == 3, again.stderr
        assert again.stdout == "", again.stdout
        assert again.stderr.splitlines() == [
            f"ckpt: error: {out / '500'} already exists (choose another destination; ckpt "
            "never overwrites a step)"
        ]
    doc = cli("reshard", src, out, "--mesh", "data=2", "--json")
    assert doc.code == 3
    assert set(doc.json()) == {"schema_version", "ok", "error"}
    assert doc.json()["error"]["code"] == "refused"
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == before


def test_failed_read_leaves_no_step(cli, fixture_copy, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    src = fixture_copy("seed_mlp")
    # seed_mlp's big chunks live out of line in ocdbt.process_0/d/: remove them.
    for f in (src / "500" / "default" / "ocdbt.process_0" / "d").iterdir():
        f.unlink()
    dst = tmp_path / "out"
    r = cli("reshard", src, dst, "--mesh", "data=2")
    assert r.code == 3, r.stderr
    assert "Traceback" not in r.stderr
    # The damaged source is refused before anything is written.
    assert "data-file-missing" in r.stderr and "ckpt verify" in r.stderr, r.stderr
    assert not dst.exists() or sorted(p.name for p in dst.iterdir()) == []  # no step, no tmp


def test_like_copies_another_layout(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    first = tmp_path / "first"
    assert (
        cli(
            "reshard",
            FIXTURES / "sharded_4x2",
            first,
            "--mesh",
            "data=2,model=4",
            "--rule",
            "params.[bw]=[null, model]",
        ).code
        == 0
    )
    second = tmp_path / "second"
    r = cli("reshard", FIXTURES / "sharded_4x2", second, "--like", first)
    assert r.code == 0, r.stderr
    history = cli("inspect", second, "--json").json()["step_custom_metadata"]["ckpt_history"]
    assert [h["operation"] for h in history] == ["reshard"] and history[0]["like"] == str(first)
    a = {x["name"]: x for x in cli("inspect", first, "--json").json()["leaves"]}
    b = {x["name"]: x for x in cli("inspect", second, "--json").json()["leaves"]}
    assert a
    for name in a:
        assert (a[name]["chunk_shape"], a[name]["sharding"]) == (
            b[name]["chunk_shape"],
            b[name]["sharding"],
        )


@pytest.mark.parametrize(
    ("args", "compressor"),
    [
        (["--compression", "none"], None),
        (["--compression", "zstd:5"], {"id": "zstd", "level": 5}),
        ([], {"id": "zstd", "level": 1}),
    ],
)
def test_compression_option_reaches_the_zarr_header(
    cli, tmp_path: Path, args: list[str], compressor: Any
) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "out"
    r = cli("reshard", FIXTURES / "no_ocdbt", out, "--mesh", "data=2", "--no-ocdbt", *args)
    assert r.code == 0, r.stderr
    header = json.loads((out / "0" / "default" / "params.Dense_0.kernel" / ".zarray").read_text())
    assert header["compressor"] == compressor
    assert_same_values(read_values(FIXTURES / "no_ocdbt"), read_values(out))


def test_bad_compression_is_a_usage_error(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    for bad in ("gzip", "zstd:0", "zstd:x"):
        r = cli(
            "reshard",
            FIXTURES / "no_ocdbt",
            tmp_path / "o",
            "--mesh",
            "data=2",
            "--compression",
            bad,
        )
        assert r.code == 2 and "--compression" in r.stderr, bad
    assert not (tmp_path / "o").exists()


def test_diff_says_identical_and_digests_carry_over(cli, fixture_copy, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    src = fixture_copy("seed_mlp")
    rec = cli("verify", src, "--step", "500", "--record")
    assert rec.code == 0, rec.stderr
    dst = tmp_path / "out"
    r = cli(
        "reshard",
        src,
        dst,
        "--mesh",
        "data=2,model=4",
        "--rule",
        "params.Dense_0.kernel=[null, model]",
    )
    assert r.code == 0, r.stderr
    diff = cli("diff", src, dst, "--step", "500", "--json")
    assert diff.code == 0, diff.stdout + diff.stderr
    assert diff.json()["equal"] is True
    digests = json.loads((dst / "500" / "default" / "_CKPT_DIGESTS.json").read_text())
    recorded = json.loads((src / "500" / "default" / "_CKPT_DIGESTS.json").read_text())
    assert digests["leaves"] == recorded["leaves"]
    assert digests["files"] != recorded["files"]  # new data files, new checksums
    deep = cli("verify", dst, "--deep", "--json")
    assert deep.code == 0, deep.stdout
    assert deep.json()["problems"] == []
    assert deep.json()["checked"]["digests"] == {"500/default": "checked"}
    # And a changed value is caught through the carried digests.
    bad = json.loads((dst / "500" / "default" / "_CKPT_DIGESTS.json").read_text())
    bad["leaves"]["params.Dense_0.bias"]["ld1"] = "ld1:" + "0" * 32
    (dst / "500" / "default" / "_CKPT_DIGESTS.json").write_text(json.dumps(bad))
    caught = cli("verify", dst, "--deep", "--json")
    assert caught.code == 1
    assert [(p["code"], p["leaf"]) for p in caught.json()["problems"]] == [
        ("digest-mismatch", "params.Dense_0.bias")
    ]
