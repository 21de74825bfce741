"""A prefix too large for one listing page is listed in parallel key ranges (``bulk.py``) and
every key comes back: on moto (byte order) and on SeaweedFS, which lists in its directory
tree's order (``6/…`` before ``6.orbax-checkpoint-tmp-1/…``) and reads ``StartAfter="r/231"``
as "after the directory 231". The roots are made of names that sort next to each other
differently in the two orders, so every range boundary falls on such a name; the listing must
equal the plain, sequential one and what was put. A key beside its own prefix (``231`` and
``231/``) is listed whole wherever a page ends beside it. What the answers cannot prove complete
(a step saved while the ranges run) is listed again as one plain listing, which says so."""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import Any

import pytest

from ckpt_cli.core.storage import StorageOptions, bulk
from ckpt_cli.core.storage.stores import open_store
from tests.support.paths import FIXTURES
from tests.support.remote_servers import BUCKET, GcsServer, keys, local_files
from tests.support.storage_fixtures import S3

#: Child names next to each other in one order and apart in the other ('.' < '/' < '0').
NASTY = ("6", "6.orbax-checkpoint-tmp-1", "60", "60.orbax-checkpoint-tmp-2", "7", "70")
NASTY += ("checkpoint_6", "230", "231", "232")
#: Names of a root where every neighbour is such a pair: k, k.tmp, k0, checkpoint_k.
NAMES = sorted(
    {*NASTY}
    | {f"{k}{tail}" for k in range(1, 91) for tail in ("", ".orbax-checkpoint-tmp-1", "0")}
    | {f"checkpoint_{k}" for k in range(1, 91, 3)}
)
#: Keys directly below the root, "231" and "6" beside the child prefixes "231/" and "6/".
DIRECT = ("231", "6", "6.txt", "zz")
PER_CHILD = ("a", "b/c", "b/d", "metrics/metrics", "z")


def nasty_keys(prefix: str) -> list[str]:
    out = [f"{prefix}/{n}/{rel}" for n in NAMES for rel in PER_CHILD]
    return sorted(out + [f"{prefix}/{d}" for d in DIRECT])


def put_nasty(s3: S3, prefix: str) -> list[str]:
    want = nasty_keys(prefix)
    assert len(want) > 1000  # the first page is truncated: the ranges run
    s3.server.put_objects((k, k.encode()) for k in want)
    return want


def listed(store: Any, prefix: str) -> tuple[list[str], list[str]]:
    notes: list[str] = []
    got = [o.key for o in bulk.list_parallel(store, prefix, notes.append)]
    return got, notes


def test_names_on_every_range_boundary_are_listed_whole(s3: S3, s3_prefix: str) -> None:
    want = put_nasty(s3, s3_prefix)
    assert sorted(keys(s3.client, s3_prefix + "/")) == want  # the plain listing: what was put
    store = open_store("s3", BUCKET, StorageOptions(s3_endpoint=s3.endpoint))
    got, notes = listed(store, s3_prefix + "/")
    assert got == want
    assert len(notes) == 1 and "parallel key ranges, every child accounted for" in notes[0], notes


@pytest.mark.parametrize("max_requests", [2, 5, 13, 64])
def test_small_pages_move_the_boundaries_over_every_name(
    s3: S3, s3_prefix: str, max_requests: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pages of 20 keys: up to ``max_requests`` ranges of a few children each, each range
    paging, so the boundaries sit on ever different names."""
    want = put_nasty(s3, s3_prefix)
    monkeypatch.setattr(bulk, "PAGE", 20)
    store = open_store(
        "s3", BUCKET, StorageOptions(s3_endpoint=s3.endpoint, max_requests=max_requests)
    )
    got, notes = listed(store, s3_prefix + "/")
    assert got == want
    assert len(notes) == 1 and "every child accounted for" in notes[0], notes
    ranges = re.search(r"in (\d+) parallel key ranges", notes[0])
    assert ranges is not None and 2 <= int(ranges.group(1)) <= max_requests
    assert sorted(o.key for o in store.list_objects(s3_prefix + "/")) == want


#: A key beside its own prefix (``231`` and ``231/``) between two children, and one key after.
BESIDE = ("230/a", "230/z", "231", "231/a", "231/b/c", "231/z", "232/a", "24")


def test_a_key_beside_its_prefix_is_paged_whole_at_every_page_size(s3: S3, s3_prefix: str) -> None:
    """Pages of 1 to 8 keys put a page boundary on each side of ``231`` (SeaweedFS answers a page
    that ends on it with the token ``231/``) and between ``231`` and the prefix ``231/`` of a
    delimiter listing: both listings page through it whole."""
    prefix = s3_prefix + "/"
    want = [prefix + rel for rel in BESIDE]
    s3.server.put_objects((k, k.encode()) for k in want)
    store = open_store("s3", BUCKET, StorageOptions(s3_endpoint=s3.endpoint))
    for limit in range(1, len(want) + 1):
        for delimiter in (None, "/"):
            objects: list[str] = []
            prefixes: list[str] = []
            token: str | None = None
            for _ in range(2 * len(want)):
                page = store.list_page(prefix, token, delimiter=delimiter, limit=limit)
                objects += [o.key for o in page.objects]
                prefixes += page.prefixes
                token = page.token
                if token is None:
                    break
            assert token is None, (limit, delimiter)
            if delimiter is None:
                assert objects == want, limit
            else:
                assert (objects, prefixes) == (
                    [prefix + "231", prefix + "24"],
                    [prefix + "230/", prefix + "231/", prefix + "232/"],
                ), limit


@pytest.mark.parametrize("before", [998, 999, 1000])
def test_a_key_beside_its_prefix_on_the_first_pages_edge_is_listed(
    s3: S3, s3_prefix: str, before: int
) -> None:
    """``before`` keys ahead of ``231``: the first page of 1,000 ends just before it (on
    ``230/z``), on it, or on ``231/a``; the parallel ranges go on from there and miss nothing."""
    fill = before - 2  # 230/a and 230/z come before 231 too
    filler = [f"{s3_prefix}/1{i:03}/{rel}" for i in range(fill // 2) for rel in ("a", "b")]
    filler += [f"{s3_prefix}/199/a"] * (fill % 2)
    want = sorted(filler + [f"{s3_prefix}/{rel}" for rel in BESIDE])
    assert want.index(f"{s3_prefix}/231") == before
    s3.server.put_objects((k, k.encode()) for k in want)
    store = open_store("s3", BUCKET, StorageOptions(s3_endpoint=s3.endpoint, max_requests=4))
    assert store.list_page(s3_prefix + "/").objects[-1].key == want[999]  # the first page's edge
    got, notes = listed(store, s3_prefix + "/")
    assert got == want
    assert len(notes) == 1 and "every child accounted for" in notes[0], notes


def test_a_child_whose_keys_were_all_deleted_is_no_false_alarm(s3: S3, s3_prefix: str) -> None:
    """SeaweedFS keeps the directory of deleted keys: the delimiter listing still names it."""
    want = put_nasty(s3, s3_prefix)
    gone = [k for k in want if k.startswith(f"{s3_prefix}/60/")]
    assert gone
    s3.client.delete_objects(
        Bucket=BUCKET, Delete={"Objects": [{"Key": k} for k in gone], "Quiet": True}
    )
    store = open_store("s3", BUCKET, StorageOptions(s3_endpoint=s3.endpoint))
    got, notes = listed(store, s3_prefix + "/")
    assert got == [k for k in want if k not in gone]
    assert len(notes) == 1 and "every child accounted for" in notes[0], notes


def put_steps(s3: S3, prefix: str, steps: int) -> str:
    """``steps`` steps of two objects each (commit metadata and marker of a real Orbax step)."""
    step = FIXTURES / "composite_best" / "2"
    files = [(n, (step / n).read_bytes()) for n in ("_CHECKPOINT_METADATA", "commit_success.txt")]
    s3.server.put_objects((f"{prefix}/{i}/{n}", data) for i in range(steps) for n, data in files)
    return f"s3://{BUCKET}/{prefix}"


def test_ls_of_a_1000_step_root_lists_every_step(cli: Any, s3: S3, s3_prefix: str) -> None:
    url = put_steps(s3, s3_prefix, 1000)
    result = cli("ls", url, "--json", "-v")
    assert result.code == 0, result.stderr
    assert sorted(s["step"] for s in result.json()["steps"]) == list(range(1000))
    assert "2,000 keys, 1,000 children in" in result.stderr
    assert "every child accounted for" in result.stderr


def put_real_steps(s3: S3, prefix: str, names: list[str]) -> str:
    step = FIXTURES / "composite_best" / "2"
    files = [(rel, p.read_bytes()) for rel, p in local_files(step)]
    s3.server.put_objects((f"{prefix}/{n}/{rel}", data) for n in names for rel, data in files)
    return f"s3://{BUCKET}/{prefix}"


#: Step names on boundaries of both orders; 70 real steps of 17 objects: more than a page.
BOUNDARY_STEPS = sorted({6, 7, 60, 70, 230, 231, 232} | {k * 11 for k in range(63)})


def test_cp_of_a_bucket_root_copies_every_step(
    cli: Any, s3: S3, s3_prefix: str, tmp_path: Path
) -> None:
    names = [str(s) for s in BOUNDARY_STEPS]
    url = put_real_steps(s3, s3_prefix, [*names, "6.orbax-checkpoint-tmp-1"])
    assert len(keys(s3.client, s3_prefix + "/")) > 1000
    result = cli("cp", url, tmp_path / "copy", "--json")
    assert result.code == 0, result.stderr
    copied = sorted(p.name for p in (tmp_path / "copy").iterdir() if p.is_dir())
    assert copied == sorted(names)  # the unfinished save is not copied
    per_step = len(list(local_files(FIXTURES / "composite_best" / "2")))
    assert all(len(list(local_files(tmp_path / "copy" / n))) == per_step for n in names)


def test_prune_keeps_exactly_the_policys_steps(cli: Any, s3: S3, s3_prefix: str) -> None:
    names = [str(s) for s in BOUNDARY_STEPS]
    url = put_real_steps(s3, s3_prefix, names)
    assert len(keys(s3.client, s3_prefix + "/")) > 1000
    result = cli("prune", url, "--keep-last", "5", "--yes", "--json")
    assert result.code == 0, result.stderr
    kept = sorted(BOUNDARY_STEPS)[-5:]
    left = {k.split("/")[2] for k in keys(s3.client, s3_prefix + "/")}
    assert left == {str(s) for s in kept}
    after = cli("ls", url, "--json")
    assert after.code == 0, after.stderr
    assert [s["step"] for s in after.json()["steps"]] == kept


def test_gs_listing_of_a_large_prefix_is_complete(gcs: GcsServer) -> None:
    """gcp-storage-emulator answers every key in one page (no token) and ignores offsets, so
    only the plain listing runs there: in key order, whatever the names."""
    import tensorstore as ts

    prefix = "listing/nasty"
    want = sorted(
        [f"{prefix}/{n}/{rel}" for n in NASTY for rel in PER_CHILD]
        + [f"{prefix}/{d}" for d in DIRECT]
    )
    store = open_store("gs", BUCKET)
    kv = ts.KvStore.open(store.kvstore_spec("")).result()
    for f in [kv.write(k, k.encode()) for k in want]:
        f.result()
    got, _ = listed(store, prefix + "/")
    assert got == want


@pytest.mark.moto_only  # before_request holds the ranges until a writer has saved a step
def test_a_step_saved_while_the_ranges_run_is_found_by_one_plain_listing(
    s3: S3, s3_prefix: str
) -> None:
    """The ranges meet keys of a child the delimiter listing did not name: nothing proves them
    complete, so the prefix is listed once more, plainly, and the new step is in it."""
    want = put_nasty(s3, s3_prefix)
    new = [f"{s3_prefix}/zz_saved_meanwhile/{rel}" for rel in PER_CHILD]
    lists = 0
    saved = threading.Event()

    def hold(kind: str, path: str) -> None:
        nonlocal lists
        if kind != "LIST":
            return
        lists += 1
        if lists == 3:  # the first range, after the first page and the delimiter listing
            s3.server.put_objects((k, b"new") for k in new)
            saved.set()
        elif lists > 3:
            assert saved.wait(30)

    s3.server.before_request = hold
    store = open_store("s3", BUCKET, StorageOptions(s3_endpoint=s3.endpoint, max_requests=4))
    got, notes = listed(store, s3_prefix + "/")
    assert saved.is_set()
    assert got == sorted(want + new)
    assert len(notes) == 1 and "one plain listing" in notes[0], notes
    assert "zz_saved_meanwhile" in notes[0]


def test_a_prefix_of_files_alone_is_one_plain_listing(s3: S3, s3_prefix: str) -> None:
    """No child prefix to split into ranges: the pages follow one another."""
    want = sorted(f"{s3_prefix}/f{i:04}" for i in range(1001))
    s3.server.put_objects((k, b"f") for k in want)
    store = open_store("s3", BUCKET, StorageOptions(s3_endpoint=s3.endpoint))
    got, notes = listed(store, s3_prefix + "/")
    assert got == want
    assert len(notes) == 1 and "1,001 keys, one plain listing (no child prefixes)" in notes[0]
