"""``gs://`` through TensorStore's ``gcs`` driver against gcp-storage-emulator on 127.0.0.1
(``STORAGE_EMULATOR_HOST``: ckpt hands it to TensorStore as ``TENSORSTORE_GCS_HTTP_URL``)."""

from __future__ import annotations

from typing import Any

from tests.support.buckets import WRITERS, listing_view, normalized, upload_gcs
from tests.support.paths import FIXTURES
from tests.support.remote_servers import BUCKET, GcsServer


def test_gs_read_commands_equal_local(cli: Any, gcs: GcsServer) -> None:
    local = str(FIXTURES / "seed_mlp")
    url = upload_gcs(FIXTURES / "seed_mlp", "gcs/seed_mlp")
    for args in (("ls",), ("inspect",), ("verify", "--deep")):
        a = cli(args[0], local, *args[1:], "--json")
        b = cli(args[0], url, *args[1:], "--json")
        assert a.code == b.code == 0, b.stderr
        want, got = normalized(a.json(), local, url), normalized(b.json(), "", "")
        if args == ("ls",):
            want, got = listing_view(want), listing_view(got)
        assert got == want, args
    assert cli("diff", url, local).code == 0


def test_gs_write_and_prune(cli: Any, gcs: GcsServer) -> None:
    src = FIXTURES / "seed_mlp"
    out = f"gs://{BUCKET}/gcs/out"
    written = cli("reshard", src, out, *WRITERS["reshard"])
    assert written.code == 0, written.stderr
    assert cli("diff", src, out).code == 0
    assert cli("verify", out, "--deep").code == 0
    url = upload_gcs(src, "gcs/prune")
    pruned = cli("prune", url, "--keep-last", "1", "--yes", "--json")
    assert pruned.code == 0, pruned.stderr
    assert pruned.json()["outcome"]["deleted"] == ["300", "400"]
    listed = cli("ls", url, "--json").json()
    assert [s["step"] for s in listed["steps"]] == [500]
