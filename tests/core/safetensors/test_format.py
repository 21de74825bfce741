"""The safetensors format layer against the ``safetensors`` library itself.

The library is the ground truth: files it writes are read block by block bit-identical, files
ckpt writes are the bytes it writes for the same tensors and load bit-identical through it
(``safe_open(framework="np")``; float8 through ``safetensors.deserialize``, whose numpy path has
no float8), and every damaged header that it refuses is refused here with one error type.
"""

from __future__ import annotations

import json
import math
import os
import struct
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import safetensors
import safetensors.numpy as stn

from ckpt_cli.core.safetensors import (
    SafetensorsReader,
    SafetensorsWriter,
    TensorSpec,
    find_files,
    parse_index,
    plan_files,
)
from ckpt_cli.core.safetensors.blocks import check_contiguous, contiguous_blocks, flat_offset
from ckpt_cli.core.safetensors.dtypes import FROM_NUMPY, TO_NUMPY, numpy_dtype
from ckpt_cli.core.safetensors.header import parse_header
from ckpt_cli.core.safetensors.reader import check_against_index
from ckpt_cli.errors import InvalidMetadataError, InvalidSafetensorsError, RefusedError
from tests.support.random_tensors import random_array

DTYPES = sorted(FROM_NUMPY)


def tensor_set(seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    out: dict[str, Any] = {}
    shapes = [(), (1,), (7,), (3, 5), (2, 3, 4), (4, 0), (1, 1, 9)]
    for i, dtype in enumerate(DTYPES):
        shape = shapes[(i + seed) % len(shapes)]
        out[f"layer_{i}.{dtype}.w"] = random_array(rng, dtype, shape)
    out['ünïcode name "quoted"\n'] = random_array(rng, "float32", (2, 2))
    return out


def load_with_library(path: Path) -> dict[str, bytes]:
    """Every tensor's bytes as the safetensors library reads them."""
    raw = {name: bytes(info["data"]) for name, info in safetensors.deserialize(path.read_bytes())}
    with safetensors.safe_open(str(path), framework="np") as f:
        for name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
            if f.get_slice(name).get_dtype().startswith("F8"):
                continue  # numpy has no float8 in the library's numpy path
            arr = f.get_tensor(name)
            assert arr.tobytes() == raw[name]
    return raw


def write_blocks(path: Path, tensors: dict[str, Any], max_bytes: int, seed: int = 0) -> Any:
    plan = plan_files(
        [TensorSpec(k, v.dtype.name, v.shape) for k, v in tensors.items()],
        max_shard_size=None,
        metadata={"format": "pt"},
    )
    assert len(plan.files) == 1
    jobs = []
    for name, arr in tensors.items():
        for start, shape in contiguous_blocks(arr.shape, arr.dtype.itemsize, max_bytes):
            index = tuple(slice(s, s + n) for s, n in zip(start, shape, strict=True))
            jobs.append((name, start, arr[index]))
    np.random.default_rng(seed).shuffle(jobs)  # any order: every block lands at its offset
    with SafetensorsWriter(str(path), plan.files[0]) as w:
        for name, start, block in jobs:
            w.write_block(name, start, block)
        w.commit()
    return plan


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_header_bytes_equal_the_reference_writer(seed: int, tmp_path: Path) -> None:
    tensors = tensor_set(seed)
    path = tmp_path / "x.safetensors"
    write_blocks(path, tensors, max_bytes=1 << 20, seed=seed)
    assert path.read_bytes() == stn.save(tensors, metadata={"format": "pt"})
    plan = plan_files(
        [TensorSpec(k, v.dtype.name, v.shape) for k, v in tensors.items()], max_shard_size=None
    )
    assert plan.files[0].encoded_header == stn.save(tensors)[: len(plan.files[0].encoded_header)]


@pytest.mark.parametrize("max_bytes", [1, 3, 8, 24, 1 << 20])
def test_blocks_written_in_any_order_load_bit_identical(max_bytes: int, tmp_path: Path) -> None:
    tensors = tensor_set(3)
    path = tmp_path / "x.safetensors"
    write_blocks(path, tensors, max_bytes, seed=max_bytes)
    loaded = load_with_library(path)
    assert sorted(loaded) == sorted(tensors)
    for name, arr in tensors.items():
        assert loaded[name] == arr.tobytes(), name
    assert not [p for p in os.listdir(tmp_path) if p != "x.safetensors"]


def test_bf16_and_float8_survive_as_raw_bytes(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    tensors = {
        "bf16": random_array(rng, "bfloat16", (33, 7)),
        "e4m3": random_array(rng, "float8_e4m3fn", (5, 5)),
        "e5m2": random_array(rng, "float8_e5m2", (9,)),
    }
    path = tmp_path / "x.safetensors"
    write_blocks(path, tensors, max_bytes=16)
    header = json.loads(path.read_bytes()[8 : 8 + struct.unpack("<Q", path.read_bytes()[:8])[0]])
    assert {header[k]["dtype"] for k in tensors} == {"BF16", "F8_E4M3", "F8_E5M2"}
    with safetensors.safe_open(str(path), framework="np") as f:
        got = f.get_tensor("bf16")
    assert got.dtype == np.dtype(ml_dtypes.bfloat16)
    assert got.tobytes() == tensors["bf16"].tobytes()
    loaded = load_with_library(path)
    assert all(loaded[k] == v.tobytes() for k, v in tensors.items())


def test_reader_reads_library_files_block_by_block(tmp_path: Path) -> None:
    tensors = tensor_set(4)
    path = tmp_path / "ref.safetensors"
    stn.save_file(tensors, str(path), metadata={"format": "np", "source": "test"})
    with SafetensorsReader.open(str(path)) as r:
        assert r.header.metadata == {"format": "np", "source": "test"}
        assert sorted(r.tensors) == sorted(tensors)
        for name, arr in tensors.items():
            assert r.read_tensor(name).tobytes() == arr.tobytes()
            assert r.read_tensor(name).dtype == arr.dtype
            for max_bytes in (1, 5, 64):
                parts = list(r.blocks(name, max_bytes))
                if arr.size:
                    assert parts
                assert b"".join(b.tobytes() for _, b in parts) == arr.tobytes()
            if arr.ndim:
                rows = r.read_rows(name, 0, min(2, arr.shape[0]))
                assert rows.tobytes() == arr[: min(2, arr.shape[0])].tobytes()


def test_interrupted_or_incomplete_writes_leave_no_file(tmp_path: Path) -> None:
    tensors = {"a": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.ones(3, np.int64)}
    plan = plan_files(
        [TensorSpec(k, v.dtype.name, v.shape) for k, v in tensors.items()], max_shard_size=None
    )
    final = tmp_path / "model.safetensors"
    with pytest.raises(KeyboardInterrupt), SafetensorsWriter(str(final), plan.files[0]) as w:
        w.write_tensor("a", tensors["a"])
        raise KeyboardInterrupt
    assert os.listdir(tmp_path) == []
    with SafetensorsWriter(str(final), plan.files[0]) as w:
        w.write_tensor("a", tensors["a"])
        w.write_block("b", (0,), tensors["b"][:2])
        assert [t.name for t in w.missing()] == ["b"]
        with pytest.raises(ValueError, match="not fully written"):
            w.commit()
    assert os.listdir(tmp_path) == []
    with SafetensorsWriter(str(final), plan.files[0]) as w:
        w.write_block("a", (1, 0), tensors["a"][1:])
        with pytest.raises(ValueError, match="already written"):
            w.write_block("a", (2, 0), tensors["a"][2:])
        with pytest.raises(ValueError, match="not C-contiguous"):
            w.write_block("a", (0, 1), tensors["a"][:2, 1:3])
        with pytest.raises(ValueError, match="is int64, block is int32"):
            w.write_block("b", (0,), tensors["b"].astype(np.int32))
    assert os.listdir(tmp_path) == []


def test_planner_shards_like_hugging_face(tmp_path: Path) -> None:
    # Sizes 6, 6, 2, 6, 2, 2 under a limit of 10: [6], [6+2], [6+2+2] (the hub's own example).
    sizes = [6, 6, 2, 6, 2, 2]
    specs = [TensorSpec(f"t{i}", "uint8", (n,)) for i, n in enumerate(sizes)]
    plan = plan_files(specs, max_shard_size=10, metadata={"format": "pt"})
    assert [f.name for f in plan.files] == [
        "model-00001-of-00003.safetensors",
        "model-00002-of-00003.safetensors",
        "model-00003-of-00003.safetensors",
    ]
    assert [[t.name for t in f.header.tensors] for f in plan.files] == [
        ["t0"],
        ["t1", "t2"],
        ["t3", "t4", "t5"],
    ]
    assert plan.index_name == "model.safetensors.index.json"
    index = json.loads(plan.index_json())
    assert index == {
        "metadata": {"total_size": 24},
        "weight_map": {f"t{i}": plan.files[[0, 1, 1, 2, 2, 2][i]].name for i in range(6)},
    }
    assert plan.index_json().endswith(b"}\n") and b'\n  "metadata"' in plan.index_json()
    big = plan_files([TensorSpec("huge", "float32", (100,))], max_shard_size=10)
    assert [f.name for f in big.files] == ["model.safetensors"] and big.index_name is None
    one = plan_files(specs, max_shard_size=None)
    assert len(one.files) == 1 and one.total_size == 24


@pytest.mark.parametrize(
    ("dtype", "phrase"),
    [
        ("int4", "sub-byte"),
        ("uint4", "sub-byte"),
        ("complex64", "complex"),
        ("float8_e4m3fnuz", "cast it to float8_e4m3fn"),
        ("key<fry>", "PRNG key"),
        ("<U5", "has no safetensors dtype"),
    ],
)
def test_planner_refuses_what_safetensors_cannot_hold(dtype: str, phrase: str) -> None:
    with pytest.raises(RefusedError, match=phrase) as e:
        plan_files([TensorSpec("params.w", dtype, (4,))], max_shard_size=None)
    assert "params.w" in str(e.value) and e.value.hint


def test_planner_refuses_reserved_and_duplicate_names() -> None:
    with pytest.raises(RefusedError, match="reserves"):
        plan_files([TensorSpec("__metadata__", "float32", (1,))], max_shard_size=None)
    with pytest.raises(RefusedError, match="two tensors"):
        plan_files([TensorSpec("a", "float32", (1,))] * 2, max_shard_size=None)
    with pytest.raises(RefusedError, match="strings to strings"):
        plan_files([TensorSpec("a", "float32", (1,))], max_shard_size=None, metadata={"n": 1})  # type: ignore[dict-item]


def test_dtype_table_is_the_formats() -> None:
    assert set(TO_NUMPY) == {
        "BOOL", "U8", "U16", "U32", "U64", "I8", "I16", "I32", "I64",
        "F16", "BF16", "F32", "F64", "F8_E4M3", "F8_E5M2",
    }  # fmt: skip
    for st, name in TO_NUMPY.items():
        arr = np.zeros((2,), numpy_dtype(name))
        entry = dict(safetensors.deserialize(stn.save({"x": arr})))["x"]
        assert entry["dtype"] == st


# --- damaged files: each defect one InvalidSafetensorsError, and the library refuses it too ---


def good_file() -> bytes:
    return stn.save(
        {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.arange(4, dtype=np.int16)},
        metadata={"format": "pt"},
    )


def with_header(doc: Any, data: bytes, raw: bytes | None = None) -> bytes:
    text = raw if raw is not None else json.dumps(doc).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


DATA = bytes(range(24)) + bytes(8)  # a: 24 bytes F32[2,3], b: 8 bytes I16[4]
A = {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}
B = {"dtype": "I16", "shape": [4], "data_offsets": [24, 32]}

DAMAGED: list[tuple[str, bytes, str, bool]] = [
    # (case, file bytes, phrase in our message, does the library refuse it too)
    ("empty", b"", "too short", True),
    ("short", b"\x10\x00\x00", "too short", True),
    ("length past end", struct.pack("<Q", 10_000) + b"{}", "runs past the end", True),
    ("length over limit", struct.pack("<Q", 200_000_000) + b"{}", "limit", True),
    ("truncated data", good_file()[:-3], "run past the end", True),
    ("trailing bytes", good_file() + b"\x00" * 8, "belong to no tensor", True),
    ("bad json", with_header(None, DATA, b'{"a": {"dtype": "F32",'), "not valid JSON", True),
    ("not utf-8", with_header(None, DATA, b'{"\xff": 1}'), "not UTF-8", True),
    ("not an object", with_header(None, DATA, b"[1, 2]"), "start with '{'", True),
    ("leading space", with_header(None, DATA, b' {"a": 1}'), "start with '{'", True),
    ("unknown dtype", with_header({"a": {**A, "dtype": "F12"}, "b": B}, DATA), "unknown dtype", True),
    ("size mismatch", with_header({"a": {**A, "shape": [2, 2]}, "b": B}, DATA), "needs 16", True),
    (
        "overlap",
        with_header({"a": A, "b": {**B, "data_offsets": [20, 28]}}, DATA[:28]),
        "overlaps",
        True,
    ),
    ("hole", with_header({"a": {**A, "data_offsets": [4, 28]}, "b": {**B, "data_offsets": [28, 36]}}, DATA + bytes(4)), "belong to no tensor", True),
    ("out of range", with_header({"a": A, "b": {**B, "data_offsets": [24, 40]}}, DATA), "needs 8", True),
    ("end before begin", with_header({"a": A, "b": {**B, "data_offsets": [24, 20]}}, DATA), "before it begins", True),
    ("negative shape", with_header({"a": {**A, "shape": [-2, 3]}, "b": B}, DATA), "non-negative", True),
    ("float offsets", with_header({"a": {**A, "data_offsets": [0.0, 24]}, "b": B}, DATA), "begin, end", True),
    ("missing shape", with_header({"a": {"dtype": "F32", "data_offsets": [0, 24]}, "b": B}, DATA), "no 'shape'", True),
    ("metadata number", with_header({"__metadata__": {"format": 1}, "a": A, "b": B}, DATA), "not a string", True),
    ("metadata list", with_header({"__metadata__": ["pt"], "a": A, "b": B}, DATA), "not a map", True),
    (
        "duplicate name",
        with_header(None, DATA, b'{"a":' + json.dumps(A).encode() + b',"a":' + json.dumps(B).encode() + b"}"),
        "names 'a' twice",
        False,  # the library keeps one of them silently; the format forbids it
    ),
]  # fmt: skip


@pytest.mark.parametrize(
    ("case", "raw", "phrase", "library_refuses"), DAMAGED, ids=[d[0] for d in DAMAGED]
)
def test_damaged_files_are_refused(case: str, raw: bytes, phrase: str, library_refuses: bool, tmp_path: Path) -> None:  # fmt: skip
    path = tmp_path / f"{case}.safetensors"
    path.write_bytes(raw)
    with pytest.raises(InvalidSafetensorsError) as e:
        SafetensorsReader.open(str(path))
    assert isinstance(e.value, InvalidMetadataError) and e.value.exit_code == 3
    assert phrase in e.value.message and str(path) in e.value.message
    assert "\n" not in str(e.value)
    if library_refuses:
        with pytest.raises(Exception, match=r"(?i)header|offset|metadata|invalid|tensor"):
            safetensors.safe_open(str(path), framework="np")


def test_valid_variants_the_library_accepts_are_accepted(tmp_path: Path) -> None:
    variants = {
        "no metadata": with_header({"a": A, "b": B}, DATA),
        "null metadata": with_header({"__metadata__": None, "a": A, "b": B}, DATA),
        "any order, extra fields": with_header({"b": {**B, "x": 1}, "a": A}, DATA),
        "unpadded header": (lambda t: struct.pack("<Q", len(t)) + t + DATA)(json.dumps({"a": A, "b": B}, separators=(",", ":")).encode() + b"\n"),
        "no tensors": with_header({"__metadata__": {"format": "pt"}}, b""),
    }  # fmt: skip
    for case, raw in variants.items():
        path = tmp_path / "v.safetensors"
        path.write_bytes(raw)
        with safetensors.safe_open(str(path), framework="np") as f:
            library = sorted(f.keys())
        with SafetensorsReader.open(str(path)) as r:
            assert sorted(r.tensors) == library, case
            if "a" in r.tensors:
                assert r.read_tensor("a").tobytes() == DATA[:24]


def test_parse_header_directly_names_the_tensor() -> None:
    raw = json.dumps({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}).encode()
    with pytest.raises(
        InvalidSafetensorsError, match=r"tensor 'w' holds 8 bytes, but F32\[3\] needs 12"
    ):
        parse_header(raw, 8 + len(raw) + 8, "f")


# --- geometry ---


@pytest.mark.parametrize(
    "shape", [(), (0,), (5,), (3, 4), (2, 3, 5), (1, 7, 1, 3), (4, 0, 2), (6, 5, 4, 3)]
)
@pytest.mark.parametrize("max_bytes", [1, 4, 12, 20, 60, 1 << 20])
def test_blocks_cover_each_element_once_in_file_order(shape: tuple[int, ...], max_bytes: int) -> None:  # fmt: skip
    itemsize = 4
    size = int(np.prod(shape))
    blocks = list(contiguous_blocks(shape, itemsize, max_bytes, chunks=(2,) * len(shape)))
    if size:
        assert blocks
    position = 0
    for start, block in blocks:
        check_contiguous(shape, start, block)
        count = int(np.prod(block))
        assert count * itemsize <= max(max_bytes, itemsize)
        assert (flat_offset(shape, start) if shape else 0) == position
        position += count
    assert position == size


def test_check_contiguous_refuses_strided_blocks() -> None:
    check_contiguous((4, 5), (1, 0), (2, 5))
    check_contiguous((4, 5), (1, 2), (1, 3))
    for start, block in [((0, 1), (2, 4)), ((0, 0), (2, 3)), ((3, 0), (2, 5))]:
        with pytest.raises(ValueError):
            check_contiguous((4, 5), start, block)


# --- Hugging Face directories ---


def test_sharded_directory_is_found_through_its_index(tmp_path: Path) -> None:
    tensors = {f"t{i}": np.full((4,), i, np.float32) for i in range(5)}
    plan = plan_files(
        [TensorSpec(k, "float32", (4,)) for k in tensors], max_shard_size=32, metadata=None
    )
    assert len(plan.files) == 3
    for f in plan.files:
        with SafetensorsWriter(str(tmp_path / f.name), f) as w:
            for t in f.header.tensors:
                w.write_tensor(t.name, tensors[t.name])
            w.commit()
    assert plan.index_name is not None
    (tmp_path / plan.index_name).write_bytes(plan.index_json())
    found = find_files(str(tmp_path))
    assert found.files == tuple(f.name for f in plan.files) and found.index is not None
    headers = {}
    for name in found.files:
        with SafetensorsReader.open(str(tmp_path / name)) as r:
            headers[name] = r.header
            for t in r.header.tensors:
                assert r.read_tensor(t.name).tobytes() == tensors[t.name].tobytes()
    assert check_against_index(found, headers) == plan.weight_map
    lying = dict(plan.weight_map, t0=plan.files[2].name)
    (tmp_path / plan.index_name).write_text(json.dumps({"weight_map": lying}))
    with pytest.raises(InvalidSafetensorsError, match="the index puts tensor 't0'"):
        check_against_index(find_files(str(tmp_path)), headers)
    os.unlink(tmp_path / plan.files[1].name)
    with pytest.raises(InvalidSafetensorsError, match="which is not in"):
        find_files(str(tmp_path))


def test_directory_without_index_or_with_several_files(tmp_path: Path) -> None:
    with pytest.raises(InvalidSafetensorsError, match=r"no \.safetensors file"):
        find_files(str(tmp_path))
    (tmp_path / "a.safetensors").write_bytes(good_file())
    assert find_files(str(tmp_path)).files == ("a.safetensors",)
    (tmp_path / "b.safetensors").write_bytes(good_file())
    with pytest.raises(InvalidSafetensorsError, match=r"2 \.safetensors files and no index"):
        find_files(str(tmp_path))
    assert find_files(str(tmp_path / "b.safetensors")).files == ("b.safetensors",)


@pytest.mark.parametrize(
    ("raw", "phrase"),
    [
        (b"{", "not valid JSON"),
        (b"[]", "no 'weight_map'"),
        (b'{"weight_map": {"a": 3}}', "not a file name"),
        (b'{"weight_map": {"a": "../x.safetensors"}}', "not a file of the index"),
        (b'{"weight_map": {}, "metadata": 5}', "'metadata' is not an object"),
    ],
)
def test_bad_index_is_refused(raw: bytes, phrase: str) -> None:
    with pytest.raises(InvalidSafetensorsError, match=phrase):
        parse_index(raw, "model.safetensors.index.json")


def test_sink_routes_blocks_to_their_files_and_writes_the_index_last(tmp_path: Path) -> None:
    from ckpt_cli.core.safetensors.sink import SafetensorsSink

    tensors = tensor_set(6)
    specs = [TensorSpec(k, v.dtype.name, v.shape) for k, v in sorted(tensors.items())]
    plan = plan_files(specs, max_shard_size=40, metadata={"format": "pt"})
    assert len(plan.files) > 2 and plan.index_name is not None
    with SafetensorsSink(str(tmp_path), plan) as sink:
        for name, arr in sorted(tensors.items()):
            for start, shape in contiguous_blocks(arr.shape, arr.dtype.itemsize, 8):
                index = tuple(slice(s, s + n) for s, n in zip(start, shape, strict=True))
                sink.write(name, start, arr[index])
        assert not (tmp_path / plan.index_name).exists()
        sink.commit()
    assert sorted(os.listdir(tmp_path)) == sorted([plan.index_name, *(f.name for f in plan.files)])
    found = find_files(str(tmp_path))
    loaded: dict[str, bytes] = {}
    for file in found.files:
        loaded.update(load_with_library(tmp_path / file))
    assert loaded == {k: v.tobytes() for k, v in tensors.items()}
    other = tmp_path / "other"
    other.mkdir()
    with pytest.raises(RuntimeError), SafetensorsSink(str(other), plan) as sink:
        name = plan.files[0].header.tensors[0].name
        sink.write(name, (0,) * len(tensors[name].shape), tensors[name])
        raise RuntimeError("interrupted")
    assert os.listdir(other) == []


def test_read_box_reads_any_box_as_numpy_slices_it(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    tensors = {
        "m": random_array(rng, "bfloat16", (6, 5, 4)),
        "b": random_array(rng, "bool", (3, 7)),
        "s": random_array(rng, "int64", ()),
        "v": random_array(rng, "float32", (9,)),
    }
    path = tmp_path / "x.safetensors"
    stn.save_file(tensors, str(path))
    with SafetensorsReader.open(str(path)) as r:
        assert r.read_box("s", ()).tobytes() == tensors["s"].tobytes()
        for name, arr in tensors.items():
            for _ in range(40):
                region = []
                for n in arr.shape:
                    a = int(rng.integers(0, n + 1))
                    b = int(rng.integers(a, n + 1))
                    region.append(slice(a, b))
                got = r.read_box(name, tuple(region))
                want = arr[tuple(region)]
                assert got.shape == want.shape and got.dtype == want.dtype
                assert got.tobytes() == np.ascontiguousarray(want).tobytes(), (name, region)
        with pytest.raises(ValueError, match="outside"):
            r.read_box("v", (slice(3, 12),))


@pytest.mark.parametrize(
    ("shape", "itemsize", "want"),
    [
        ((4096, 4096), 4, (1024, 4096)),  # row slabs: one contiguous run of the tensor each
        ((4096, 4096), 2, (2048, 4096)),
        ((8, 4096, 4096), 4, (1, 1024, 4096)),  # a row over the limit: cut along the next axis
        ((12, 3), 4, (12, 3)),  # small: whole
        ((1 << 24,), 4, (1 << 22,)),
        ((0, 5), 4, (1, 5)),  # a chunk of 1 along an empty axis, as Orbax writes it
        ((), 4, ()),
    ],
)
def test_import_chunks_are_row_slabs_that_tile_the_shard(
    shape: tuple[int, ...], itemsize: int, want: tuple[int, ...]
) -> None:
    from ckpt_cli.core.safetensors.placement import row_chunk

    got = row_chunk(shape, itemsize, 16 << 20)
    assert got == want
    assert all(c == 0 or s % c == 0 for s, c in zip(shape, got, strict=True))


@pytest.mark.parametrize("shape", [(4099, 4096), (2, 4099, 8192), (4099, 2, 8192), (4099, 4099)])
def test_import_chunks_never_much_smaller_than_split_chunk(shape: tuple[int, ...]) -> None:
    from ckpt_cli.core.format.sharding import split_chunk
    from ckpt_cli.core.safetensors.placement import row_chunk

    # 4099 rows is prime: only a one-row slab divides the shard; split_chunk's chunks are taken
    # instead whenever they are more than four times bigger.
    got, other = row_chunk(shape, 4, 16 << 20), split_chunk(shape, 4, 16 << 20)
    assert all(s % c == 0 for s, c in zip(shape, got, strict=True))
    assert math.prod(got) * 4 >= math.prod(other)
    assert math.prod(got) * 4 <= 16 << 20
