"""A ``verify --deep`` worker opens the item once per pass, not once per unit (each open lists
the item and reads its headers: round trips with nothing else in flight), and a later pass opens
it again (it may have changed). Counted, never timed."""

from __future__ import annotations

from typing import Any

import pytest

from ckpt_cli.core.storage import LocalLocation
from ckpt_cli.core.verify import distributed as dist
from ckpt_cli.core.verify.run import verify_path
from ckpt_cli.core.verify.types import VerifyOptions
from tests.support.spy_executor import Spy


def test_a_worker_opens_the_item_once_per_deep_pass(fixture_copy, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    root = fixture_copy("no_ocdbt")
    opened: list[str] = []

    class Counting(dist.ItemStore):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            opened.append(str(args[0]))
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(dist, "ItemStore", Counting)
    monkeypatch.setattr(dist, "_STORES", {})
    spy = Spy()
    # Units of 64 bytes: every leaf is split over several units.
    report = verify_path(LocalLocation(str(root)), VerifyOptions(deep=True), None, spy, 64)
    assert report.ok
    array_units = [u for u in spy.units if u.tasks]
    assert len(array_units) >= 3
    assert len({u.run for u in array_units}) == 1
    assert len(opened) == 1
    again = verify_path(LocalLocation(str(root)), VerifyOptions(deep=True), None, Spy(), 64)
    assert again.ok
    assert len(opened) == 2  # a new pass: the item is opened again


@pytest.fixture(autouse=True)
def _no_kept_stores() -> None:
    dist._STORES.clear()
