"""verify's OCDBT walk decoded by ckpt (``scan_decoded``) against TensorStore's
(``scan_with_tensorstore``): the same keys and references on every sound fixture (each Orbax
release of the matrix, the frameworks' own saves, merged and per-process databases), and on a
damaged one the walk falls back to TensorStore's, whose problems it reports unchanged."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ckpt_cli.core.du.ocdbt import databases
from ckpt_cli.core.format.ocdbt import OcdbtFormatError
from ckpt_cli.core.storage.local import LocalLocation
from ckpt_cli.core.verify.ocdbt import scan_database, scan_decoded, scan_with_tensorstore

REPO = Path(__file__).resolve().parents[3]
FIXTURES = REPO / "fixtures"


def _items(under: Path) -> list[Path]:
    """Every item directory below ``under`` holding an OCDBT database."""
    out = set()
    for manifest in under.rglob("manifest.ocdbt"):
        parent = manifest.parent
        out.add(parent.parent if parent.name.startswith("ocdbt.process_") else parent)
    return sorted(out)


def _databases(items: list[Path]) -> list[tuple[LocalLocation, str, dict[str, int]]]:
    """(item, database, the item's files with their sizes) of every database of ``items``."""
    out = []
    for item in items:
        files = _files(item)
        out += [(LocalLocation(str(item)), db, files) for db in databases(files)]
    return out


def _files(item: Path) -> dict[str, int]:
    return {
        os.path.relpath(os.path.join(d, f), item): os.path.getsize(os.path.join(d, f))
        for d, _, names in os.walk(item)
        for f in names
    }


SOUND = [p for sub in ("ckpts", "frameworks", "matrix") for p in _items(FIXTURES / sub)]
DAMAGED = _items(FIXTURES / "damaged")


def test_there_are_fixtures_of_every_kind() -> None:
    assert len(SOUND) > 200 and DAMAGED
    assert any("ocdbt.process_" in f for item in SOUND for f in _files(item))
    assert {p.relative_to(FIXTURES / "matrix").parts[0] for p in SOUND if "matrix" in p.parts} >= {
        "0.4.3",
        "0.12.8",
    }


@pytest.mark.parametrize("sub", ["ckpts", "frameworks", "matrix"])
def test_decoded_walk_equals_tensorstore_on_every_sound_fixture(sub: str) -> None:
    items = [p for p in SOUND if (FIXTURES / sub) in p.parents]
    walks = _databases(items)
    assert items and len(walks) >= len(items)
    for loc, db, files in walks:
        want = scan_with_tensorstore(loc, db, files.get)
        assert want.complete and not want.problems, (loc, db)
        got = scan_decoded(loc, db, files.get)
        assert got.complete and not got.problems
        assert got.keys == want.keys, (loc, db)
        assert set(got.refs) == set(want.refs), (loc, db)
        assert len(got.refs) == len(set(got.refs))


def test_a_damaged_database_is_walked_by_tensorstore_with_its_problems() -> None:
    stopped = 0
    walks = _databases(DAMAGED)
    assert walks
    for loc, db, files in walks:
        want = scan_with_tensorstore(loc, db, files.get)
        got = scan_database(loc, db, files.get)
        assert (got.keys, set(got.refs), got.problems, got.complete) == (
            want.keys,
            set(want.refs),
            want.problems,
            want.complete,
        )
        try:
            scan_decoded(loc, db, files.get)
        except OcdbtFormatError:
            stopped += 1
    # Damage the decoder itself catches (a node's CRC, a node past its file's end) was seen.
    assert stopped >= 2


def test_a_node_with_a_flipped_bit_stops_the_decoder(tmp_path: Path) -> None:
    src = FIXTURES / "ckpts" / "seed_mlp" / "500" / "default"
    item = tmp_path / "default"
    subprocess.run(["cp", "-r", str(src), str(item)], check=True)
    files = _files(item)
    loc = LocalLocation(str(item))
    sound = scan_decoded(loc, "", files.get)
    node = next(r for r, key in sound.refs if r.kind == "btreenode")
    blob = bytearray((item / node.file).read_bytes())
    blob[node.offset + node.length // 2] ^= 0x01
    (item / node.file).write_bytes(bytes(blob))
    with pytest.raises(OcdbtFormatError, match="checksum"):
        scan_decoded(loc, "", files.get)
    codes = [p.code for p in scan_database(loc, "", files.get).problems]
    assert codes == ["ocdbt-crc"]


def test_verify_of_a_sound_checkpoint_imports_no_tensorstore() -> None:
    root = FIXTURES / "ckpts" / "seed_mlp"
    code = (
        "import sys\n"
        f"sys.argv = ['ckpt', 'verify', {str(root)!r}]\n"
        "from ckpt_cli.app import main\n"
        "try:\n    main()\nexcept SystemExit as e:\n    code = e.code\n"
        "print('exit', code, 'tensorstore' in sys.modules, 'numpy' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True
    )
    assert "OK: no problems found" in out.stdout
    assert out.stdout.strip().splitlines()[-1] == "exit 0 False False"
