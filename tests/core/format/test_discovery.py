"""Layout discovery on the committed real fixtures and on step/tmp naming of every Orbax era."""

from __future__ import annotations

import shutil

import pytest

from ckpt_cli.core.format.discovery import choose_item, detect, latest_committed, list_steps
from ckpt_cli.core.format.names import parse_step_name
from ckpt_cli.core.format.resolve import resolve_item, resolve_items
from ckpt_cli.core.storage import LocalLocation
from ckpt_cli.errors import NotACheckpointError, NotFoundError, SeveralItemsError
from tests.support.paths import FIXTURES


@pytest.mark.parametrize(
    ("name", "step", "prefix", "tmp"),
    [
        ("100", 100, None, False),
        ("00000100", 100, None, False),
        ("ckpt_00000010", 10, "ckpt", False),
        ("my_run_7", 7, "my_run", False),
        ("3.orbax-checkpoint-tmp", 3, None, True),
        ("4.orbax-checkpoint-tmp-0", 4, None, True),
        ("5.orbax-checkpoint-tmp-1703334121930256", 5, None, True),
        ("ckpt_6.orbax-checkpoint-tmp-1689000000", 6, "ckpt", True),
    ],
)
def test_parse_step_name(name: str, step: int, prefix: str | None, tmp: bool) -> None:
    parsed = parse_step_name(name)
    assert parsed is not None
    assert (parsed.step, parsed.prefix, parsed.tmp) == (step, prefix, tmp)


@pytest.mark.parametrize("name", ["metadata", "default", "step", "100.tmp", "abc_", ".hidden"])
def test_non_step_names(name: str) -> None:
    assert parse_step_name(name) is None


@pytest.mark.parametrize(
    ("fixture", "kind"),
    [
        ("seed_mlp", "root"),
        ("sharded_4x2", "root"),
        ("composite_best", "root"),
        ("v1_zarr3", "root"),
        ("no_ocdbt", "root"),
        ("prefixed", "root"),
        ("with_tmp", "root"),
        ("single_checkpointer", "step"),
        ("msgpack_legacy", "legacy"),
        ("seed_mlp/500", "step"),
        ("seed_mlp/500/default", "item"),
        ("v1_zarr3/1/state", "item"),
        ("unmerged_ocdbt/3/default", "item"),
    ],
)
def test_detect_kind(fixture: str, kind: str) -> None:
    assert detect(LocalLocation(str(FIXTURES / fixture))).kind == kind


def test_tmp_dirs_of_all_eras_are_incomplete_and_never_latest() -> None:
    steps = list_steps(LocalLocation(str(FIXTURES / "with_tmp")))
    assert [(s.step, s.status) for s in steps] == [
        (1, "committed"),
        (2, "committed"),
        (3, "incomplete"),
        (4, "incomplete"),
        (5, "incomplete"),
        (6, "incomplete"),
    ]
    latest = latest_committed(steps)
    assert latest is not None and latest.step == 2


def test_prefixed_fixed_length_steps() -> None:
    steps = list_steps(LocalLocation(str(FIXTURES / "prefixed")))
    assert [(s.step, s.name, s.prefix) for s in steps] == [
        (0, "ckpt_00000000", "ckpt"),
        (10, "ckpt_00000010", "ckpt"),
    ]


def test_object_store_steps_need_the_commit_marker(fixture_copy) -> None:  # type: ignore[no-untyped-def]
    root = fixture_copy("seed_mlp")
    (root / "400" / "commit_success.txt").unlink()

    class Remote(LocalLocation):
        requires_commit_marker = True

        def child(self, *parts: str) -> Remote:
            return Remote(super().child(*parts).path)

    statuses = {s.step: s.status for s in list_steps(Remote(str(root)))}
    assert statuses == {300: "committed", 400: "uncommitted", 500: "committed"}
    local = {s.step: s.status for s in list_steps(LocalLocation(str(root)))}
    assert local[400] == "committed"  # locally the rename is the commit


def test_resolve_defaults_to_latest_committed_and_only_item() -> None:
    ref = resolve_item(LocalLocation(str(FIXTURES / "seed_mlp")))
    assert (ref.step, ref.name) == (500, "default")
    assert str(ref.location).endswith("seed_mlp/500/default")


def test_resolve_single_checkpointer_dir_is_its_own_item() -> None:
    ref = resolve_item(LocalLocation(str(FIXTURES / "single_checkpointer")))
    assert ref.name == "default"
    assert ref.location == LocalLocation(str(FIXTURES / "single_checkpointer"))


def test_resolve_picks_the_one_state_item_else_needs_item(fixture_copy) -> None:  # type: ignore[no-untyped-def]
    # state (StandardSave) beside extra (JsonSave): state is the one to read.
    ref = resolve_item(LocalLocation(str(FIXTURES / "composite_best")))
    assert (ref.step, ref.name) == (4, "state")
    ref = resolve_item(LocalLocation(str(FIXTURES / "composite_best")), step=2, item="extra")
    assert (ref.step, ref.name) == (2, "extra")
    # A second PyTree item (Orbax's own files, copied): no item is the obvious one.
    root = fixture_copy("composite_best")
    shutil.copytree(root / "4" / "state", root / "4" / "params")
    with pytest.raises(SeveralItemsError, match=r"several items \(extra, params, state\)") as e:
        resolve_item(LocalLocation(str(root)))
    assert e.value.items == ("extra", "params", "state") and e.value.exit_code == 2
    assert [r.name for r in resolve_items(LocalLocation(str(root)))] == [
        "extra",
        "metrics",
        "params",
        "state",
    ]


def test_resolve_missing_step_and_item() -> None:
    root = LocalLocation(str(FIXTURES / "seed_mlp"))
    with pytest.raises(NotFoundError, match="step 42 not found"):
        resolve_item(root, step=42)
    with pytest.raises(NotFoundError, match="item 'nope' not found"):
        resolve_item(root, item="nope")


def test_resolve_refuses_unfinished_step_by_number() -> None:
    with pytest.raises(NotACheckpointError, match=r"step 3 .* is incomplete"):
        resolve_item(LocalLocation(str(FIXTURES / "with_tmp")), step=3)


def test_choose_item_ignores_metrics() -> None:
    assert choose_item(["metrics", "state"], None, LocalLocation("/x")) == "state"


def test_a_grain_iterator_item_is_a_json_item_beside_the_state(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """grain's handler writes ``process_<i>-of-<n>.json`` and no ``_METADATA``: the item
    directory is an item, a JSON one, and the step's one state item stays the default."""
    pytest.importorskip("grain")
    from ckpt_cli.core.format.items import item_kind
    from ckpt_cli.core.format.metadata import read_step_metadata
    from ckpt_cli.core.format.names import is_grain_handler, json_item_files
    from tests.support import training_states as ts

    ts.grain_run(tmp_path / "run")
    step = LocalLocation(tmp_path / "run" / "3")
    handlers = read_step_metadata(step).item_handlers
    assert isinstance(handlers, dict) and is_grain_handler(handlers["data_iter"])
    assert not is_grain_handler(handlers["state"])
    assert detect(step.child("data_iter")).kind == "item"
    assert item_kind(step, "data_iter", handlers) == "json"
    assert item_kind(step, "data_iter", None) == "json"  # from its files alone
    assert resolve_item(step).name == "state"
    assert json_item_files(["process_1-of-2.json", "process_0-of-2.json", "_METADATA"]) == [
        "process_0-of-2.json",
        "process_1-of-2.json",
    ]
