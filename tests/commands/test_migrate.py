"""``ckpt migrate`` on the seed fixture: every op, optimizer following, refusals, the plan."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.matrix import fixture
from tests.support.paths import FIXTURES, REPO
from tests.support.sharded import read_values

SEED = FIXTURES / "seed_mlp"
K0, K1 = "params.Dense_0.kernel", "params.Dense_1.kernel"
MU = "opt_state.0.mu."
NU = "opt_state.0.nu."


@pytest.fixture(scope="module")
def source() -> dict[str, Any]:
    return read_values(SEED)


def spec_file(tmp_path: Path, rules: str, name: str = "spec.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(rules))
    return path


def run(cli, tmp_path: Path, rules: str, *args: str) -> Any:  # type: ignore[no-untyped-def]
    r = cli("migrate", SEED, tmp_path / "out", "--spec", spec_file(tmp_path, rules), *args)
    assert r.code == 0, r.stderr
    return read_values(tmp_path / "out")


def test_widen_resizes_params_and_their_moments(cli, tmp_path: Path, source) -> None:  # type: ignore[no-untyped-def]
    spec = REPO / "examples" / "widen_64_to_128.yaml"
    dry = cli("migrate", SEED, tmp_path / "out", "--spec", spec, "--dry-run", "--json")
    assert dry.code == 0, dry.stderr
    assert not (tmp_path / "out").exists()
    plan = {leaf["name"]: leaf for leaf in dry.json()["leaves"]}
    assert plan[K0]["shape"] == [16, 128] and plan[K0]["streams"]
    assert plan[MU + "Dense_0.kernel"]["operations"][0]["follows"] == K0
    assert plan["step"]["changed"] is False and plan["step"]["operations"] == []
    assert dry.json()["spec"]["rules"] == 3 and dry.json()["dropped"] == []

    r = cli("migrate", SEED, tmp_path / "out", "--spec", spec, "--json")
    assert r.code == 0, r.stderr
    assert r.json()["output"] == str(tmp_path / "out" / "500")
    got = read_values(tmp_path / "out")
    assert got[K0].shape == (16, 128) and got[K1].shape == (128, 10)
    assert got[K0][:, :64].tobytes() == source[K0].tobytes()
    assert np.abs(got[K0][:, 64:]).max() > 0  # lecun_normal columns
    assert (got[K1][64:] == 0).all() and got[K1][:64].tobytes() == source[K1].tobytes()
    for moments in (MU, NU):
        m = got[moments + "Dense_0.kernel"]
        assert m.shape == (16, 128) and (m[:, 64:] == 0).all()
        assert m[:, :64].tobytes() == source[moments + "Dense_0.kernel"].tobytes()
    for name in ("params.Dense_1.bias", "step", "rng", "opt_state.0.count", MU + "Dense_1.bias"):
        assert got[name].tobytes() == source[name].tobytes(), name
    meta = json.loads((tmp_path / "out" / "500" / "_CHECKPOINT_METADATA").read_text())
    history = meta["custom_metadata"]["ckpt_history"][-1]
    assert history["operation"] == "migrate" and len(history["spec_sha256"]) == 64
    assert history["spec"]["rules"][0]["op"] == "resize"


def test_rename_follows_into_the_optimizer(cli, tmp_path: Path, source) -> None:  # type: ignore[no-untyped-def]
    got = run(cli, tmp_path, r"""
        rules:
          - {op: rename, from: 'params\.Dense_(\d+)\.(.*)', to: 'params.layer_\1.\2'}
    """)  # fmt: skip
    assert got["params.layer_0.kernel"].tobytes() == source[K0].tobytes()
    assert got[MU + "layer_1.bias"].tobytes() == source[MU + "Dense_1.bias"].tobytes()
    assert not [n for n in got if "Dense" in n]
    assert got["opt_state.1"] == ("None", None)


def test_rename_without_following(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    got = run(cli, tmp_path, r"""
        rules:
          - {op: rename, from: 'params\.(.*)', to: 'model.\1', follow_optimizer: false}
    """)  # fmt: skip
    assert "model.Dense_0.kernel" in got and MU + "Dense_0.kernel" in got


def test_drop_follows_keep_only_filters(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    got = run(cli, tmp_path, r"""
        rules:
          - {op: drop, match: 'params\.Dense_1\..*'}
    """)  # fmt: skip
    assert not [n for n in got if "Dense_1" in n]
    assert MU + "Dense_0.bias" in got
    r = cli(
        "migrate", SEED, tmp_path / "only", "--json", "--spec",
        spec_file(tmp_path, r"rules: [{op: keep_only, match: 'params\..*'}]", "k.yaml"),
    )  # fmt: skip
    assert r.code == 0, r.stderr
    params = sorted(n for n in read_values(SEED) if n.startswith("params."))
    assert sorted(read_values(tmp_path / "only")) == params and len(params) == 4
    assert "opt_state.0.count" in r.json()["dropped"]


def test_cast_stays_off_the_moments_unless_asked(cli, tmp_path: Path, source) -> None:  # type: ignore[no-untyped-def]
    got = run(cli, tmp_path, r"""
        rules:
          - {op: cast, match: 'params\..*kernel', dtype: bfloat16}
          - {op: cast, match: 'params\..*bias', dtype: float16, follow_optimizer: true}
    """)  # fmt: skip
    assert got[K0].dtype.name == "bfloat16" and got[MU + "Dense_0.kernel"].dtype == np.float32
    assert got["params.Dense_0.bias"].dtype == np.float16
    assert got[NU + "Dense_0.bias"].dtype == np.float16
    # Round to nearest even, as ml_dtypes' astype.
    import ml_dtypes

    assert got[K0].tobytes() == source[K0].astype(ml_dtypes.bfloat16).tobytes()


def test_set_add_and_structure_ops(cli, tmp_path: Path, source) -> None:  # type: ignore[no-untyped-def]
    got = run(cli, tmp_path, r"""
        seed: 4
        rules:
          - {op: set, match: 'step|opt_state\.0\.count', value: 0}
          - {op: add, name: params.Dense_2.bias, shape: [10], dtype: float32, init: 'constant(0.5)'}
          - {op: split, match: 'params\.Dense_0\.kernel', into: [params.a, params.b], axis: 1, sizes: [24, 40]}
          - {op: concat, from: ['params\.b', 'params\.a'], to: params.ba, axis: 1}
          - {op: transpose, match: 'params\.ba', axes: [1, 0]}
          - {op: reshape, match: 'params\.Dense_1\.kernel', shape: [-1]}
    """)  # fmt: skip
    assert int(got["step"]) == 0 and int(got["opt_state.0.count"]) == 0
    assert (got["params.Dense_2.bias"] == 0.5).all()
    assert (got[MU + "Dense_2.bias"] == 0).all() and got[NU + "Dense_2.bias"].shape == (10,)
    expected = np.concatenate([source[K0][:, 24:], source[K0][:, :24]], axis=1).T
    assert got["params.ba"].tobytes() == expected.tobytes()
    assert (
        got[MU + "ba"].tobytes()
        == np.concatenate(
            [source[MU + "Dense_0.kernel"][:, 24:], source[MU + "Dense_0.kernel"][:, :24]], axis=1
        ).T.tobytes()
    )
    assert got[K1].tobytes() == source[K1].reshape(-1).tobytes() and got[K1].shape == (640,)
    assert got[NU + "Dense_1.kernel"].shape == (640,)


def test_python_runs_only_when_allowed(cli, tmp_path: Path, monkeypatch, source) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "fixups.py").write_text("def double(x, name):\n    return x * 2\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "fixups", raising=False)
    spec = spec_file(
        tmp_path,
        r"rules: [{op: python, match: 'params\.Dense_0\.bias', function: 'fixups:double'}]",
    )
    refused = cli("migrate", SEED, tmp_path / "out", "--spec", spec)
    assert refused.code == 3 and "rule 1 (python) runs fixups:double" in refused.stderr
    assert "--allow-python" in refused.stderr and not (tmp_path / "out").exists()
    r = cli("migrate", SEED, tmp_path / "out", "--spec", spec, "--allow-python")
    assert r.code == 0, r.stderr
    got = read_values(tmp_path / "out")
    assert (got["params.Dense_0.bias"] == source["params.Dense_0.bias"] * 2).all()


def test_target_lists_every_difference(cli, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    examples = str(REPO / "examples")
    (tmp_path / "wide.py").write_text(
        f"import sys\nsys.path.insert(0, {examples!r})\nfrom train_mlp import abstract_state\n"
        "def wide():\n    return abstract_state(128)\n"
    )
    monkeypatch.chdir(tmp_path)
    spec = spec_file(
        tmp_path,
        r"rules: [{op: resize, match: 'params\.Dense_0\.bias', shape: [128], init: zeros}]",
    )
    r = cli("migrate", SEED, tmp_path / "out", "--spec", spec, "--target", "wide:wide")
    assert r.code == 3 and not (tmp_path / "out").exists()
    assert "differs from --target wide:wide in 6 leaves" in r.stderr
    assert r.stderr.count("\n") == 1
    dry = cli(
        "migrate",
        SEED,
        tmp_path / "out",
        "--spec",
        spec,
        "--target",
        "wide:wide",
        "--dry-run",
        "--json",
    )
    assert dry.code == 3
    diffs = {d["name"]: d for d in dry.json()["target"]["differences"]}
    assert diffs[K0] == {"name": K0, "kind": "shape", "expected": "[16,128]", "planned": "[16,64]"}
    assert "params.Dense_0.bias" not in diffs
    ok = cli(
        "migrate",
        SEED,
        tmp_path / "out",
        "--spec",
        REPO / "examples" / "widen_64_to_128.yaml",
        "--target",
        "wide:wide",
    )
    assert ok.code == 0 and "matches --target wide:wide" in ok.stdout
    forced = cli(
        "migrate",
        SEED,
        tmp_path / "o2",
        "--spec",
        spec,
        "--target",
        "wide:wide",
        "--allow-mismatch",
    )
    assert forced.code == 0 and "differs from --target" in forced.stderr
    assert cli("migrate", SEED, tmp_path / "o3", "--spec", spec, "--target", "nocolon").code == 2
    missing = cli("migrate", SEED, tmp_path / "o3", "--spec", spec, "--target", "nosuchmod:f")
    assert missing.code == 3 and "cannot import nosuchmod" in missing.stderr


BAD_PLANS = [
    (r"[{op: rename, from: 'params\.Dense_\d\.bias', to: params.bias}]", "rule 1 (rename): two leaves would be named"),
    (r"[{op: add, name: step, shape: []}]", "rule 1 (add): two leaves would be named 'step'"),
    (r"[{op: cast, match: 'params\..*', dtype: float16}, {op: cast, match: 'params\.Dense_0\..*', dtype: bfloat16}]", "rule 2 (cast): leaf 'params.Dense_0.bias' is already given a cast by rule 1"),
    (r"[{op: cast, match: 'params\..*', dtype: int8}]", "field 'rounding' is required"),
    (r"[{op: reshape, match: 'params\.Dense_0\.kernel', shape: [7, -1]}]", "rule 1 (reshape): leaf 'params.Dense_0.kernel': impossible reshape"),
    (r"[{op: reshape, match: 'params\.Dense_0\.kernel', shape: [100, 10]}]", "impossible reshape of [16,64] (1024 elements)"),
    (r"[{op: resize, match: 'params\.Dense_0\.kernel', shape: [16, 100]}]", "field 'init' is required"),
    (r"[{op: transpose, match: 'params\.Dense_0\.bias', axes: [1, 0]}]", "has rank 1: field 'axes'"),
    (r"[{op: split, match: 'params\.Dense_1\.bias', into: [a.x, a.y, a.z], axis: 0}]", "does not split into 3 equal parts"),
    (r"[{op: concat, from: ['params\.Dense_0\.bias', 'params\.Dense_1\.bias'], to: params.b, axis: 1}]", "field 'axis' 1 is out of range"),
    (r"[{op: concat, from: ['params\.(\w+)\.kernel', 'params\.(\w+)\.bogus'], to: params.x, axis: 0}]", "has no partner matching"),
    (r"[{op: rename, from: 'params\.Dense_0\.bias', to: params.Dense_0.kernel.b}]", "'params.Dense_0.kernel' would be a leaf"),
    (r"[{op: set, match: step, value: 1.5}]", "rule 1 (set): leaf 'step' is int32: field 'value' 1.5 is not an integer"),
    (r"[{op: drop, match: 'nothing\..*'}]", "rule 1 (drop) matched no leaf; nothing written"),
    (r"[{op: cast, match: step, dtype: float32}, {op: dorp, match: x}]", "rule 2: field 'op': unknown op 'dorp'"),
    (r"[{op: cast, match: step, dtype: flaot32}]", "unknown dtype 'flaot32' (did you mean 'float32'?)"),
]  # fmt: skip


@pytest.mark.parametrize(("rules", "message"), BAD_PLANS)
def test_bad_specs_write_nothing(cli, tmp_path: Path, rules: str, message: str) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "out"
    r = cli("migrate", SEED, out, "--spec", spec_file(tmp_path, f"rules: {rules}\n"))
    assert r.code == 3, r.stderr
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("ckpt: error: ")
    assert message in r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""
    assert not out.exists()


def test_unused_rules_are_allowed_on_request(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    spec = spec_file(
        tmp_path, r"rules: [{op: drop, match: nothing}, {op: set, match: step, value: 3}]"
    )
    r = cli("migrate", SEED, tmp_path / "out", "--spec", spec, "--allow-unused")
    assert r.code == 0 and "rule 1 (drop) matched no leaf" in r.stderr
    assert int(read_values(tmp_path / "out")["step"]) == 3


@pytest.mark.parametrize(("dtype", "value"), [("float16", "1.0e+6"), ("bfloat16", "3.4e+38")])
def test_failure_in_the_data_leaves_no_step(cli, tmp_path: Path, dtype: str, value: str) -> None:  # type: ignore[no-untyped-def]
    """A float32 value that rounds to Inf in the target dtype (bfloat16: found by its bits)."""
    spec = spec_file(tmp_path, rf"""
        rules:
          - {{op: set, match: 'params\.Dense_1\.bias', value: {value}}}
          - {{op: cast, match: 'params\..*', dtype: {dtype}}}
    """)  # fmt: skip
    out = tmp_path / "out"
    r = cli("migrate", SEED, out, "--spec", spec)
    assert r.code == 3 and "rule 2 (cast): cannot cast leaf 'params.Dense_1.bias'" in r.stderr
    assert f"beyond the range of {dtype}" in r.stderr
    assert not out.exists()  # the run made it: nothing is left that was not there before


def test_initialised_values_do_not_depend_on_chunking(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    spec = spec_file(tmp_path, r"""
        rules:
          - {op: resize, match: 'params\.Dense_0\.kernel', shape: [300, 200], init: truncated_normal(0.1)}
          - {op: add, name: params.extra, shape: [64, 50], init: glorot_uniform}
    """)  # fmt: skip
    outs = []
    for i, limits in enumerate(
        (["--memory-limit", "1GiB"], ["--memory-limit", "64KiB", "--max-chunk-bytes", "2KiB"])
    ):
        r = cli("migrate", SEED, tmp_path / f"o{i}", "--spec", spec, "--json", *limits)
        assert r.code == 0, r.stderr
        outs.append((r.json(), read_values(tmp_path / f"o{i}")))
    (plan_a, a), (plan_b, b) = outs
    chunks = [{x["name"]: x["chunk_shape"] for x in p["leaves"]}[K0] for p in (plan_a, plan_b)]
    assert chunks[0] != chunks[1]
    for name in (K0, "params.extra", MU + "Dense_0.kernel"):
        assert a[name].tobytes() == b[name].tobytes(), name


def test_step_out_and_step_destination(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    spec = spec_file(tmp_path, r"rules: [{op: set, match: step, value: 0}]")
    r = cli("migrate", SEED, tmp_path / "out", "--spec", spec, "--step-out", "0")
    assert r.code == 0, r.stderr
    assert (tmp_path / "out" / "0").is_dir()
    r = cli("migrate", SEED, tmp_path / "out" / "7", "--spec", spec, "--step", "400")
    assert r.code == 0, r.stderr
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["0", "7"]
    again = cli("migrate", SEED, tmp_path / "out" / "7", "--spec", spec)
    assert again.code == 3 and "already exists" in again.stderr


def test_an_existing_destination_step_is_refused_before_any_plan(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The destination is checked first: one line on stderr, exit 3, no plan on stdout (text,
    --json and --dry-run alike); the step named by --step-out too."""
    spec = spec_file(tmp_path, r"rules: [{op: drop, match: rng}]")
    out = tmp_path / "out"
    assert cli("migrate", SEED, out, "--spec", spec).code == 0
    assert cli("migrate", SEED, out, "--spec", spec, "--step-out", "9").code == 0
    for step, extra in (("500", []), ("500", ["--dry-run"]), ("9", ["--step-out", "9"])):
        again = cli("migrate", SEED, out, "--spec", spec, *extra)
        assert again.code == 3, again.stderr
        assert again.stdout == "", again.stdout
        assert again.stderr.splitlines() == [
            f"ckpt: error: {out / step} already exists (choose another destination; ckpt "
            "never overwrites a step)"
        ]
    doc = cli("migrate", SEED, out, "--spec", spec, "--json")
    assert doc.code == 3 and set(doc.json()) == {"schema_version", "ok", "error"}


def test_text_plan(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    spec = spec_file(tmp_path, r"""
        rules:
          - {op: drop, match: rng}
          - {op: reshape, match: 'params\.Dense_0\.kernel', shape: [32, 32]}
    """)  # fmt: skip
    r = cli("migrate", SEED, tmp_path / "out", "--spec", spec, "--dry-run")
    assert r.code == 0, r.stderr
    assert "reshape [16,64] -> [32,32] [rule 2]  (holds the whole leaf)" in r.stdout
    assert "reshape [16,64] -> [32,32] (follows params.Dense_0.kernel) [rule 2]" in r.stdout
    assert "dropped: rng" in r.stdout
    assert "15 leaves: 3 changed, 12 unchanged; 1 dropped" in r.stdout


def test_migrate_without_target_does_not_import_jax(tmp_path: Path) -> None:
    spec = spec_file(tmp_path, r"rules: [{op: cast, match: 'params\..*', dtype: bfloat16}]")
    probe = textwrap.dedent("""
        import sys
        sys.argv = ["ckpt", *sys.argv[1:]]
        from ckpt_cli.app import main
        try:
            main()
        except SystemExit as e:
            assert not e.code, e.code
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("jax", "orbax", "flax")))
    """)
    args = ["migrate", str(SEED), str(tmp_path / "out"), "--spec", str(spec), "--json"]
    proc = subprocess.run(
        [sys.executable, "-c", probe, *args], capture_output=True, text=True, check=True
    )
    assert proc.stdout.strip().splitlines()[-1] == "[]"


def test_digests_are_recorded_when_the_source_has_them(cli, fixture_copy, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    src = fixture_copy("seed_mlp")
    spec = REPO / "examples" / "widen_64_to_128.yaml"
    plain = cli("migrate", src, tmp_path / "plain", "--spec", spec, "--json")
    assert plain.code == 0 and "digests" not in plain.json()
    assert cli("verify", src, "--step", "500", "--record").code == 0
    r = cli("migrate", src, tmp_path / "out", "--spec", spec, "--json")
    assert r.code == 0, r.stderr
    assert r.json()["digests"] == "recorded"
    assert (tmp_path / "out" / "500" / "default" / "_CKPT_DIGESTS.json").is_file()
    check = cli("verify", tmp_path / "out", "--deep", "--json")
    assert check.code == 0, check.stdout
    assert check.json()["checked"]["digests"] == {"500/default": "checked"}
    off = cli("migrate", src, tmp_path / "off", "--spec", spec, "--no-record-digests", "--json")
    assert off.code == 0 and "digests" not in off.json()


def test_unused_rule_hints_the_command_that_lists_the_leaves(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """With --dry-run given, 'use --dry-run' helps nobody: the hint names the listing, which runs."""
    import re
    import shlex

    spec = spec_file(tmp_path, r"rules: [{op: drop, match: 'nothing\..*'}]")
    r = cli("migrate", SEED, tmp_path / "out", "--spec", spec, "--dry-run")
    assert r.code == 3 and "matched no leaf" in r.stderr
    assert "--dry-run lists" not in r.stderr
    found = re.search(r"`ckpt (inspect [^`]+ --flat)` lists the leaf names", r.stderr)
    assert found, r.stderr
    listing = cli(*shlex.split(found.group(1)))
    assert listing.code == 0 and K0 in listing.stdout


def test_dotdot_key_is_refused_without_ocdbt(cli: Any, tmp_path: Path) -> None:
    """A key ``..`` cannot be a directory of a plain zarr item: refused, nothing written (Orbax
    0.12.8's ``odd_keys``)."""
    spec = tmp_path / "spec.yaml"
    spec.write_text("rules: [{op: cast, match: 'a\\.b', dtype: float16}]\n")
    src = fixture("0.12.8", "odd_keys").path
    r = cli("migrate", src, tmp_path / "m", "--spec", spec, "--no-ocdbt")
    assert r.code == 3 and "'..'" in r.stderr and "without OCDBT" in r.stderr, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.yaml"]
