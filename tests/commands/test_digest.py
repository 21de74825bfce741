"""``ckpt digest`` through the real entry point: text and JSON, every item of a step, damage
(a flipped byte changes one leaf's digest; an unreadable chunk is exit 1 naming the leaf), and
safetensors (an export prints its source's digests)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.exchange import export
from tests.support.paths import FIXTURES

LINE = re.compile(r"^(ld1:[0-9a-f]{32}|-)\s+(\S+)\[([0-9,]*)\]\s+(\S+)$")
DAMAGED = FIXTURES.parent / "damaged"


def _text(cli, path: Path, *args: str) -> dict[str, str]:  # type: ignore[no-untyped-def]
    r = cli("digest", path, *args)
    assert r.code == 0, r.stderr
    found = {}
    for line in r.stdout.splitlines():
        if line.startswith("# "):
            continue
        m = LINE.match(line)
        assert m, line
        found[m.group(4)] = m.group(1)
    assert found
    return found


def test_text_and_json_print_the_same_digests(cli) -> None:  # type: ignore[no-untyped-def]
    text = _text(cli, FIXTURES / "seed_mlp")
    doc = cli("digest", FIXTURES / "seed_mlp", "--json").json()
    assert doc["schema_version"] == 1 and doc["ok"] is True and doc["source"] == "orbax"
    assert doc["step"] == 500 and doc["algorithm"].startswith("ld1")
    leaves = doc["items"][0]["leaves"]
    assert leaves
    assert {x["name"]: x["digest"] for x in leaves} == text


def test_an_item_a_step_and_the_root_print_the_same_digests(cli) -> None:  # type: ignore[no-untyped-def]
    root = FIXTURES / "seed_mlp"
    latest = _text(cli, root)
    assert _text(cli, root / "500") == latest
    item = cli("digest", root / "500" / "default", "--json")
    assert item.code == 0, item.stderr
    [printed] = item.json()["items"]
    assert {x["name"]: x["digest"] for x in printed["leaves"]} == latest
    assert _text(cli, root, "--step", "300") != latest  # another step: other values


def test_a_step_prints_every_item_under_its_name(cli) -> None:  # type: ignore[no-untyped-def]
    r = cli("digest", FIXTURES / "composite_best")
    assert r.code == 0, r.stderr
    headings = [line[2:] for line in r.stdout.splitlines() if line.startswith("# ")]
    assert headings == ["extra", "metrics", "state"]
    doc = cli("digest", FIXTURES / "composite_best", "--json").json()
    dtypes = {x["dtype"] for item in doc["items"] for x in item["leaves"]}
    assert {"json", "int64"} <= dtypes


def test_a_flipped_byte_changes_exactly_the_leaf_it_is_in(cli) -> None:  # type: ignore[no-untyped-def]
    good = _text(cli, FIXTURES / "seed_mlp")
    bad = _text(cli, DAMAGED / "flipped-byte")
    assert sorted(good) == sorted(bad)
    assert [n for n in good if good[n] != bad[n]] == ["opt_state.0.nu.Dense_0.kernel"]


def test_an_unreadable_chunk_is_exit_1_naming_the_leaf(cli) -> None:  # type: ignore[no-untyped-def]
    r = cli("digest", DAMAGED / "deleted-data-file", "--json")
    assert r.code == 1
    assert "params.Dense_0.kernel: a chunk cannot be read" in r.stderr
    assert "Traceback" not in r.stderr
    doc = r.json()
    assert doc["ok"] is False
    broken = [x for x in doc["items"][0]["leaves"] if x["problem"]]
    assert broken and all(x["digest"] is None for x in broken)
    assert any(x["digest"] for x in doc["items"][0]["leaves"])  # the readable ones still print


def test_an_export_prints_its_sources_digests(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    export(FIXTURES / "bf16", tmp_path / "st")
    assert _text(cli, tmp_path / "st") == _text(cli, FIXTURES / "bf16")
    doc = cli("digest", tmp_path / "st" / "model.safetensors", "--json").json()
    assert doc["source"] == "safetensors" and doc["step"] is None
    r = cli("digest", tmp_path / "st", "--step", "1")
    assert r.code == 2 and "--step does not apply to safetensors" in r.stderr
