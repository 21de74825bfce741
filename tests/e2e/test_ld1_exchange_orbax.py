"""``ld1`` digests through ``export`` and ``import`` (the ``ckpt.ld1`` metadata key): a
TrainState saved by the installed Orbax and recorded is exported to one file and to shards;
every file carries each tensor's digest, which ``ckpt digest`` of the files reproduces; the
import checks them as it writes, records them in the new item (``verify --deep`` checks them),
and the step restores into the user's state and trains on. Damage is refused before anything
is committed: a safetensors byte changed after the export, an Orbax value changed after the
record."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ckpt_cli.errors import SourceDigestError
from tests.support.exchange import export, import_, load_dir

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:

    from ckpt_cli.core.storage import LocalLocation
    from ckpt_cli.core.verify.run import verify_path
    from ckpt_cli.core.verify.types import VerifyOptions
    from tests.support import linen_train_state as lts

    root = tmp_path_factory.mktemp("ld1") / "root"
    state = lts.save_trained(root)
    assert verify_path(LocalLocation(str(root)), VerifyOptions(record=True)).recorded
    return root, state


def _record(item: Path) -> dict[str, str]:
    doc = json.loads((item / "_CKPT_DIGESTS.json").read_text())
    assert doc["version"] == 2 and doc["leaves"]
    return {k: v["ld1"] for k, v in doc["leaves"].items() if v["dtype"] != "string"}


@pytest.mark.parametrize("shards", [None, 600], ids=["one-file", "shards"])
def test_digests_survive_export_and_import_and_training_resumes(
    cli: Any, recorded: tuple[Path, Any], tmp_path: Path, shards: int | None
) -> None:

    from tests.support import linen_train_state as lts

    root, state = recorded
    source = _record(root / "1" / "default")
    out = tmp_path / "st"
    export(root, out, **({"max_shard_size": shards} if shards else {}))
    _, metadata = load_dir(out)
    assert metadata is not None
    carried = json.loads(metadata["ckpt.ld1"])
    assert carried == source  # every array leaf, by its tensor name (= the leaf name)
    printed = cli("digest", out, "--json")
    assert printed.code == 0, printed.stderr
    st_leaves = [x for item in printed.json()["items"] for x in item["leaves"]]
    assert st_leaves and {x["name"]: x["digest"] for x in st_leaves} == source
    back = tmp_path / "back"
    import_(out, back, step=1, target="tests.support.linen_train_state:abstract_state")
    assert _record(back / "1" / "default") == source
    deep = cli("verify", back, "--deep", "--json")
    assert deep.code == 0 and deep.json()["checked"]["digests"] == {"1/default": "checked"}
    lts.assert_resumes(back, state)


def test_import_refuses_a_file_changed_after_export(
    cli: Any, recorded: tuple[Path, Any], tmp_path: Path
) -> None:
    import safetensors

    root, _ = recorded
    out = tmp_path / "st"
    export(root, out)
    (path,) = out.glob("*.safetensors")
    data = path.read_bytes()
    header = 8 + int.from_bytes(data[:8], "little")
    entry = json.loads(data[8:header])["params.Dense_0.kernel"]["data_offsets"]
    blob = bytearray(data)
    blob[header + entry[0] + 1] ^= 0x01  # a valid float still: only the digest can tell
    path.write_bytes(bytes(blob))
    assert safetensors.deserialize(path.read_bytes())  # the file still parses
    r = cli("import", out, tmp_path / "back", "--step", "1", "--json")
    assert r.code == 3, r.stdout + r.stderr
    assert r.json()["error"]["code"] == "source-digest-mismatch"
    assert "params.Dense_0.kernel" in r.json()["error"]["message"]
    assert not list((tmp_path / "back").glob("1*"))


def test_export_refuses_a_source_changed_after_recording(fixture_copy, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import tensorstore as ts

    from ckpt_cli.core.storage import LocalLocation
    from ckpt_cli.core.verify.run import verify_path
    from ckpt_cli.core.verify.types import VerifyOptions

    root = fixture_copy("no_ocdbt")
    assert verify_path(LocalLocation(str(root)), VerifyOptions(record=True)).recorded
    item = root / "0" / "default"
    arr = ts.open({"driver": "zarr", "kvstore": f"file://{item}/params.Dense_0.kernel/"}).result()
    values = arr.read().result()
    values[0, 0] += 1.0
    arr.write(values).result()
    with pytest.raises(SourceDigestError, match=r"params\.Dense_0\.kernel"):
        export(root, tmp_path / "st")
    assert not (tmp_path / "st").exists()


@pytest.mark.parametrize("shards", [None, 600], ids=["one-file", "shards"])
def test_export_of_an_unrecorded_step_writes_ld1_and_import_keeps_it(
    cli: Any, tmp_path: Path, shards: int | None
) -> None:
    """No record in the source: export computes every tensor's ``ld1`` from the blocks it
    writes; the import checks and records them; ``ckpt digest`` of the imported step equals
    ``ckpt digest`` of the source."""

    from tests.support import linen_train_state as lts

    root = tmp_path / "root"
    state = lts.save_trained(root)
    assert not (root / "1" / "default" / "_CKPT_DIGESTS.json").exists()
    source = cli("digest", root, "--json")
    assert source.code == 0, source.stderr
    want = {x["name"]: x["digest"] for x in source.json()["items"][0]["leaves"] if x["digest"]}
    assert want
    out = tmp_path / "st"
    export(root, out, **({"max_shard_size": shards} if shards else {}))
    files = sorted(out.glob("*.safetensors"))
    assert len(files) == 1 if shards is None else len(files) > 1
    _, metadata = load_dir(out)
    assert metadata is not None
    written = json.loads(metadata["ckpt.ld1"])
    assert written and set(written.items()) <= set(want.items())
    back = tmp_path / "back"
    import_(out, back, step=1, target="tests.support.linen_train_state:abstract_state")
    assert _record(back / "1" / "default") == written  # checked while importing, recorded
    again = cli("digest", back, "--json")
    assert again.code == 0, again.stderr
    got = {x["name"]: x["digest"] for x in again.json()["items"][0]["leaves"] if x["digest"]}
    assert got == want
    lts.assert_resumes(back, state)
