"""Every read command on the local tier of Orbax 0.12.8's emergency checkpoint managers
(``fixtures/orbax012/emergency/``): ``verify`` exits 0 with its note, ``ls`` keeps the steps
committed and says whose shards they hold, ``du`` counts what is stored, and the commands that
need whole leaves (``inspect --stats``, ``trend``, ``digest``, ``diff``) refuse in one line
pointing at the persistent tier, never at ``ckpt verify`` nor at a copy to restore."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.support.paths import REPO

EMERGENCY = REPO / "fixtures" / "orbax012" / "emergency"
ECM = EMERGENCY / "ecm" / "local_p2"
REFUSAL = (
    "params.b is only partly on this host (local tier of Orbax's emergency manager, process "
    "2's shards): read the persistent tier"
)
LOCAL = [
    *(EMERGENCY / "ecm" / f"local_p{p}" for p in (2, 3)),
    *(EMERGENCY / "replicator" / f"local_p{p}" for p in range(4)),
    *(EMERGENCY / "p2p" / f"local_p{p}" for p in range(4)),
]


def _no_false_advice(text: str) -> None:
    assert "ckpt verify" not in text and "restore" not in text and "from a copy" not in text


@pytest.mark.parametrize("local", LOCAL, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_verify_of_every_local_tier_exits_0(cli, local: Path) -> None:  # type: ignore[no-untyped-def]
    r = cli("verify", local, "--deep", "--json")
    assert r.code == 0, r.stdout
    doc = r.json()
    assert doc["ok"] and doc["schema_version"] == 8
    assert not [p for p in doc["problems"] if p["severity"] == "error"]
    assert doc["local_tiers"] and all(t["partial_leaves"] for t in doc["local_tiers"])


def test_verify_says_the_tier_in_a_note(cli) -> None:  # type: ignore[no-untyped-def]
    r = cli("verify", ECM)
    assert r.code == 0, r.stdout
    assert "chunk-missing" not in r.stdout and "unknown" not in r.stdout
    assert (
        "note: 4/state: local tier of Orbax's emergency or replicator CheckpointManager: only "
        "the shards of process 2 (devices 4096, 4097) are stored here; 3 of 4 arrays are "
        "partial by design (6 of their 12 chunks stored here, the rest on other hosts)"
    ) in " ".join(r.stdout.split())
    assert "OK: no problems found" in r.stdout


def test_verify_of_a_p2p_local_tier_warns(cli) -> None:  # type: ignore[no-untyped-def]
    r = cli("verify", EMERGENCY / "p2p" / "local_p1")
    assert r.code == 0
    text = " ".join(r.stdout.split())
    assert "warning chunk-missing" in text
    assert "looks like the local tier of Orbax's p2p manager, process 1's shards" in text
    assert "OK: 0 errors, 1 warning" in text


def test_ls_keeps_the_steps_committed_and_names_the_tier(cli) -> None:  # type: ignore[no-untyped-def]
    r = cli("ls", ECM)
    assert r.code == 0, r.stderr
    assert (
        "steps 3, 4: local tier of Orbax's emergency or replicator CheckpointManager: only "
        "the shards of process 2 (devices 4096, 4097) are stored here"
    ) in " ".join(r.stdout.split())
    doc = cli("ls", ECM, "--json").json()
    assert doc["schema_version"] == 6
    for s in doc["steps"]:
        assert s["status"] == "committed"
        assert s["local_tier"] == {
            "marker": "process-metadata",
            "process": 2,
            "devices": [4096, 4097],
            "note": "local tier of Orbax's emergency or replicator CheckpointManager: only the "
            "shards of process 2 (devices 4096, 4097) are stored here",
        }


def test_ls_names_a_p2p_local_tier_of_another_host_than_process_0(cli) -> None:  # type: ignore[no-untyped-def]
    (step,) = cli("ls", EMERGENCY / "p2p" / "local_p3", "--json").json()["steps"]
    assert step["status"] == "committed"
    assert step["local_tier"]["marker"] == "single-writer" and step["local_tier"]["process"] == 3
    assert step["local_tier"]["note"].startswith("looks like the local tier")


@pytest.mark.parametrize("root", ["ecm/persistent", "p2p/persistent"])
def test_ls_and_verify_of_a_persistent_tier_say_nothing_of_tiers(cli, root: str) -> None:  # type: ignore[no-untyped-def]
    assert [s["local_tier"] for s in cli("ls", EMERGENCY / root, "--json").json()["steps"]] == [
        None
    ] * len(list((EMERGENCY / root).iterdir()))
    doc = cli("verify", EMERGENCY / root, "--json").json()
    assert doc["ok"] and doc["problems"] == [] and doc["local_tiers"] == []


def test_ls_does_not_call_the_machinerys_entries_junk(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    local = tmp_path / "local_p0"
    shutil.copytree(EMERGENCY / "replicator" / "local_p0", local)
    (local / "replicator.yaml").write_text("x")
    (local / "p2p_restore").mkdir()
    (local / "other").mkdir()
    r = cli("ls", local, "--json")
    assert r.json()["ignored"] == ["other"]


def test_du_counts_the_chunks_stored(cli) -> None:  # type: ignore[no-untyped-def]
    r = cli("du", ECM / "4")
    assert r.code == 0, r.stderr
    assert (
        "local tier of Orbax's emergency manager, process 2's shards: holds 7 of 13 chunks"
    ) in " ".join(r.stdout.split())
    (step,) = cli("du", ECM / "4", "--json").json()["steps"]
    state = next(i for i in step["items"] if i["item"] == "state")
    logical = {leaf["name"]: leaf["logical_bytes"] for leaf in state["leaves"]}
    # half of each sharded leaf (2 of its 4 chunks) and the whole replicated one
    assert logical == {
        "params.b": 6 * 4 * 4 // 2,
        "params.big": 64 * 64 * 4 // 2,
        "params.replicated": 5 * 4,
        "params.w": 8 * 4 * 4 // 2,
    }
    assert "holds 7 of 13 chunks" in state["note"]


def test_du_deep_does_not_read_the_partial_leaves(cli) -> None:  # type: ignore[no-untyped-def]
    r = cli("du", ECM, "--deep")
    assert r.code == 0, r.stderr
    assert "could not be read" not in r.stdout


@pytest.mark.parametrize(
    "args",
    [
        ("inspect", "--stats", ECM / "4"),
        ("trend", ECM),
        ("digest", ECM / "4"),
        ("diff", ECM / "3", ECM / "4"),
        ("diff", EMERGENCY / "ecm" / "persistent" / "4" / "default", ECM / "4" / "state"),
    ],
    ids=["inspect-stats", "trend", "digest", "diff", "diff-persistent"],
)
def test_commands_that_need_whole_leaves_refuse_in_one_line(cli, args: tuple) -> None:  # type: ignore[no-untyped-def,type-arg]
    r = cli(*args)
    assert r.code == 3, r.stdout + r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert lines == [f"ckpt: error: {REFUSAL}"]
    _no_false_advice(r.stderr)


def test_a_p2p_local_tier_is_refused_as_one(cli) -> None:  # type: ignore[no-untyped-def]
    r = cli("inspect", "--stats", EMERGENCY / "p2p" / "local_p0" / "2")
    assert r.code == 3
    assert (
        "params.b is only partly on this host (looks like the local tier of Orbax's p2p "
        "manager, process 0's shards): read the persistent tier"
    ) in r.stderr
    _no_false_advice(r.stderr)


def test_plain_inspect_works_and_names_the_process_metadata(cli) -> None:  # type: ignore[no-untyped-def]
    r = cli("inspect", ECM / "4")
    assert r.code == 0, r.stderr
    assert "params" in r.stdout
    r = cli("inspect", ECM / "4", "--item", "process_metadata")
    assert r.code == 0, r.stderr
    assert "this step is one host's local tier" in " ".join(r.stdout.split())


@pytest.mark.parametrize("root", ["ecm/persistent", "p2p/persistent"])
def test_the_persistent_tier_is_read_whole(cli, root: str) -> None:  # type: ignore[no-untyped-def]
    assert cli("trend", EMERGENCY / root).code == 0
    r = cli("digest", EMERGENCY / root)
    assert r.code == 0, r.stderr


@pytest.mark.parametrize("command", [["export"], ["reshard", "--mesh", "data=1"]])
def test_a_writer_refuses_a_local_tier_as_what_it_is_not_as_damage(  # type: ignore[no-untyped-def]
    cli, tmp_path: Path, command: list[str]
) -> None:
    out = tmp_path / "out"
    r = cli(command[0], ECM, out, *command[1:])
    assert r.code == 3
    assert "only partly on this host" in r.stderr and "persistent tier" in r.stderr
    assert "damaged" not in r.stderr and "restore" not in r.stderr
    assert not out.exists()
    ok = cli(command[0], EMERGENCY / "ecm" / "persistent", tmp_path / "ok", *command[1:])
    assert ok.code == 0, ok.stderr
