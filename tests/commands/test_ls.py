"""``ckpt ls`` on real fixtures: JSON shape, statuses, times, metrics, formats, latest marker."""

from __future__ import annotations

import re
from datetime import datetime

import pytest

from tests.support.paths import FIXTURES


def test_ls_json_shape_seed(cli) -> None:  # type: ignore[no-untyped-def]
    r = cli("ls", FIXTURES / "seed_mlp", "--json")
    assert r.code == 0, r.stderr
    doc = r.json()
    assert doc["schema_version"] == 6
    assert doc["root"] == str(FIXTURES / "seed_mlp")
    assert [s["step"] for s in doc["steps"]] == [300, 400, 500]
    assert doc["latest_step"] == 500
    assert [s["latest"] for s in doc["steps"]] == [False, False, True]
    for s in doc["steps"]:
        assert s["status"] == "committed"
        assert s["reason"] is None and s["deleting"] == []
        assert s["local_tier"] is None
        assert s["kind"] == "step"
        assert s["items"] == ["default"]
        assert s["formats"] == {"default": "ocdbt+zarr2"}
        assert s["time_source"] == "commit_metadata"
        assert datetime.fromisoformat(s["committed_at"]).tzinfo is not None
        assert s["size_bytes"] > 1000
        assert s["path"] == str(FIXTURES / "seed_mlp" / str(s["step"]))
    times = [s["committed_at"] for s in doc["steps"]]
    assert times == sorted(times)
    assert doc["total_bytes"] == sum(s["size_bytes"] for s in doc["steps"])


def test_ls_size_is_bytes_on_disk(cli) -> None:  # type: ignore[no-untyped-def]
    step = FIXTURES / "seed_mlp" / "500"
    expected = sum(p.stat().st_size for p in step.rglob("*") if p.is_file())
    doc = cli("ls", FIXTURES / "seed_mlp", "--json").json()
    assert doc["steps"][-1]["size_bytes"] == expected


def test_ls_tmp_dirs_are_incomplete_with_mtime(cli) -> None:  # type: ignore[no-untyped-def]
    doc = cli("ls", FIXTURES / "with_tmp", "--json").json()
    by_step = {s["step"]: s for s in doc["steps"]}
    assert {k: v["status"] for k, v in by_step.items()} == {
        1: "committed",
        2: "committed",
        3: "incomplete",
        4: "incomplete",
        5: "incomplete",
        6: "incomplete",
    }
    assert doc["latest_step"] == 2
    # The copies had commit_timestamp_nsecs nulled: their time comes from the directory.
    assert by_step[3]["time_source"] == "mtime"


def test_ls_metrics_items_root_metadata(cli) -> None:  # type: ignore[no-untyped-def]
    doc = cli("ls", FIXTURES / "composite_best", "--json").json()
    assert [s["step"] for s in doc["steps"]] == [2, 4]
    assert all(s["items"] == ["extra", "state"] for s in doc["steps"])
    assert all(isinstance(s["metrics"]["loss"], float) for s in doc["steps"])
    assert doc["root_metadata"]["custom_metadata"] == {"experiment": "composite"}


@pytest.mark.parametrize(
    ("fixture", "formats"),
    [
        ("v1_zarr3", {"state": "ocdbt+zarr3"}),
        ("no_ocdbt", {"default": "plain+zarr2"}),
        ("no_ocdbt_zarr3", {"default": "plain+zarr3"}),
    ],
)
def test_ls_formats(cli, fixture: str, formats: dict[str, str]) -> None:  # type: ignore[no-untyped-def]
    doc = cli("ls", FIXTURES / fixture, "--json").json()
    assert doc["steps"][-1]["formats"] == formats


def test_ls_prefixed_and_single_step_dir(cli) -> None:  # type: ignore[no-untyped-def]
    doc = cli("ls", FIXTURES / "prefixed", "--json").json()
    assert [(s["step"], s["name"]) for s in doc["steps"]] == [
        (0, "ckpt_00000000"),
        (10, "ckpt_00000010"),
    ]
    one = cli("ls", FIXTURES / "seed_mlp" / "400", "--json").json()
    assert [s["step"] for s in one["steps"]] == [400]


def test_ls_human_output_marks_latest(cli) -> None:  # type: ignore[no-untyped-def]
    r = cli("ls", FIXTURES / "with_tmp")
    assert r.code == 0
    assert "2 *" in r.stdout
    assert "incomplete" in r.stdout
    assert "latest committed: 2" in r.stdout


def test_ls_reports_non_step_dirs(cli, fixture_copy) -> None:  # type: ignore[no-untyped-def]
    root = fixture_copy("seed_mlp")
    (root / "notes").mkdir()
    r = cli("ls", root, "--json")
    assert r.code == 0
    assert r.json()["ignored"] == ["notes"]
    assert "not steps, ignored: notes" in r.stderr


def test_ls_damaged_step_metadata_is_a_problem_not_an_abort(cli, fixture_copy) -> None:  # type: ignore[no-untyped-def]
    root = fixture_copy("seed_mlp")
    (root / "400" / "_CHECKPOINT_METADATA").write_text("{trunc")
    r = cli("ls", root, "--json")
    assert r.code == 0
    by_step = {s["step"]: s for s in r.json()["steps"]}
    assert "not valid JSON" in by_step[400]["problem"]
    assert by_step[400]["time_source"] == "mtime"
    assert "step 400:" in r.stderr


def test_the_table_is_written_whole_or_not_at_all(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A signal while the text is built (here: in the table) leaves nothing on stdout, not the
    root's name alone; the startup-signal test found that half output in CI."""
    import signal

    from ckpt_cli.commands import ls_text as render
    from ckpt_cli.core.listing import list_root
    from ckpt_cli.core.storage import open_location
    from ckpt_cli.errors import Interrupted

    listing = list_root(open_location(str(FIXTURES / "seed_mlp")), from_listing=True)
    render.print_listing(listing)
    whole = capsys.readouterr().out
    assert str(FIXTURES / "seed_mlp") in whole and "latest committed: 500" in whole

    def interrupted(*args: object, **kwargs: object) -> list[str]:
        raise Interrupted(signal.SIGTERM)

    monkeypatch.setattr(render, "table_lines", interrupted)
    with pytest.raises(Interrupted):
        render.print_listing(listing)
    assert capsys.readouterr().out == ""


def test_single_item_checkpoint_has_no_made_up_step(cli) -> None:  # type: ignore[no-untyped-def]
    r = cli("ls", FIXTURES / "single_checkpointer")
    assert r.code == 0, r.stderr
    assert not re.search(r"^\s*0 \*", r.stdout, re.MULTILINE), r.stdout
    doc = cli("ls", FIXTURES / "single_checkpointer", "--json").json()
    assert [s["step"] for s in doc["steps"]] == [None]
