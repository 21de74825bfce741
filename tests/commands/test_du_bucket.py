"""``ckpt du`` on a bucket (moto and SeaweedFS): the local answer for every layout and for
garbage made by real saves (a planted data file, a database rewritten in place, a leftover tmp
save), ``--deep`` there too, the multipart uploads left open under the path as garbage with the
bytes of their parts, and (moto, which counts requests) each manifest read once."""

from __future__ import annotations

import re
import shutil
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.buckets import normalized
from tests.support.du_saves import save
from tests.support.paths import FIXTURES
from tests.support.remote_servers import BUCKET
from tests.support.storage_fixtures import S3


def walked(path: Path) -> int:
    return sum(p.lstat().st_size for p in path.rglob("*") if p.is_file() or p.is_symlink())


@pytest.fixture(scope="module")
def with_garbage(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real OCDBT root (3 steps, a frozen leaf, no records) made untidy: a data file nothing
    references, step 2's database rewritten in place, and a save left unfinished."""
    import tensorstore as ts

    root = save(tmp_path_factory.mktemp("du") / "run", "ocdbt-zarr3", steps=(1, 2, 3))
    (root / "1" / "default" / "d" / ("0" * 32)).write_bytes(np.arange(250, dtype=np.int32))
    item = root / "2" / "default"
    arr = ts.open(
        {
            "driver": "zarr3",
            "kvstore": {"driver": "ocdbt", "base": f"file://{item}", "path": "params.embed/"},
        }
    ).result()
    arr.write(np.ones((40, 16), dtype=arr.dtype.numpy_dtype)).result()
    shutil.copytree(root / "3", root / "4.orbax-checkpoint-tmp-1712345678")
    return root


def same(cli: Any, local: str, url: str, *args: str) -> dict[str, Any]:
    a = cli("du", local, "--json", *args)
    b = cli("du", url, "--json", *args)
    assert a.code == b.code == 0, (a.stderr, b.stderr)
    doc = b.json()
    assert normalized(a.json(), local, url) == doc
    return doc


@pytest.mark.parametrize("name", ["seed_mlp", "v1_zarr3", "no_ocdbt", "no_ocdbt_zarr3", "with_tmp"])
def test_a_bucket_gives_the_local_answer_for_each_layout(cli: Any, s3: S3, name: str) -> None:
    doc = same(cli, str(FIXTURES / name), s3.fixture(name))
    assert doc["total_bytes"] == walked(FIXTURES / name)
    assert doc["steps"] and all(s["items"] for s in doc["steps"])


def test_garbage_and_deep_duplicates_in_a_bucket(
    cli: Any, s3: S3, s3_prefix: str, with_garbage: Path
) -> None:
    url = s3.put_dir(with_garbage, s3_prefix)
    doc = same(cli, str(with_garbage), url)
    assert doc["total_bytes"] == walked(with_garbage)
    kinds = Counter(g["kind"] for g in doc["garbage"])
    assert kinds == {"unreferenced-file": 1, "unreferenced-ranges": 1, "tmp-save": 1}
    planted = next(g for g in doc["garbage"] if g["kind"] == "unreferenced-file")
    assert planted["bytes"] == 1000 and planted["path"] == f"{url}/1/default/d/{'0' * 32}"
    assert not doc["duplicates"] and doc["uncompared_leaves"] > 0
    deep = same(cli, str(with_garbage), url, "--deep")
    assert deep["deep"] and deep["uncompared_leaves"] == 0
    # params.embed differs in step 2 (rewritten); params.frozen is the same in all three.
    assert [(d["leaf"], d["steps"]) for d in deep["duplicates"]] == [("params.frozen", [1, 2, 3])]


def test_open_uploads_are_garbage_with_their_parts(cli: Any, s3: S3, s3_prefix: str) -> None:
    """An upload begun and never completed (a killed writer's) under the root: listed with the
    bytes of its parts and how to abort it, outside ``total_bytes``; aborted, it is gone."""
    url = s3.put_dir(FIXTURES / "seed_mlp", s3_prefix)
    key = f"{s3_prefix}/500/default/d/{'a' * 32}"
    upload = s3.client.create_multipart_upload(Bucket=BUCKET, Key=key)["UploadId"]
    s3.client.upload_part(Bucket=BUCKET, Key=key, PartNumber=1, UploadId=upload, Body=b"x" * 12345)
    other = s3.client.create_multipart_upload(Bucket=BUCKET, Key="elsewhere/x")["UploadId"]
    try:
        doc = cli("du", url, "--json").json()
        assert doc["total_bytes"] == walked(FIXTURES / "seed_mlp")
        (g,) = [g for g in doc["garbage"] if g["kind"] == "open-upload"]
        assert g["path"] == f"s3://{BUCKET}/{key}" and g["bytes"] == 12345
        assert f"ckpt prune {url} --clean-tmp" in g["hint"]
        assert f"--key {key} --upload-id {upload}" in g["hint"]
        assert doc["garbage_bytes"] == 12345
        text = cli("du", url).stdout
        assert "besides, 1 open upload 12.1 KiB" in text
        assert "open-upload: 500/default/d/" in text
        assert all(len(line) <= 80 for line in text.splitlines())
        s3.client.abort_multipart_upload(Bucket=BUCKET, Key=key, UploadId=upload)
        assert not [g for g in cli("du", url, "--json").json()["garbage"]]
    finally:
        s3.client.abort_multipart_upload(Bucket=BUCKET, Key="elsewhere/x", UploadId=other)


def test_a_missing_bucket_path_is_exit_3(cli: Any, s3: S3, s3_prefix: str) -> None:
    r = cli("du", f"s3://{BUCKET}/{s3_prefix}/nope")
    assert r.code == 3 and r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.moto_only
def test_each_manifest_and_node_is_read_once(cli: Any, s3: S3, s3_prefix: str) -> None:
    """12 steps: one listing of the files, one listing of the open uploads, and per step one
    GET of each manifest and of each b-tree node it decodes."""
    for step in range(12):
        s3.put_dir(FIXTURES / "seed_mlp" / "500", f"{s3_prefix}/{step}")
    url = f"s3://{BUCKET}/{s3_prefix}"
    seen: list[tuple[str, str]] = []
    s3.server.before_request = lambda kind, path: seen.append((kind, path))
    doc = cli("du", url, "--json").json()
    s3.server.before_request = None
    assert len(doc["steps"]) == 12
    kinds = Counter(kind for kind, _ in seen)
    assert kinds["LIST"] == 1
    gets = Counter(path for kind, path in seen if kind == "GET")
    manifests = [p for p in gets if p.endswith("/manifest.ocdbt")]
    assert len(manifests) == 2 * 12  # the merged root and ocdbt.process_0, each step
    assert all(gets[p] == 1 for p in manifests)
    # Per step: 2 manifests and the merged root's node (ocdbt.process_0's single-node
    # versions are only referenced: every data file is), plus ListMultipartUploads once.
    assert sum(gets.values()) == 3 * 12 + 1, gets


class HoldAll:
    """A moto hook (``before_request``): every GET whose path ``wanted`` matches is held until
    ``count`` of them are in the server (10 s at most: then it is noted in ``gave_up``), so
    that they pass only if the client asks for all of them without waiting for an answer;
    ``gets`` counts every GET by path."""

    def __init__(self, wanted: Callable[[str], object], count: int) -> None:
        self.wanted, self.count = wanted, count
        self.lock, self.all_in = threading.Lock(), threading.Event()
        self.held: list[str] = []
        self.gave_up: list[str] = []
        self.gets: Counter[str] = Counter()

    def __call__(self, kind: str, path: str) -> None:
        if kind != "GET":
            return
        with self.lock:
            self.gets[path] += 1
            if self.wanted(path):
                self.held.append(path)
                if len(self.held) == self.count:
                    self.all_in.set()
        if self.wanted(path) and not self.all_in.wait(10):
            self.gave_up.append(path)


def du_held(cli: Any, s3: S3, url: str, hold: HoldAll) -> dict[str, Any]:
    s3.server.before_request = hold
    try:
        return cli("du", url, "--json").json()
    finally:
        s3.server.before_request = None
        hold.all_in.set()


@pytest.mark.moto_only
def test_every_step_is_read_in_one_wave(cli: Any, s3: S3, s3_prefix: str, tmp_path: Path) -> None:
    """40 recorded steps: the 40 merged roots' manifests, their b-tree nodes, the 40
    ``ocdbt.process_0`` manifests, the 40 digest records and the listing of the open uploads
    are asked for together, 161 GETs in flight at once, no read waiting for another's answer
    (a request costs latency: in flight at once, 161 cost one round trip, as ``ls -v``'s one
    read a step does). The server holds each of those GETs until all 161 are in it; a du that
    read a step's nodes after its manifests, or its record afterwards, or a few steps at a
    time, or listed the uploads at the end, would never get there."""
    steps = 40
    step = tmp_path / "500"
    shutil.copytree(FIXTURES / "seed_mlp" / "500", step)
    assert cli("verify", str(step), "--record").code == 0
    for i in range(steps):
        s3.put_dir(step, f"{s3_prefix}/{i}")
    first = re.compile(
        rf"/{re.escape(s3_prefix)}/\d+/default/(?:d/[0-9a-f]{{32}}|manifest\.ocdbt"
        rf"|ocdbt\.process_0/manifest\.ocdbt|_CKPT_DIGESTS\.json)$|^/{BUCKET}/?$"
    )
    hold = HoldAll(first.search, 4 * steps + 1)
    doc = du_held(cli, s3, f"s3://{BUCKET}/{s3_prefix}", hold)
    assert len(doc["steps"]) == steps and all(s["items"][0]["exact"] for s in doc["steps"])
    assert len(hold.held) == len(set(hold.held)) == 4 * steps + 1 and not hold.gave_up
    assert len([p for p in hold.held if "/default/d/" in p]) == steps
    # Four GETs a step and ListMultipartUploads: no read of a node twice, no other.
    assert sum(hold.gets.values()) == 4 * steps + 1, hold.gets
    assert [d["steps"] for d in doc["duplicates"]]  # the records were read


@pytest.mark.moto_only
def test_steps_are_decoded_while_the_wave_is_in_flight(
    cli: Any, s3: S3, s3_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """12 steps: the server holds the GETs of the last step's files until the 11 other steps
    are decoded (``step_usage`` of each: its walk is done). A du that decoded the steps after
    the wave's last answer would never get there (the hold gives up after 10 s, noted). Every
    step comes out whole, in order."""
    import ckpt_cli.core.du.run as du_run

    steps = 12
    for i in range(steps):
        s3.put_dir(FIXTURES / "seed_mlp" / "500", f"{s3_prefix}/{i}")
    decoded: list[str] = []
    others_in = threading.Event()
    usage = du_run.step_usage

    def counted(*args: Any, **kwargs: Any) -> Any:
        out = usage(*args, **kwargs)
        decoded.append(args[1])
        if len(decoded) == steps - 1:
            others_in.set()
        return out

    held: list[str] = []
    gave_up: list[str] = []

    def hold(kind: str, path: str) -> None:
        if kind == "GET" and f"/{s3_prefix}/{steps - 1}/" in path:
            held.append(path)
            if not others_in.wait(10):
                gave_up.append(path)

    monkeypatch.setattr(du_run, "step_usage", counted)
    s3.server.before_request = hold
    try:
        doc = cli("du", f"s3://{BUCKET}/{s3_prefix}", "--json").json()
    finally:
        s3.server.before_request = None
        others_in.set()
    assert len(held) == 3 and not gave_up  # two manifests and the merged root's node file
    assert sorted(decoded[:-1], key=int) == [str(i) for i in range(steps - 1)]
    assert decoded[-1] == str(steps - 1)
    assert [s["step"] for s in doc["steps"]] == list(range(steps))
    assert all(s["items"][0]["exact"] and s["items"][0]["leaves"] for s in doc["steps"])


def decoded_in_the_wave(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The directories of the steps ``du`` will decode in its first wave, as it does."""
    import ckpt_cli.core.du.run as du_run

    early: list[str] = []
    decode = du_run._early

    def counted(t: Any) -> Any:
        out = decode(t)
        if out is not None:
            early.append(t[2])
        return out

    monkeypatch.setattr(du_run, "_early", counted)
    return early


@pytest.mark.moto_only
def test_a_step_whose_wave_read_fails_is_walked_after_the_wave(
    cli: Any, s3: S3, s3_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """6 steps; step 2's root node file is deleted as its GET reaches the server (gone between
    the listing and the read). The other steps are decoded as their reads arrive; step 2 is
    left to the walk after the wave, which reads it again, stops, and has TensorStore say
    what is damaged: the item not exact, with the note, and no garbage claimed in it."""

    steps = 6
    for i in range(steps):
        s3.put_dir(FIXTURES / "seed_mlp" / "500", f"{s3_prefix}/{i}")
    early = decoded_in_the_wave(monkeypatch)
    node = re.compile(rf"^/{BUCKET}/({re.escape(s3_prefix)}/2/default/d/[0-9a-f]{{32}})$")
    gone: list[str] = []

    def drop(kind: str, path: str) -> None:
        if kind == "GET" and (m := node.match(path)) and not gone:
            gone.append(m.group(1))
            s3.client.delete_object(Bucket=BUCKET, Key=m.group(1))

    s3.server.before_request = drop
    try:
        r = cli("du", f"s3://{BUCKET}/{s3_prefix}", "--json")
    finally:
        s3.server.before_request = None
    assert len(gone) == 1 and r.code == 0, r.stderr
    assert sorted(early) == ["0", "1", "3", "4", "5"]
    items = [s["items"][0] for s in r.json()["steps"]]
    assert len(items) == steps
    assert not items[2]["exact"] and "damaged" in items[2]["note"]
    assert all(i["exact"] and i["leaves"] for n, i in enumerate(items) if n != 2)
    assert not [g for g in r.json()["garbage"] if "/2/" in g["path"]]


@pytest.mark.moto_only
@pytest.mark.parametrize("budget", [0, None])
def test_a_step_needing_a_read_the_wave_did_not_make_is_left_to_the_walk_after_it(
    cli: Any,
    s3: S3,
    s3_prefix: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    budget: int | None,
) -> None:
    """4 recorded steps. With no room in the wave for the digest records (``budget`` 0), no
    step is decoded in the wave (each would read its record on its own, one round trip after
    another): all are walked after it, their records read together; with the default room,
    all are decoded in the wave. The answer is the local one either way."""
    import ckpt_cli.core.du.wave as du_wave

    step = tmp_path / "500"
    shutil.copytree(FIXTURES / "seed_mlp" / "500", step)
    assert cli("verify", str(step), "--record").code == 0
    root = tmp_path / "run"
    for i in range(4):
        shutil.copytree(step, root / str(i))
        s3.put_dir(step, f"{s3_prefix}/{i}")
    if budget is not None:
        monkeypatch.setattr(du_wave, "FIRST_READ_BYTES", budget)
    early = decoded_in_the_wave(monkeypatch)
    doc = same(cli, str(root), f"s3://{BUCKET}/{s3_prefix}")
    assert sorted(early) == ([] if budget == 0 else ["0", "1", "2", "3"])
    assert [d["steps"] for d in doc["duplicates"]]  # the records were read


@pytest.mark.moto_only
def test_the_headers_of_plain_zarr_steps_are_read_once_in_one_wave(
    cli: Any, s3: S3, s3_prefix: str
) -> None:
    """40 steps saved without OCDBT: every leaf's ``.zarray`` is asked for in the same wave,
    once (not a batch a step, each on connections of its own, 16 steps at a time). The
    server holds each header's GET until all 120 are in."""
    steps, step = 40, FIXTURES / "no_ocdbt" / "0"
    headers = sorted(p.relative_to(step) for p in step.rglob(".zarray"))
    assert headers
    for i in range(steps):
        s3.put_dir(step, f"{s3_prefix}/{i}")
    hold = HoldAll(lambda path: path.endswith("/.zarray"), steps * len(headers))
    doc = du_held(cli, s3, f"s3://{BUCKET}/{s3_prefix}", hold)
    assert len(doc["steps"]) == steps and not hold.gave_up
    leaves = doc["steps"][0]["items"][0]["leaves"]
    assert len(leaves) == len(headers) and all(leaf["dtype"] for leaf in leaves)
    assert len(hold.held) == len(set(hold.held)) == steps * len(headers)
    # Each header once, and ListMultipartUploads.
    assert sum(hold.gets.values()) == steps * len(headers) + 1, hold.gets


@pytest.mark.moto_only
def test_uploads_the_store_will_not_list_are_a_note_not_a_failure(
    cli: Any, s3: S3, s3_prefix: str
) -> None:
    """A credential may read objects without listing multipart uploads: du still answers,
    with a note that the open uploads were not listed."""
    url = s3.put_dir(FIXTURES / "with_tmp", s3_prefix)

    def refuse(kind: str, path: str) -> None:
        if kind == "GET" and path.rstrip("/") == f"/{BUCKET}":  # ListMultipartUploads
            raise PermissionError("the test's credential may not list uploads")

    s3.server.before_request = refuse
    r = cli("du", url, "--json")
    s3.server.before_request = None
    assert r.code == 0, r.stderr
    doc = r.json()
    assert doc["total_bytes"] == walked(FIXTURES / "with_tmp")
    (note,) = doc["notes"]
    assert note.startswith("open multipart uploads not listed: ")
    assert not [g for g in doc["garbage"] if g["kind"] == "open-upload"]
