"""One language across the commands: ``ROOT@STEP`` wherever a step is taken (the same document
as ``--step``; both given and different: exit 2 naming both), ``--filter`` wherever leaves are
selected (``trend``'s and ``average``'s old ``--match`` kept as a hidden alias), ``--item`` on
``verify``, one pattern rule (a plain name matches whole components: ``params`` is not
``hyperparams``), and usage errors that suggest only the command's own options."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.main import get_command

from ckpt_cli.app import app, closest_option
from ckpt_cli.commands import COMMANDS
from ckpt_cli.core.format.names import compile_filter
from tests.support.paths import FIXTURES

SEED = FIXTURES / "seed_mlp"  # steps 300, 400, 500
COMPOSITE = FIXTURES / "composite_best"  # steps 2, 4: items extra, metrics, state
GROUP = get_command(app)


def _params(name: str) -> list[Any]:
    return list(GROUP.commands[name].params)  # type: ignore[attr-defined]


def _takes_a_step(name: str) -> bool:
    """An option ``--step``/``--steps`` or an argument called ``step`` (pin, unpin)."""
    return any(
        {"--step", "--steps"} & set(p.opts)
        or (p.param_type_name == "argument" and p.name == "step")
        for p in _params(name)
    )


STEP_COMMANDS = [c.name for c in COMMANDS if _takes_a_step(c.name)]


def _forms(name: str, tmp_path: Path, cli: Any) -> tuple[list[object], list[object]]:
    """``name`` run with ROOT@STEP, and the same run with the step given as an option."""
    out, seed = tmp_path / "out", str(SEED)
    if name in ("pin", "unpin"):
        root = shutil.copytree(SEED, tmp_path / "root")
        return [f"{root}@400", "--json"], [root, "400", "--json"]
    if name == "import":
        exported = tmp_path / "exported"
        assert cli("export", SEED, exported).code == 0
        return [exported, f"{out}@7", "--dry-run", "--json"], [
            exported, out, "--step", "7", "--dry-run", "--json",
        ]  # fmt: skip
    if name == "diff":
        return [f"{seed}@300", f"{seed}@400", "--json"], [
            seed, seed, "--step-a", "300", "--step-b", "400", "--json",
        ]  # fmt: skip
    if name in ("trend", "average"):
        tail = [out, "--dry-run"] if name == "average" else []
        return [f"{seed}@300,400", *tail, "--json"], [seed, *tail, "--steps", "300,400", "--json"]
    tail: list[object] = {
        "doctor": ["--like", seed],
        "reshard": [out, "--mesh", "data=1", "--dry-run"],
        "migrate": [out, "--spec", _spec(tmp_path), "--dry-run"],
        "export": [out, "--dry-run"],
        "cp": [out, "--dry-run"],
    }.get(name, [])
    return [f"{seed}@400", *tail, "--json"], [seed, *tail, "--step", "400", "--json"]


def _spec(tmp_path: Path) -> Path:
    spec = tmp_path / "spec.yaml"
    spec.write_text("rules: [{op: drop, match: rng}]\n")
    return spec


def _stable(doc: Any) -> Any:
    """A document without what differs between two runs of the same thing (times)."""
    if isinstance(doc, dict):
        return {
            k: _stable(v)
            for k, v in doc.items()
            if not any(w in k for w in ("elapsed", "seconds", "pinned_at", "time"))
        }
    if isinstance(doc, list):
        return [_stable(v) for v in doc]
    return doc


def test_the_commands_that_take_a_step() -> None:
    assert {
        "inspect", "verify", "digest", "diff", "doctor", "trend", "reshard", "migrate",
        "average", "export", "import", "cp", "pin", "unpin",
    } <= set(STEP_COMMANDS)  # fmt: skip


@pytest.mark.parametrize("name", STEP_COMMANDS)
def test_root_at_step_is_the_step_option(cli: Any, tmp_path: Path, name: str) -> None:
    at, option = _forms(name, tmp_path, cli)
    by_at = cli(name, *at)
    assert by_at.code in (0, 1), by_at.stderr  # diff and doctor: 1 when the two differ
    if name == "pin":
        assert cli("unpin", *option).code == 0, "unpinned, to pin again the other way"
    by_option = cli(name, *option)
    assert by_option.code == by_at.code, by_option.stderr
    assert _stable(by_at.json()) == _stable(by_option.json())


def test_du_takes_root_at_step_as_that_step(cli: Any) -> None:
    by_at = cli("du", f"{SEED}@400", "--json").json()
    assert by_at == cli("du", SEED / "400", "--json").json()
    assert (
        cli("du", f"{COMPOSITE}@4:state", "--json").json()
        == cli("du", COMPOSITE / "4" / "state", "--json").json()
    )


def _conflict(name: str, at: list[object]) -> list[object]:
    """The ROOT@STEP form of ``name`` with a different step given the other way too."""
    if name in ("trend", "average"):
        return [*at, "--steps", "300"]
    if name in ("pin", "unpin"):
        return [at[0], "300"]
    if name == "diff":
        return [*at, "--step", "500"]
    return [*at, "--step", "300"]


@pytest.mark.parametrize("name", STEP_COMMANDS)
def test_a_step_named_both_ways_differently_is_a_usage_error(
    cli: Any, tmp_path: Path, name: str
) -> None:
    at, _ = _forms(name, tmp_path, cli)
    r = cli(name, *_conflict(name, at))
    assert r.code == 2, r.stderr
    line = r.stderr.splitlines()[0]
    assert "@" in line and ("step" in line.lower()), line


def test_at_step_conflicts_name_both_and_an_item_too(cli: Any) -> None:
    r = cli("inspect", f"{SEED}@400", "--step", "300")
    assert r.code == 2
    assert f"{SEED}@400 names step 400, --step says 300: give one of them" in r.stderr
    r = cli("inspect", f"{COMPOSITE}@4:state", "--item", "extra")
    assert r.code == 2 and "names the item 'state', --item says 'extra'" in r.stderr
    assert cli("inspect", f"{SEED}@400", "--step", "400").code == 0  # the same step: fine
    r = cli("inspect", f"{SEED}@300-400")
    assert r.code == 2 and "this command reads one step" in r.stderr
    r = cli("digest", f"{COMPOSITE}@4:state")
    assert r.code == 2 and "this command takes a step, ROOT@N" in r.stderr
    r = cli("cp", f"{COMPOSITE}@4:state", "/nonexistent/out", "--dry-run")
    assert r.code == 2 and "cp copies whole steps" in r.stderr


def test_a_directory_named_with_an_at_stays_a_path(cli: Any, tmp_path: Path) -> None:
    odd = shutil.copytree(SEED, tmp_path / "run@400")
    doc = cli("inspect", odd, "--json").json()
    assert doc["step"] == 500  # the latest step of the root called run@400, not step 400


# --- --filter everywhere leaves are selected ----------------------------------------------------


def _selects_leaves(name: str) -> bool:
    return any(p.name in ("filter_", "match") for p in _params(name))


def test_every_command_selecting_leaves_takes_filter_and_no_visible_match() -> None:
    selecting = [c.name for c in COMMANDS if _selects_leaves(c.name)]
    assert {"inspect", "diff", "trend", "average"} <= set(selecting)
    for name in selecting:
        options = {o: p for p in _params(name) for o in p.opts}
        assert "--filter" in options and "-f" in options, name
        assert "--match" not in options or options["--match"].hidden, name


def test_trend_filter_and_its_old_name_match(cli: Any) -> None:
    by_filter = cli("trend", SEED, "--filter", "params.*kernel", "--json")
    assert by_filter.code == 0, by_filter.stderr
    names = [leaf["name"] for leaf in by_filter.json()["leaves"]]
    assert names and all(n.startswith("params.") and n.endswith("kernel") for n in names)
    by_match = cli("trend", SEED, "--match", "params.*kernel", "--json")
    assert _stable(by_match.json()) == _stable(by_filter.json()) and by_match.stderr == ""
    r = cli("trend", SEED, "--filter", "params", "--match", "opt_state")
    assert r.code == 2 and "--match 'opt_state' (its old name) differ" in r.stderr
    assert "--match" not in cli("trend", "--help").stdout


# --- verify --item -----------------------------------------------------------------------------


def test_verify_item_checks_that_item_of_each_step(cli: Any) -> None:
    every = cli("verify", COMPOSITE, "--json").json()["checked"]
    one = cli("verify", COMPOSITE, "--item", "state", "--json")
    assert one.code == 0, one.stderr
    checked = one.json()["checked"]
    assert checked["steps"] == [2, 4] and checked["items"] == 2 < every["items"]
    assert set(checked["digests"]) == {"2/state", "4/state"}
    at = cli("verify", f"{COMPOSITE}@4:extra", "--json").json()
    assert (at["checked"]["steps"], at["checked"]["items"]) == ([4], 1)
    by_options = cli("verify", COMPOSITE, "--step", "4", "--item", "extra", "--json").json()
    assert _stable(at) == _stable(by_options)


def test_verify_item_refusals(cli: Any) -> None:
    r = cli("verify", COMPOSITE, "--item", "nope")
    assert r.code == 3 and "item 'nope' not found" in r.stderr
    assert "its items: extra, metrics, state" in r.stderr
    r = cli("verify", COMPOSITE / "4" / "state", "--item", "state")
    assert r.code == 2 and "--item applies to a root or a step" in r.stderr
    r = cli("verify", f"{COMPOSITE}@4", "--item", "state", "--mark-committed")
    assert r.code == 2 and "--mark-committed needs every item checked" in r.stderr


# --- the pattern rule: a plain name is whole components ---------------------------------------

NAMES = [
    "params.Dense_0.kernel",
    "opt_state.1.hyperparams.learning_rate",
    "opt_state.1.hyperparams_states",
    "opt_state.0.mu.params.Dense_0.kernel",
    "mlp/~/linear_0.w",
    "xparams",
    "step",
]


@pytest.mark.parametrize(
    ("pattern", "found"),
    [
        ("params", [0, 3]),  # a component anywhere, not part of one
        ("hyperparams", [1]),
        ("Dense_0.kernel", [0, 3]),  # a dotted name: consecutive whole components
        ("Dense_0.ker", []),
        ("linear_0", [4]),  # Haiku's `/` separates components too
        ("params.*", [0]),  # a glob: the whole name
        (r"^opt_state\.1\.hyper", [1, 2]),  # a regex: searched
        ("re:params", [0, 1, 2, 3, 5]),  # re: the old substring search, when wanted
        ("step", [6]),
    ],
)
def test_a_plain_name_matches_whole_components(pattern: str, found: list[int]) -> None:
    compiled = compile_filter(pattern)
    assert compiled is not None
    assert [i for i, n in enumerate(NAMES) if compiled.search(n)] == found


def test_filter_params_leaves_hyperparams_out_of_a_real_train_state(
    cli: Any, tmp_path: Path
) -> None:
    """A linen TrainState with ``optax.inject_hyperparams`` saved by the installed Orbax."""
    from tests.support.average_runs import linen_steps

    root = tmp_path / "run"
    linen_steps(root)

    def names(*args: str) -> list[str]:
        r = cli("inspect", f"{root}@2", "--json", *args)
        assert r.code == 0, r.stderr
        return [leaf["name"] for leaf in r.json()["leaves"]]

    params = names("--filter", "params")
    assert params and all(n.startswith("params.") for n in params)
    hyper = names("--filter", "hyperparams")
    assert hyper and all(n.startswith("opt_state.1.hyperparams.") for n in hyper)
    assert set(names("--filter", "re:params")) >= set(params) | set(hyper)
    trend = cli("trend", f"{root}@1-3", "--filter", "params", "--json")
    assert trend.code == 0, trend.stderr
    assert {leaf["name"] for leaf in trend.json()["leaves"]} <= set(params)


# --- usage errors suggest the command's own options, or none ------------------------------------


def test_closest_option() -> None:
    names = ["--step", "--steps", "--item", "--filter", "--json", "--memory-limit", "-s"]
    assert closest_option("--stpe", names) == ["--step"]
    assert closest_option("--fil", names) == ["--filter"]
    assert closest_option("--memory", names) == ["--memory-limit"]
    assert closest_option("--match", names) == []
    assert closest_option("--filter", ["--item", "--junit", "--step"]) == []


@pytest.mark.parametrize("name", [c.name for c in COMMANDS])
def test_an_unknown_option_suggests_only_the_commands_own(cli: Any, name: str) -> None:
    own = {o for p in _params(name) if not getattr(p, "hidden", False) for o in p.opts}
    for typed in ("--filter", "--item", "--match"):
        if typed in own or (typed == "--match" and name in ("trend", "average")):
            continue
        r = cli(name, "x", "y", typed, "z")
        assert r.code == 2, r.stderr
        line = r.stderr.splitlines()[0]
        assert f"No such option: {typed}" in line, line
        suggested = line.partition("Possible options: ")[2].partition(")")[0]
        assert not suggested or suggested in own, line
        assert "--item" not in suggested or typed == "--item", line
