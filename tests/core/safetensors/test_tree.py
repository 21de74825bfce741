"""``ckpt.tree``: the containers export records and import reads back, and those of a target."""

from __future__ import annotations

import json
from typing import Any, NamedTuple

import pytest

from ckpt_cli.core.safetensors.tree import Node, encode_tree, parse_tree, target_containers
from ckpt_cli.errors import RefusedError

NODES = [
    Node(("step",), (2,), "scalar"),
    Node(("params", "w"), (2, 2), "jax.Array"),
    Node(("opt", "0"), (2, 1), "None"),
    Node(("opt", "1", "count"), (2, 1, 2), "jax.Array"),
    Node(("opt", "1", "mu", "w"), (2, 1, 2, 2), "jax.Array"),
    Node(("opt", "1", "hp"), (2, 1, 2), "Dict"),
    Node(("opt", "3"), (2, 1), "Tuple"),  # index 2 was not exported: a gap
    Node(("mask",), (2,), "np.ndarray"),
]


def triples(nodes: Any) -> list[tuple[Any, ...]]:
    return sorted((n.keypath, n.key_types, n.value_type) for n in nodes)


def test_encode_then_parse_gives_every_node_back() -> None:
    text = encode_tree(NODES)
    assert json.loads(text)["tree"]["opt"] == [
        "None",
        {"count": 1, "mu": {"w": 1}, "hp": "Dict"},
        0,
        "Tuple",
    ]
    parsed = parse_tree(text)
    assert parsed.origin == "ckpt.tree"
    assert triples(parsed.nodes) == triples(NODES)
    assert sorted(parsed.tensors) == ["mask", "opt.1.count", "opt.1.mu.w", "params.w", "step"]
    assert {n.name for n in parsed.empties} == {"opt.0", "opt.1.hp", "opt.3"}


def test_a_sequence_at_the_top_and_keys_with_dots() -> None:
    nodes = [Node(("0", "a.b"), (1, 2), "jax.Array"), Node(("1",), (1,), "None")]
    text = encode_tree(nodes)
    assert json.loads(text)["tree"] == [{"a.b": 1}, "None"]
    assert triples(parse_tree(text).nodes) == triples(nodes)


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "[1]",
        '{"version": 1}',
        '{"version": 1, "tree": {"a": true}}',
        '{"version": 1, "tree": {"a": 2}}',
        '{"version": 1, "tree": {"a": ""}}',
        '{"version": 1, "tree": {"a": null}}',
        "[" * 100_000 + "]" * 100_000,
        '{"version": 1, "tree": ' + '{"a": ' * 5000 + "1" + "}" * 5001,
    ],
)
def test_damaged_values_are_refused(text: str) -> None:
    with pytest.raises(RefusedError, match=r"ckpt\.tree metadata is damaged") as e:
        parse_tree(text)
    assert e.value.hint and "--target" in e.value.hint


def test_a_newer_version_is_refused_with_a_way_out() -> None:
    with pytest.raises(RefusedError, match="has version 2; this ckpt reads version 1") as e:
        parse_tree('{"version": 2, "tree": {}}')
    assert e.value.hint and "--target" in e.value.hint


class State(NamedTuple):
    count: Any
    mu: Any


class Empty(NamedTuple):
    pass


def test_target_containers_are_what_orbax_records() -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np

    tree = {
        "step": 3,
        "opt": (Empty(), State(jax.ShapeDtypeStruct((), jnp.int32), {"w": jnp.zeros(2)}), None),
        "hp": {},
        "seq": [(), []],
        "host": np.zeros(3),
    }
    got = target_containers(tree)
    assert got.origin == "target"
    assert triples(got.nodes) == triples(
        [
            Node(("step",), (2,), "scalar"),
            Node(("opt", "0"), (2, 1), "None"),  # an empty NamedTuple: None without rich types
            Node(("opt", "1", "count"), (2, 1, 2), "jax.Array"),
            Node(("opt", "1", "mu", "w"), (2, 1, 2, 2), "jax.Array"),
            Node(("opt", "2"), (2, 1), "None"),
            Node(("hp",), (2,), "Dict"),
            Node(("seq", "0"), (2, 1), "Tuple"),
            Node(("seq", "1"), (2, 1), "List"),
            Node(("host",), (2,), "np.ndarray"),
        ]
    )
