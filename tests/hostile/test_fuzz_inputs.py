"""Property: no outside input reaches an internal error. Every parser of a file ckpt reads from
outside, fed generated content, drives the real CLI (in-process, ``cli``: the real ``main()``)
to exit 0, 1, 2 or 3 with no traceback of ckpt's and no "internal error" on stderr
(``cli.ckpt_failure``: a traceback without a frame of ckpt's is another test's leftover).

Inputs: a safetensors header and a ``model.safetensors.index.json`` (``import``; ``verify
--deep`` of the file and of the folder), a migrate spec
(``migrate``), reshard rules (``reshard``), the ``verify --rotate`` state, a pin
(``_CKPT_PINNED.json``: ``ls``, ``prune``), a digest record (``verify``), the OCDBT manifest
(``verify --deep``, ``inspect``). Orbax's JSON metadata (``_METADATA``, ``_CHECKPOINT_METADATA``,
``.zarray``, ...) has its own harness, ``test_fuzz_metadata.py``, run under a memory limit; the
value strategies and the corpus of lethal values are its (``fuzz_child``).

Each target starts from a real file (written by the reference safetensors writer, by ``ckpt``
itself, or by Orbax: the committed fixtures), tries a fixed corpus (every lethal value at the
top and at each key of the first two levels), then ``EXAMPLES`` hypothesis examples
(``HEAVY_EXAMPLES`` where a run reads arrays), derandomized: the same inputs every run
(``CKPT_FAULTS_LONG=1``: 10 times as many, a fresh seed). The suite takes about 25 s of CPU.
Command-line values (``--rule``, ``--mesh``, sizes, ``--max-duration``) of 5,000 digits or
5,000-deep nesting are tested one by one at the end: usage errors, exit 2.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import ckpt_failure
from tests.support.fuzz_child import LETHAL, dumps, fuzz_settings, mutate, strategies
from tests.support.paths import FIXTURES

#: Examples per target: more where a run only parses (a dry run), fewer where it reads arrays.
EXAMPLES = 40
HEAVY_EXAMPLES = 12
LONG = os.environ.get("CKPT_FAULTS_LONG", "") not in ("", "0")


@dataclass(frozen=True)
class Codec:
    """How a target's file holds its document: JSON text, or a safetensors header."""

    decode: Callable[[bytes], Any]
    encode: Callable[[Any, bytes], bytes]  # (document, the original file) -> file


def _json_encode(doc: Any, original: bytes) -> bytes:
    return dumps(doc).encode("utf-8", "surrogatepass")


JSON = Codec(json.loads, _json_encode)


def _header_decode(raw: bytes) -> Any:
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8 : 8 + n])


def _header_encode(doc: Any, original: bytes) -> bytes:
    n = struct.unpack("<Q", original[:8])[0]
    header = dumps(doc).encode("utf-8", "surrogatepass")
    header += b" " * (-len(header) % 8)
    return struct.pack("<Q", len(header)) + header + original[8 + n :]


HEADER = Codec(_header_decode, _header_encode)


@dataclass(frozen=True)
class Target:
    path: Path  # the file the examples rewrite
    commands: list[list[str]]
    codec: Codec | None  # None: a binary file, mutated byte-wise only


def _reference_safetensors(directory: Path, names: dict[str, list[int]], file: str) -> Path:
    import numpy as np
    from safetensors.numpy import save_file

    tensors = {n: np.arange(int(np.prod(s)), dtype=np.float32).reshape(s) for n, s in names.items()}
    save_file(tensors, str(directory / file), metadata={"format": "np"})
    return directory / file


def _header(tmp: Path) -> Target:
    src = _reference_safetensors(tmp, {"params.w": [2, 3], "params.b": [3]}, "model.safetensors")
    commands = [
        ["import", str(src), str(tmp / "out"), "--dry-run", "--json"],
        ["verify", str(src), "--deep", "--json"],
    ]
    return Target(src, commands, HEADER)


def _index(tmp: Path) -> Target:
    weight_map = {}
    for i, name in enumerate(["params.w", "params.b"]):
        file = f"model-0000{i + 1}-of-00002.safetensors"
        _reference_safetensors(tmp, {name: [2, 3]}, file)
        weight_map[name] = file
    index = tmp / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {"total_size": 48}, "weight_map": weight_map}))
    commands = [
        ["import", str(index), str(tmp / "out"), "--dry-run", "--json"],
        ["verify", str(tmp), "--deep", "--json"],
    ]
    return Target(index, commands, JSON)


def _spec(tmp: Path) -> Target:
    spec = tmp / "spec.json"  # JSON is YAML: the spec loader reads it as YAML
    rules = [
        {"op": "rename", "from": r"params\.Dense_0\.(.*)", "to": r"params.first.\1"},
        {"op": "cast", "match": r"params\..*bias", "dtype": "bfloat16"},
        {"op": "resize", "match": r"params\.Dense_1\.kernel", "shape": [None, 8]},
        {"op": "add", "name": "params.head.bias", "shape": [10], "init": "zeros"},
    ]
    spec.write_text(json.dumps({"rules": rules}))
    # Without OCDBT: the plan checks every name as a directory too.
    cmd = ["migrate", str(FIXTURES / "seed_mlp"), str(tmp / "out"), "--spec", str(spec)]
    return Target(spec, [[*cmd, "--no-ocdbt", "--dry-run", "--json"]], JSON)


def _rules(tmp: Path) -> Target:
    rules = tmp / "rules.json"
    rules.write_text(json.dumps({"params.*kernel": [None, "model"], "params.*bias": ["model"]}))
    cmd = ["reshard", str(FIXTURES / "seed_mlp"), str(tmp / "out"), "--mesh", "data=1,model=1"]
    return Target(rules, [[*cmd, "--rules", str(rules), "--dry-run", "--json"]], JSON)


def _seed_copy(tmp: Path) -> Path:
    return Path(shutil.copytree(FIXTURES / "seed_mlp", tmp / "run", symlinks=True))


def _run(cli: Any, *args: object) -> None:
    r = cli(*args)
    assert r.code == 0, r.stderr


def _state(tmp: Path, cli: Any) -> Target:
    root = _seed_copy(tmp)
    cmd = ["verify", str(root), "--step", "500", "--deep", "--max-duration", "1h", "--rotate"]
    _run(cli, *cmd)
    return Target(root / "500/default/_CKPT_VERIFY_STATE.json", [[*cmd, "--json"]], JSON)


def _pin(tmp: Path, cli: Any) -> Target:
    root = _seed_copy(tmp)
    _run(cli, "pin", root, "400", "--note", "best eval")
    commands = [
        ["ls", str(root), "--json"],
        ["prune", str(root), "--keep-last", "1", "--dry-run", "--json"],
        ["unpin", str(root), "400"],
    ]
    return Target(root / "400/_CKPT_PINNED.json", commands, JSON)


def _digests(tmp: Path, cli: Any) -> Target:
    root = _seed_copy(tmp)
    _run(cli, "verify", root, "--step", "500", "--record")
    commands = [
        ["verify", str(root), "--step", "500", "--json"],
        ["verify", str(root), "--step", "500", "--deep"],
    ]
    return Target(root / "500/default/_CKPT_DIGESTS.json", commands, JSON)


def _manifest(tmp: Path) -> Target:
    root = _seed_copy(tmp)
    commands = [
        ["verify", str(root), "--step", "500", "--deep", "--json"],
        ["inspect", str(root), "--step", "500", "--json"],
    ]
    return Target(root / "500/default/manifest.ocdbt", commands, None)


TARGETS: dict[str, Callable[..., Target]] = {
    "safetensors header": _header,
    "safetensors index": _index,
    "migrate spec": _spec,
    "reshard rules": _rules,
    "rotate state": _state,
    "pin": _pin,
    "digest record": _digests,
    "ocdbt manifest": _manifest,
}
NEEDS_CLI = {"rotate state", "pin", "digest record"}
YAML = {"migrate spec", "reshard rules"}
HEAVY = {"rotate state", "pin", "digest record", "ocdbt manifest"}


def _byte_mutation(data: Any, original: bytes) -> tuple[bytes, str]:
    from hypothesis import strategies as st

    how = data.draw(st.sampled_from(["empty", "truncate", "binary", "bom", "flip", "splice"]))
    if how == "truncate":
        at = data.draw(st.integers(0, max(0, len(original) - 1)))
        return original[:at], f"truncated at {at}"
    if how in ("flip", "splice"):
        at = data.draw(st.integers(0, max(0, len(original) - 1)))
        chunk = data.draw(st.binary(min_size=1, max_size=16))
        end = at + (len(chunk) if how == "flip" else 0)
        return original[:at] + chunk + original[end:], f"{how} {chunk!r} at {at}"
    raw = {"empty": b"", "binary": bytes(range(256)), "bom": b"\xef\xbb\xbf" + original}[how]
    return raw, how


def _corpus(doc0: Any, depth: int) -> list[tuple[list[Any], Any]]:
    """Every lethal value at the top, at each top-level key and (``depth`` 2) at the first three
    keys below each (a record's leaves are alike). YAML files go one level deep only: PyYAML is
    pure Python, and 5,000-deep nesting costs seconds at any level while reaching one parser."""
    spots: list[list[Any]] = [[]]
    if isinstance(doc0, dict):
        for k, v in doc0.items():
            spots.append([k])
            if depth < 2:
                continue
            children = (
                list(v) if isinstance(v, dict) else range(len(v)) if isinstance(v, list) else []
            )
            spots += [[k, c] for c in list(children)[:3]]
    return [(spot, value) for spot in spots for value in LETHAL]


def _put(doc0: Any, spot: list[Any], value: Any) -> Any:
    if not spot:
        return value
    doc = json.loads(json.dumps(doc0))
    node = doc
    for key in spot[:-1]:
        node = node[key]
    node[spot[-1]] = value
    return doc


@pytest.mark.parametrize("name", list(TARGETS))
def test_no_input_reaches_an_internal_error(cli: Any, tmp_path: Path, name: str) -> None:
    from hypothesis import given
    from hypothesis import strategies as st

    target = TARGETS[name](tmp_path, cli) if name in NEEDS_CLI else TARGETS[name](tmp_path)
    original = target.path.read_bytes()
    doc0 = target.codec.decode(original) if target.codec else None
    runs: list[str] = []

    def attempt(raw: bytes, label: str) -> None:
        target.path.write_bytes(raw)
        try:
            for args in target.commands:
                r = cli(*args)
                runs.append(args[0])
                bad = r.code not in (0, 1, 2, 3) or ckpt_failure(r.stderr) is not None
                assert not bad, (
                    f"{name}, {label}: `ckpt {' '.join(args[:1])}` exited {r.code}: "
                    f"{r.stderr.strip()[-400:]}; input {raw[:300]!r}"
                )
        finally:
            target.path.write_bytes(original)
            shutil.rmtree(tmp_path / "out", ignore_errors=True)

    if target.codec is not None:
        for spot, value in _corpus(doc0, 1 if name in YAML else 2):
            attempt(target.codec.encode(_put(doc0, spot, value), original), f"corpus at {spot}")
    values = strategies(small_ints=False)
    examples = (HEAVY_EXAMPLES if name in HEAVY else EXAMPLES) * (10 if LONG else 1)

    @fuzz_settings(examples, derandomize=not LONG)
    @given(data=st.data())
    def check(data: Any) -> None:
        if target.codec is None or data.draw(st.integers(0, 4)) == 0:
            raw, label = _byte_mutation(data, original)
        else:
            doc, where = mutate(json.loads(json.dumps(doc0)), data, values)
            raw, label = target.codec.encode(doc, original), f"value at {where!r}"
        attempt(raw, label)

    check()
    assert len(runs) >= examples * len(target.commands)  # every example ran every command


@pytest.mark.parametrize("spec", ["[" * 5000, "[" + "9" * 5000 + "]"], ids=["deep", "digits"])
def test_a_hostile_rule_on_the_command_line_is_a_usage_error(
    cli: Any, tmp_path: Path, spec: str
) -> None:
    src = FIXTURES / "seed_mlp"
    r = cli("reshard", src, tmp_path / "out", "--mesh", "x=1", "--rule", f"params.*={spec}")
    assert r.code == 2, r.stderr
    assert "--rule" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert "internal error" not in r.stderr and not (tmp_path / "out").exists()


DIGITS = "9" * 5000
HOSTILE_OPTIONS = [
    ("reshard", "--mesh", f"x={DIGITS}"),
    ("reshard", "--mesh", "x=\u00b2"),  # str.isdigit() takes a superscript 2, int() does not
    ("reshard", "--max-chunk-bytes", DIGITS),
    ("reshard", "--memory-limit", f"{DIGITS}GiB"),
    ("verify", "--max-duration", f"{DIGITS}s"),
    ("verify", "--max-duration", "999999999999999w"),
]


@pytest.mark.parametrize(
    ("command", "option", "value"),
    HOSTILE_OPTIONS,
    ids=[f"{o[1]}={o[2][:12]}" for o in HOSTILE_OPTIONS],
)
def test_a_hostile_option_value_is_a_usage_error(
    cli: Any, tmp_path: Path, command: str, option: str, value: str
) -> None:
    src = FIXTURES / "seed_mlp"
    args = (
        ["reshard", src, tmp_path / "out", "--mesh", "x=1", "--dry-run"]
        if command == "reshard"
        else ["verify", src, "--deep"]
    )
    r = cli(*args, option, value)
    assert r.code == 2, r.stderr
    assert option in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "internal error" not in r.stderr and len(r.stderr) < 400
