"""The OCDBT reader without TensorStore (``format/ocdbt.py``) returns exactly the keys and values
TensorStore reads, on every database of the committed fixtures (Orbax 0.4-0.12, merged roots and
per-process databases, zarr2 and zarr3), and refuses damage instead of guessing."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckpt_cli.core.format import codecs
from ckpt_cli.core.format import ocdbt as fmt
from ckpt_cli.core.format.ocdbt import Fetch, OcdbtFormatError, Value, read_values
from tests.support.paths import FIXTURES

ROOT = FIXTURES.parent
DATABASES = sorted(
    {p.parent for p in (ROOT / "ckpts").rglob("manifest.ocdbt")}
    | {p.parent for p in (ROOT / "matrix").rglob("manifest.ocdbt")}
)

pytestmark = pytest.mark.skipif(not codecs.available(), reason="no libzstd or google_crc32c here")


def _fetch(db: Path) -> Fetch:
    def fetch(refs: list[tuple[str, int, int]]) -> list[bytes]:
        out = []
        for path, offset, length in refs:
            with open(db / path, "rb") as f:
                f.seek(offset)
                out.append(f.read(length))
        return out

    return fetch


def _value(db: Path, v: Value) -> bytes:
    return v if isinstance(v, bytes) else _fetch(db)([v])[0]


def test_every_fixture_database_reads_as_tensorstore_reads_it() -> None:
    import tensorstore as ts

    assert len(DATABASES) > 100  # ckpts and the version matrix
    for db in DATABASES:
        ours = read_values((db / "manifest.ocdbt").read_bytes(), _fetch(db))
        kv = ts.KvStore.open({"driver": "ocdbt", "base": f"file://{db}/"}).result()
        keys = kv.list().result()
        assert keys, db
        assert sorted(ours) == sorted(keys), db
        for key in keys:
            assert _value(db, ours[key]) == kv.read(key).result().value, (db, key)


def test_a_flipped_byte_in_a_node_is_refused(tmp_path: Path) -> None:
    db = ROOT / "ckpts" / "seed_mlp" / "500" / "default"
    fetch = _fetch(db)

    def flipped(refs: list[tuple[str, int, int]]) -> list[bytes]:
        return [bytes([d[0], d[1] ^ 0xFF, *d[2:]]) if d else d for d in fetch(refs)]

    manifest = (db / "manifest.ocdbt").read_bytes()
    assert read_values(manifest, fetch)
    with pytest.raises(OcdbtFormatError):
        read_values(manifest, flipped)
    broken = bytearray(manifest)
    broken[-10] ^= 0x01
    with pytest.raises(OcdbtFormatError):
        read_values(bytes(broken), fetch)
    for cut in (0, 7, 17, len(manifest) - 1):
        with pytest.raises(OcdbtFormatError):
            read_values(manifest[:cut], fetch)


def kvstore_with_versions(path: Path, writes: int, arity_log2: int) -> Path:
    """A database of ``writes`` commits (one key each, the first rewritten at the end) whose
    version tree has nodes of arity ``2**arity_log2``: the manifest holds only the latest."""
    import tensorstore as ts

    spec = {"version_tree_arity_log2": arity_log2}
    kv = ts.KvStore.open({"driver": "ocdbt", "base": f"file://{path}", "config": spec}).result()
    for i in range(writes):
        kv.write(f"k{i:03d}", bytes([i]) * (40 + 60 * (i % 40))).result()
    kv.write("k000", b"rewritten" * 300).result()
    return path


@pytest.mark.parametrize(("writes", "arity_log2"), [(12, 1), (40, 4)])
def test_version_tree_nodes_give_every_version(
    tmp_path: Path, writes: int, arity_log2: int
) -> None:
    """More commits than the manifest holds: the older versions' roots come from the version
    tree nodes it names (interior and leaf), one per commit after the empty first one."""
    db = kvstore_with_versions(tmp_path / "db", writes, arity_log2)
    inline, nodes, keys = fmt.read_manifest((db / "manifest.ocdbt").read_bytes())
    assert nodes and inline and inline[-1] is not None
    assert keys == writes  # the latest version's statistics
    heights: set[int] = set()

    def versions_below(v: fmt.VersionNodeRef) -> list[fmt.NodeRef | None]:  # oldest first
        heights.add(v.height)
        children, roots = fmt.decode_version_node(
            (db / v.path).read_bytes()[v.offset :][: v.length], v
        )
        return roots + [r for c in children for r in versions_below(c)]

    older = [r for v in nodes for r in versions_below(v)]
    assert 0 in heights and max(heights) > 0  # leaf and interior version nodes
    versions = older + inline
    assert versions[0] is None  # the empty tree of generation 1
    assert len([r for r in versions if r is not None]) == writes + 1
    for r in versions[1:]:
        assert r is not None
        fmt.decode_node((db / r.path).read_bytes()[r.offset : r.offset + r.length], r)


def test_threads_decoding_at_once_each_get_their_own_zstd_context() -> None:
    """zstd frames of real nodes decoded by 8 threads at once (each keeps a context of its own
    between decodes) give what one thread gives, and TensorStore's values through them."""
    from concurrent.futures import ThreadPoolExecutor

    frames = []
    for db in DATABASES[:40]:
        manifest = (db / "manifest.ocdbt").read_bytes()
        head = fmt._Reader(manifest[:-4])
        head.pos = 12
        head.varint()
        if head.varint() == 1:  # zstd
            frames.append(manifest[head.pos : -4])
    assert len(frames) > 10
    alone = [codecs.zstd_decompress(f) for f in frames]
    assert all(isinstance(d, bytes) and d for d in alone)
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(codecs.zstd_decompress, frames * 20))
    assert together == alone * 20
    db = DATABASES[0]
    ours = read_values((db / "manifest.ocdbt").read_bytes(), _fetch(db))
    with ThreadPoolExecutor(8) as pool:
        again = list(
            pool.map(
                lambda _: read_values((db / "manifest.ocdbt").read_bytes(), _fetch(db)), range(16)
            )
        )
    assert again == [ours] * 16


def test_a_context_stopped_while_made_is_dropped_without_a_word() -> None:
    """A signal raising while ``ZSTD_createDCtx`` returns left a context with no ``dctx``, and
    its ``__del__`` printed "Exception ignored ... AttributeError" after "ckpt: interrupted"
    (CI: a SIGTERM test of `verify --deep --json`). Now it frees nothing and says nothing."""
    import gc
    import sys

    freed: list[object] = []

    class Stopped:
        def ZSTD_createDCtx(self) -> object:
            raise KeyboardInterrupt

        def ZSTD_freeDCtx(self, dctx: object) -> None:
            freed.append(dctx)

    unraisable: list[object] = []
    old = sys.unraisablehook
    sys.unraisablehook = unraisable.append
    try:
        with pytest.raises(KeyboardInterrupt):
            codecs.Handle(Stopped(), "ZSTD_createDCtx", "ZSTD_freeDCtx")
        gc.collect()
        lib = type("Lib", (Stopped,), {"ZSTD_createDCtx": lambda self: 7})()
        made = codecs.Handle(lib, "ZSTD_createDCtx", "ZSTD_freeDCtx")
        del made
        gc.collect()
    finally:
        sys.unraisablehook = old
    assert unraisable == []
    assert freed == [7]  # a context that was made is freed once
