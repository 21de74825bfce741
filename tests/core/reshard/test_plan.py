"""The reshard planner (``core/reshard/plan.py``, ``rules.py``) on real Orbax outputs: each
leaf's partition spec, per-device shard and chunk from a mesh and rules (first match wins, whole
leaf names, unmatched leaves replicated, optimizer moments following their parameter), the
refusals (a dimension that does not divide, a request that makes no sense), the chunk budget
under ``--max-chunk-bytes``, ``--like``, and the plan ``--dry-run`` prints. Planning reads
metadata only: nothing is written until ``execute``."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from ckpt_cli.core.format.dtypes import dtype_itemsize
from ckpt_cli.core.reshard.execute import execute
from ckpt_cli.core.reshard.plan import LeafPlan, ReshardPlan, plan_reshard
from ckpt_cli.core.write.types import WriteOptions
from ckpt_cli.errors import RefusedError, UsageError
from tests.support.matrix import fixture
from tests.support.paths import FIXTURES

SHARDED = FIXTURES / "sharded_4x2"  # step 7: params.w [8,4], params.b [6,4], ... saved on (4, 2)


def by_name(plan: ReshardPlan) -> dict[str, LeafPlan]:
    leaves = {p.leaf.name: p for p in plan.leaves}
    assert leaves, "the plan has no leaf"
    return leaves


def test_rules_give_spec_shard_and_chunk(tmp_path: Path) -> None:
    plan = plan_reshard(
        SHARDED, tmp_path / "out", mesh="data=2,model=4", rules=["params.w=[data, model]"]
    )
    leaves = by_name(plan)
    w = leaves["params.w"]
    assert (w.spec, w.write_shape, w.chunk_shape, w.rule) == (
        ("data", "model"),
        (4, 1),
        (4, 1),
        "params.w",
    )
    assert w.sharding is not None
    assert (w.sharding.axis_names, w.sharding.mesh_shape) == (("data", "model"), (2, 4))
    b = leaves["params.b"]  # no rule: replicated, the whole array on every device
    assert (b.spec, b.write_shape, b.chunk_shape, b.rule) == ((), (6, 4), (6, 4), None)
    scalar = leaves["scalar"]  # a host value: no sharding recorded
    assert (scalar.spec, scalar.sharding) == (None, None)
    assert plan.refusal is None and plan.layout.unused_rules == ()
    assert plan.operation == {
        "operation": "reshard", "mesh": "data=2,model=4", "like": None, "rules": None,
    }  # fmt: skip
    assert not (tmp_path / "out").exists()  # planning reads metadata only


def test_an_axis_tuple_splits_one_dimension_over_both(tmp_path: Path) -> None:
    plan = plan_reshard(SHARDED, tmp_path / "o", mesh="data=2,model=4", rules={"params.w": [["data", "model"]]})  # fmt: skip
    w = by_name(plan)["params.w"]
    assert (w.spec, w.write_shape) == ((("data", "model"),), (1, 4))


def test_first_rule_wins_and_patterns_name_whole_leaves(tmp_path: Path) -> None:
    plan = plan_reshard(
        SHARDED,
        tmp_path / "o",
        mesh="data=2,model=4",
        rules=["params.w=[model]", "params.*=[data]", "params.re=[data]"],
    )
    leaves = by_name(plan)
    assert (leaves["params.w"].rule, leaves["params.w"].spec) == ("params.w", ("model",))
    assert (leaves["params.b"].rule, leaves["params.b"].spec) == ("params.*", ("data",))
    # `params.re` is no prefix of `params.replicated`: it matched nothing.
    assert leaves["params.replicated"].rule == "params.*"
    assert plan.layout.unused_rules == ("params.re",)
    assert plan.warnings == ("rule 'params.re' matched no leaf",)


def test_a_dimension_that_does_not_divide_is_a_refusal_naming_the_leaf(tmp_path: Path) -> None:
    out = tmp_path / "out"
    plan = plan_reshard(SHARDED, out, mesh="data=4", rules=["params.b=[data]"])
    problems = [p for p in plan.leaves if p.problem]
    assert [(p.leaf.name, p.problem) for p in problems] == [
        ("params.b", "dimension 0 of size 6 is not divisible by 4 (data)")
    ]
    refusal = plan.refusal
    assert isinstance(refusal, RefusedError)
    assert str(refusal).startswith("1 leaves cannot take the target layout, nothing written")
    assert "params.b: dimension 0 of size 6" in str(refusal)
    assert plan.to_json()["leaves"]  # the dry run still shows every leaf, the problem too
    with pytest.raises(RefusedError):
        execute(plan)
    assert not out.exists()


def test_a_spec_longer_than_the_array_is_a_problem(tmp_path: Path) -> None:
    plan = plan_reshard(SHARDED, tmp_path / "o", mesh="data=2", rules=["params.replicated=[data, null]"])  # fmt: skip
    assert by_name(plan)["params.replicated"].problem == (
        "partition spec has 2 entries for a rank-1 array"
    )


@pytest.mark.parametrize(
    ("kw", "phrase"),
    [
        ({}, "say where to reshard to"),
        ({"mesh": "data=2", "like": str(SHARDED)}, "do not combine it with --mesh"),
        ({"mesh": "data=2", "rules": ["params.w=[nope]"]}, "unknown mesh axis 'nope'"),
        ({"mesh": "data=2,model=2", "rules": ["params.w=[data, data]"]}, "used twice"),
        ({"mesh": "data=2", "rules": ["params.w=data"]}, "a partition spec is a list"),
        ({"mesh": "data=x"}, "NAME=SIZE"),
    ],
)
def test_requests_that_make_no_sense_are_usage_errors(
    tmp_path: Path, kw: dict[str, object], phrase: str
) -> None:
    with pytest.raises(UsageError, match=phrase):
        plan_reshard(SHARDED, tmp_path / "o", **kw)  # type: ignore[arg-type]
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("budget", [64, 100, 1024])
def test_every_chunk_fits_the_budget_and_tiles_its_shard(tmp_path: Path, budget: int) -> None:
    write = WriteOptions(max_chunk_bytes=budget, memory_limit=4 * budget)
    plan = plan_reshard(
        SHARDED, tmp_path / "o", mesh="data=2", rules=["params.w=[data]"], write=write
    )
    arrays = [p for p in plan.leaves if p.leaf.is_array and p.leaf.shape]
    assert arrays
    for p in arrays:
        assert p.leaf.dtype is not None
        assert math.prod(p.chunk_shape) * dtype_itemsize(p.leaf.dtype) <= budget, p.leaf.name
        assert all(s % c == 0 for s, c in zip(p.write_shape, p.chunk_shape, strict=True))
    assert by_name(plan)["params.w"].write_shape == (4, 4)


def test_the_chunk_budget_is_at_most_a_quarter_of_the_memory_limit() -> None:
    with pytest.raises(UsageError, match="at most a quarter of --memory-limit"):
        WriteOptions(max_chunk_bytes=1 << 20, memory_limit=(4 << 20) - 1)
    assert WriteOptions(max_chunk_bytes=1 << 20, memory_limit=4 << 20).memory_limit == 4 << 20


def test_like_copies_chunks_and_sharding_and_names_what_it_cannot(tmp_path: Path) -> None:
    plan = plan_reshard(SHARDED, tmp_path / "o", like=SHARDED)
    leaves = by_name(plan)
    w = leaves["params.w"]
    assert (w.rule, w.chunk_shape, w.problem) == ("--like", (2, 2), None)
    assert w.sharding == w.leaf.sharding
    assert plan.layout.mesh is not None and plan.layout.mesh.shape == (4, 2)
    other = plan_reshard(FIXTURES / "seed_mlp", tmp_path / "p", like=SHARDED)
    missing = [p for p in other.leaves if p.problem]
    assert missing and all(p.problem == "not in the --like checkpoint" for p in missing)
    assert other.refusal is not None


@pytest.mark.parametrize("release", ["0.5.20", "0.12.8"])
def test_adam_moments_follow_their_parameter_unless_a_rule_names_them(
    release: str, tmp_path: Path
) -> None:
    f = fixture(release, "sharded")
    plan = plan_reshard(f.path, tmp_path / "o", mesh="data=2,model=2", rules={"params.w": ["model", "data"]})  # fmt: skip
    follows = {p.leaf.name: p.follows for p in plan.leaves if p.follows}
    assert follows == {"opt_state.mu.w": "params.w", "opt_state.nu.w": "params.w"}
    leaves = by_name(plan)
    assert (
        leaves["opt_state.mu.w"].spec == ("model", "data") and leaves["opt_state.mu.w"].rule is None
    )
    assert {p["name"]: p["follows"] for p in plan.to_json()["leaves"]}[
        "opt_state.mu.w"
    ] == "params.w"
    named = plan_reshard(
        f.path, tmp_path / "o2", mesh="data=2,model=2",
        rules={"params.w": ["model", "data"], "opt_state.*": []},
    )  # fmt: skip
    assert not any(p.follows for p in named.leaves)
    assert by_name(named)["opt_state.mu.w"].spec == ()


def test_dry_run_document_is_the_plan(tmp_path: Path) -> None:
    plan = plan_reshard(SHARDED, tmp_path / "o", mesh="data=2,model=4", rules=["params.w=[data, model]", "x=[]"])  # fmt: skip
    doc = plan.to_json()
    assert doc["schema_version"] == ReshardPlan.SCHEMA_VERSION and doc["ok"] is True
    assert doc["mesh"] == {"data": 2, "model": 4} and doc["unused_rules"] == ["x"]
    assert [leaf["name"] for leaf in doc["leaves"]] == [p.leaf.name for p in plan.leaves]
    assert doc["total_bytes"] == plan.total_bytes == sum(p.leaf.size_bytes for p in plan.leaves)
    w = next(leaf for leaf in doc["leaves"] if leaf["name"] == "params.w")
    assert (w["old_chunk_shape"], w["new_chunk_shape"], w["partition_spec"]) == (
        [2, 2], [4, 1], ["data", "model"],
    )  # fmt: skip
    assert [(i["item"], i["total_bytes"]) for i in doc["items"]] == [("default", plan.total_bytes)]


def test_only_the_pytree_items_of_a_step_are_planned(tmp_path: Path) -> None:
    """composite_best's step holds ``state`` (a PyTree), ``extra`` (JSON) and ``metrics``: the
    PyTree is resharded, the others are not arrays to lay out."""
    whole = plan_reshard(FIXTURES / "composite_best", tmp_path / "a", mesh="data=2")
    assert [i.source.name for i in whole.items] == ["state"]
    one = plan_reshard(FIXTURES / "composite_best", tmp_path / "b", mesh="data=2", item="state")
    assert [p.leaf.name for p in one.leaves] == [p.leaf.name for p in whole.leaves]
