"""Issue 17 from a script author's shell: pins, prune's ranking, time-boxed and partitioned verify,
quieter Composite output, JSON items as JSON values. CLI level: these survive any re-layout of
the library underneath."""

from __future__ import annotations

import json

import pytest

from tests.support.paths import FIXTURES
from tests.support.world import World, one_json_document

PIN_FILE = "_CKPT_PINNED.json"
STATE_FILE = "_CKPT_VERIFY_STATE.json"


# --- pin / unpin --------------------------------------------------------------------------------


def test_pin_is_shown_by_ls(world: World, cli) -> None:  # type: ignore[no-untyped-def]
    r = cli("pin", world.good, "400", "--note", "best eval so far", "--json")
    assert r.code == 0, r.stderr
    doc = one_json_document(r.stdout)
    assert doc["ok"] is True and doc["step"] == 400 and doc["changed"] is True
    assert (world.good / "400" / PIN_FILE).is_file()
    listing = one_json_document(cli("ls", world.good, "--json").stdout)
    pins = {s["step"]: s["pinned"] for s in listing["steps"]}
    assert pins[300] is None and pins[500] is None
    assert pins[400]["note"] == "best eval so far" and pins[400]["pinned_at"]
    text = cli("ls", world.good)
    row = next(line for line in text.stdout.splitlines() if line.lstrip().startswith("400"))
    assert "pinned" in row


def test_pin_twice_updates_the_note_and_unpin_is_idempotent(world: World, cli) -> None:  # type: ignore[no-untyped-def]
    assert cli("pin", world.good, "400").code == 0
    again = one_json_document(cli("pin", world.good, "400", "--note", "n2", "--json").stdout)
    assert again["changed"] is True and again["note"] == "n2"
    assert one_json_document(cli("unpin", world.good, "400", "--json").stdout)["changed"] is True
    assert not (world.good / "400" / PIN_FILE).exists()
    second = one_json_document(cli("unpin", world.good, "400", "--json").stdout)
    assert second["ok"] is True and second["changed"] is False


def test_prune_keeps_a_pinned_step_with_the_reason(world: World, cli) -> None:  # type: ignore[no-untyped-def]
    assert cli("pin", world.good, "300", "--note", "paper figure 3").code == 0
    r = cli("prune", world.good, "--keep-last", "1", "--yes", "--json")
    assert r.code == 0, r.stderr
    doc = one_json_document(r.stdout)
    kept = {k["step"]: k["reasons"] for k in doc["keep"]}
    assert set(kept) == {300, 500}
    assert any(reason.startswith("pinned") and "paper figure 3" in reason for reason in kept[300])
    assert [d["step"] for d in doc["delete"]] == [400]
    assert sorted(p.name for p in world.good.iterdir() if not p.name.startswith(".")) == [
        "300",
        "500",
    ]
    # Unpinned, the same rule deletes it.
    assert cli("unpin", world.good, "300").code == 0
    assert cli("prune", world.good, "--keep-last", "1", "--yes").code == 0
    assert sorted(p.name for p in world.good.iterdir() if not p.name.startswith(".")) == ["500"]


def test_verify_does_not_flag_the_pin_file(world: World, cli) -> None:  # type: ignore[no-untyped-def]
    assert cli("pin", world.good, "500").code == 0
    doc = one_json_document(cli("verify", world.good, "--strict", "--json").stdout)
    assert doc["ok"] is True, doc["problems"]


# --- prune --keep-best ------------------------------------------------------------------------


def test_keep_best_requires_mode(world: World, cli) -> None:  # type: ignore[no-untyped-def]
    r = cli("prune", world.composite, "--keep-best", "1", "--metric", "loss", "--dry-run")
    assert r.code == 2
    assert "--mode" in r.stderr and "max" in r.stderr and "min" in r.stderr


def test_prune_plan_shows_the_metric_values(world: World, cli) -> None:  # type: ignore[no-untyped-def]
    args = ["prune", world.composite, "--keep-best", "1", "--metric", "loss", "--mode", "min"]
    doc = one_json_document(cli(*args, "--dry-run", "--json").stdout)
    ranked = {e["step"]: e["metric"] for e in [*doc["keep"], *doc["delete"]]}
    assert ranked[4] == {"name": "loss", "value": 0.2, "rank": 1}
    assert ranked[2] == {"name": "loss", "value": 0.3, "rank": 2}
    text = cli(*args, "--dry-run")
    assert text.code == 0
    rows = {line.split()[0]: line for line in text.stdout.splitlines() if line.strip()}
    assert "0.3" in rows["2"] and "0.2" in rows["4"]


# --- verify: Composite runs, --sample n/t, --max-duration, --rotate -----------------------------


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


# --- inspect: JSON items -------------------------------------------------------------------------


def test_json_item_values_are_json_values(world: World, cli) -> None:  # type: ignore[no-untyped-def]
    doc = one_json_document(cli("inspect", world.composite, "--item", "extra", "--json").stdout)
    values = {leaf["name"]: leaf["value"] for leaf in doc["leaves"]}
    assert values == {"epoch": 2, "note": "step 4", "lr": 0.001}
    strings = one_json_document(cli("inspect", FIXTURES / "strings", "--json").stdout)
    assert {leaf["name"]: leaf["value"] for leaf in strings["leaves"]}["name"] == "mlp-experiment"
