"""Which directories are per-process OCDBT databases and which files are a database's, on the
Orbax 0.12.x layouts: custom process ids, replica-separate folders, a v1 partial save's renamed
databases, metadata and values stored apart (``ocdbt_meta/``, ``ocdbt_data/``)."""

from __future__ import annotations

import pytest

from ckpt_cli.core.format.names import MANIFEST, is_process_db
from ckpt_cli.core.format.ocdbt import database_files, database_of, item_databases
from tests.support.orbax012_layouts import NAMES, item_dir, item_files, truth


def _databases_on_disk(name: str) -> list[str]:
    """The per-process database directories the truth lists for a root, item-relative."""
    prefix = item_dir(name) + "/"
    return sorted(d[len(prefix) :] for d in truth(name)["process_dbs"])


def test_every_per_process_database_orbax_writes_is_one_whatever_its_id() -> None:
    found = {db for name in NAMES for db in _databases_on_disk(name)}
    assert {"ocdbt.process_0", "ocdbt.process_controller", "ocdbt.process_replica_0"} <= found
    renamed = [db for db in found if db.startswith("ocdbt.process_0") and len(db) > 30]
    assert renamed  # v1 partial finalize: ocdbt.process_0<uuid hex>
    for db in found:
        assert is_process_db(db), db


@pytest.mark.parametrize(
    "name",
    ["ocdbt.process_", "ocdbt.process_a_b", "ocdbt.process_replica_", "ocdbt.process_0.tmp",
     "xocdbt.process_0", "ocdbt.process_-1", "d", "ocdbt_meta"],
)  # fmt: skip
def test_a_name_orbax_never_gives_a_process_database_is_none(name: str) -> None:
    # Orbax's OcdbtProcessSpec: ocdbt.process_(replica_)?<alphanumeric id>, nothing else.
    assert not is_process_db(name)


@pytest.mark.parametrize("name", NAMES)
def test_every_data_file_is_told_with_its_database(name: str) -> None:
    files = item_files(name)
    dbs = _databases_on_disk(name)
    assert dbs
    data = {rel: db for rel in files if (db := database_of(rel)) is not None}
    assert data
    assert set(data.values()) == {"", *dbs}  # every database holds data files
    for rel, db in data.items():
        assert rel.startswith(f"{db}/" if db else ""), rel
        assert rel.split("/")[-2] in ("d", "ocdbt_meta", "ocdbt_data"), rel
    # Nothing else is a data file: metadata, manifests, array_metadatas/.
    others = set(files) - set(data)
    assert others and not any(database_of(rel) is not None for rel in others)
    assert item_databases(files) == ["", *dbs]
    for db in dbs:
        assert database_files(f"{db}/{MANIFEST}") == db


def test_split_folders_are_a_databases_files() -> None:
    files = item_files("split_folders")
    split = [rel for rel in files if "/ocdbt_" in f"/{rel}"]
    assert any(rel.startswith("ocdbt_meta/") for rel in split)  # the merged root's nodes
    assert any(rel.startswith("ocdbt.process_0/ocdbt_data/") for rel in split)
    assert any(rel.startswith("ocdbt.process_0/ocdbt_meta/") for rel in split)
    assert not any("/d/" in f"/{rel}" for rel in files)
    for rel in split:
        assert database_of(rel) == ("" if rel.startswith("ocdbt_") else "ocdbt.process_0")
