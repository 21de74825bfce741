"""Metadata that is valid JSON but absurd gives exit 3 with one line, or the
value shown as it is; never an internal error. Inspect's tree view stays linear in the size of
the tree.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.ckpt_process import INTERNAL_ERROR, ckpt, copy_fixture, edit_json
from tests.support.cli import CliResult

DEEP = 5000


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def _timestamp(value: int) -> Callable[[Path], Path]:
    def make(tmp: Path) -> Path:
        src = copy_fixture("composite_best", tmp / "S")
        edit_json(
            src / "4" / "_CHECKPOINT_METADATA",
            lambda m: m.__setitem__("commit_timestamp_nsecs", value),
        )
        return src

    make.__name__ = f"commit_timestamp_{'minus_' if value < 0 else ''}1e30"
    return make


def huge_metric(tmp: Path) -> Path:
    src = copy_fixture("composite_best", tmp / "S")
    (src / "4" / "metrics" / "metrics").write_text('{"loss": ' + "9" * 5001 + "}")
    return src


def deep_metric(tmp: Path) -> Path:
    src = copy_fixture("composite_best", tmp / "S")
    (src / "4" / "metrics" / "metrics").write_text('{"loss": ' + nested(DEEP) + "}")
    return src


def deep_step_custom_metadata(tmp: Path) -> Path:
    src = copy_fixture("composite_best", tmp / "S")
    meta = src / "4" / "_CHECKPOINT_METADATA"
    text = meta.read_text().rstrip()
    doc = json.loads(text)
    doc["custom_metadata"] = {}
    body = json.dumps(doc)
    meta.write_text(body.replace('"custom_metadata": {}', '"custom_metadata": ' + nested(DEEP)))
    return src


def deep_root_metadata(tmp: Path) -> Path:
    src = copy_fixture("composite_best", tmp / "S")
    (src / "metadata" / "_ROOT_METADATA").write_text(
        '{"internal_metadata": {}, "custom_metadata": ' + nested(DEEP) + "}"
    )
    return src


def deep_tree_custom_metadata(tmp: Path) -> Path:
    src = copy_fixture("composite_best", tmp / "S")
    meta = src / "4" / "state" / "_METADATA"
    doc = json.loads(meta.read_text())
    doc["custom_metadata"] = "PLACEHOLDER"
    meta.write_text(json.dumps(doc).replace('"PLACEHOLDER"', nested(DEEP)))
    return src


def deep_sharding(tmp: Path) -> Path:
    src = copy_fixture("composite_best", tmp / "S")
    path = src / "4" / "state" / "_sharding"
    doc = json.loads(path.read_text())
    key = next(iter(doc))
    doc[key] = "PLACEHOLDER"
    path.write_text(json.dumps(doc).replace('"PLACEHOLDER"', json.dumps(nested(DEEP))))
    return src


SOURCES = [
    _timestamp(10**30),
    _timestamp(-(10**30)),
    huge_metric,
    deep_metric,
    deep_step_custom_metadata,
    deep_root_metadata,
    deep_tree_custom_metadata,
    deep_sharding,
]
COMMANDS = {
    "ls": ["ls", "{src}"],
    "ls-json": ["ls", "{src}", "--json"],
    "inspect": ["inspect", "{src}", "--item", "state"],
    "inspect-json": ["inspect", "{src}", "--item", "state", "--json"],
    "verify": ["verify", "{src}"],
    "du": ["du", "{src}", "--json"],
    "prune": [
        "prune",
        "{src}",
        "--keep-best",
        "1",
        "--metric",
        "loss",
        "--mode",
        "min",
        "--dry-run",
    ],
}


CASES = [
    pytest.param(make, command, id=f"{command}-{make.__name__}")
    for make in SOURCES
    for command in COMMANDS
]


@pytest.mark.parametrize(("make", "command"), CASES)
def test_absurd_but_valid_json_never_crashes(
    cli: Callable[..., CliResult], tmp_path: Path, make: Callable[[Path], Path], command: str
) -> None:
    """In-process (these commands import neither jax nor orbax): exit 0/1/3, never 70."""
    src = make(tmp_path)
    run = cli(*[a.format(src=src) for a in COMMANDS[command]])
    code, stderr = run.code, run.stderr
    assert INTERNAL_ERROR not in stderr, stderr
    assert code in (0, 1, 3), stderr
    if code == 3:
        assert len([x for x in stderr.splitlines() if x.startswith("ckpt: error")]) == 1, stderr


def _deep_keypath(tmp: Path, depth: int) -> tuple[Path, int]:
    src = copy_fixture("seed_mlp", tmp / "S")
    meta = src / "500" / "default" / "_METADATA"
    doc = json.loads(meta.read_text())
    keys = [f"k{i}" for i in range(depth)]
    doc["tree_metadata"][str(tuple(keys))] = {
        "key_metadata": [{"key": k, "key_type": 2} for k in keys],
        "value_metadata": {"value_type": "None", "skip_deserialize": True},
    }
    meta.write_text(json.dumps(doc))
    return src, meta.stat().st_size


def test_tree_view_of_a_deep_path_is_linear_in_the_tree(tmp_path: Path) -> None:
    """A 1,000-deep key path: the tree view prints O(size of the tree) characters (today each
    level was indented one step further: 2 MB of output for 44 KB of metadata)."""
    src, size = _deep_keypath(tmp_path, 1000)
    run = ckpt("inspect", src, timeout=120, mem_limit=None)
    assert run.code == 0, run.stderr
    assert "k999" in run.stdout
    assert len(run.stdout) < 4 * size, len(run.stdout)


def test_tree_view_of_a_5000_deep_path_finishes(tmp_path: Path) -> None:
    """The issue's depth; a hang guard (no timing assertion): it took minutes before."""
    src, size = _deep_keypath(tmp_path, DEEP)
    run = ckpt("inspect", src, timeout=30, mem_limit=None)
    assert run.code == 0, run.stderr[-300:]
    assert len(run.stdout) < 4 * size
