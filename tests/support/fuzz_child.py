"""The metadata fuzz harness (hypothesis), run in its own process under an address-space limit:
``python tests/support/fuzz_child.py TARGET EXAMPLES SEED``.

It mutates one metadata file of a copy of a real Orbax fixture (a value at a random JSON path
replaced by random JSON or by an absurd value: 5,000-deep nesting, a 5,001-digit number,
+-1e30, NaN, path-like strings; or the whole file truncated, emptied, made binary), then drives
the CLI in-process (``ckpt_cli.app.main``) with ``ls --json``, ``inspect --json`` and
``verify`` on it. A run fails when an exit code is other than 0, 1 or 3, or stderr carries an
internal error. It prints one JSON line: the target, the examples run and the first failure
(hypothesis shrinks it) or null. Array shapes stay small in zarr headers: sizes that exhaust
memory are item 5's tests, one by one under limits.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "fixtures" / "ckpts"

#: target -> (fixture, file inside it, the root to list, the item to inspect: (step, item))
TARGETS: dict[str, tuple[str, str, tuple[str, str]]] = {
    "_METADATA": ("seed_mlp", "500/default/_METADATA", ("500", "default")),
    "_CHECKPOINT_METADATA": ("composite_best", "4/_CHECKPOINT_METADATA", ("4", "state")),
    "_sharding": ("sharded_4x2", "7/default/_sharding", ("7", "default")),
    "array_metadatas": ("seed_mlp", "500/default/array_metadatas/process_0", ("500", "default")),
    ".zarray": ("no_ocdbt", "0/default/params.Dense_0.kernel/.zarray", ("0", "default")),
    "zarr.json": ("no_ocdbt_zarr3", "0/default/params.Dense_0.kernel/zarr.json", ("0", "default")),
    "metrics": ("composite_best", "4/metrics/metrics", ("4", "state")),
    "_ROOT_METADATA": ("composite_best", "metadata/_ROOT_METADATA", ("4", "state")),
}
SMALL_INTS = frozenset({".zarray", "zarr.json"})
DEEP = 5000


@dataclass(frozen=True)
class Raw:
    """JSON text put in place as it is (nesting deeper than json.dumps can write)."""

    text: str


#: The fixed corpus: tried at the top of every file and at each of its top-level keys.
LETHAL: list[Any] = [
    Raw("[" * 5000 + "]" * 5000),
    Raw("9" * 5001),
    Raw("1e30"),
    Raw("-1e30"),
    Raw("NaN"),
    "../../../../etc/passwd",
]


ABSURD = [
    Raw("[" * DEEP + "]" * DEEP),
    Raw("{" + '"a":{' * DEEP + "}" * DEEP + "}"),
    Raw("9" * 5001),
    Raw("-" + "9" * 5001),
    Raw("1e30"),
    Raw("-1e30"),
    Raw("1e400"),
    Raw("NaN"),
    Raw("Infinity"),
    10**30,
    -(10**30),
    2**63,
    -1,
    "",
    "..",
    "../../../../etc/passwd",
    "/etc/passwd",
    "a/b",
    "\u0000",
    "\udcff",
    "x" * 100_000,
    [],
    {},
    None,
]


def strategies(small_ints: bool) -> Any:
    from hypothesis import strategies as st

    ints = st.integers(-2, 64) if small_ints else st.integers()
    leaves = st.none() | st.booleans() | ints | st.floats(allow_nan=True) | st.text(max_size=20)
    values = st.recursive(
        leaves,
        lambda inner: (
            st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
        ),
        max_leaves=12,
    )
    known = os.environ.get("CKPT_FUZZ_SKIP_KNOWN")  # exploring past the known failures
    absurd = st.sampled_from(
        [
            a
            for a in ABSURD
            if not (small_ints and isinstance(a, Raw) and a.text[:1] in "9-1")
            and not (known and isinstance(a, Raw) and (len(a.text) > 1000 or "e30" in a.text))
        ]
    )
    return values | absurd


def dumps(doc: Any) -> str:
    """json.dumps with Raw values spliced in as text."""
    raws: list[str] = []

    def encode(x: Any) -> Any:
        if isinstance(x, Raw):
            raws.append(x.text)
            return f"__RAW_{len(raws) - 1}__"
        if isinstance(x, dict):
            return {k: encode(v) for k, v in x.items()}
        if isinstance(x, list):
            return [encode(v) for v in x]
        return x

    text = json.dumps(encode(doc), ensure_ascii=False)
    for i, raw in enumerate(raws):
        text = text.replace(f'"__RAW_{i}__"', raw)
    return text


def mutate(doc: Any, data: Any, value_strategy: Any) -> tuple[Any, list[Any]]:
    """Replace the value at a random path (or delete a dict key); returns the doc and the path."""
    from hypothesis import strategies as st

    path: list[Any] = []
    parent, key = None, None
    node = doc
    while isinstance(node, (dict, list)) and node and not data.draw(st.booleans()):
        keys = list(node) if isinstance(node, dict) else list(range(len(node)))
        parent, key = node, data.draw(st.sampled_from(keys))
        path.append(key)
        node = node[key]
    if parent is None:
        return data.draw(value_strategy), path
    if isinstance(parent, dict) and data.draw(st.integers(0, 5)) == 0:
        del parent[key]
        return doc, [*path, "<deleted>"]
    parent[key] = data.draw(value_strategy)
    return doc, path


def fuzz_settings(examples: int, derandomize: bool) -> Any:
    """The hypothesis settings of every fuzz harness: no deadline (a run may wait on a loaded
    machine), no example database, every health check off (the examples are slow on purpose)."""
    from hypothesis import HealthCheck, settings

    return settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=derandomize,
        suppress_health_check=list(HealthCheck),
        print_blob=False,
    )


def run_cli(args: list[str]) -> tuple[int, str, str]:
    from ckpt_cli.app import main

    out, err = io.StringIO(), io.StringIO()
    old = sys.argv
    sys.argv = ["ckpt", *args]
    code = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.argv = old
    return code, out.getvalue(), err.getvalue()


def main() -> None:
    from hypothesis import given
    from hypothesis import strategies as st

    target, examples, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    derandomize = seed == 0  # seed 0: the same examples every run (the fast suite)
    if len(sys.argv) > 4:
        import resource

        limit = int(sys.argv[4])
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    fixture, rel, (step, item) = TARGETS[target]
    work = Path(tempfile.mkdtemp(prefix="ckpt-fuzz-"))
    root = work / fixture
    shutil.copytree(FIXTURES / fixture, root, symlinks=True)
    path = root / rel
    original = path.read_bytes()
    doc0 = json.loads(original)
    value_strategy = strategies(target in SMALL_INTS)
    runs = [0]
    commands = [
        ["ls", str(root), "--json"],
        ["inspect", str(root), "--step", step, "--item", item, "--json"],
        ["verify", str(root)],
    ]

    @fuzz_settings(examples, derandomize)
    @given(data=st.data())
    def check(data: Any) -> None:
        runs[0] += 1
        kind = data.draw(st.sampled_from(["value", "value", "value", "value", "bytes"]))
        if kind == "bytes":
            how = data.draw(st.sampled_from(["empty", "truncate", "binary", "bom"]))
            raw = {
                "empty": b"",
                "truncate": original[: len(original) // 2],
                "binary": bytes(range(256)),
                "bom": b"\xef\xbb\xbf" + original,
            }[how]
            label = how
        else:
            doc, where = mutate(json.loads(json.dumps(doc0)), data, value_strategy)
            raw = dumps(doc).encode("utf-8", "surrogatepass")
            label = f"at {where!r}"
        path.write_bytes(raw)
        try:
            for args in commands:
                code, _, err = run_cli(args)
                ok = code in (0, 1, 3) and "internal error" not in err
                assert ok, json.dumps(
                    {"mutation": label, "file": rel, "command": args[0], "code": code,
                     "stderr": err.strip()[-400:], "content": raw[:300].decode("utf-8", "replace")}
                )  # fmt: skip
        finally:
            path.write_bytes(original)

    random.seed(seed)
    failure = None
    corpus = 0
    # First a fixed corpus, so that the known lethal shapes are always tried: each at the top
    # of the file and at every key of its top level.
    spots: list[list[Any]] = [[]] + ([[k] for k in doc0] if isinstance(doc0, dict) else [])
    if os.environ.get("CKPT_FUZZ_NO_CORPUS"):  # exploring past the known failures
        spots = []
    for spot in spots:
        for value in LETHAL:
            if failure is not None:
                break
            corpus += 1
            doc = json.loads(json.dumps(doc0))
            if spot:
                doc[spot[0]] = value
            else:
                doc = value
            path.write_bytes(dumps(doc).encode("utf-8", "surrogatepass"))
            try:
                for args in commands:
                    code, _, err = run_cli(args)
                    if code not in (0, 1, 3) or "internal error" in err:
                        failure = {"mutation": f"corpus at {spot!r}", "file": rel,
                                   "command": args[0], "code": code,
                                   "stderr": err.strip()[-400:],
                                   "content": dumps(doc)[:300]}  # fmt: skip
                        break
            finally:
                path.write_bytes(original)
    try:
        if failure is None:
            check()
    except AssertionError as e:
        text = str(e)
        start = text.find("{")
        failure = json.loads(text[start : text.rfind("}") + 1]) if start >= 0 else text[:500]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps({"target": target, "corpus": corpus, "examples": runs[0], "failure": failure}))


if __name__ == "__main__":
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    main()
