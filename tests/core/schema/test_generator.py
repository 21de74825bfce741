"""The TypedDict -> JSON Schema generator (``ckpt_cli.core.schema``) on small types: what it
accepts and rejects, checked with ``jsonschema`` on documents that fit and documents that do not."""

from __future__ import annotations

from typing import Annotated, Literal, TypedDict

import pytest
from typing_extensions import NotRequired

from ckpt_cli.core.schema import JSONValue, json_schema


class Problem(TypedDict):
    """One finding."""

    severity: Literal["error", "warning"]
    code: str
    leaf: str | None


class Report(TypedDict):
    schema_version: Literal[3]
    ok: bool
    count: Annotated[int, "how many leaves"]
    ratio: float
    problems: list[Problem]
    by_item: dict[str, int]
    steps: tuple[int, ...]
    metrics: JSONValue
    stats: NotRequired[Problem | None]


GOOD = {
    "schema_version": 3,
    "ok": True,
    "count": 2,
    "ratio": 0.5,
    "problems": [{"severity": "error", "code": "x", "leaf": None}],
    "by_item": {"a": 1},
    "steps": [1, 2],
    "metrics": {"loss": [0.1, {"nested": None}]},
}


def _validator():  # type: ignore[no-untyped-def]
    from jsonschema import Draft202012Validator

    schema = json_schema(Report, schema_id="https://example.invalid/r", title="r")
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def test_documents_that_fit_validate() -> None:
    v = _validator()
    assert v.is_valid(GOOD)
    assert v.is_valid({**GOOD, "stats": None})
    assert v.is_valid({**GOOD, "metrics": 7})
    assert v.is_valid({**GOOD, "ratio": 1})  # a JSON number may be written without a fraction


@pytest.mark.parametrize(
    "bad",
    [
        {k: v for k, v in GOOD.items() if k != "ok"},  # a required key missing
        {**GOOD, "surprise": 1},  # a key the type does not declare
        {**GOOD, "schema_version": 2},  # another version
        {**GOOD, "ok": "yes"},
        {**GOOD, "count": True},  # bool is not an integer in JSON Schema either
        {**GOOD, "count": 1.5},
        {**GOOD, "problems": [{"severity": "fatal", "code": "x", "leaf": None}]},  # Literal
        {**GOOD, "problems": [{"severity": "error", "code": "x"}]},  # nested required
        {**GOOD, "by_item": {"a": "1"}},
        {**GOOD, "steps": ["1"]},
        {**GOOD, "stats": {"severity": "error"}},
    ],
)
def test_documents_that_do_not_fit_fail(bad: dict[str, object]) -> None:
    assert not _validator().is_valid(bad)


def test_output_is_deterministic_and_described() -> None:
    a, b = json_schema(Report), json_schema(Report)
    assert a == b
    assert a["$ref"] == "#/$defs/Report"
    props = a["$defs"]["Report"]["properties"]
    assert props["count"] == {"type": "integer", "description": "how many leaves"}
    assert a["$defs"]["Problem"]["description"] == "One finding."
    assert "stats" not in a["$defs"]["Report"]["required"]
    assert a["$defs"]["Report"]["additionalProperties"] is False


class WithAny(TypedDict):
    x: object


class WithTuple(TypedDict):
    x: tuple[int, str]


class WithIntKeys(TypedDict):
    x: dict[int, str]


class WithSet(TypedDict):
    x: set[str]


@pytest.mark.parametrize("tp", [WithAny, WithTuple, WithIntKeys, WithSet])
def test_what_json_cannot_say_is_refused(tp: type) -> None:
    with pytest.raises(TypeError):
        json_schema(tp)
