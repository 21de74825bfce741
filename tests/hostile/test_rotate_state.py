"""``verify --rotate`` never trusts its state file (``_CKPT_VERIFY_STATE.json``).

A state that is damaged (NaN, 1e400, a string, a negative or astronomic number) or does not fit
the item (another size, a cursor past the last leaf, more bytes covered than precede the
cursor) starts a new cycle with one warning line on stderr and a ``rotation.warnings`` entry in
--json; the coverage reported is what this cycle read, never what the file claims.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ckpt_cli.core.digest.records import STATE_FILE
from tests.support.world import one_json_document

RAW = "__RAW__"


def rotate(cli: Any, root: Path) -> tuple[Any, dict[str, Any]]:
    r = cli("verify", root, "--deep", "--max-duration", "1h", "--rotate", "--json")
    assert "internal error" not in r.stderr and "Traceback" not in r.stderr, r.stderr
    return r, one_json_document(r.stdout)


def edit_state(path: Path, edit: Callable[[dict[str, Any]], Any], raw: str | None = None) -> None:
    doc = json.loads(path.read_text())
    edit(doc)
    text = json.dumps(doc)
    path.write_text(text.replace(f'"{RAW}"', raw) if raw is not None else text)


def setter(**fields: Any) -> Callable[[dict[str, Any]], None]:
    return lambda doc: doc.update(fields)


CASES = [
    ("cursor 1e400", setter(cursor=RAW), "1e400", "cursor"),
    ("cursor 10**30", setter(cursor=10**30), None, "cursor"),
    ("cursor NaN", setter(cursor=RAW), "NaN", "cursor"),
    ("cursor -1", setter(cursor=-1), None, "cursor"),
    ("cursor a float", setter(cursor=1.5), None, "cursor"),
    ("cursor a string", setter(cursor="0"), None, "cursor"),
    ("cycle true", setter(cycle=True), None, "cycle"),
    ("covered_bytes 5,000 digits", setter(covered_bytes=RAW), "9" * 5000, "covered_bytes"),
    ("file_crc past 32 bits", setter(file_crc=1 << 40), None, "file_crc"),
    ("layout a number", setter(layout=7), None, "layout"),
    ("cursor past the last leaf", setter(cursor=1000 << 32), None, "leaf 1,000"),
    ("cursor past its leaf's blocks", setter(cursor=(1 << 32) - 1), None, "block 4,294,967,295"),
    ("of_bytes of another item", setter(of_bytes=1), None, "bytes of arrays"),
    ("covered past the cursor", setter(covered_bytes=10_000), None, "more than precede"),
    ("another layout", setter(layout="0" * 64), None, "other arrays"),
]


@pytest.mark.parametrize(("case", "edit", "raw", "phrase"), CASES, ids=[c[0] for c in CASES])
def test_a_state_that_cannot_be_trusted_starts_a_new_cycle_with_a_warning(
    cli: Any,
    fixture_copy: Any,
    case: str,
    edit: Callable[[dict[str, Any]], None],
    raw: str | None,
    phrase: str,
) -> None:
    root = fixture_copy("seed_mlp")
    r, _ = rotate(cli, root)
    assert r.code == 0 and r.stderr == "", r.stderr  # a clean first cycle: no warning
    state = root / "500" / "default" / STATE_FILE
    edit_state(state, edit, raw)
    r, doc = rotate(cli, root)
    assert r.code == 0, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "warning" in lines[0], r.stderr
    assert f"500/default/{STATE_FILE}" in lines[0] and phrase in lines[0], lines[0]
    rotation = doc["checked"]["rotation"]
    assert rotation["warnings"] == [lines[0].removeprefix("ckpt: warning: ")]
    # The new cycle read every byte; coverage is what was read, never what the file claimed.
    assert doc["checked"]["bytes_decoded"] == rotation["of_bytes"] > 0
    assert rotation["covered_bytes"] == doc["checked"]["bytes_decoded"]
    assert rotation["cycle_complete"] is True
    assert json.loads(state.read_text())["cursor"] == 0  # the state is whole again


def test_an_untouched_state_is_used_without_a_warning(cli: Any, fixture_copy: Any) -> None:
    root = fixture_copy("seed_mlp")
    for cycle in (1, 2):
        r, doc = rotate(cli, root)
        assert r.code == 0 and r.stderr == "", r.stderr
        assert doc["checked"]["rotation"]["warnings"] == []
        assert doc["checked"]["rotation"]["cycles_completed"] == cycle
